"""benchmarks/rule_vs_fix.py --from-kept: a pair built from an apply run committed under benchmarks/results/
(timm ResNet-50 training at batch 64, ``--fix bf16``, H200), its estimate re-derived with this checkout's rules;
and what a run keeps: the earlier runs of its pair, the after side's own host time, the base file's own description."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "benchmarks" / "results" / "ga302_autocast"


@pytest.fixture(scope="module")
def rvf():
    return load("rule_vs_fix")


def test_batch_64_bf16_run_with_a_fast_host_lands_within_30_percent(rvf):
    entry = rvf.from_kept(
        "timm_resnet50_train",
        "GA302",
        "bf16",
        None,
        KEPT / "apply_b64.bf16.report.json",
        KEPT / "b64_nchw_fp32.trace.json.gz",
    )
    assert entry["fired"] and entry["fix_status"] == "applied"
    assert entry["measured_saving_us"] == pytest.approx(32068.82 - 28536.86)
    # that run's host enqueued a step in 19.7 ms, under the GPU's 28.5 ms after the fix: no host cap applies
    assert entry["host_enqueue_us"] == pytest.approx(19684.15)
    # 3,444 µs before cuDNN's layout transposes counted their own tensor (the convolution kernels beside them
    # took the rest of their operators' bytes, and some changed roof side), 3,323 before native bf16 batch norm
    # was counted per element (it predicts 2% more batch-norm time than this batch took, 4% less at batch 192)
    assert entry["estimate_judged_us"] == entry["gpu_saving_us"] == pytest.approx(3037.0, abs=50)
    assert entry["within_30pct"] is True
    assert entry["command"].endswith("--fix bf16 --rounds 4 --steps 10")


H100 = ROOT / "benchmarks" / "results" / "rule_vs_fix_h100"


@pytest.mark.parametrize(
    ("model", "batch", "report", "trace", "host", "measured", "estimate"),
    [
        # 2026-12-06: its host enqueued the step in 18.5 ms of 37.3, so the GPU bounds it; GA302's terms were
        # measured on the H200 only, and counting native bf16 batch norm per element they carry to the H100 (4,310
        # µs, 0.69x, when batch norm counted as the H200's ratio of cuDNN's time)
        (
            "timm_resnet50_train",
            None,
            H100 / "timm_resnet50_train.bf16.report.json",
            KEPT / "h100_b64_nchw_fp32.trace.json.gz",
            18488.33,
            6247.17,
            5832.0,
        ),
        # 2026-12-07, a second BatchNorm net, not the one GA302's terms were measured on; the H200's ratio of
        # cuDNN's time put it at 11,175 µs (0.64x)
        (
            "hf_resnet_train",
            192,
            H100 / "2026-12-07" / "hf_resnet_train.b192.bf16.report.json",
            H100 / "2026-12-07" / "hf_resnet_train.b192.bf16.before_trace.json.gz",
            24968.7,
            17458.07,
            16038.0,
        ),
        # 2026-12-07: its host enqueued the step in 27.5 ms of 37.2 (paired saving 6,045 µs, pooled 3,506)
        (
            "timm_resnet50_train",
            None,
            H100 / "2026-12-07" / "timm_resnet50_train.bf16.report.json",
            H100 / "2026-12-07" / "timm_resnet50_train.bf16.before_trace.json.gz",
            27502.6,
            6044.99,
            5826.0,
        ),
    ],
)
def test_the_h100_bf16_runs_land_within_30_percent(rvf, model, batch, report, trace, host, measured, estimate):
    assert json.loads(report.read_text())["env"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    entry = rvf.from_kept(model, "GA302", "bf16", batch, report, trace)
    assert entry["fired"] and entry["fix_status"] == "applied"
    assert entry["host_enqueue_us"] == pytest.approx(host, abs=0.5)
    assert entry["measured_saving_us"] == pytest.approx(measured, abs=0.5)
    assert entry["estimate_judged_us"] == pytest.approx(estimate, abs=50)
    assert entry["within_30pct"] is True


def test_a_kept_run_of_another_fix_is_refused(rvf):
    with pytest.raises(SystemExit, match="not an apply run of --fix bf16 alone"):
        rvf.from_kept(
            "timm_resnet50_train",
            "GA302",
            "bf16",
            None,
            KEPT / "apply_b64.cl_bf16.report.json",
            KEPT / "b64_nchw_fp32.trace.json.gz",
        )


@pytest.mark.parametrize("text", [None, "", "{", "[]"])
def test_a_missing_or_malformed_report_is_a_one_line_error(rvf, tmp_path, text):
    report = tmp_path / "report.json"
    if text is not None:
        report.write_text(text)
    with pytest.raises(SystemExit) as raised:
        rvf.from_kept("timm_resnet50_train", "GA302", "bf16", None, report, KEPT / "b64_nchw_fp32.trace.json.gz")
    assert str(raised.value).startswith(f"error: {report}") and "\n" not in str(raised.value)


def test_a_new_run_keeps_the_pairs_earlier_runs_on_record(rvf):
    slow = {"model": "m", "rule": "GA203", "fix": "channels_last", "batch": None, "date": "d1"}
    kept = {**slow, "kept_run": "report.json", "date": None}
    other = {**slow, "batch": 192}
    new = {**slow, "date": "d2"}
    pairs, replaced = rvf._replace_run([slow, kept, other], new)
    assert pairs == [kept, other, new]  # the kept-run entry and the other batch stay beside the new run
    assert replaced == [slow]


def test_a_run_records_the_after_sides_host_time_beside_the_assumed_one(rvf, tmp_path, monkeypatch):
    evidence = {"host_enqueue_us": 30221.5, "host_after_fix_us": 31657.8, "gpu_saving_us": 7672.8}
    evidence["expected_alone_us"] = 527.6
    report = {
        "before": {
            "step_time_us": 32185.4,
            "host_enqueue_us": 30221.5,
            "findings": [{"rule_id": "GA203", "estimated_saving_us_per_step": 527.6, "evidence": evidence}],
        },
        "after": {"step_time_us": 30835.3, "host_enqueue_us": 30402.0},
        "fixes": [{"fix_id": "channels_last", "status": "applied"}],
        "speedup": {"median": 1.044, "ci_low": 1.022, "ci_high": 1.089},
    }

    def fake_apply(command, **kwargs):
        folder = Path(command[command.index("--out") + 1])
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps(report))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(rvf.subprocess, "run", fake_apply)
    entry = rvf.run_pair("timm_resnet50_train", "GA203", "channels_last", tmp_path, 6, 10, 90)
    assert entry["host_after_fix_us"] == 31657.8 and entry["host_after_fix_measured_us"] == 30402.0
    assert entry["measured_saving_us"] == pytest.approx(1350.1)
    assert entry["within_30pct"] is False and entry["measured_saving_ci_us"][0] < 1350.1 * 0.7


def test_a_rejudged_estimate_reads_the_before_side_not_the_report_summary(rvf, tmp_path):
    """An apply report's summary is its after side's. A slow host after the fix (40 ms to enqueue, over the step)
    must not cap the estimate the before side's figures give."""
    report = json.loads((KEPT / "apply_b64.bf16.report.json").read_text())
    report["summary"]["host_enqueue_us"] = 40_000.0
    report["summary"]["step_time_us"] = 41_000.0
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    entry = rvf.from_kept("timm_resnet50_train", "GA302", "bf16", None, path, KEPT / "b64_nchw_fp32.trace.json.gz")
    assert entry["estimate_judged_us"] == pytest.approx(3037.0, abs=50)  # the before side's host cap: none


def test_the_saving_judged_is_the_paired_one_where_the_run_has_it(rvf):
    pooled_only = {"median": 1.05, "ci_low": 0.98, "ci_high": 1.12, "paired": None}
    assert rvf.measured_saving(50_000.0, 48_000.0, pooled_only) == (2000.0, 2000.0)
    paired = dict(pooled_only, paired={"median": 1.08, "ci_low": 1.06, "ci_high": 1.1, "rounds": 60})
    judged, pooled = rvf.measured_saving(50_000.0, 48_000.0, paired)
    assert pooled == 2000.0 and judged == pytest.approx(50_000.0 * (1 - 1 / 1.08), abs=0.01)
    entry = {"speedup": paired, "before_us": 50_000.0, "estimate_judged_us": 3600.0}
    rvf.add_saving_interval(entry)  # the interval is the paired figure's
    assert entry["measured_saving_ci_us"] == [pytest.approx(2830.2, abs=0.1), pytest.approx(4545.5, abs=0.1)]
    assert entry["estimate_within_ci"] is True
    assert rvf.measured_saving(None, 48_000.0, paired) == (None, None)


def test_a_run_merged_into_a_base_keeps_what_the_file_says_of_itself(rvf, tmp_path, monkeypatch):
    """The base's own description (method, kept_files) survives a new run merged into it; the run's gpu, date
    and command replace the base's, and the earlier run of the pair moves to earlier_runs."""
    earlier = {"model": "m", "rule": "GA205", "fix": "fused_optimizer", "batch": None, "date": "d1"}
    base = tmp_path / "base.json"
    base.write_text(
        json.dumps(
            {
                "gpu": "older GPU",
                "date": "d1",
                "command": "old",
                "method": "paired medians, 150 rounds",
                "kept_files": ["a.json"],
                "pairs": [earlier],
                "commands": ["old"],
            }
        )
    )

    def fake_pair(model, rule, fix, apply_dir, rounds, steps, timeout_s, batch):
        return {"model": model, "rule": rule, "fix": fix, "batch": batch, "measured_saving_us": 1.0}

    monkeypatch.setattr(rvf, "run_pair", fake_pair)
    out = tmp_path / "out.json"
    argv = ["--out", str(out), "--base", str(base), "--pairs", "m:GA205:fused_optimizer", "--apply-dir", str(tmp_path)]
    assert rvf.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["method"] == "paired medians, 150 rounds" and doc["kept_files"] == ["a.json"]
    assert doc["gpu"] != "older GPU" and doc["date"] != "d1" and doc["commands"][0] == "old"
    assert [p["date"] for p in doc["pairs"]] == [doc["date"]]
    assert doc["earlier_runs"] == [{**earlier, "replaced_by": doc["date"]}]


TF32_RUNS = [ROOT / "benchmarks" / "results" / "tf32_h100" / f"rvf_vit_tf32_ratio_{n}.json" for n in range(1, 7)]


def test_merge_takes_each_runs_own_entry_of_the_pair_and_keeps_the_ones_it_replaces(rvf, tmp_path):
    """--merge: the six H100 runs (two machines) of the single-image ViT's GA301/tf32 pair (2026-12-08, 240 rounds
    each, GA301 timed as a ratio of TF32 on to off over up to 120 rounds) merged into a base holding an older run:
    the last run is the pair's entry, the others and the older one are earlier runs; each run's estimate is within
    30% of what apply measured (the pair's old 40-round difference of µs was in one run of four)."""
    old = {"model": "hf_vit_infer", "rule": "GA301", "fix": "tf32", "batch": None, "date": "2026-12-06"}
    other = {"model": "hf_vit_infer", "rule": "GA301", "fix": "tf32", "batch": 32, "date": "2026-12-06"}
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "pairs": [other, old], "commands": ["c0"]}))
    out = tmp_path / "out.json"
    argv = ["--out", str(out), "--base", str(base), "--pairs", "hf_vit_infer:GA301:tf32", "--merge"]
    assert rvf.main([*argv, ",".join(str(p) for p in TF32_RUNS)]) == 0
    doc = json.loads(out.read_text())
    runs = [json.loads(p.read_text()) for p in TF32_RUNS]
    assert doc["pairs"][0] == other and len(doc["pairs"]) == 2
    assert doc["pairs"][1]["date"] == runs[-1]["date"] and doc["pairs"][1]["batch"] is None
    assert [p["date"] for p in doc["earlier_runs"]] == ["2026-12-06"] + [r["date"] for r in runs[:-1]]
    assert [p["replaced_by"] for p in doc["earlier_runs"]] == [r["date"] for r in runs]
    assert doc["commands"][:2] == ["c0", runs[0]["command"]] and "--merge" in doc["commands"][-1]
    for entry in [*doc["earlier_runs"][1:], doc["pairs"][1]]:
        estimate, measured = entry["estimate_judged_us"], entry["measured_saving_us"]
        assert estimate < 0 and measured < 0  # TF32 made this host-bound step slower, and GA301 said so
        assert abs(measured - estimate) <= 0.3 * abs(estimate), entry["date"]
        assert "--rounds 240" in entry["command"]


def test_merge_refuses_a_run_from_another_gpu_without_the_pair_or_already_merged(rvf, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"gpu": "NVIDIA H200", "pairs": []}))
    out = tmp_path / "out.json"
    argv = ["--out", str(out), "--base", str(base), "--merge", str(TF32_RUNS[0]), "--pairs"]
    with pytest.raises(SystemExit, match="ran on NVIDIA H100 80GB HBM3, not NVIDIA H200"):
        rvf.main([*argv, "hf_vit_infer:GA301:tf32"])
    base.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "pairs": []}))
    with pytest.raises(SystemExit, match="did not run any of --pairs"):
        rvf.main([*argv, "hf_gpt2_eager_attention:GA202:sdpa"])
    assert not out.exists()
    assert rvf.main([*argv, "hf_vit_infer:GA301:tf32"]) == 0  # merging the same run twice would list it twice
    base.write_text(out.read_text())
    out.unlink()
    with pytest.raises(SystemExit, match="already holds the run of .*rvf_vit_tf32_ratio_1.json"):
        rvf.main([*argv, "hf_vit_infer:GA301:tf32"])
    assert not out.exists()
