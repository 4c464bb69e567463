"""`gpuadvisor profile` on broken model files, run as a user runs it (a subprocess, on the CPU).

Each case writes a model file into its own tmp_path and profiles it with ``--out tmp_path/out``. Every case
must end with one line on stderr, no traceback, the documented exit code (2 bad input, 3 the user's code
failed, 130 interrupted) and nothing left behind: no output folder and no temporary folder beside it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

TINY_MLP = Path(__file__).resolve().parents[1] / "examples" / "tiny_mlp.py"

# Fast enough for CI: one warm-up step, three timed steps, one profiled step (calls 1, 2-4, 5-7 of step()).
# No warm-up steps: on a GPU machine a warm-up is stretched to 3 s of steps, which would move the step numbers
# below from one phase to another; with none, steps 1-3 are timed and 4-6 profiled on any machine.
RUN_ARGS = ["--warmup", "0", "--steps", "3", "--min-time", "0", "--profile-steps", "1"]
# Kineto's own log lines ("USDT:2026-11-29 10:57:00 123:123 SyncActivityProfilerHandler.cpp:52] ...") are
# filtered by gpuadvisor while the profiler starts and stops; any that slip through are not ours to count.
KINETO_LOG = re.compile(r"^(USDT|INFO|VERBOSE):\d{4}-\d\d-\d\d ")

COUNTING_STEP = """
import torch

calls = 0


def build():
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)


def step(model, inputs):
    global calls
    calls += 1
{body}
    return model(*inputs)
"""


def counting_model(body: str) -> str:
    """A model whose step() runs ``body`` (indented 4 spaces) with ``calls`` = this call's number, from 1."""
    return COUNTING_STEP.format(body="\n".join("    " + line for line in body.strip().splitlines()))


CASES = {
    "missing_file": (None, 2, ["no such file"]),
    "syntax_error": ("def build(:\n    pass\n", 2, ["syntax error", ":1"]),
    "no_build": ("import torch\n\nX = 1\n", 2, ["no function build()"]),
    "build_raises": (
        "def build():\n    raise ValueError('no weights here')\n",
        3,
        ["build() raised", "no weights here"],
    ),
    "build_wrong_types": ("def build():\n    return 42\n", 2, ["expected build() to return", "int 42"]),
    "step_raises_mid_run": (
        counting_model("if calls == 2:\n    raise RuntimeError('bad batch')"),
        3,
        ["step() raised RuntimeError: bad batch", "timing", "step 2 of 3"],
    ),
    "out_of_memory": (
        counting_model(
            "if calls == 2:\n"
            "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total '\n"
            "                                 'capacity of 79.15 GiB of which 1.50 GiB is free.')"
        ),
        3,
        ["CUDA out of memory in the step", "tried to allocate 20.00 GiB", "1.50 GiB free of 79.15 GiB"],
    ),
    "step_raises_while_profiling": (
        counting_model("if calls == 5:\n    raise KeyError('late')"),
        3,
        ["step() raised KeyError", "profiling", "step 2 of 3"],
    ),
}


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip() and not KINETO_LOG.match(line)]


def assert_nothing_left(tmp_path, model_file):
    assert not (tmp_path / "out").exists()
    left = sorted(p.name for p in tmp_path.iterdir() if model_file is None or p != model_file)
    assert left == [], left  # no temporary folder (".out.*.tmp") either


@pytest.mark.parametrize("case", list(CASES))
def test_bad_model(cli, tmp_path, case):
    source, code, needles = CASES[case]
    model_file = tmp_path / "model.py"
    if source is not None:
        model_file.write_text(source)
    result = cli("profile", model_file, "--out", tmp_path / "out", *RUN_ARGS)

    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = stderr_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "internal error" not in lines[0]
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])
    assert_nothing_left(tmp_path, model_file if source is not None else None)


@pytest.mark.parametrize("call", [2, 6], ids=["timing", "profiling"])
def test_ctrl_c_leaves_nothing(cli, tmp_path, call):
    """SIGINT from inside a step: during the timing phase (call 2) and while the profiler records (call 6),
    when the temporary output folder already exists."""
    model_file = tmp_path / "model.py"
    model_file.write_text(
        "import os\nimport signal\n" + counting_model(f"if calls == {call}:\n    os.kill(os.getpid(), signal.SIGINT)")
    )
    result = cli("profile", model_file, "--out", tmp_path / "out", *RUN_ARGS)

    assert result.returncode == 130, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = stderr_lines(result)
    assert lines == ["interrupted: nothing was written"], result.stderr
    assert result.stdout == ""
    assert_nothing_left(tmp_path, model_file)


def test_out_folder_with_other_files_is_refused(cli, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = cli("profile", TINY_MLP, "--out", out, *RUN_ARGS)
    assert result.returncode == 2, result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1 and "holds other files (notes.txt)" in lines[0], result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# Issue 17: a step that leaves by sys.exit() or another BaseException is the user's code failing (exit 3, one line
# naming the phase, the step and the source line), for profile and apply alike; KeyboardInterrupt stays 130.
BYE = "class Bye(BaseException):\n    pass\n"
EXITING_STEPS = {
    "sys_exit_0": ("import sys\n", "if calls == 2:\n    sys.exit(0)", ["SystemExit: 0"]),
    "sys_exit_7": ("import sys\n", "if calls == 2:\n    sys.exit(7)", ["SystemExit: 7"]),
    "raise_system_exit_bye": ("", "if calls == 2:\n    raise SystemExit('bye')", ["SystemExit: bye"]),
    "base_exception_subclass": (BYE, "if calls == 2:\n    raise Bye('gone')", ["Bye: gone"]),
    "unprintable_exception": (
        "class Unprintable(Exception):\n    def __str__(self):\n        raise RuntimeError('no text')\n",
        "if calls == 2:\n    raise Unprintable()",
        ["Unprintable", "cannot be printed"],
    ),
}


def _exiting_model(tmp_path, case) -> Path:
    preamble, body, _ = EXITING_STEPS[case]
    model_file = tmp_path / "model.py"
    model_file.write_text(preamble + counting_model(body))
    return model_file


def _line_of(model_file: Path, needle: str) -> int:
    return next(i for i, line in enumerate(model_file.read_text().splitlines(), start=1) if needle in line)


@pytest.mark.parametrize("case", list(EXITING_STEPS))
def test_a_step_that_exits_is_the_users_code_failing(cli, tmp_path, case):
    model_file = _exiting_model(tmp_path, case)
    result = cli("profile", model_file, "--out", tmp_path / "out", *RUN_ARGS)

    assert result.returncode == 3, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0]
    where = f"model.py:{_line_of(model_file, 'calls == 2') + 1}"  # the line after the test: the exit itself
    for needle in [*EXITING_STEPS[case][2], "timing", "step 2 of 3", where]:
        assert needle in lines[0], (needle, lines[0])
    assert result.stdout == ""
    assert_nothing_left(tmp_path, model_file)


@pytest.mark.parametrize("case", ["sys_exit_0", "raise_system_exit_bye"])
def test_a_step_that_exits_fails_apply_the_same_way(cli, tmp_path, case):
    model_file = _exiting_model(tmp_path, case)
    args = ["--fix", "graphs", "--warmup", "1", "--steps", "1", "--rounds", "1", "--profile-steps", "1"]
    result = cli("apply", model_file, "--out", tmp_path / "out", *args)

    assert result.returncode == 3, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in [*EXITING_STEPS[case][2], "profiling", "model.py:"]:  # call 2: the before-profile's first step
        assert needle in lines[0], (needle, lines[0])
    assert_nothing_left(tmp_path, model_file)


def test_what_the_model_prints_does_not_corrupt_json_on_stdout(cli, tmp_path):
    model_file = tmp_path / "model.py"
    model_file.write_text(
        "import os\n"
        "print('model: imported')\n"
        + counting_model("print('model: step', calls)\nif calls == 1:\n    os.write(1, b'model: fd 1\\n')")
    )
    result = cli("profile", model_file, "--out", tmp_path / "out", *RUN_ARGS, "--format", "json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # one JSON document and nothing else
    assert report["command"] == "profile"
    assert "model: imported" in result.stderr and "model: step 1" in result.stderr and "model: fd 1" in result.stderr
    assert "model:" not in result.stdout


def test_sigterm_ends_like_ctrl_c_with_143(cli, tmp_path):
    """SIGTERM (kill, a CI timeout) from inside a step while the profiler records: the same clean-up as Ctrl-C,
    exit 128 + 15."""
    model_file = tmp_path / "model.py"
    model_file.write_text(
        "import os\nimport signal\n" + counting_model("if calls == 5:\n    os.kill(os.getpid(), signal.SIGTERM)")
    )
    result = cli("profile", model_file, "--out", tmp_path / "out", *RUN_ARGS)

    assert result.returncode == 143, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert stderr_lines(result) == ["interrupted: nothing was written"], result.stderr
    assert result.stdout == ""
    assert_nothing_left(tmp_path, model_file)


def test_an_interruption_after_a_file_was_written_says_what_was_written(python, tmp_path):
    """ "nothing was written" only when nothing was: here a report was put in place before the interruption."""
    target = tmp_path / "report.json"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gpuadvisor import cli, outputs\n"
        f"outputs.write_atomic(Path({str(target)!r}), '{{}}')\n"
        "cli.exit_interrupted()\n"
    )
    result = python("-c", code)
    assert result.returncode == 130, result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("interrupted: wrote ") and str(target) in lines[0], lines
    assert "nothing was written" not in lines[0]
