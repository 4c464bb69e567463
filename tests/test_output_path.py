"""One output path (gpuadvisor/emit.py): every command's result goes out once, in the --format asked for; JSON is
strict (null, never NaN) with one trailing newline; a format a command does not have is refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuadvisor.emit import View, emit
from gpuadvisor.errors import BadInputError

REPO = Path(__file__).resolve().parents[1]
SCAN_CORPUS = REPO / "tests" / "scan_corpus" / "bank_conflicts.cu"
NCU_CSV = REPO / "benchmarks" / "results" / "bank_conflicts_ncu.csv"
SAMPLE = REPO / "sample_traces" / "gemm.json.gz"


def strict_json(text: str):
    def no_constants(name: str):
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=no_constants)


@pytest.mark.parametrize(
    "args",
    [
        ("rules",),
        ("analyze",),
        ("analyze", SAMPLE),
        ("scan", SCAN_CORPUS),
        ("ncu", "--import", NCU_CSV),
        ("diff", SAMPLE, SAMPLE),
    ],
    ids=["rules", "analyze", "analyze-gemm", "scan", "ncu", "diff"],
)
def test_json_outputs_are_strict_with_one_trailing_newline(cli, args):
    result = cli(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    strict_json(result.stdout)
    assert result.stdout.endswith("\n") and not result.stdout.endswith("\n\n"), repr(result.stdout[-5:])


@pytest.mark.parametrize("args", [("rules",), ("analyze",), ("scan", SCAN_CORPUS)], ids=["rules", "analyze", "scan"])
def test_markdown_outputs_end_with_one_newline(cli, args):
    result = cli(*args, "--format", "markdown")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and not result.stdout.endswith("\n\n")


def test_a_format_a_command_does_not_have_is_refused_naming_the_ones_it_has(cli):
    result = cli("calibrate", "--format", "markdown")
    assert result.returncode == 2, result.stderr
    assert "'markdown' is not one of 'terminal', 'json'" in result.stderr, result.stderr
    assert result.stdout == ""


def test_a_view_refuses_what_it_cannot_show():
    view = View("calibrate", terminal=lambda result, console: None)
    assert view.formats == ("terminal", "json")
    with pytest.raises(
        BadInputError, match="calibrate --format markdown: not supported by calibrate; use terminal or json"
    ):
        view.check("markdown")
    assert View("doctor", terminal=lambda r, c: None, json=None).formats == ("terminal",)


def test_emit_writes_null_for_nan(capsys):
    emit({"x": float("nan"), "y": [float("inf"), 1.5]}, View("t", terminal=lambda r, c: None), "json")
    out = capsys.readouterr().out
    assert strict_json(out) == {"x": None, "y": [None, 1.5]}


def test_scan_and_ncu_files_have_the_one_output_mode(cli, tmp_path):
    import os

    for args, names in (
        (("scan", SCAN_CORPUS), ("scan.json", "scan.md")),
        (("ncu", "--import", NCU_CSV), ("ncu.json", "ncu.md")),
        (("analyze", SAMPLE), ("report.json", "report.md")),
    ):
        out = tmp_path / args[0]
        result = cli(*args, "--out", out)
        assert result.returncode == 0, result.stderr
        umask = os.umask(0)
        os.umask(umask)
        for name in names:
            assert (out / name).stat().st_mode & 0o777 == 0o644 & ~umask, (args[0], name)
        strict_json((out / names[0]).read_text())
