"""The compare gate: statistics on synthetic samples, verdict rules, settings, and the CLI contract
(exit codes, one-line errors, JUnit XML, $GITHUB_STEP_SUMMARY, pyproject overrides) run as a subprocess."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest

from gpuadvisor import gate
from gpuadvisor.errors import BadInputError
from gpuadvisor.report.json import SCHEMA_VERSION

SEEDS = range(20)
GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
MUL = "void at::native::elementwise_kernel<128, 4, MulFunctor>(int, MulFunctor)"


def make_report(samples, **summary) -> dict:
    """A minimal schema-v1 report as `gpuadvisor profile` writes it (H200, 30 timed steps)."""
    samples = [round(float(s), 2) for s in samples]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gpuadvisor", "version": "0.1.0"},
        "command": "profile",
        "env": {
            "gpu_name": "NVIDIA H200",
            "driver": "580.159.04",
            "cuda": "13.0",
            "torch": "2.11.0+cu130",
            "clocks": {"sm_mhz_median": 1980, "mem_mhz_median": 3201},
        },
        "summary": {
            "step_time_us": float(np.median(samples)) if samples else None,
            "samples_us": samples,
            "kernels_per_step": 436,
            "host_syncs_per_step": 0,
            **summary,
        },
        "kernels": [
            {"name": GEMM, "count_per_step": 32, "us_per_step": 250.0, "total_us": 750.0},
            {"name": MUL, "count_per_step": 64, "us_per_step": 170.0, "total_us": 510.0},
        ],
        "findings": [],
    }


def draw(seed: int, shift: float = 0.0, n: int = 30, median_us: float = 1000.0, noise: float = 0.05):
    """Base and current samples: Gaussian, noise x median standard deviation; current's median x (1 + shift)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(median_us, noise * median_us, n)
    current = rng.normal(median_us * (1 + shift), noise * median_us * (1 + shift), n)
    return base, current


def step_verdict(base, current, settings: gate.Settings | None = None) -> str:
    result = gate.compare_reports(make_report(base), make_report(current), settings)
    (step,) = [m for m in result["metrics"] if m["key"] == "step_time"]
    return step["verdict"]


def metric(result: dict, key: str) -> dict:
    (found,) = [m for m in result["metrics"] if m["key"] == key]
    return found


# --- statistics on synthetic samples ------------------------------------------------------------


def test_identical_distributions_pass() -> None:
    verdicts = [step_verdict(*draw(seed)) for seed in SEEDS]
    assert verdicts.count(gate.REGRESSION) == 0
    assert verdicts.count(gate.PASS) >= 19, verdicts


def test_identical_reports_pass_with_exit_code_0() -> None:
    report = make_report(draw(0)[0])
    result = gate.compare_reports(report, copy.deepcopy(report))
    assert result["verdict"] == gate.PASS and gate.exit_code(result) == 0
    assert {m["verdict"] for m in result["metrics"]} == {gate.PASS}


def test_ten_percent_slower_is_a_regression() -> None:
    verdicts = [step_verdict(*draw(seed, shift=0.10)) for seed in SEEDS]
    assert verdicts == [gate.REGRESSION] * len(SEEDS)
    result = gate.compare_reports(*(make_report(s) for s in draw(0, shift=0.10)))
    assert result["verdict"] == gate.REGRESSION and gate.exit_code(result) == 1
    step = metric(result, "step_time")
    assert step["p_value"] < 0.001 and 6 < step["change_pct"] < 15 and step["n_base"] == step["n_current"] == 30


def test_two_percent_slower_is_not_a_regression_at_default_thresholds() -> None:
    verdicts = [step_verdict(*draw(seed, shift=0.02)) for seed in SEEDS]
    assert gate.REGRESSION not in verdicts, verdicts


def test_ten_percent_faster_is_an_improvement_and_passes() -> None:
    result = gate.compare_reports(*(make_report(s) for s in draw(1, shift=-0.10)))
    assert metric(result, "step_time")["verdict"] == gate.IMPROVEMENT
    assert result["verdict"] == gate.PASS and gate.exit_code(result, strict=True) == 0


def test_past_threshold_with_three_samples_is_inconclusive() -> None:
    base, current = [1000.0, 1010.0, 990.0], [1200.0, 1210.0, 1190.0]
    result = gate.compare_reports(make_report(base), make_report(current))
    step = metric(result, "step_time")
    assert step["verdict"] == gate.INCONCLUSIVE and "3 and 3 samples" in step["reason"]
    assert result["verdict"] == gate.INCONCLUSIVE
    assert gate.exit_code(result) == 0 and gate.exit_code(result, strict=True) == 1


def test_past_threshold_but_not_significant_is_inconclusive() -> None:
    # Medians 8% apart, but the samples overlap: half of each set sits at the same values.
    base = [1000.0] * 5 + [900.0, 1300.0, 950.0, 1250.0, 1100.0]
    current = [1080.0] * 5 + [900.0, 1300.0, 950.0, 1250.0, 1000.0]
    step = metric(gate.compare_reports(make_report(base), make_report(current)), "step_time")
    assert step["change_pct"] > 5
    assert step["verdict"] == gate.INCONCLUSIVE and step["p_value"] >= 0.05, step


def test_significant_change_under_the_floor_passes() -> None:
    base, current = draw(2, shift=0.10, median_us=100.0, noise=0.01)  # +10 µs: past 5%, under the 20 µs floor
    step = metric(gate.compare_reports(make_report(base), make_report(current)), "step_time")
    assert step["p_value"] < 0.001
    assert step["verdict"] == gate.PASS, step


def test_one_sided_test_direction() -> None:
    slower, faster = [1100.0 + i for i in range(10)], [900.0 + i for i in range(10)]
    assert gate.mann_whitney_p(slower, faster, "greater") < 0.001
    assert gate.mann_whitney_p(slower, faster, "less") > 0.99
    assert gate.mann_whitney_p([5.0] * 8, [5.0] * 8, "greater") == 1.0


def test_tokens_per_s_is_higher_is_better() -> None:
    base, current = draw(3, shift=0.10)
    tokens = 1e6 / np.median(base), 1e6 / np.median(current)  # one token per step
    result = gate.compare_reports(
        make_report(base, tokens_per_s=tokens[0]), make_report(current, tokens_per_s=tokens[1])
    )
    rate = metric(result, "tokens_per_s")
    assert rate["direction"] == gate.HIGHER and rate["change_pct"] < -5
    assert rate["verdict"] == gate.REGRESSION
    assert rate["base"] == pytest.approx(tokens[0], rel=1e-6)


# --- values without samples ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "current", "verdict"),
    [(436, 436, gate.PASS), (436, 437, gate.REGRESSION), (436, 435, gate.IMPROVEMENT)],
)
def test_counters_compare_exactly(base: int, current: int, verdict: str) -> None:
    samples = draw(4)[0]
    result = gate.compare_reports(
        make_report(samples, kernels_per_step=base), make_report(samples, kernels_per_step=current)
    )
    assert metric(result, "kernels_per_step")["verdict"] == verdict
    assert result["verdict"] == (gate.REGRESSION if verdict == gate.REGRESSION else gate.PASS)


def test_one_more_host_sync_is_a_regression() -> None:
    samples = draw(4)[0]
    result = gate.compare_reports(make_report(samples), make_report(samples, host_syncs_per_step=1))
    assert metric(result, "host_syncs_per_step")["verdict"] == gate.REGRESSION
    assert gate.exit_code(result) == 1


@pytest.mark.parametrize(
    ("base_bytes", "current_bytes", "verdict"),
    [
        (2**30, 2**30 + 100 * 2**20, gate.REGRESSION),  # +9.8%, +100 MiB
        (4 * 2**30, 4 * 2**30 + 100 * 2**20, gate.PASS),  # +100 MiB, but 2.4%
        (100 * 2**20, 132 * 2**20, gate.PASS),  # +32%, but only 32 MiB
        (2**30, 2**30 - 200 * 2**20, gate.IMPROVEMENT),
    ],
)
def test_memory_needs_ratio_and_floor(base_bytes: int, current_bytes: int, verdict: str) -> None:
    samples = draw(5)[0]
    result = gate.compare_reports(
        make_report(samples, memory_allocated_peak_bytes=base_bytes),
        make_report(samples, memory_allocated_peak_bytes=current_bytes),
    )
    assert metric(result, "memory_allocated")["verdict"] == verdict


def test_energy_and_kernel_times_have_one_value_so_they_are_at_most_inconclusive() -> None:
    samples = draw(6)[0]
    base = make_report(samples, energy_j_per_step=1.10)
    current = make_report(samples, energy_j_per_step=1.30)
    current["kernels"][0]["us_per_step"] = 400.0
    result = gate.compare_reports(base, current)
    assert metric(result, "energy_per_step")["verdict"] == gate.INCONCLUSIVE
    assert metric(result, gate.KERNEL_PREFIX + GEMM)["verdict"] == gate.INCONCLUSIVE
    assert metric(result, gate.KERNEL_PREFIX + MUL)["verdict"] == gate.PASS
    assert result["verdict"] == gate.INCONCLUSIVE


def test_top_kernels_come_from_both_reports() -> None:
    samples = draw(7)[0]
    base, current = make_report(samples), make_report(samples)
    current["kernels"].insert(0, {"name": "new_kernel", "us_per_step": 500.0, "total_us": 1500.0})
    result = gate.compare_reports(base, current, gate.Settings(top_kernels=1))
    keys = [m["key"] for m in result["metrics"] if m["key"].startswith(gate.KERNEL_PREFIX)]
    assert keys == [gate.KERNEL_PREFIX + "new_kernel", gate.KERNEL_PREFIX + GEMM]
    added = metric(result, gate.KERNEL_PREFIX + "new_kernel")
    assert added["base"] == 0 and added["change_pct"] is None and "not in the base" in added["reason"]


def test_metric_in_one_report_only_is_skipped_and_absent_in_both_is_left_out() -> None:
    samples = draw(8)[0]
    result = gate.compare_reports(make_report(samples, energy_j_per_step=1.1), make_report(samples))
    assert metric(result, "energy_per_step")["verdict"] == gate.SKIPPED
    assert "tokens_per_s" not in {m["key"] for m in result["metrics"]}
    assert result["verdict"] == gate.PASS


# --- comparability ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("env", "gpu_name", "NVIDIA H100 80GB HBM3"),
        ("env", "torch", "2.10.0+cu130"),
        ("env", "driver", "570.86.15"),
        ("env", "cuda", "12.8"),
        ("env", "torch", None),
        (None, "command", "analyze"),
    ],
)
def test_environment_drift_is_not_comparable(section: str | None, key: str, value) -> None:
    samples = draw(9)[0]
    base, current = make_report(samples), make_report(samples)
    (current[section] if section else current)[key] = value
    result = gate.compare_reports(base, current)
    assert result["verdict"] == gate.NOT_COMPARABLE and result["metrics"] == []
    assert gate.exit_code(result) == 2
    allowed = gate.compare_reports(base, current, allow_env_drift=True)
    assert allowed["verdict"] == gate.PASS and allowed["drift"] and gate.exit_code(allowed) == 0


@pytest.mark.parametrize(("clock_mhz", "comparable"), [(1980, True), (1890, True), (1860, False), (2100, False)])
def test_sm_clocks_within_five_percent(clock_mhz: int, comparable: bool) -> None:
    samples = draw(10)[0]
    current = make_report(samples)
    current["env"]["clocks"]["sm_mhz_median"] = clock_mhz
    result = gate.compare_reports(make_report(samples), current)
    assert (result["verdict"] != gate.NOT_COMPARABLE) is comparable


def test_missing_clocks_are_not_drift() -> None:
    samples = draw(10)[0]
    current = make_report(samples)
    current["env"]["clocks"] = None
    assert gate.compare_reports(make_report(samples), current)["comparable"]


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r["summary"].update(samples_us="fast"),
        lambda r: r["summary"].update(samples_us=[1000.0, "x"]),
        lambda r: r["summary"].update(kernels_per_step="436"),
        lambda r: r["kernels"].append({"us_per_step": 3.0}),
    ],
)
def test_malformed_numbers_are_bad_input(change) -> None:
    samples = draw(11)[0]
    current = make_report(samples)
    change(current)
    with pytest.raises(BadInputError):
        gate.compare_reports(make_report(samples), current)


# --- settings -----------------------------------------------------------------------------------


def test_settings_from_pyproject_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.gpuadvisor.compare]\ntime_threshold_pct = 12\nmemory_floor_mib = 128\nmin_samples = 8\n")
    settings, path = gate.load_settings(config)
    assert path == config
    assert (settings.time_threshold_pct, settings.memory_floor_mib, settings.min_samples) == (12.0, 128.0, 8)
    assert settings.kernel_threshold_pct == 5.0 and settings.sources["time_threshold_pct"] == str(config)
    settings, _ = gate.load_settings(config, {"--threshold-pct": 3.0, "--alpha": 0.01, "--top": None})
    assert settings.time_threshold_pct == settings.memory_threshold_pct == settings.energy_threshold_pct == 3.0
    assert settings.alpha == 0.01 and settings.top_kernels == 5 and settings.sources["alpha"] == "--alpha"


def test_find_config_searches_upwards_for_the_table(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.gpuadvisor.compare]\nalpha = 0.01\n")
    inner = tmp_path / "pkg" / "sub"
    inner.mkdir(parents=True)
    (tmp_path / "pkg" / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")  # no table: keep looking
    assert gate.find_config(inner) == tmp_path / "pyproject.toml"
    assert gate.find_config(tmp_path / "pkg") == tmp_path / "pyproject.toml"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[tool.gpuadvisor.compare]\ntime_treshold_pct = 3\n", "unknown key 'time_treshold_pct'"),
        ("[tool.gpuadvisor.compare]\nalpha = 2\n", "alpha must be between 0 and 1"),
        ("[tool.gpuadvisor.compare]\ntime_floor_us = 'ten'\n", "must be a number"),
        ("[tool.gpuadvisor.compare]\nmin_samples = 2.5\n", "whole number"),
        ("[tool.gpuadvisor.compare\nalpha = 0.1\n", "not valid TOML"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, text: str, needle: str) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text(text)
    with pytest.raises(BadInputError, match=needle):
        gate.load_settings(config)


def test_settings_change_the_verdict() -> None:
    base, current = draw(12, shift=0.10)
    assert step_verdict(base, current) == gate.REGRESSION
    assert step_verdict(base, current, gate.Settings(time_threshold_pct=15.0)) == gate.PASS
    assert step_verdict(base, current, gate.Settings(time_floor_us=500.0)) == gate.PASS
    assert step_verdict(base, current, gate.Settings(min_samples=40)) == gate.INCONCLUSIVE


# --- renderings ---------------------------------------------------------------------------------


def test_markdown_and_junit_of_a_regression() -> None:
    base, current = (make_report(s) for s in draw(13, shift=0.10))
    current["kernels"][1]["name"] = "custom|kernel[1]"
    result = gate.compare_reports(base, current)
    markdown = gate.render_markdown(result)
    assert markdown.startswith("### gpuadvisor compare: ❌ regression")
    assert "custom\\|kernel\\[1\\]" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| Metric"))
    rows = [line for line in markdown.splitlines() if line.startswith("| step time")]
    assert len(rows) == 1 and rows[0].count(" | ") == header.count(" | ")
    root = ElementTree.fromstring(gate.render_junit_xml(result))
    cases = root.findall("testcase")
    assert [c.get("name") for c in cases] == ["environment"] + [m["name"] for m in result["metrics"]]
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["step time"] and root.get("failures") == "1"


# --- the CLI, as a subprocess -------------------------------------------------------------------


def write_reports(folder: Path, base: dict, current: dict) -> tuple[Path, Path]:
    paths = folder / "base.json", folder / "current.json"
    for path, report in zip(paths, (base, current)):
        path.write_text(json.dumps(report))
    return paths


def assert_one_line_error(result, *needles: str) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    return lines[0]


def test_cli_regression_exit_1_with_junit_xml(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    base, current = write_reports(tmp_path, *(make_report(s) for s in draw(14, shift=0.10)))
    junit = tmp_path / "gate.xml"
    result = cli("compare", base, current, "--junit-xml", junit, "--format", "json")
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("regression: step time")
    data = json.loads(result.stdout)
    assert data["verdict"] == "regression"
    root = ElementTree.parse(junit).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert len(cases) == len(data["metrics"]) + 1
    assert set(cases) == {"environment", *(m["name"] for m in data["metrics"])}
    assert cases["step time"].find("failure") is not None
    assert all(c.find("failure") is None for name, c in cases.items() if name != "step time")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_cli_pass_and_inconclusive_exit_codes(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    base, current = write_reports(tmp_path, *(make_report(s) for s in draw(15)))
    result = cli("compare", base, current)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "Verdict pass" in result.stdout
    base, current = write_reports(tmp_path, make_report([1000, 1010, 990]), make_report([1200, 1210, 1190]))
    assert cli("compare", base, current).returncode == 0
    strict = cli("compare", base, current, "--strict")
    assert strict.returncode == 1 and strict.stderr.startswith("inconclusive (--strict): step time")


def test_cli_env_drift_exit_2_unless_allowed(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    samples = draw(16)[0]
    current = make_report(samples)
    current["env"].update(gpu_name="NVIDIA H100 80GB HBM3", torch="2.10.0+cu130")
    base, current = write_reports(tmp_path, make_report(samples), current)
    result = cli("compare", base, current)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("not comparable:") and "NVIDIA H100" in lines[0]
    assert "torch: 2.11.0+cu130 vs 2.10.0+cu130" in lines[0]
    allowed = cli("compare", base, current, "--allow-env-drift", "--format", "json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["verdict"] == "pass"


def _truncated(path: Path) -> None:
    text = json.dumps(make_report(draw(0)[0]))
    path.write_text(text[: len(text) // 2])


def _wrong_version(path: Path) -> None:
    report = make_report(draw(0)[0])
    report["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(report))


def _no_summary(path: Path) -> None:
    report = make_report(draw(0)[0])
    del report["summary"]
    path.write_text(json.dumps(report))


def _bad_samples(path: Path) -> None:
    report = make_report(draw(0)[0])
    report["summary"]["samples_us"] = {"median": 3}
    path.write_text(json.dumps(report))


BAD_REPORTS = {
    "malformed": (lambda p: p.write_text("{'schema_version': 1,}"), ("not valid JSON",)),
    "truncated": (_truncated, ("truncated",)),
    "empty": (lambda p: p.write_text(""), ("empty",)),
    "wrong schema version": (_wrong_version, ("schema_version 2",)),
    "array": (lambda p: p.write_text("[]"), ("expected a JSON object",)),
    "missing key": (_no_summary, ("lacks required key", "summary")),
    "samples not a list": (_bad_samples, ("samples_us",)),
}


@pytest.mark.parametrize("label", sorted(BAD_REPORTS))
def test_cli_bad_reports_are_one_line_errors(cli, tmp_path: Path, label: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make_report(draw(0)[0])))
    bad = tmp_path / "bad.json"
    build, needles = BAD_REPORTS[label]
    build(bad)
    junit = tmp_path / "gate.xml"
    assert_one_line_error(cli("compare", good, bad, "--junit-xml", junit), "bad.json", *needles)
    assert_one_line_error(cli("compare", bad, good), "bad.json", *needles)
    assert not junit.exists()


def test_cli_missing_report_is_a_one_line_error(cli, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make_report(draw(0)[0])))
    assert_one_line_error(cli("compare", good, tmp_path / "nosuch.json"), "no such file", "nosuch.json")


def test_cli_appends_markdown_to_github_step_summary(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    summary = tmp_path / "step_summary.md"
    summary.write_text("## Earlier step\n\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base, current = write_reports(tmp_path, *(make_report(s) for s in draw(17, shift=0.10)))
    result = cli("compare", base, current, "--format", "markdown")
    assert result.returncode == 1
    text = summary.read_text()
    assert text.startswith("## Earlier step\n\n### gpuadvisor compare: ❌ regression")
    assert result.stdout.strip() in text and "| step time |" in text


def test_cli_pyproject_and_flags_change_the_verdict(cli, tmp_path: Path, monkeypatch) -> None:
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    base, current = write_reports(project / "runs", *(make_report(s) for s in draw(18, shift=0.10)))
    monkeypatch.chdir(project / "runs")
    assert cli("compare", base, current).returncode == 1
    (project / "pyproject.toml").write_text("[tool.gpuadvisor.compare]\ntime_threshold_pct = 15\n")
    relaxed = cli("compare", base, current, "--format", "json")
    assert relaxed.returncode == 0, relaxed.stderr
    data = json.loads(relaxed.stdout)
    assert data["config"] == str(project / "pyproject.toml") and data["settings"]["time_threshold_pct"] == 15
    assert cli("compare", base, current, "--threshold-pct", "5").returncode == 1  # the flag wins
    (project / "pyproject.toml").write_text("[tool.gpuadvisor.compare]\ntime_threshold = 15\n")
    assert_one_line_error(cli("compare", base, current), "unknown key 'time_threshold'")


def test_cli_import_stays_light(python) -> None:
    code = (
        "import sys, gpuadvisor.cli, gpuadvisor.gate; "
        "print(sorted(m for m in ('scipy', 'pandas', 'numpy', 'torch') if m in sys.modules))"
    )
    result = python("-c", code)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
