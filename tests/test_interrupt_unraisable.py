"""A Ctrl-C or SIGTERM whose handler runs inside a callback that Python does not let raise (a weakref callback, such
as importlib's ``_ModuleLock`` one, or a ``__del__``): no "Exception ignored in ..." on stderr, and the command
still stops, with the documented exit status and its one line (gpuadvisor/interrupt.py, issue 17).

Each case runs in a subprocess that installs the CLI's handlers and makes the signal arrive inside such a callback
deterministically: the callback sends the signal to its own process (``signal.raise_signal`` / ``os.kill`` run the
handler before they return), so the handler's exception is raised inside the callback. Then the script runs
ordinary code that does not check for an interruption itself: only the re-delivery can stop it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import pytest

from gpuadvisor import interrupt

REPO = Path(__file__).resolve().parents[1]
LINE = "interrupted: nothing was written"

PRELUDE = """\
import gc, os, signal, sys, time, weakref
from gpuadvisor import cli, interrupt

interrupt.install()


class Thing:
    pass


def busy(seconds):  # ordinary code that never checks for an interruption itself
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def in_weakref_callback(send):
    def callback(ref):
        send()  # the handler runs inside this call: its exception leaves the callback, unraisable
        sys.stdout.write("callback went on\\n")

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing  # the callback runs here
    return ref
"""

EPILOGUE = """\
try:
    main()
except KeyboardInterrupt:
    cli.exit_interrupted()
sys.stdout.write("not interrupted\\n")
sys.exit(0)
"""


def run_script(body: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    source = PRELUDE + "\n\n" + textwrap.dedent(body) + "\n\n" + EPILOGUE
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done, time.monotonic() - started


def assert_interrupted(done: subprocess.CompletedProcess, status: int) -> None:
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [LINE], done.stderr
    assert "not interrupted" not in done.stdout, done.stdout
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)


SENDS = {
    "raise_signal": "lambda: signal.raise_signal(signal.{sig})",
    "os.kill": "lambda: os.kill(os.getpid(), signal.{sig})",
}


@pytest.mark.parametrize("send", sorted(SENDS))
@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_inside_a_weakref_callback_stops_the_run_quietly(send, sig, status):
    done, _ = run_script(
        f"""
        def main():
            in_weakref_callback({SENDS[send].format(sig=sig)})
            busy(20)
        """
    )
    assert_interrupted(done, status)
    assert "callback went on" not in done.stdout  # the handler did raise inside the callback


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_inside_del_stops_the_run_quietly(sig, status):
    done, _ = run_script(
        f"""
        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.{sig})
                sys.stdout.write("__del__ went on\\n")


        def main():
            Finalized()  # dropped at once: __del__ runs here
            busy(20)
        """
    )
    assert_interrupted(done, status)
    assert "__del__ went on" not in done.stdout


def test_the_redelivery_wakes_a_blocking_call():
    """The re-delivery is a real signal to the main thread: a sleep (or a wait for a child process) is woken."""
    done, elapsed = run_script(
        """
        def main():
            in_weakref_callback(lambda: signal.raise_signal(signal.SIGTERM))
            time.sleep(30)
        """
    )
    assert_interrupted(done, 143)
    assert elapsed < 15, elapsed


def test_a_redelivery_swallowed_again_is_sent_again():
    """The re-delivered signal lands in another callback (a cascade of slow finalizers): it is re-delivered again
    until it reaches ordinary code."""
    done, _ = run_script(
        """
        class Slow:
            def __del__(self):
                busy(0.002)


        def main():
            slow = [Slow() for _ in range(40)]
            in_weakref_callback(lambda: signal.raise_signal(signal.SIGINT))
            del slow  # 80 ms of finalizers, back to back: re-deliveries land in them
            busy(20)
        """
    )
    assert_interrupted(done, 130)


def test_redelivery_is_bounded_then_the_phase_check_stops_the_run():
    """Finalizers for seconds on end, no ordinary code between them: the re-deliveries stop after
    MAX_REDELIVERIES, the finalizers all run (each re-delivery ends one early), and raise_if_interrupted() (the
    phase check) stops the command."""
    done, _ = run_script(
        """
        interrupt.MAX_REDELIVERIES = 5
        finalized = []


        class Slow:
            def __del__(self):
                finalized.append(1)
                busy(0.005)


        def main():
            slow = [Slow() for _ in range(300)]
            in_weakref_callback(lambda: signal.raise_signal(signal.SIGTERM))
            del slow  # 1.5 s of finalizers: every re-delivery is swallowed by one of them
            busy(0.5)  # time for a (wrong) sixth re-delivery to arrive
            sys.stdout.write(f"redeliveries={interrupt._redeliveries} finalized={len(finalized)}\\n")
            interrupt.raise_if_interrupted()
        """
    )
    assert_interrupted(done, 143)
    counts = dict(item.split("=") for item in done.stdout.split())
    assert counts["redeliveries"] == "5", done.stdout
    # every finalizer ran; one that a re-delivery hit at its first bytecode did not get to count itself
    assert 300 - 5 <= int(counts["finalized"]) <= 300, done.stdout


def test_a_signal_while_the_hook_works_is_redelivered_after_it():
    """A signal whose handler runs inside the unraisable hook (here: inside the previous hook that ours chains to,
    for an unrelated exception) must not raise there: Python would print "Exception ignored in
    sys.unraisablehook"; it is re-delivered once the hook has returned. The unrelated exception still reaches the
    previous hook."""
    done, _ = run_script(
        """
        def previous(unraisable):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs inside this call
            sys.stdout.write(f"previous hook saw {unraisable.exc_type.__name__}\\n")


        interrupt.uninstall()
        sys.unraisablehook = previous
        interrupt.install()


        def main():
            def fails(ref):
                raise ValueError("unrelated")

            thing = Thing()
            ref = weakref.ref(thing, fails)
            del thing
            busy(20)
        """
    )
    assert_interrupted(done, 143)
    assert "previous hook saw ValueError" in done.stdout, done.stdout


# --------------------------------------------------------------------------------------------------------------
# in-process: the hook is chained, and put back


@pytest.fixture
def python_handlers():
    """Python's own handlers while the test runs (install() takes only those), and everything put back after."""
    saved = {number: signal.getsignal(number) for number in interrupt.HANDLED}
    saved_hook = sys.unraisablehook
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    interrupt.uninstall()
    interrupt.reset()
    for number, handler in saved.items():
        signal.signal(number, handler)
    sys.unraisablehook = saved_hook


def _recorder():
    seen = []

    def record(unraisable):
        seen.append(unraisable)

    return seen, record


def _unraisable_from_weakref_callback(exc: BaseException) -> None:
    class Thing:
        pass

    def callback(ref):
        raise exc

    thing = Thing()
    ref = weakref.ref(thing, callback)  # noqa: F841 - kept alive so that the callback runs
    del thing


def test_other_unraisable_exceptions_reach_the_previous_hook(python_handlers):
    seen, record = _recorder()
    sys.unraisablehook = record
    interrupt.install()
    assert sys.unraisablehook is not record
    _unraisable_from_weakref_callback(ValueError("unrelated"))
    _unraisable_from_weakref_callback(KeyboardInterrupt())  # a KeyboardInterrupt that is not ours: not taken over
    assert [type(u.exc_value) for u in seen] == [ValueError, KeyboardInterrupt]
    assert str(seen[0].exc_value) == "unrelated"


def test_uninstall_puts_back_the_hook_and_the_handlers(python_handlers):
    seen, record = _recorder()
    sys.unraisablehook = record
    interrupt.install()
    interrupt.install()  # twice: still chained once, to the hook found first
    assert signal.getsignal(signal.SIGINT) is interrupt._on_signal
    assert signal.getsignal(signal.SIGTERM) is interrupt._on_signal
    interrupt.uninstall()
    assert sys.unraisablehook is record
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    _unraisable_from_weakref_callback(interrupt.Interrupted(signal.SIGTERM))  # ours, but no longer in charge
    assert [type(u.exc_value) for u in seen] == [interrupt.Interrupted]


def test_a_hook_left_in_someone_elses_chain_passes_everything_on(python_handlers):
    seen, record = _recorder()
    sys.unraisablehook = record
    interrupt.install()
    ours = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: ours(unraisable)  # someone chains to ours after install()
    interrupt.uninstall()  # cannot take ours out of their chain
    _unraisable_from_weakref_callback(interrupt.Interrupted())
    _unraisable_from_weakref_callback(ValueError("unrelated"))
    assert [type(u.exc_value) for u in seen] == [interrupt.Interrupted, ValueError]


def test_install_outside_the_main_thread_changes_nothing(python_handlers):
    before = sys.unraisablehook
    worker = threading.Thread(target=interrupt.install)
    worker.start()
    worker.join()
    assert sys.unraisablehook is before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupted_is_a_keyboard_interrupt_that_pickles():
    import pickle

    exc = pickle.loads(pickle.dumps(interrupt.Interrupted(signal.SIGTERM)))
    assert isinstance(exc, KeyboardInterrupt) and exc.signum == signal.SIGTERM


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_a_torch_module_imports_waits_for_the_import_then_stops_the_run(sig, status):
    """torch's C++ start-up calls back into Python through pybind11 while its modules import, and an exception
    raised there ends the process with abort() (exit -6, once in 20 runs of the Ctrl-C test in CI). A module
    code object whose __name__ is under torch stands in for such an import: the signal arrives inside it, the
    import finishes, and the re-delivery stops the run afterwards."""
    done, _ = run_script(
        f"""
        def main():
            module = {{"__name__": "torch.distributed_stand_in"}}
            exec(compile("os.kill(os.getpid(), signal.{sig})\\nbusy(0.2)\\nsys.stdout.write('import went on\\\\n')",
                         "<torch module>", "exec"), {{**globals(), **module}})
            busy(20)
        """
    )
    assert_interrupted(done, status)
    assert "import went on" in done.stdout  # the handler did not raise inside the import
