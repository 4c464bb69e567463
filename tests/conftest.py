"""Shared test helpers: run Python, or the `gpuadvisor` CLI of this checkout, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Tests never read or write the user's cache: a calibration cached by `gpuadvisor calibrate` on this
# machine would change the roofs, and so the expected findings. Subprocesses inherit this.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="gpuadvisor-test-cache-")


def _run(argv: list, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGV`` with this checkout first on the path, default limits and no colour; output captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(NO_COLOR="1", COLUMNS="160")
    return subprocess.run(
        [sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def cli():
    """``cli(*args)`` runs ``python -m gpuadvisor ARGS`` and returns the CompletedProcess (never raises)."""
    return lambda *args, timeout=120: _run(["-m", "gpuadvisor", *args], timeout)


@pytest.fixture(scope="session")
def python():
    """``python(*args)`` runs ``python ARGS`` the same way (``python("-c", code)``)."""
    return lambda *args, timeout=120: _run(list(args), timeout)


class PlantedFix:
    """A fix built from a function (workload -> Applied), registered for one test (the ``planted`` fixture)."""

    def __init__(self, fix_id: str, make, policy: str = "model"):
        self.id, self.title, self.make, self.numerics = fix_id, fix_id, make, policy

    def check(self, workload):
        return None

    def apply(self, workload):
        return self.make(workload)


@pytest.fixture
def planted():
    """``planted(fix_id, make, policy="model")`` registers a :class:`PlantedFix` for the test and returns its id; the
    fixes are unregistered after it. A deliberately wrong variant of a fix shows what the numerics guard rejects."""
    from gpuadvisor.fixes.registry import register_fix, unregister_fix

    registered = []

    def plant(fix_id: str, make, policy: str = "model") -> str:
        register_fix(PlantedFix(fix_id, make, policy), fix_id)
        registered.append(fix_id)
        return fix_id

    yield plant
    for fix_id in registered:
        unregister_fix(fix_id)
