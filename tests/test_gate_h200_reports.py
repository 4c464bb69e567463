"""The gate on real reports recorded on the H200 (benchmarks/gate_reports.py, benchmarks/results/gate/):
20 rounds of a GPU-bound step as baseline, a second baseline (A/A), a planted 10% slowdown (one extra
matmul kernel) and a planted small slowdown (2.6% measured: 0.78% larger matmuls, same kernels)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpuadvisor.gate import compare_reports
from gpuadvisor.report.json import load_report

GATE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gate"


def reports(kind: str) -> list[dict]:
    return [load_report(p) for p in sorted((GATE / kind).glob("*.json"))]


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[dict]]:
    return {kind: reports(kind) for kind in ("base", "aa", "slow10", "slow2")}


def verdicts(base: list[dict], current: list[dict]) -> list[str]:
    return [compare_reports(b, c)["verdict"] for b, c in zip(base, current)]


def step_metric(result: dict) -> dict:
    return next(m for m in result["metrics"] if m["key"] == "step_time")


def test_recorded_on_the_h200(recorded):
    assert all(len(v) == 20 for v in recorded.values())
    assert {r["env"]["gpu_name"] for v in recorded.values() for r in v} == {"NVIDIA H200"}
    assert json.loads((GATE / "recording.json").read_text())["gpu"] == "NVIDIA H200"


def test_a_a_pairs_report_no_regression(recorded):
    assert verdicts(recorded["base"], recorded["aa"]).count("regression") == 0


def test_planted_ten_percent_slowdown_is_a_regression_in_19_of_20(recorded):
    results = [compare_reports(b, c) for b, c in zip(recorded["base"], recorded["slow10"])]
    assert sum(step_metric(r)["verdict"] == "regression" for r in results) >= 19
    assert sum(r["verdict"] == "regression" for r in results) >= 19
    slower = statistics.median(
        c["summary"]["step_time_us"] / b["summary"]["step_time_us"] - 1
        for b, c in zip(recorded["base"], recorded["slow10"])
    )
    assert 0.08 < slower < 0.13  # measured, not edited: the extra kernel costs about 10% of the step


def test_small_planted_change_is_not_a_regression(recorded):
    slower = statistics.median(
        c["summary"]["step_time_us"] / b["summary"]["step_time_us"] - 1
        for b, c in zip(recorded["base"], recorded["slow2"])
    )
    assert 0.01 < slower < 0.04
    assert verdicts(recorded["base"], recorded["slow2"]).count("regression") == 0
