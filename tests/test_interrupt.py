"""gpuadvisor.interrupt.deferred: a Ctrl-C inside a short transition is held until it ends, then raised."""

from __future__ import annotations

import os
import signal

import pytest

from gpuadvisor import interrupt


@pytest.fixture
def python_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
    interrupt.reset()  # the held Ctrl-C is remembered; later tests in this process must not see it


def test_a_ctrl_c_inside_the_block_is_raised_after_it_ends(python_sigint):
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes: give it the chance to
                pass
            finished.append(True)  # reached: the interrupt did not stop the block half-way
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_a_second_ctrl_c_inside_the_block_raises_at_once(python_sigint):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            reached.append(True)
    assert reached == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_the_block_runs_as_it_is(python_sigint):
    with interrupt.deferred():
        value = 1 + 1
    assert value == 2
