"""What a fix's predicted saving is built from, on the suite's H200 traces: which findings a fix addresses
(all of a finding, or only the kernel families torch.compile rewrites) and the optimizer loop re-derived
against the step timed without the profiler."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpuadvisor.fixes.coverage import COMPILE_GENERATED_FAMILIES, addressed_saving, combined_saving, fix_covers
from gpuadvisor.pipeline import analyze_path
from gpuadvisor.rules.engine import load_rules, retime_saving

REAL = Path(__file__).resolve().parents[1] / "sample_traces" / "real"


def findings_of(name: str) -> tuple[dict, dict[str, dict]]:
    report = analyze_path(REAL / f"{name}.json.gz")
    return report, {f["rule_id"]: f for f in report["findings"]}


def test_cudnn_batchnorm_and_implicit_gemm_convolutions_get_their_own_families():
    report, _ = findings_of("timm_resnet50_train")
    family = {k["name"]: k["family"] for k in report["kernels"]}
    bn = [n for n in family if "bn_fw_tr_1C11" in n or "bn_bw_1C11" in n]
    convs = [n for n in family if "implicit_gemm" in n and ("fprop" in n or "dgrad" in n or "wgrad" in n)]
    layout = [n for n in family if "nchwToNhwc" in n or "nhwcToNchw" in n]
    assert bn and convs and layout
    assert {family[n] for n in bn} == {"normalization"}
    assert {family[n] for n in convs} == {"convolution"}
    assert {family[n] for n in layout} == {"copy"}


def test_compile_claims_the_under_filled_batchnorm_kernels_but_not_the_convolutions():
    _, by_rule = findings_of("timm_resnet50_train")
    ga102 = by_rule["GA102"]
    parts = ga102["evidence"]["saving_by_family_us"]
    assert sum(parts.values()) == pytest.approx(ga102["estimated_saving_us_per_step"], rel=0.01)
    assert parts["normalization"] > 1000 and parts["convolution"] > 1000
    covered = fix_covers("compile", {"mode": "reduce-overhead"})
    claimed = addressed_saving(ga102, covered)
    assert claimed == pytest.approx(sum(v for f, v in parts.items() if f in COMPILE_GENERATED_FAMILIES))
    assert claimed < ga102["estimated_saving_us_per_step"] - parts["convolution"] + 1
    # The layout conversions (Inductor runs the convolutions in channels_last) and the BN/ReLU chains count;
    # the fp32 convolutions (bf16's finding) do not.
    assert addressed_saving(by_rule["GA203"], covered) == by_rule["GA203"]["estimated_saving_us_per_step"]
    assert addressed_saving(by_rule["GA201"], covered) == by_rule["GA201"]["estimated_saving_us_per_step"]
    assert addressed_saving(by_rule["GA302"], covered) == 0.0
    # graphs alone claims none of GA102.
    assert addressed_saving(ga102, fix_covers("graphs")) == 0.0


def test_a_decode_step_gemv_underfill_is_not_compile_s():
    _, by_rule = findings_of("hf_llama_decode")
    ga102 = by_rule["GA102"]
    parts = ga102["evidence"]["saving_by_family_us"]
    claimed = addressed_saving(ga102, fix_covers("compile", {"mode": "default"}))
    assert "gemm" in parts and claimed == pytest.approx(
        ga102["estimated_saving_us_per_step"]
        - parts["gemm"]
        - parts.get("attention", 0.0)
        - parts.get("other", 0.0)
        - parts.get("convolution", 0.0),
        abs=0.5,
    )


def test_combined_saving_counts_a_by_family_part_once_as_a_share():
    findings = [
        {
            "rule_id": "GA102",
            "fix_id": None,
            "estimated_saving_us_per_step": 300.0,
            "evidence": {"saving_by_family_us": {"normalization": 200.0, "gemm": 100.0}},
        },
        {"rule_id": "GA203", "fix_id": "channels_last", "estimated_saving_us_per_step": 500.0},
    ]
    # 1 - (1 - 0.2)(1 - 0.5) = 0.6 of a 1,000 µs step.
    assert combined_saving(findings, fix_covers("compile"), 1000.0) == pytest.approx(600.0)
    assert combined_saving(findings, {"channels_last"}, 1000.0) == pytest.approx(500.0)
    bad = copy.deepcopy(findings[0])
    bad["evidence"]["saving_by_family_us"] = {"normalization": 900.0}  # never more than the finding's saving
    assert addressed_saving(bad, {"compile"}) == 300.0


def test_the_optimizer_loop_is_re_derived_against_the_timed_step():
    report, by_rule = findings_of("hf_gpt2_train_foreach_off")
    finding = copy.deepcopy(by_rule["GA204"])
    rule = next(r for r in load_rules() if r.id == "GA204")
    profiled = report["summary"]["step_time_us"]
    region = finding["evidence"]["region_us_per_step"]
    fused = finding["evidence"]["fused_estimate_us"]
    timed = profiled * 0.6
    saving = retime_saving(finding, rule, timed, profiled)
    assert saving == pytest.approx(region * 0.6 - fused, rel=1e-3)
    assert finding["evidence"]["region_timed_us_per_step"] == pytest.approx(region * 0.6, rel=1e-3)
    assert "Timed without the profiler" in finding["message"]
    # A timed step no shorter than the profiled one keeps the profiled figure.
    again = copy.deepcopy(by_rule["GA204"])
    assert retime_saving(again, rule, profiled * 1.1, profiled) == pytest.approx(again["estimated_saving_us_per_step"])


def test_a_tf32_gpu_allows_another_convolution_algorithm_four_times_the_original_s_float64_error():
    torch = pytest.importorskip("torch")
    from gpuadvisor.fixes.numerics import REFERENCE_FACTOR, TF32_REFERENCE_FACTOR, _judge

    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, dtype=torch.float64, generator=gen)
    noise = torch.randn(4096, dtype=torch.float64, generator=gen)
    other = torch.randn(4096, dtype=torch.float64, generator=gen)
    original = (exact + 1e-3 * noise * exact.norm() / noise.norm()).float()  # 1e-3 from float64
    patched = (exact + 3e-3 * other * exact.norm() / other.norm()).float()  # 3e-3: another algorithm's error
    trial = {"outputs": ([("output", original)], [("output", patched)], [("output", exact)]), "state": ([], [], [])}
    strict = _judge("model", [trial], True, "float32", None, True, REFERENCE_FACTOR)
    tf32 = _judge("model", [trial], True, "float32", None, True, TF32_REFERENCE_FACTOR)
    assert not strict.passed and tf32.passed
    assert tf32.bound == pytest.approx(TF32_REFERENCE_FACTOR * tf32.reference_error)
    assert "bound max(4 x" in tf32.detail and "bound max(2 x" in strict.detail
    # A tensor scaled by 1.01 stays caught by the scale check, whatever the factor.
    scaled = (exact * 1.01).float()
    wrong = {"outputs": ([("output", original)], [("output", scaled)], [("output", exact)]), "state": ([], [], [])}
    assert not _judge("model", [wrong], True, "float32", None, True, TF32_REFERENCE_FACTOR).passed


def test_the_suite_trace_findings_say_which_part_of_the_step_their_saving_is_in():
    from gpuadvisor.fixes.coverage import saving_part

    _, by_rule = findings_of("timm_resnet50_train")
    parts = {rule: saving_part(finding) for rule, finding in by_rule.items()}
    assert parts == {
        "GA101": "idle",
        "GA102": "generated",
        "GA201": "generated",
        "GA203": "generated",
        "GA302": "library",
    }
    covered = fix_covers("channels_last") | fix_covers("bf16") | fix_covers("compile", {"mode": "reduce-overhead"})
    step = 32080.0  # the H200 step timed without the profiler
    findings = list(by_rule.values())
    # The parts add: more than every finding multiplied as a share of one step, never more than their plain sum.
    together = combined_saving(findings, covered, step)
    plain_sum = sum(addressed_saving(f, covered) for f in findings)
    remaining = 1.0
    for finding in findings:
        remaining *= 1.0 - addressed_saving(finding, covered) / step
    assert step * (1.0 - remaining) < together
    from gpuadvisor.fixes.coverage import fused_bf16_saving

    extra = fused_bf16_saving(by_rule["GA201"], covered, findings)
    assert extra > 0 and together <= plain_sum + extra
