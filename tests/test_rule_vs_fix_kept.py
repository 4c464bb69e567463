"""benchmarks/rule_vs_fix.py --from-kept: a pair built from an apply run committed under benchmarks/results/
(timm ResNet-50 training at batch 64, ``--fix bf16``, H200), its estimate re-derived with this checkout's rules."""

from __future__ import annotations

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
    assert entry["estimate_judged_us"] == entry["gpu_saving_us"] == pytest.approx(3444.0, abs=50)
    assert entry["within_30pct"] is True
    assert entry["command"].endswith("--fix bf16 --rounds 4 --steps 10")


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
