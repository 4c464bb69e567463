"""Ctrl-C and SIGTERM that are not lost: the CLI's handlers remember them, so that a KeyboardInterrupt swallowed
on the way (library code that catches BaseException, a ``__del__`` or weakref callback where Python only prints
"Exception ignored", seen during ``import torch``) still stops the command before it writes anything.

SIGTERM (``kill``, a CI runner's timeout, ``docker stop``) is handled as Ctrl-C is: it raises KeyboardInterrupt,
so the same clean-up runs (staging folders removed, the profiler stopped, child processes such as the trace
reader's forked worker and torchrun's ranks ended), and the command exits 128 + the signal's number: 130 after
Ctrl-C (SIGINT), 143 after SIGTERM (:func:`exit_status`).

``install()`` is called by the CLI only; the library never changes signal handlers. ``raise_if_interrupted()``
runs at phase boundaries and just before an output folder is published.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_received = 0  # the number of the last interrupting signal since install(); 0: none

HANDLED = (signal.SIGINT, signal.SIGTERM)


def install() -> None:
    """Handle SIGINT as Python does (raise KeyboardInterrupt), and SIGTERM the same way, remembering which came.
    Main thread only; a signal that is ignored (SIGINT in a background job of a non-interactive shell) or handled
    by someone else is left so."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_signal)


def _on_signal(signum, frame) -> None:
    global _received
    _received = signum
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt when a Ctrl-C or SIGTERM came since ``install()``, even if its exception was
    swallowed."""
    if _received:
        raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether a Ctrl-C or SIGTERM came since ``install()`` (or the last :func:`reset`)."""
    return bool(_received)


def exit_status() -> int:
    """The exit status after an interruption: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(_received or signal.SIGINT)


def reset() -> None:
    """Forget an interruption (for a process that goes on, such as a test run)."""
    global _received
    _received = 0


@contextlib.contextmanager
def deferred():
    """Hold a Ctrl-C (or SIGTERM, once :func:`install` handles it) that arrives inside the block until the block
    ends, then raise it: for short transitions that must not stop half-way (the profiler starting or stopping
    inside C++, stderr redirected around it). A second one inside the block raises at once. Outside the main
    thread, or for a signal whose handler is not Python's own or ours, the block runs as it is for that signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for number in HANDLED:
        handler = signal.getsignal(number)
        if handler is _on_signal or (number == signal.SIGINT and handler is signal.default_int_handler):
            previous[number] = handler
    if not previous:
        yield
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        global _received
        _received = signum
        held.append(signum)
        if len(held) > 1:
            raise KeyboardInterrupt

    for number in previous:
        signal.signal(number, hold)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        raise KeyboardInterrupt
