"""`gpuadvisor ncu`: parsing Nsight Compute CSV exports, the per-kernel shared-memory table, and GA502 -- on a
small hand-written export (the layout ncu prints) and on the measured corpus (benchmarks/results/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuadvisor.errors import BadInputError
from gpuadvisor.ncu.counters import METRICS, kernel_table, parse_csv
from gpuadvisor.ncu.run import build_report

REPO = Path(__file__).resolve().parents[1]
MEASURED_CSV = REPO / "benchmarks" / "results" / "bank_conflicts_ncu.csv"
HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)


def details_csv(kernels: dict[str, dict[str, str]]) -> str:
    """An export in ncu's --csv details layout: one row per launch and metric (values as ncu prints them)."""
    rows = [HEADER, "==PROF== Disconnected from process 4242"]
    for launch_id, (name, values) in enumerate(kernels.items()):
        for metric, (unit, value) in values.items():
            rows.append(
                f'"{launch_id}","4242","python3","h","{name}","1","7","(32, 8, 1)","(64, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{metric}","{unit}","{value}"'
            )
    return "\n".join(rows) + "\n"


def counters(ld_inst, ld_wf, ld_conf, st_inst=2048, st_wf=2048, duration_ns="12,480", pct="40.5"):
    return {
        METRICS["ld_instructions"]: ("inst", ld_inst),
        METRICS["st_instructions"]: ("inst", st_inst),
        METRICS["ld_wavefronts"]: ("", ld_wf),
        METRICS["st_wavefronts"]: ("", st_wf),
        METRICS["ld_bank_conflicts"]: ("", ld_conf),
        METRICS["st_bank_conflicts"]: ("", "0"),
        METRICS["duration"]: ("nsecond", duration_ns),
        METRICS["shared_pipe_pct"]: ("%", pct),
    }


# Hand-made: a 32-way column read (2,048 loads, 65,536 wavefronts, 63,488 counted conflicts), its padded twin,
# and a clean float4 kernel (4 wavefronts per load is its ideal, no conflicts).
SYNTHETIC = details_csv(
    {
        "transpose_naive_32x32": counters("2,048", "65,536", "63,488"),
        "transpose_padded_32x33": counters("2,048", "2,048", "0", duration_ns="3,120"),
        "float4_contiguous": counters("512", "2,048", "0", st_inst="512", st_wf="2,048", duration_ns="1,000"),
    }
)


def test_details_layout_is_parsed_with_separators_and_units():
    table = {row["kernel"]: row for row in kernel_table(parse_csv(SYNTHETIC))}
    naive = table["transpose_naive_32x32"]
    assert naive["ld_instructions"] == 2048 and naive["ld_wavefronts"] == 65536
    assert naive["ld_wavefronts_per_instruction"] == 32.0
    assert naive["ld_ideal_wavefronts"] == 2048 and naive["ld_excess_ratio"] == 32.0
    assert naive["duration_us"] == pytest.approx(12.48)
    assert table["float4_contiguous"]["ld_excess_ratio"] == 1.0  # 4 wavefronts per 16-byte load is the ideal
    assert list(table) == ["transpose_naive_32x32", "transpose_padded_32x33", "float4_contiguous"]


def test_raw_page_layout_is_parsed():
    names = [
        "ld_instructions",
        "st_instructions",
        "ld_wavefronts",
        "st_wavefronts",
        "ld_bank_conflicts",
        "st_bank_conflicts",
        "duration",
    ]
    header = '"ID","Kernel Name",' + ",".join(f'"{METRICS[n]}"' for n in names)
    units = '"","",' + ",".join('"usecond"' if n == "duration" else '""' for n in names)
    row = '"0","k",' + ",".join(f'"{v}"' for v in ("100", "10", "400", "10", "300", "0", "2.5"))
    (k,) = kernel_table(parse_csv("\n".join([header, units, row])))
    assert k["ld_wavefronts_per_instruction"] == 4.0 and k["ld_excess_ratio"] == 4.0 and k["duration_us"] == 2.5


def test_ga502_flags_the_conflicting_transpose_only():
    report = build_report(kernel_table(parse_csv(SYNTHETIC)), source="synthetic", steps=None, rules_dir=None)
    flagged = {(f["evidence"]["kernel"], f["evidence"]["op"]) for f in report["findings"]}
    assert flagged == {("transpose_naive_32x32", "loads")}
    (finding,) = report["findings"]
    assert finding["rule_id"] == "GA502"
    assert finding["evidence"]["wavefronts_per_instruction"] == 32.0
    assert finding["evidence"]["bank_conflicts"] == 63488
    # 12.48 µs x 40.5% shared-pipe busy x 31/32 of its wavefronts are replays
    assert finding["estimated_saving_us_per_step"] == pytest.approx(12.48 * 0.405 * 31 / 32, abs=0.01)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "no Nsight Compute CSV rows"),
        ('"a","b"\n"1","2"\n', "Kernel Name"),
        ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","x","","1"\n', "lacks"),
    ],
)
def test_bad_exports_are_one_line_errors(text, words):
    with pytest.raises(BadInputError) as info:
        kernel_table(parse_csv(text))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_cli_import(cli, tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(SYNTHETIC)
    result = cli("ncu", "--import", path, "--format", "json", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [f["rule_id"] for f in report["findings"]] == ["GA502"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ncu.json", "ncu.md"]
    markdown = cli("ncu", "--import", path, "--format", "markdown")
    assert "transpose_naive_32x32" in markdown.stdout and "32.00x" in markdown.stdout


def test_cli_without_ncu_on_path_names_it(cli, tmp_path, monkeypatch):
    model = tmp_path / "model.py"
    model.write_text("def build():\n    return (lambda: None), ()\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu here; the subprocess inherits it
    result = cli("ncu", model)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error:") and "ncu (Nsight Compute) is not on PATH" in line


@pytest.mark.parametrize("args", [[], ["model.py", "--import", "x.csv"], ["--import", "nosuch.csv"]])
def test_cli_usage_errors_exit_2(cli, tmp_path, args):
    result = cli("ncu", *[tmp_path / a if a.endswith((".py", ".csv")) else a for a in args])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error:")


@pytest.mark.skipif(
    not MEASURED_CSV.exists(),
    reason="no measured ground truth yet: run "
    "benchmarks/bank_conflicts_ncu.py on the GPU machine and commit benchmarks/results/",
)
def test_measured_corpus_ga502_flags_the_naive_transpose_not_the_padded_one():
    report = build_report(
        kernel_table(parse_csv(MEASURED_CSV.read_text())), source=str(MEASURED_CSV), steps=None, rules_dir=None
    )
    flagged = {f["evidence"]["kernel"] for f in report["findings"]}
    assert "transpose_naive_32x32" in flagged
    clean = {
        "transpose_padded_32x33",
        "transpose_swizzled_32x32",
        "broadcast_float",
        "double_contiguous",
        "u16_contiguous",
        "float4_contiguous",
        "reduce_sequential",
    }
    assert not flagged & clean, flagged & clean


GA502_RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "ga502_transpose" / "ncu.csv"


def test_h200_ga502_run_flags_the_naive_transpose_with_its_counters():
    """The export `gpuadvisor ncu benchmarks/ga502_transpose/model.py` wrote on the H200 (8192 x 8192 floats)."""
    table = kernel_table(parse_csv(GA502_RUN.read_text()))
    report = build_report(table, source=str(GA502_RUN), steps=2, rules_dir=None)
    (finding,) = [f for f in report["findings"] if f["rule_id"] == "GA502"]
    evidence = finding["evidence"]
    assert evidence["kernel"] == "transpose_naive_32x32" and evidence["op"] == "loads"
    assert evidence["instructions"] == 4_194_304
    assert evidence["wavefronts_per_instruction"] == pytest.approx(32.26, abs=0.01)
    assert evidence["excess_ratio"] == pytest.approx(32.26, abs=0.01)
    padded = next(row for row in report["kernels"] if row["kernel"] == "transpose_padded_32x33")
    assert padded["ld_excess_ratio"] == pytest.approx(1.04, abs=0.01)  # under the 1.5 threshold: not flagged
