"""A native crash while the profiler's stderr filter holds descriptor 2 still names where it happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Abort (as a C++ std::terminate does) inside the window where capture/profiler.py captures descriptor 2.
CRASH = """
import os
from gpuadvisor.capture.profiler import _without_kineto_log
{setup}
def inside_the_profiler_transition():
    with _without_kineto_log():
        os.abort()
inside_the_profiler_transition()
"""


def crash(setup: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", CRASH.format(setup=setup)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.skipif(os.name != "posix", reason="signals and descriptor 2 as on Linux")
def test_an_abort_inside_the_stderr_filter_prints_the_python_stack():
    silent = crash("")  # as before: the process dies with descriptor 2 pointing at the filter's file
    assert silent.returncode == -signal.SIGABRT
    assert silent.stderr == ""

    reported = crash("from gpuadvisor.crash import report_native_crashes\nreport_native_crashes()")
    assert reported.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in reported.stderr
    assert "inside_the_profiler_transition" in reported.stderr


def test_left_alone_when_faulthandler_is_already_on():
    code = "from gpuadvisor import crash; crash.report_native_crashes(); print(crash._fd)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["PYTHONPATH"] = str(REPO)
    for flag, taken in (("-X faulthandler", False), ("", True)):
        out = subprocess.run(
            [sys.executable, *flag.split(), "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert (out.stdout.strip() != "None") is taken, flag  # a descriptor taken only when it was off
