"""benchmarks/real_models.py's comparison of auto against the torch.compile modes and its ``--auto-from``
re-timing of an earlier auto choice (CPU: the tiny MLP as a one-model suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "real_models.py"


@pytest.fixture(scope="module")
def real_models():
    return load("real_models")


def test_best_compile_takes_the_fastest_mode_that_ran(real_models):
    entry = {
        "auto_us": 1020.0,
        "auto_speedup": 10.0,
        "compile": {"default": 3000.0, "reduce-overhead": 1000.0, "max-autotune": {"error": "RuntimeError: boom"}},
    }
    row = real_models.best_compile(entry)
    assert row["mode"] == "reduce-overhead" and row["us"] == 1000.0
    assert row["modes_timed"] == ["default", "reduce-overhead"] and row["modes_failed"] == ["max-autotune"]
    assert row["auto_over_best_compile"] == pytest.approx(1.02)
    assert real_models.best_compile({"auto_us": 5.0, "compile": {"default": {"error": "x"}}}) is None
    assert "auto_over_best_compile" not in real_models.best_compile({"auto_us": None, "compile": {"default": 2.0}})


def _results(path: Path, entry: dict) -> Path:
    path.write_text(json.dumps({"models": [entry]}))
    return path


def test_auto_from_refuses_a_model_without_a_finished_auto_run(real_models, tmp_path):
    results = _results(tmp_path / "auto.json", {"name": "a", "date": "d", "auto_fixes": ["bf16"], "findings": []})
    fields = real_models.auto_from_results(results, "a")
    assert fields["auto_fixes"] == ["bf16"]
    assert fields["auto_from"] == {"file": str(results), "date": "d", "command": None}
    with pytest.raises(SystemExit, match="no entry for model 'b'"):
        real_models.auto_from_results(results, "b")
    failed = _results(tmp_path / "failed.json", {"name": "a", "error": "killed"})
    with pytest.raises(SystemExit, match="no completed apply --fix auto run"):
        real_models.auto_from_results(failed, "a")
    with pytest.raises(SystemExit, match="no entry"):
        real_models.auto_from_results(tmp_path / "missing.json", "a")


def test_auto_from_re_applies_the_choice_and_times_it_beside_eager(tmp_path):
    pytest.importorskip("torch")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "tiny.py").write_text((ROOT / "examples" / "tiny_mlp.py").read_text() + '\nKIND = "infer"\n')
    earlier = {"name": "tiny", "date": "2026-12-02T20:00:00+00:00", "auto_fixes": ["bf16"], "auto_facts": {}}
    results = _results(tmp_path / "auto.json", earlier)
    out = tmp_path / "out.json"
    command = [sys.executable, str(SCRIPT), "--suite", str(suite), "--auto-from", str(results), "--skip-compile"]
    command += ["--steps", "2", "--rounds", "1", "--warmup", "0", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    entry = json.loads(out.read_text())["models"][0]
    assert entry["auto_from"]["date"] == earlier["date"]
    assert entry["auto_fixes_timed"] == ["bf16"]  # applied again here, not copied from the earlier run
    assert len(entry["samples"]["auto"]) == 2 and entry["auto_us"] > 0
    assert entry["best_compile"] is None  # no compile mode timed


def test_auto_from_is_not_for_runs_that_skip_the_auto_variant(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--auto-from", str(tmp_path / "x.json"), "--auto-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--auto-from re-times an earlier auto choice" in done.stderr
