"""Ctrl-C that is not lost: the CLI's SIGINT handler remembers it, so that a KeyboardInterrupt swallowed on the
way (library code that catches BaseException, a ``__del__`` or weakref callback where Python only prints
"Exception ignored", seen during ``import torch``) still stops the command before it writes anything.

``install()`` is called by the CLI only; the library never changes signal handlers. ``raise_if_interrupted()``
runs at phase boundaries and just before an output folder is published.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_received = False


def install() -> None:
    """Handle SIGINT as Python does (raise KeyboardInterrupt), remembering that it came. Main thread only; a
    SIGINT that is ignored (a background job of a non-interactive shell) or handled by someone else is left so."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def _on_sigint(signum, frame) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt when a Ctrl-C came since ``install()``, even if its exception was swallowed."""
    if _received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred():
    """Hold a Ctrl-C that arrives inside the block until the block ends, then raise it: for short transitions that
    must not stop half-way (the profiler starting or stopping inside C++, stderr redirected around it). A second
    Ctrl-C inside the block raises at once. Outside the main thread, or with a SIGINT handler that is not Python's
    own or ours, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous not in (signal.default_int_handler, _on_sigint):
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        global _received
        _received = True
        held.append(signum)
        if len(held) > 1:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
