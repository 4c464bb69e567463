"""Run one function in a forked child process and get its result back through a pipe.

Used by the trace reader to decode half of a large trace on the second core. The child inherits the
parent's memory (the mapped trace bytes included) copy-on-write, so nothing is sent to it; its result
comes back pickled. The child never prints and never runs the parent's exit handlers: whatever happens
in it (an exception, Ctrl-C) ends it with ``os._exit``, and the parent only sees a result or
:class:`WorkerFailed`. The parent always reaps the child (and kills it first when the parent itself
fails or is interrupted), so the child's resource usage shows up in the parent's ``RUSAGE_CHILDREN``.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any


class WorkerFailed(Exception):
    """The child raised, was killed, or sent back something unreadable."""


def can_fork() -> bool:
    """Whether a second process can usefully run here: fork exists and this process may use two CPUs."""
    if not hasattr(os, "fork"):
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus >= 2


class ForkedCall:
    """``fn()`` started in a forked child; :meth:`result` waits for it. Use as a context manager, so
    that the child is killed and reaped when the parent leaves early (an error, Ctrl-C)."""

    def __init__(self, fn: Callable[[], Any]):
        for stream in (sys.stdout, sys.stderr):  # nothing buffered may be written twice
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(fn, read_fd, write_fd)
        os.close(write_fd)
        self.pid: int | None = pid
        self._read_fd: int | None = read_fd

    def result(self) -> Any:
        """The child's return value; :class:`WorkerFailed` when it raised or died."""
        chunks = []
        try:
            while True:
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            self._close()
        self._reap()
        try:
            status, value = pickle.loads(b"".join(chunks))
        except Exception:  # killed before it wrote everything (OOM killer, a signal)
            raise WorkerFailed("the worker process died") from None
        if status != "ok":
            raise WorkerFailed(value)
        return value

    def _close(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

    def _reap(self, kill: bool = False) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)

    def __enter__(self) -> ForkedCall:
        return self

    def __exit__(self, *exc) -> None:
        self._close()
        self._reap(kill=True)


def _child(fn: Callable[[], Any], read_fd: int, write_fd: int) -> None:
    code = 0
    try:
        os.close(read_fd)
        # Ctrl-C reaches the whole process group: the child just ends; the parent reports the interrupt
        # (unless the parent ignores SIGINT, as a background job of a script does: then so does the child).
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            payload = pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, which decides)
            payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
    except BaseException:  # noqa: BLE001 (the parent sees a short read and reports it)
        code = 1
    finally:
        os._exit(code)
