"""Ctrl-C and SIGTERM that are not lost: the CLI's handlers remember them, so that a KeyboardInterrupt swallowed
on the way (library code that catches BaseException, a ``__del__`` or weakref callback where Python only prints
"Exception ignored", seen during ``import torch``) still stops the command before it writes anything.

SIGTERM (``kill``, a CI runner's timeout, ``docker stop``) is handled as Ctrl-C is: it raises :class:`Interrupted`,
a KeyboardInterrupt, so the same clean-up runs (staging folders removed, the profiler stopped, child processes
such as the trace reader's forked worker and torchrun's ranks ended), and the command exits 128 + the signal's
number: 130 after Ctrl-C (SIGINT), 143 after SIGTERM (:func:`exit_status`).

``install()`` is called by the CLI only; the library never changes signal handlers. ``raise_if_interrupted()``
runs at phase boundaries and just before an output folder is published. ``uninstall()`` puts back what
``install()`` replaced (for a process that goes on, such as a test).

A signal inside a callback whose exceptions Python swallows
-----------------------------------------------------------
Python runs a signal's handler in the main thread at the next bytecode boundary, whatever code that is. When it
is a weakref callback (importlib's ``_ModuleLock`` one fires during any import), a ``__del__``, a GC callback or a
generator closed by the collector, the handler's exception cannot propagate: CPython hands it to
``sys.unraisablehook``, whose default prints "Exception ignored in: ..." with a traceback, and the interrupted
code goes on as if nothing happened. So ``install()`` also installs an unraisable hook, chained to the one that
was there (every other unraisable exception goes to it unchanged). For an :class:`Interrupted` (only ours: a
KeyboardInterrupt raised by anything else is not taken over) it prints nothing and *owes* a re-delivery, which
it makes as follows:

* Not from the hook itself. Whatever arms a pending interrupt (``_thread.interrupt_main``, ``signal.raise_signal``,
  an async exception) is acted on at the next eval-breaker check, and the first one is the one right after that
  very call, still inside the hook: the handler's exception would then escape the hook, and CPython prints
  "Exception ignored in sys.unraisablehook" instead.
* From a short-lived helper thread, which waits (at most :data:`_HOOK_WAIT_S`) until the main thread's stack no
  longer holds the hook, then sends the same signal to the main thread with ``signal.pthread_kill`` (the
  ``_thread.interrupt_main(signum)`` of Python >= 3.10 where there is no ``pthread_kill``). It is a real signal
  again: a main thread blocked in ``sleep``, ``select`` or ``wait`` is woken (EINTR), and the handler runs at the
  next bytecode boundary of ordinary code, where its exception propagates as usual. If that boundary is inside
  another such callback, the same happens once more, and so on until one lands in ordinary code.
* The handler guards the rest: when it runs while the main thread's stack holds the hook (a second Ctrl-C while
  the hook works, or a re-delivery that came early), it raises nothing and owes a re-delivery instead.

Why it cannot go wrong:

* It cannot loop forever: each re-delivery is one signal from one helper, a new one only when the previous one
  was swallowed again, and at most :data:`MAX_REDELIVERIES` after one ``install()`` (or :func:`reset`). Past
  that, the interrupt is still remembered and :func:`raise_if_interrupted` stops the command at its next check,
  as before.
* It does not interrupt twice: whenever one of ours is raised in ordinary code (the handler,
  :func:`raise_if_interrupted`, the end of :func:`deferred`), the debt is cleared, and a re-delivery that arrives
  after that is dropped by the handler, so clean-up that has started is not interrupted by our own re-delivery.
  A re-delivery is only sent while the signal's handler is still ours (``install()``'s, or :func:`deferred`'s),
  never to the default action (which would kill the process) nor to a handler someone else installed since;
  ``uninstall()`` cancels one still owed, under the same lock the helper sends under.
* The hook is ``sys.unraisablehook`` only between ``install()`` and ``uninstall()``; after ``uninstall()`` (and
  if someone chained their own hook to ours and kept it), it passes everything on unchanged.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time

_received = 0  # the number of the last interrupting signal since install(); 0: none

HANDLED = (signal.SIGINT, signal.SIGTERM)

MAX_REDELIVERIES = 100  # per install() (or reset()): past that, raise_if_interrupted() is the backstop
# How long a helper waits for the main thread to leave the unraisable hook or a torch import before sending
# (importing torch took about 2 s on the CI machine).
_HOOK_WAIT_S = 5.0

_lock = threading.RLock()  # the helper's check-and-send against uninstall() and the debt's clearing
_active = False  # between install() and uninstall(): the hook takes our interrupts, re-deliveries are made
_main_ident: int | None = None
_previous_handlers: dict[int, object] = {}
_previous_hook = None  # the sys.unraisablehook that install() found (chained to for everything else)
_owed = 0  # a signal whose Interrupted was swallowed and not raised again in ordinary code since; 0: none
_in_flight = False  # a re-delivery was sent and has not reached one of our handlers yet
_helper_running = False
_redeliveries = 0
_delegating = threading.local()  # guards against a chain that leads back to our hook


class Interrupted(KeyboardInterrupt):
    """The KeyboardInterrupt that Ctrl-C or SIGTERM raises once :func:`install` handles them (``signum``: which)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__()
        self.signum = int(signum)

    def __reduce__(self):
        return (type(self), (self.signum,))


def install() -> None:
    """Handle SIGINT as Python does (raise KeyboardInterrupt), and SIGTERM the same way, remembering which came;
    and take over the unraisable hook for those interrupts (module docstring). Main thread only; a signal that is
    ignored (SIGINT in a background job of a non-interactive shell) or handled by someone else is left so."""
    global _active, _main_ident, _previous_hook, _redeliveries
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _previous_handlers.setdefault(signal.SIGINT, signal.signal(signal.SIGINT, _on_signal))
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _previous_handlers.setdefault(signal.SIGTERM, signal.signal(signal.SIGTERM, _on_signal))
    _main_ident = threading.main_thread().ident
    if sys.unraisablehook is not _unraisable_hook:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable_hook
    if not _active:
        _redeliveries = 0
    _active = True


def uninstall() -> None:
    """Put back the signal handlers and the unraisable hook that :func:`install` replaced (where they are still
    ours), and cancel a re-delivery still owed. The remembered interrupt stays (:func:`reset` forgets it)."""
    global _active, _owed, _in_flight, _previous_hook
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        _active = False
        _owed = 0
        _in_flight = False
    for number, previous in list(_previous_handlers.items()):
        if signal.getsignal(number) is _on_signal:
            signal.signal(number, previous)
    _previous_handlers.clear()
    if sys.unraisablehook is _unraisable_hook:
        sys.unraisablehook = _previous_hook
        _previous_hook = None
    # else someone installed a hook after ours and may call ours still: it passes everything on (_active is off)


def _on_signal(signum, frame) -> None:
    global _received
    if not _arrived(signum):
        return
    _received = signum
    _interrupt(signum, frame)


def _arrived(signum: int) -> bool:
    """Account for a signal reaching one of our handlers: False when it is a re-delivery no longer needed (ours
    was raised in ordinary code since it was owed), which is then dropped."""
    global _in_flight
    if _in_flight:
        _in_flight = False
        if not _owed:
            return False
    return True


def _interrupt(signum: int, frame) -> None:
    """Raise Interrupted(signum), unless the main thread is inside our unraisable hook, where it would only be
    reported as the hook's own failure, or inside the import of a torch module, where torch's C++ start-up calls
    back into Python through pybind11 and an exception raised there ends the process with abort() (seen: exit
    -6 from ``torch/distributed/__init__.py``, 1 run in 20 of the Ctrl-C test): then re-deliver it once the
    main thread has left both."""
    if _inside_hook(frame) or _inside_torch_import(frame):
        _owe(signum)
        return
    _raise(signum)


def _inside_torch_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "<module>" and str(frame.f_globals.get("__name__", "")).split(".")[0] == "torch":
            return True
        frame = frame.f_back
    return False


def _raise(signum: int):
    global _owed
    with _lock:
        _owed = 0  # raised in ordinary code: a re-delivery still on its way is dropped on arrival
    raise Interrupted(signum)


def _inside_hook(frame) -> bool:
    while frame is not None:
        if frame.f_code is _HOOK_CODE:
            return True
        frame = frame.f_back
    return False


def _unraisable_hook(unraisable) -> None:
    """sys.unraisablehook between install() and uninstall(): our Interrupted is re-delivered without a word;
    everything else goes to the hook that was there before."""
    if _active:
        exc, kind = unraisable.exc_value, unraisable.exc_type
        if isinstance(exc, Interrupted):
            _owe(exc.signum)
            return
        if exc is None and isinstance(kind, type) and issubclass(kind, Interrupted):
            _owe(_received or signal.SIGINT)
            return
    previous = _previous_hook
    if previous is None or getattr(_delegating, "depth", 0):
        previous = sys.__unraisablehook__
    _delegating.depth = getattr(_delegating, "depth", 0) + 1
    try:
        previous(unraisable)
    finally:
        _delegating.depth -= 1


_HOOK_CODE = _unraisable_hook.__code__


def _owe(signum: int) -> None:
    """Remember that ``signum``'s interrupt was swallowed, and start a helper to send it again (one at a time:
    a helper sends what is owed when it sends, so a running one covers a newer debt too)."""
    global _owed, _helper_running, _redeliveries
    with _lock:
        if not _active:
            return
        _owed = signum
        if _helper_running or _redeliveries >= MAX_REDELIVERIES:
            return  # the running helper sends it; past the limit raise_if_interrupted() stops the command
        _redeliveries += 1
        _helper_running = True
    try:
        _thread.start_new_thread(_send_again, ())
    except BaseException:  # noqa: BLE001 - no thread (interpreter shutting down): the phase checks stop the command
        with _lock:
            _helper_running = False


def _send_again() -> None:
    """The helper thread: once the main thread has left the unraisable hook, send it the owed signal."""
    global _helper_running, _in_flight
    try:
        deadline = time.monotonic() + _HOOK_WAIT_S
        while time.monotonic() < deadline and _main_in_hook():
            time.sleep(0.001)
        with _lock:
            _helper_running = False
            signum = _owed
            if not (_active and signum and _is_ours(signal.getsignal(signum))):
                return
            _in_flight = True  # before it is sent: the handler may run as soon as it is
            try:
                if hasattr(signal, "pthread_kill") and _main_ident is not None:
                    signal.pthread_kill(_main_ident, signum)  # a real signal: wakes a blocking call with EINTR
                else:
                    _thread.interrupt_main(signum)
            except BaseException:
                _in_flight = False
                raise
    except BaseException:  # noqa: BLE001 - a thread started with _thread reports its exception as unraisable
        with contextlib.suppress(BaseException):
            with _lock:
                _helper_running = False


def _after_fork_in_child() -> None:
    # A fork while a helper held the lock would leave the child's copy held for ever; the child's only thread is
    # its main thread now, and a re-delivery owed to the parent is not the child's.
    global _lock, _main_ident, _owed, _in_flight, _helper_running
    _lock = threading.RLock()
    _main_ident = threading.get_ident()
    _owed = 0
    _in_flight = False
    _helper_running = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _main_in_hook() -> bool:
    frames = getattr(sys, "_current_frames", None)
    if frames is None or _main_ident is None:
        return False
    frame = frames().get(_main_ident)
    return _inside_hook(frame) or _inside_torch_import(frame)


def _is_ours(handler) -> bool:
    return handler is _on_signal or getattr(handler, "_gpuadvisor_interrupt", False)


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt (:class:`Interrupted`) when a Ctrl-C or SIGTERM came since ``install()``, even if
    its exception was swallowed."""
    if _received:
        _raise(_received)


def interrupted() -> bool:
    """Whether a Ctrl-C or SIGTERM came since ``install()`` (or the last :func:`reset`)."""
    return bool(_received)


def exit_status() -> int:
    """The exit status after an interruption: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(_received or signal.SIGINT)


def reset() -> None:
    """Forget an interruption (for a process that goes on, such as a test run), and any re-delivery owed."""
    global _received, _owed, _in_flight, _redeliveries
    with _lock:
        _received = 0
        _owed = 0
        _in_flight = False
        _redeliveries = 0


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
        if not _arrived(signum):
            return
        _received = signum
        held.append(signum)
        if len(held) > 1:
            _interrupt(signum, frame)

    hold._gpuadvisor_interrupt = True  # a re-delivery may be sent to it (_is_ours)
    for number in previous:
        signal.signal(number, hold)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        _raise(held[-1])
