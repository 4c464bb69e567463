"""A native crash (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL in torch's, Kineto's or gloo's C++ code) reported
with the Python stack where it happened, on the stderr the process started with.

The profiler's start and stop run with file descriptor 2 captured (:mod:`gpuadvisor.capture.profiler` drops
Kineto's log lines from it), so a process that died there said nothing: torchrun then only reports a rank
"killed by signal SIGABRT". :func:`report_native_crashes` turns on :mod:`faulthandler` writing to a duplicate of
descriptor 2 taken at start-up, which that capture does not touch.
"""

from __future__ import annotations

import faulthandler
import os

_fd: int | None = None  # the duplicate of the starting stderr; open for the rest of the process


def report_native_crashes() -> None:
    """Turn on faulthandler (all threads) writing to the stderr this process started with. Left as it is when
    faulthandler is already on (``python -X faulthandler``, ``PYTHONFAULTHANDLER``, pytest's own) or when there
    is no descriptor 2."""
    global _fd
    if faulthandler.is_enabled():
        return
    try:
        _fd = os.dup(2)
    except OSError:
        return
    faulthandler.enable(file=_fd, all_threads=True)
