"""GA203 and GA302 on a timed step: a kernel saving is capped by the host's time per step (an eager step cannot go
under it), autocast's casts add host time, and beside compile or graphs the GPU's saving counts in full.

The figures are the H200's (benchmarks/results/host_bound_check.json): a timm ResNet-50 training step took
32.0 ms with 28.6 ms of host time and 32.0 ms of GPU time; channels_last took 9 ms of GPU time off and the step
went to 28.8 ms."""

from __future__ import annotations

import pytest

from gpuadvisor.fixes.coverage import combined_saving
from gpuadvisor.rules.detectors_model import MAX_PROBED_LAUNCHES, fp32_compute_timed, layout_conversions_timed
from gpuadvisor.rules.engine import load_rules, retime_saving

RULES = {rule.id: rule for rule in load_rules()}


def layout_finding(gpu_saving: float = 7_664.0) -> dict:
    return {
        "rule_id": "GA203",
        "fix_id": "channels_last",
        "saving_from": "kernels",
        "message": "conversions.",
        "estimated_saving_us_per_step": gpu_saving,
        "evidence": {"gpu_saving_us": gpu_saving},
    }


def precision_finding(gpu_saving: float = 3_600.0, casts: float = 108.0) -> dict:
    per_cast = RULES["GA302"].threshold("autocast_host_us_per_cast")
    return {
        "rule_id": "GA302",
        "fix_id": "bf16",
        "saving_from": "kernels",
        "message": "fp32.",
        "estimated_saving_us_per_step": gpu_saving,
        "evidence": {
            "gpu_saving_us": gpu_saving,
            "autocast_casts_per_step": casts,
            "autocast_host_us_per_step": casts * per_cast,
        },
    }


def timed(host: float | None = 28_600.0, launches: float = 737.0, syncs: float = 0.0) -> dict:
    return {"host_enqueue_us": host, "launch_calls_per_step": launches, "host_syncs_per_step": syncs}


def test_a_host_bound_step_saves_only_down_to_the_host_time():
    finding = layout_finding()
    saving = retime_saving(finding, RULES["GA203"], 32_000.0, 56_000.0, timed())
    assert saving == pytest.approx(32_000.0 - 28_600.0)
    evidence = finding["evidence"]
    assert evidence["expected_alone_us"] == pytest.approx(3_400.0)
    assert evidence["host_enqueue_us"] == 28_600.0
    assert evidence["gpu_saving_us"] == 7_664.0  # kept for stacks with compile or graphs
    assert "28,600 µs" in finding["message"] and "compile or graphs" in finding["message"]


def test_a_gpu_bound_step_keeps_the_whole_kernel_saving():
    finding = layout_finding(2_000.0)
    saving, text = layout_conversions_timed(finding, RULES["GA203"], 32_000.0, None, timed(host=20_000.0))
    assert saving == 2_000.0 and text is None
    assert finding["evidence"]["expected_alone_us"] == pytest.approx(2_000.0)


def test_autocast_casts_can_make_a_host_bound_step_slower_and_the_saving_stays_at_zero():
    per_cast = RULES["GA302"].threshold("autocast_host_us_per_cast")
    finding = precision_finding(gpu_saving=3_600.0, casts=108.0)
    host = 31_500.0
    saving, text = fp32_compute_timed(finding, RULES["GA302"], 32_000.0, None, timed(host=host))
    expected = 32_000.0 - max(host + 108.0 * per_cast, 32_000.0 - 3_600.0)
    assert expected < 0
    assert finding["evidence"]["expected_alone_us"] == pytest.approx(expected, abs=0.1)
    assert saving == 0.0
    assert "slower" in text and "108 casts" in text


@pytest.mark.parametrize(
    "summary, why",
    [
        (timed(host=None), "not measured"),
        (timed(syncs=2), "synchronizes"),
        (timed(launches=MAX_PROBED_LAUNCHES + 1), "launch queue"),
    ],
)
def test_where_the_host_time_is_unknown_or_not_separable_the_gpu_saving_stands(summary, why):
    finding = layout_finding()
    saving, text = layout_conversions_timed(finding, RULES["GA203"], 32_000.0, None, summary)
    assert saving == 7_664.0 and text is None
    assert why in finding["evidence"]["host_bound_basis"]
    assert "expected_alone_us" not in finding["evidence"]


def test_beside_compile_or_graphs_the_capped_saving_counts_in_full():
    finding = layout_finding()
    retime_saving(finding, RULES["GA203"], 32_000.0, None, timed())
    finding["estimated_saving_us_per_step"] = round(finding["evidence"]["expected_alone_us"], 1)
    alone = combined_saving([finding], {"channels_last"}, 32_000.0)
    with_compile = combined_saving([finding], {"channels_last", "compile"}, 32_000.0)
    with_graphs = combined_saving([finding], {"channels_last", "graphs"}, 32_000.0)
    assert alone == pytest.approx(3_400.0)
    assert with_compile == pytest.approx(7_664.0) and with_graphs == pytest.approx(7_664.0)


def test_a_retimed_finding_retimes_the_same_way_twice():
    """apply analyses the before side again for its report: the cap reads the GPU saving, not its own output."""
    finding = layout_finding()
    first = retime_saving(finding, RULES["GA203"], 32_000.0, None, timed())
    finding["estimated_saving_us_per_step"] = first
    second = retime_saving(finding, RULES["GA203"], 32_000.0, None, timed())
    assert first == second


def test_the_rescale_note_names_the_host_cap_only_where_a_finding_was_capped():
    from gpuadvisor.report.profiled import rescale_savings

    def report(*findings: dict) -> dict:
        summary = {"step_time_us": 32_000.0, "trace_step_time_us": 56_000.0, **timed()}
        return {"summary": summary, "findings": list(findings), "notes": []}

    capped = report(layout_finding(), precision_finding())
    rescale_savings(capped, RULES.values())
    note = capped["notes"][-1]
    assert "GA203 and GA302's kernel saving capped by the host's 28,600 µs" in note, note

    gpu_only = {**layout_finding(), "rule_id": "GA201", "fix_id": "fusion"}
    plain = report(gpu_only)
    rescale_savings(plain, RULES.values())
    assert "capped" not in plain["notes"][-1]


def test_channels_last_takes_the_conversion_launches_off_the_host():
    """On the H200 the ResNet-50 step's host time fell by 2.1-2.3 ms in channels_last (its 200 conversion kernels
    per step launch no more): the host bound after the fix is the host time less their launch calls."""
    finding = layout_finding()
    finding["evidence"].update({"channels_last_host_us_per_step": -1_698.0, "conversion_launch_calls_per_step": 200})
    saving, text = layout_conversions_timed(finding, RULES["GA203"], 32_121.0, None, timed(host=30_344.0))
    assert finding["evidence"]["host_after_fix_us"] == pytest.approx(30_344.0 - 1_698.0)
    assert saving == pytest.approx(32_121.0 - (30_344.0 - 1_698.0), abs=0.1)
    assert "−1,698 µs: the 200 conversion kernels' launch calls per step go" in text


def test_the_resnet_trace_counts_its_conversion_launches():
    from pathlib import Path

    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.rules.engine import run_rules
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(Path(__file__).resolve().parents[1] / "sample_traces" / "real" / "timm_resnet50_train.json.gz")
    findings, _ = run_rules(analyze_trace(trace, lookup_peaks(trace.device, None)), [RULES["GA203"]])
    (finding,) = findings
    evidence = finding["evidence"] if isinstance(finding, dict) else finding.evidence
    assert evidence["conversion_launch_calls_per_step"] == 200
    assert -2_000 < evidence["channels_last_host_us_per_step"] < -1_400


def test_ga301_on_a_host_bound_step_saves_nothing_alone_and_its_kernel_time_beside_compile():
    """The suite's single-image ViT on the H100: a 9,730 µs step with 1.7 ms of GPU work, where TF32 left the step
    at 10,072 µs while GA301 claimed 2,550 µs from the kernels alone."""
    finding = {
        "rule_id": "GA301",
        "fix_id": "tf32",
        "saving_from": "kernels",
        "message": "fp32 GEMMs.",
        "estimated_saving_us_per_step": 2_550.0,
        "evidence": {"gpu_saving_us": 2_550.0},
    }
    saving = retime_saving(finding, RULES["GA301"], 9_730.0, None, timed(host=9_600.0, launches=186.0))
    assert saving == pytest.approx(130.0)
    assert finding["evidence"]["expected_alone_us"] == pytest.approx(130.0)
    assert "TF32 would bring the step to about 9,600 µs" in finding["message"]
    finding["estimated_saving_us_per_step"] = saving
    assert combined_saving([finding], {"tf32", "compile"}, 9_730.0) == pytest.approx(2_550.0)


def test_ga301_takes_the_step_timed_with_tf32_on_and_off_where_the_profile_timed_it():
    """The single-image ViT on the H100 (benchmarks/results/tf32_h100/rvf_vit_tf32.json): an 8,302 µs step,
    8,408 µs of host time from the probes, 2,542 µs of kernel time TF32 takes off, and the step 273 µs slower with
    TF32 on, timed in a loop. Without that timing GA301 expects no change (the step is the host's time either way);
    with it, the measured change is the saving, on the basis of a measured alternative."""

    def finding() -> dict:
        return {
            "rule_id": "GA301",
            "fix_id": "tf32",
            "saving_from": "kernels",
            "saving_basis": "roof",
            "message": "fp32 GEMMs.",
            "estimated_saving_us_per_step": 2_542.0,
            "evidence": {"gpu_saving_us": 2_542.0},
        }

    plain = finding()
    retime_saving(plain, RULES["GA301"], 8_302.0, None, timed(host=8_408.0, launches=186.0))
    # the probe (from an idle GPU) reads more than the step itself: the host's time per step is the step's
    assert plain["evidence"]["expected_alone_us"] == pytest.approx(0.0)
    assert plain["evidence"]["host_enqueue_us"] == 8_408.0 and plain["evidence"]["host_after_fix_us"] == 8_302.0
    assert "tf32_step_delta_us" not in plain["evidence"] and plain["saving_basis"] == "roof"

    slower = finding()
    summary = {**timed(host=8_408.0, launches=186.0), "tf32_step_delta_us": 273.0, "tf32_step_delta_rounds": 40}
    saving = retime_saving(slower, RULES["GA301"], 8_302.0, None, summary)
    assert saving == 0.0
    assert slower["evidence"]["expected_alone_us"] == pytest.approx(-273.0)
    assert slower["saving_basis"] == "measured alternative"
    assert "40 rounds" in slower["evidence"]["basis"]
    assert "took 273 µs more per step with it on" in slower["message"]

    faster = finding()
    saving = retime_saving(faster, RULES["GA301"], 8_302.0, None, {**summary, "tf32_step_delta_us": -1_200.0})
    assert saving == pytest.approx(1_200.0)
    assert faster["evidence"]["expected_alone_us"] == pytest.approx(1_200.0)
    assert "took 1,200 µs less per step" in faster["message"]


def test_the_apply_report_keeps_the_before_side_s_tf32_host_figure():
    """rule_vs_fix.py and a reader of a kept apply run re-derive GA301 from the before side's figures."""
    from gpuadvisor.apply import SideMeasurement
    from gpuadvisor.report.apply_report import _side_section

    side = SideMeasurement("before", samples_us=[8_162.0], round_medians_us=[8_162.0])
    side.summary = {
        "step_time_us": 8_162.0,
        "host_enqueue_us": 8_156.4,
        "tf32_step_delta_us": 385.7,
        "tf32_step_delta_rounds": 40,
    }
    section = _side_section(side, None, None)
    assert section["host_enqueue_us"] == 8_156.4 and section["tf32_step_delta_us"] == 385.7
    assert section["tf32_step_delta_rounds"] == 40
