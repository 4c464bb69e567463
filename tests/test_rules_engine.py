"""The rule catalog and engine: TOML data validated on load, detectors registered by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadvisor.errors import BadInputError
from gpuadvisor.rules.engine import CATALOG_DIR, DETECTORS, load_rules, parse_rule


def test_builtin_detector_names_match_the_registered_detectors():
    """One registry (engine.DETECTORS): every name resolves to its function (and its retime function), and no
    detector or retime function of the rule modules is left out of it."""
    import importlib
    import inspect

    from gpuadvisor.rules.engine import detector_function, retime_function

    for name, entry in DETECTORS.items():
        assert callable(detector_function(name)), name
        assert (retime_function(name) is None) == (entry.retime is None), name
    registered = {(e.module, f) for e in DETECTORS.values() for f in (e.function, e.retime) if f}
    for module_name in {e.module for e in DETECTORS.values() if e.module.startswith("gpuadvisor.rules.")}:
        module = importlib.import_module(module_name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            parameters = list(inspect.signature(fn).parameters)[:2]
            if (
                fn.__module__ == module_name
                and not name.startswith("_")
                and parameters in (["a", "rule"], ["finding", "rule"])
            ):
                assert (module_name, name) in registered, f"{module_name}.{name} is not in engine.DETECTORS"
    assert {r.detector for r in load_rules()} <= set(DETECTORS)


def test_catalog_rules_have_docs_thresholds_and_stable_file_names():
    rules = load_rules()
    ids = ["GA101", "GA102", "GA201", "GA202", "GA203", "GA204", "GA205", "GA301", "GA302", "GA303"]
    ids += ["GA401", "GA402", "GA501", "GA502", "GA601", "GA602", "GA603", "GA701", "GA702"]
    assert [r.id for r in rules] == ids
    for rule in rules:
        assert Path(rule.path).name == f"{rule.id}-{rule.name}.toml"
        assert rule.thresholds and all(v > 0 for v in rule.thresholds.values())
        assert set(rule.doc) == {"what", "why", "example", "fix"}
    assert {r.id: r.fix_id for r in rules}["GA101"] == "graphs"
    assert {r.id: r.fix_id for r in rules}["GA201"] == "fusion"


def test_listing_rules_does_not_import_the_analyses():
    code = "import sys; from gpuadvisor.rules.engine import load_rules; load_rules(); print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace('severity = "high"', 'severity = "urgent"'), "severity 'urgent'"),
        (lambda t: t.replace('id = "GA101"', 'id = "X101"'), "is not of the form"),
        (lambda t: t.replace('detector = "launch_bound"', 'detector = "nope"'), "unknown detector 'nope'"),
        (lambda t: t.replace("min_launch_idle_pct = 30.0", 'min_launch_idle_pct = "30"'), "must be a number"),
        (lambda t: "exec = 'import os'\n" + t, "unknown key(s) exec"),
        (lambda t: t.replace("[doc]", "[doc]\nwhat = 'x'\n", 1), "invalid TOML"),
    ],
)
def test_bad_rule_files_are_refused_with_one_line(tmp_path, edit, message):
    text = (CATALOG_DIR / "GA101-launch-bound.toml").read_text()
    (tmp_path / "GA101-launch-bound.toml").write_text(edit(text))
    with pytest.raises(BadInputError) as info:
        load_rules(tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_user_rule_overrides_builtin_by_id(tmp_path):
    shutil.copy(CATALOG_DIR / "GA101-launch-bound.toml", tmp_path / "mine.toml")
    text = (tmp_path / "mine.toml").read_text().replace("min_launch_idle_pct = 30.0", "min_launch_idle_pct = 99.5")
    (tmp_path / "mine.toml").write_text(text)
    rules = {r.id: r for r in load_rules(tmp_path)}
    assert rules["GA101"].thresholds["min_launch_idle_pct"] == 99.5
    assert parse_rule(tmp_path / "mine.toml").path.endswith("mine.toml")


def test_raised_threshold_silences_the_finding(tmp_path):
    from gpuadvisor.pipeline import analyze_path

    samples = Path(__file__).resolve().parents[1] / "sample_traces"
    text = (
        (CATALOG_DIR / "GA101-launch-bound.toml")
        .read_text()
        .replace("min_launch_idle_pct = 30.0", "min_launch_idle_pct = 99.0")
    )
    (tmp_path / "GA101.toml").write_text(text)
    baseline = analyze_path(samples / "llama_decode.json.gz")
    raised = analyze_path(samples / "llama_decode.json.gz", rules_dir=tmp_path)
    assert baseline["findings"][0]["rule_id"] == "GA101"
    assert "GA101" not in [f["rule_id"] for f in raised["findings"]]  # idle for launches is 96.4% < 99%


def test_every_catalog_rule_names_its_saving_basis():
    from gpuadvisor.rules.engine import SAVING_BASES, SAVING_SOURCES

    rules = {r.id: r for r in load_rules()}
    assert all(r.saving_basis in SAVING_BASES and r.saving_from in SAVING_SOURCES for r in rules.values())
    assert rules["GA101"].saving_basis == "graph replay model"
    assert {i for i, r in rules.items() if r.saving_basis == "upper bound"} == {
        "GA102",
        "GA401",
        "GA501",
        "GA502",
        "GA601",  # GA6xx: memory, not time (0 µs per step)
        "GA602",
        "GA603",
        "GA701",
        "GA702",
    }


def test_upper_bounds_rank_below_savings_with_a_fix_of_the_same_size():
    from gpuadvisor.rules.engine import rank_key

    def finding(rule_id, saving, basis, severity="medium"):
        return {"rule_id": rule_id, "estimated_saving_us_per_step": saving, "saving_basis": basis, "severity": severity}

    ranked = sorted(
        [
            finding("GA401", 100.0, "upper bound", "high"),
            finding("GA402", 100.0, "roof"),
            finding("GA102", 250.0, "upper bound"),
            finding("GA201", 60.0, "roof"),
            finding("GA301", 40.0, "roof"),
        ],
        key=rank_key,
    )
    # Upper bounds count at half: 250 -> 125, 100 -> 50 (below the 60 µs fix, above the 40 µs one).
    assert [f["rule_id"] for f in ranked] == ["GA102", "GA402", "GA201", "GA401", "GA301"]


def test_combined_estimate_counts_a_share_of_the_step_once():
    from gpuadvisor.rules.engine import combined_estimate

    summary = {"step_time_us": 1000.0, "idle_launch_us": 500.0, "kernel_us_per_step": 400.0}
    findings = [
        {"estimated_saving_us_per_step": 400.0, "saving_basis": "roof", "saving_from": "kernels"},
        {"estimated_saving_us_per_step": 200.0, "saving_basis": "roof", "saving_from": "kernels"},
        {"estimated_saving_us_per_step": 500.0, "saving_basis": "graph replay model", "saving_from": "launch_idle"},
        {"estimated_saving_us_per_step": 100.0, "saving_basis": "upper bound", "saving_from": "sync_idle"},
    ]
    got = combined_estimate(findings, summary)
    # kernels: 400 of 400 and 200 of 400 cannot save more than the 400 µs of kernels; launch idle adds 500.
    assert got["combined_saving_us"] == 900.0 and got["combined_saving_pct"] == 90.0
    # sync idle is not in the summary: the upper bound combines against the whole step.
    assert got["combined_upper_bound_us"] == 100.0
    assert combined_estimate(findings, {"step_time_us": None})["combined_saving_us"] is None
