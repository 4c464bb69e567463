"""Ctrl-C during `gpuadvisor profile`, at any moment of its run: exit 130, one line, nothing written.

The run is a real subprocess of the CLI on a small CPU model whose steps sleep, so that every phase (start-up,
build, warm-up, timing, profiling, analysis) lasts long enough to be hit. SIGINT goes to the process group, as
a terminal's Ctrl-C does. The moments are drawn (seeded) from the span an uninterrupted run takes before its
output folder appears; after that the command is done and a Ctrl-C has nothing left to stop.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
MOMENTS = 20
SEED = 16  # issue 16
EARLIEST_S = 0.1  # before this the interpreter itself starts up (its SIGINT handler is not installed yet)
LATEST_SHARE = 0.9  # of the uninterrupted run's time to publication: its own run-to-run noise stays clear of it

MODEL = """\
import time

import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), (torch.randn(8, 64),)


def step(model, inputs):
    time.sleep(0.05)  # every step phase lasts a few tenths of a second
    return model(*inputs)
"""


_STARTING = threading.Lock()  # one fork at a time: preexec_fn runs Python code in the forked child


def _sigint_as_usual() -> None:
    # A job started in the background by a non-interactive shell inherits SIGINT ignored; Ctrl-C reaches a CLI
    # run from a terminal with Python's default handling.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(model: Path, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(NO_COLOR="1", COLUMNS="160", OMP_NUM_THREADS="1")
    args = ["profile", model, "--warmup", "2", "--steps", "5", "--min-time", "0", "--profile-steps", "2"]
    with _STARTING:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuadvisor", *map(str, args), "--out", str(out), "-f", "json"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: SIGINT reaches it and its children, as Ctrl-C does
            preexec_fn=_sigint_as_usual,
        )


def _time_to_publication(model: Path, out: Path) -> float:
    started = time.monotonic()
    process = _start(model, out)
    published = None
    while process.poll() is None:
        if published is None and out.exists():
            published = time.monotonic() - started
        time.sleep(0.005)
    stderr = process.stderr.read()
    assert process.returncode == 0, stderr
    assert out.is_dir()
    return published if published is not None else time.monotonic() - started


def _interrupt_at(model: Path, folder: Path, moment_s: float) -> tuple[float, int, str, list[str], bool]:
    """Start a run, send SIGINT after ``moment_s``; the last item says whether its output folder was already
    published then (a run faster than the calibration one: the command was done, only the interpreter's exit
    was left to interrupt)."""
    folder.mkdir()
    out = folder / "out"
    process = _start(model, out)
    time.sleep(moment_s)
    late = out.exists() or process.poll() is not None
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
    return moment_s, process.returncode, stderr, sorted(p.name for p in folder.iterdir()), late


@pytest.mark.slow
def test_ctrl_c_at_any_moment_exits_130_and_writes_nothing(tmp_path):
    model = tmp_path / "sleepy_model.py"
    model.write_text(MODEL)
    latest = LATEST_SHARE * _time_to_publication(model, tmp_path / "calibration")
    rng = random.Random(SEED)
    moments = sorted(rng.uniform(EARLIEST_S, latest) for _ in range(MOMENTS))
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        results = list(
            pool.map(lambda item: _interrupt_at(model, tmp_path / f"run{item[0]}", item[1]), enumerate(moments))
        )
    failures = [
        f"SIGINT at {moment:.2f} s: exit {code}, left {left}, stderr {stderr[:3000]!r}"
        for moment, code, stderr, left, late in results
        if not late and (code != 130 or left or "Traceback" in stderr or "interrupted" not in stderr)
    ]
    # After publication (seen once in CI: a run at least 10% faster than the calibration one, SIGINT during the
    # interpreter's exit, status -2): the folder is whole, the report in it complete.
    failures += [
        f"SIGINT at {moment:.2f} s, after the output was published: exit {code}, left {left}, report incomplete"
        for index, (moment, code, _, left, late) in enumerate(results)
        if late and not _is_whole(tmp_path / f"run{index}")
    ]
    assert not failures, f"{len(failures)} of {MOMENTS} interrupted runs went wrong:\n" + "\n".join(failures)
    late = sum(result[-1] for result in results)
    assert late <= MOMENTS // 4, f"{late} of {MOMENTS} moments fell after publication: the calibration run was slow"


def _is_whole(folder: Path) -> bool:
    """Only the published folder is there, and its report.json parses as a whole report."""
    if sorted(p.name for p in folder.iterdir()) != ["out"]:
        return False
    try:
        return isinstance(json.loads((folder / "out" / "report.json").read_text()).get("findings"), list)
    except (OSError, ValueError, AttributeError):
        return False
