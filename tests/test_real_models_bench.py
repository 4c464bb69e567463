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


KEPT_CACHE = (
    Path(__file__).resolve().parents[1] / "benchmarks/results/auto_vs_compile/max_autotune_h100_autotune_cache.json"
)


class _Choice:
    """Stands for one of Inductor's choice callers: the autotuning cache knows a choice by its hash_key()."""

    def __init__(self, key: str) -> None:
        self.key = key

    def hash_key(self) -> str:
        return self.key


def test_kept_autotuning_results_are_what_inductor_reads_instead_of_benchmarking(real_models, tmp_path, monkeypatch):
    """--autotune-cache puts the H100 runs' results where Inductor's own lookup finds them: for each of the 26
    operator inputs (two runs of 2026-12-07 added 15 to the first run's 11) it returns the kept times and never
    calls the benchmark."""
    torch = pytest.importorskip("torch")
    from torch._inductor import codecache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (kept,) = json.loads(KEPT_CACHE.read_text())["inductor_local_caches"].values()
    assert real_models.seed_autotune_cache(KEPT_CACHE) == {"file": str(KEPT_CACHE), "operator_inputs": 26}
    monkeypatch.setattr(codecache.CacheBase, "get_system", staticmethod(lambda: kept["system"]))
    codecache.CacheBase.get_local_cache_path.cache_clear()
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")

    def benchmark(choices):
        raise AssertionError("benchmarked an operator the kept results cover")

    try:
        looked_up = 0
        for op, per_input in kept["cache"].items():
            for inputs, per_precision in per_input.items():
                times = per_precision["highest"]
                found = codecache.PersistentCache().lookup([_Choice(k) for k in times], op, inputs, benchmark)
                assert {c.key: ms for c, ms in found.items()} == times
                looked_up += 1
        assert looked_up == 26
    finally:
        codecache.CacheBase.get_local_cache_path.cache_clear()


def test_a_run_s_new_results_are_merged_into_the_kept_file(real_models, tmp_path, monkeypatch):
    """After a model, what Inductor's folder holds joins the file: an operator timed now is added, one timed
    again takes the new time, the rest stay; a second system's cache sits beside the first."""
    pytest.importorskip("torch")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    kept_file = tmp_path / "kept.json"
    kept_file.write_text(KEPT_CACHE.read_text())
    ((system_hash, kept),) = json.loads(KEPT_CACHE.read_text())["inductor_local_caches"].items()
    assert real_models.seed_autotune_cache(kept_file)["operator_inputs"] == 26
    folder = tmp_path / "inductor" / "cache"
    here = json.loads((folder / system_hash).read_text())
    conv_input, conv_times = next(iter(here["cache"]["convolution"].items()))
    aten = next(k for k in conv_times["highest"] if k.startswith("convolution"))
    here["cache"]["convolution"][conv_input]["highest"][aten] = 0.123
    here["cache"]["bmm"] = {"new input": {"highest": {"bmm-x": 0.5}}}
    (folder / system_hash).write_text(json.dumps(here))
    (folder / "another-system").write_text(json.dumps({"system": {"device": "H200"}, "cache": {"mm": {"k": {}}}}))
    (folder / "not-a-cache.lock").write_text("")

    assert real_models.save_autotune_cache(kept_file, "python3 benchmarks/real_models.py ...") == 28
    saved = json.loads(kept_file.read_text())
    assert saved["gpu"] == "NVIDIA H100 80GB HBM3"
    earlier = json.loads(KEPT_CACHE.read_text())["commands"]
    assert len(earlier) == 4 and saved["commands"] == [*earlier, "python3 benchmarks/real_models.py ..."]
    caches = saved["inductor_local_caches"]
    assert set(caches) == {system_hash, "another-system"}
    merged = caches[system_hash]["cache"]
    assert merged["convolution"][conv_input]["highest"][aten] == 0.123
    assert merged["bmm"] == {"new input": {"highest": {"bmm-x": 0.5}}}
    assert merged["mm"] == kept["cache"]["mm"]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"inductor_local_caches": {"h": 3}}', '{"other": {}}'])
def test_a_file_that_is_no_autotuning_cache_is_a_one_line_error(real_models, tmp_path, text):
    path = tmp_path / "cache.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as raised:
        real_models.read_autotune_cache(path)
    assert str(raised.value).startswith(f"error: {path}: not an autotuning cache file") and "\n" not in str(
        raised.value
    )
    assert real_models.read_autotune_cache(tmp_path / "absent.json") == {}


def test_a_bad_autotune_cache_file_stops_the_run_before_any_model(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text("{")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "real_models.py"
    out = tmp_path / "out.json"
    run = subprocess.run(
        [sys.executable, str(script), "--models", "hf_llama_decode", "--autotune-cache", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "not an autotuning cache file" in run.stderr and not out.exists()
