"""The CLI contract, run as a user runs it (a subprocess): bad input exits 2 with one `error:` line on stderr,
no traceback and no half-written --out folder; plus the commands that should succeed."""

from __future__ import annotations

import gzip
import json
import re
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GEMM = SAMPLES / "gemm.json.gz"
CATALOG = REPO / "rules"
GA101_TOML = CATALOG / "GA101-launch-bound.toml"
CPU_ONLY = REPO.parent / "shared" / "traces" / "public" / "cpu_only.json.gz"
BUILTIN_IDS = {"GA101", "GA102", "GA201", "GA301", "GA401", "GA402"}
DOC_HEADINGS = ("What it does", "Why is this bad?", "Example", "Use instead")


def assert_one_line_error(result, *needles: str) -> str:
    """Exit 2, exactly one non-empty stderr line starting with "error:" that contains every needle."""
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), result.stderr
    line = lines[0]
    assert line.startswith("error:"), line
    assert "internal error" not in line, line
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


def gzip_member(data: bytes, level: int = 6) -> bytes:
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)
    return comp.compress(data) + comp.flush()


def rules_dir(root: Path, text: str) -> Path:
    folder = root / "rules"
    folder.mkdir()
    (folder / "GA150-custom.toml").write_text(text)
    return folder


# --------------------------------------------------------------------------------------------
# bad input: each case builds its input in its own folder and returns (CLI args, words the message must hold).
# Every `analyze` case also gets `--out <folder>/out`, which must not exist afterwards.


def _missing_file(d):
    return ["analyze", d / "nosuch.json.gz"], ("nosuch.json.gz", "no such file")


def _empty_file(d):
    (d / "empty.json").write_bytes(b"")
    return ["analyze", d / "empty.json"], ("empty",)


def _truncated_json(d):
    data = gzip.decompress(GEMM.read_bytes())
    (d / "half.json").write_bytes(data[: len(data) // 2])
    return ["analyze", d / "half.json"], ("truncated", "json")


def _corrupt_gzip(d):
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"  # a valid gzip header, then no deflate stream
    (d / "corrupt.json.gz").write_bytes(header + b"this is not deflate data at all " * 8)
    return ["analyze", d / "corrupt.json.gz"], ("corrupt gzip",)


def _truncated_gzip(d):
    data = GEMM.read_bytes()
    (d / "half.json.gz").write_bytes(data[: len(data) // 2])
    return ["analyze", d / "half.json.gz"], ("truncated gzip",)


def _json_object_not_a_trace(d):
    (d / "foo.json").write_text('{"foo": 1}')
    return ["analyze", d / "foo.json"], ("not a kineto trace", "traceEvents")


def _json_array_of_numbers(d):
    (d / "numbers.json").write_text("[1, 2, 3]")
    return ["analyze", d / "numbers.json"], ("not a kineto trace",)


def _json_null(d):
    (d / "null.json").write_text("null")
    return ["analyze", d / "null.json"], ("null.json", "null")


def _binary_garbage(d):
    (d / "garbage.bin").write_bytes(bytes(range(256)) * 16)
    return ["analyze", d / "garbage.bin"], ("not json",)


def _empty_directory(d):
    (d / "traces").mkdir()
    (d / "traces" / "readme.txt").write_text("no traces here")
    return ["analyze", d / "traces"], ("no trace files",)


def _directory_with_corrupt_trace(d):
    (d / "traces").mkdir()
    _corrupt_gzip(d / "traces")
    return ["analyze", d / "traces"], ("corrupt.json.gz", "corrupt gzip")


def _cpu_only_trace(d):
    if not CPU_ONLY.is_file():
        pytest.skip(f"{CPU_ONLY} is not available")
    return ["analyze", CPU_ONLY], ("no GPU kernels",)


def _peaks_missing(d):
    return ["analyze", "--sample", "gemm", "--peaks", d / "peaks.toml"], ("peaks.toml", "no such file")


def _peaks_malformed(d):
    (d / "peaks.toml").write_text("[gpu\nhbm_bytes_per_s = = 3e12\n")
    return ["analyze", "--sample", "gemm", "--peaks", d / "peaks.toml"], ("peaks.toml", "toml")


def _rules_missing_dir(d):
    return ["analyze", "--sample", "gemm", "--rules", d / "no-rules"], ("no-rules", "--rules")


def _rules_without_detector(d):
    text = re.sub(r"(?m)^detector = .*\n", "", GA101_TOML.read_text())
    return ["analyze", "--sample", "gemm", "--rules", rules_dir(d, text)], ("GA150-custom.toml", "detector")


def _rules_invalid_toml(d):
    return ["analyze", "--sample", "gemm", "--rules", rules_dir(d, 'id = "GA150"\nname = [oops\n')], (
        "GA150-custom.toml",
        "invalid toml",
    )


def _rules_unknown_detector(d):
    text = re.sub(r"(?m)^detector = .*$", 'detector = "no_such_detector"', GA101_TOML.read_text())
    return ["analyze", "--sample", "gemm", "--rules", rules_dir(d, text)], ("unknown detector", "no_such_detector")


def _explain_unknown_rule(d):
    return ["explain", "GA999"], ("GA999",)


def _rank_not_in_trace(d):
    return ["analyze", GEMM, "--rank", "7"], ("rank 7",)


def _path_and_sample(d):
    return ["analyze", GEMM, "--sample", "gemm"], ("--sample",)


def _unknown_sample(d):
    return ["analyze", "--sample", "nosuch"], ("nosuch",)


BAD_INPUT = {f.__name__.lstrip("_"): f for f in [
    _missing_file, _empty_file, _truncated_json, _corrupt_gzip, _truncated_gzip, _json_object_not_a_trace,
    _json_array_of_numbers, _json_null, _binary_garbage, _empty_directory, _directory_with_corrupt_trace,
    _cpu_only_trace, _peaks_missing, _peaks_malformed, _rules_missing_dir, _rules_without_detector,
    _rules_invalid_toml, _rules_unknown_detector, _explain_unknown_rule, _rank_not_in_trace, _path_and_sample,
    _unknown_sample,
]}  # fmt: skip


@pytest.fixture(scope="module")
def bad_input_runs(request, tmp_path_factory, cli):
    """Run the selected bad-input cases side by side (each CLI start imports pandas: about a second of CPU)."""
    selected = {
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_bad_input" and hasattr(item, "callspec")
    }
    jobs = {}
    for name in sorted(selected):
        folder = tmp_path_factory.mktemp(name)
        try:
            args, needles = BAD_INPUT[name](folder)
        except pytest.skip.Exception as exc:
            jobs[name] = exc
            continue
        out = None
        if args[0] == "analyze":
            out = folder / "out"
            args = [*args, "--out", out]
        jobs[name] = (args, needles, out)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {n: pool.submit(cli, *job[0]) for n, job in jobs.items() if isinstance(job, tuple)}
        results = {n: f.result() for n, f in futures.items()}
    return {n: job if not isinstance(job, tuple) else (*job, results[n]) for n, job in jobs.items()}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input(case, bad_input_runs):
    run = bad_input_runs[case]
    if isinstance(run, BaseException):
        raise run
    args, needles, out, result = run
    assert_one_line_error(result, *needles)
    if out is not None:
        assert not out.exists(), f"--out {out} was created"


def test_bad_input_keeps_an_existing_out_folder_empty(tmp_path, cli):
    (tmp_path / "empty.json.gz").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    result = cli("analyze", tmp_path / "empty.json.gz", "--out", out)
    assert_one_line_error(result, "empty")
    assert out.is_dir() and list(out.iterdir()) == []


def test_out_is_an_existing_file(tmp_path, cli):
    target = tmp_path / "report.txt"
    target.write_text("keep me\n")
    result = cli("analyze", "--sample", "gemm", "--out", target, "--format", "json")
    assert_one_line_error(result, str(target))
    assert target.read_text() == "keep me\n"
    assert list(tmp_path.iterdir()) == [target]  # no temporary files left beside it


@pytest.mark.parametrize(
    "args",
    [["analyze", "--no-such-option"], ["analyze", "--sample", "gemm", "--format", "yaml"], ["explain"]],
    ids=["unknown-option", "bad-choice", "missing-argument"],
)
def test_usage_errors_exit_2(args, cli):
    result = cli(*args)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.strip() and "internal error" not in result.stderr


# Decompression bombs: 1 MiB compressed once and written 1024 times as separate gzip members (valid,
# concatenated gzip): about 1 MB on disk that inflates to 1 GiB.
@pytest.mark.parametrize(
    ("prefix", "fill"), [(b"", b"\0"), (b'{"traceEvents": [', b" ")], ids=["zeros", "json-then-spaces"]
)
def test_gzip_bomb_is_refused_quickly(tmp_path, prefix, fill, cli):
    member = gzip_member(fill * (1 << 20), 9)
    bomb = tmp_path / "bomb.json.gz"
    with open(bomb, "wb") as f:
        if prefix:
            f.write(gzip_member(prefix))
        for _ in range(1024):
            f.write(member)
    assert bomb.stat().st_size < 2 << 20
    out = tmp_path / "out"
    start = time.monotonic()
    result = cli("analyze", bomb, "--out", out, timeout=60)
    elapsed = time.monotonic() - start
    line = assert_one_line_error(result, "bomb.json.gz")
    assert "bomb" in line or "not a JSON trace" in line, line
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# what should work


def test_version(cli):
    result = cli("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gpuadvisor {version}"


def test_rules_lists_the_builtin_rules(cli):
    result = cli("rules")
    assert result.returncode == 0, result.stderr
    for rule_id in BUILTIN_IDS:
        assert re.search(rf"\b{rule_id}\b", result.stdout), rule_id


def test_rules_markdown_table(cli):
    result = cli("rules", "--format", "markdown")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "| id | name | severity | category | fix | title |"
    assert re.fullmatch(r"\|( --- \|){6}", lines[1])
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(row) == 6 for row in rows)
    assert BUILTIN_IDS <= {row[0] for row in rows}
    ga101 = next(row for row in rows if row[0] == "GA101")
    assert ga101[1:4] == ["launch-bound", "high", "launch"]


def test_explain_shows_the_rule_doc(cli):
    result = cli("explain", "GA101")
    assert result.returncode == 0, result.stderr
    for heading in DOC_HEADINGS:
        assert heading in result.stdout, heading
    assert "launch-bound" in result.stdout
    positions = [result.stdout.index(h) for h in DOC_HEADINGS]
    assert positions == sorted(positions)


def test_fail_on_high_exits_1_after_writing_the_reports(tmp_path, cli):
    out = tmp_path / "report"
    result = cli("analyze", "--sample", "llama_decode", "--fail-on", "high", "--format", "json", "--out", out)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    stderr = result.stderr.splitlines()
    assert len(stderr) == 1 and "--fail-on high" in stderr[0]
    stdout_report = json.loads(result.stdout)
    assert any(f["rule_id"] == "GA101" and f["severity"] == "high" for f in stdout_report["findings"])
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    written = json.loads((out / "report.json").read_text())
    assert written["schema_version"] == 1
    assert written == stdout_report
    markdown = (out / "report.md").read_text()
    assert "GA101" in markdown and markdown.startswith("# ")


def test_fail_on_high_passes_without_high_findings(cli):
    result = cli("analyze", "--sample", "gemm", "--fail-on", "high", "--format", "markdown")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    separators = [i for i, line in enumerate(lines) if re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", line)]
    assert separators, "no Markdown table"
    assert all(lines[i - 1].startswith("|") and lines[i + 1].startswith("|") for i in separators[:1])
    assert "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT" in result.stdout


def test_rules_folder_overrides_a_builtin_title(tmp_path, cli):
    folder = tmp_path / "rules"
    folder.mkdir()
    text = GA101_TOML.read_text()
    new_title = "Custom launch-bound title from a project rule"
    changed = re.sub(r'(?m)^title = ".*"$', f'title = "{new_title}"', text, count=1)
    assert changed != text
    (folder / GA101_TOML.name).write_text(changed)
    result = cli("analyze", "--sample", "llama_decode", "--rules", folder, "--format", "json")
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)["findings"]
    ga101 = [f for f in findings if f["rule_id"] == "GA101"]
    assert ga101 and all(f["title"] == new_title for f in ga101)
    assert all(f["title"] != tomllib.loads(text)["title"] for f in findings)


def test_analyze_help_does_not_import_heavy_modules(cli, python):
    result = cli("analyze", "--help")
    assert result.returncode == 0, result.stderr
    assert "--sample" in result.stdout and "--fail-on" in result.stdout
    code = (
        "import contextlib, io, json, sys\n"
        "import gpuadvisor.cli as cli\n"
        "heavy = ('torch', 'triton', 'pynvml', 'pandas', 'numpy')\n"
        "after_import = [m for m in heavy if m in sys.modules]\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n"
        "        cli.app(['analyze', '--help'], prog_name='gpuadvisor', standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(json.dumps({'import': after_import, 'help': [m for m in heavy if m in sys.modules],\n"
        "                  'text': buf.getvalue()}))\n"
    )
    probe = python("-c", code)
    assert probe.returncode == 0, probe.stderr
    loaded = json.loads(probe.stdout)
    assert "--sample" in loaded["text"]
    assert loaded["import"] == []
    assert loaded["help"] == []


def test_reader_closing_the_pipe_is_not_an_error():
    """`gpuadvisor analyze | head -1`: the terminal report meets a closed pipe; exit 0, no traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuadvisor", "analyze"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    proc.stdout.close()  # before the report is written: its first write meets a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "error" not in stderr


def test_a_fifo_is_refused_with_one_line(cli, tmp_path):
    import os

    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    result = cli("analyze", fifo)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0] and "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------
# gpuadvisor's own missing dependency (exit 2) against the user's code missing one of its imports (exit 3)

# Runs the CLI with torch unimportable: None in sys.modules makes `import torch` raise ModuleNotFoundError
# (name "torch"), as on a machine without torch, whatever is installed here.
WITHOUT_TORCH = """
import sys

sys.modules["torch"] = None
from gpuadvisor.cli import main

sys.argv = ["gpuadvisor", *sys.argv[1:]]
main()
"""

MODEL_WITH_TORCH = """
import torch


def build():
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
"""


@pytest.mark.parametrize("command", [["profile"], ["apply", "--fix", "graphs"]])
def test_missing_torch_is_gpuadvisors_dependency_exit_2(tmp_path, python, command):
    """Issue 16: without torch, profile exited 3 ("your code failed") for gpuadvisor's own missing dependency."""
    model = tmp_path / "model.py"
    model.write_text(MODEL_WITH_TORCH)
    runner = tmp_path / "without_torch.py"
    runner.write_text(WITHOUT_TORCH)
    out = tmp_path / "out"
    result = python(runner, command[0], model, *command[1:], "--out", out)
    assert_one_line_error(result, f"{command[0]} needs torch: pip install torch")
    assert not out.exists()


def test_the_models_own_missing_import_is_its_code_exit_3(tmp_path, cli):
    pytest.importorskip("torch")
    model = tmp_path / "model.py"
    model.write_text("import gpuadvisor_test_no_such_module  # noqa: F401\n\n\ndef build():\n    return abs, (1,)\n")
    out = tmp_path / "out"
    result = cli("profile", model, "--out", out)
    assert result.returncode == 3, result.stderr
    line = result.stderr.strip()
    assert line.startswith("error:") and "\n" not in line and "Traceback" not in line
    assert "gpuadvisor_test_no_such_module" in line and "needs torch" not in line
    assert not out.exists()


def test_require_torch_names_the_command_and_the_install_line(monkeypatch):
    from gpuadvisor.dependencies import require_torch
    from gpuadvisor.errors import BadInputError

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BadInputError, match=r"^profile needs torch: pip install torch$") as caught:
        require_torch("profile")
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    "args, needles",
    [
        (["analyze", "--format", "foo"], ("'foo' is not one of", "analyze --help")),
        (["analyze", "--no-such-option"], ("no such option", "analyze --help")),
        (["explain"], ("missing argument", "explain --help")),
        (["calibrate", "--format", "markdown"], ("'markdown' is not one of 'terminal', 'json'",)),
        (["no-such-command"], ("no such command",)),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help(cli, args, needles):
    assert_one_line_error(cli(*args), *needles)
