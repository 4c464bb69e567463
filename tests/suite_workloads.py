"""What the tests of the real-model suite (examples/real/) share: loading a suite file at its small CPU size,
skipping when the library it needs is missing or does not import, and snapshotting the state it holds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from gpuadvisor.fixes.state import collect_state
from gpuadvisor.workload import Workload, load_workload

SUITE = Path(__file__).resolve().parent.parent / "examples" / "real"
LIBRARIES = ("timm", "torchvision", "transformers")


def needs(path: Path) -> list[str]:
    """The libraries among ``LIBRARIES`` a suite file imports."""
    text = path.read_text()
    return [name for name in LIBRARIES if re.search(rf"^(from|import) {name}\b", text, re.MULTILINE)]


def load(path: Path | str, monkeypatch) -> Workload:
    """The suite file (a path, or a name in examples/real/) at its small size; skips without its libraries."""
    path = Path(path) if isinstance(path, Path) or str(path).endswith(".py") else SUITE / f"{path}.py"
    for library in needs(path):
        if importlib.util.find_spec(library) is None:
            pytest.skip(f"{path.name} needs {library}, which is not installed")
        try:
            __import__(library)
        except Exception as error:  # timm without torchvision, torchvision beside a CPU torch build
            pytest.skip(f"{path.name}: {library} does not import here ({type(error).__name__}: {error})")
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    return load_workload(str(path))


def state_values(workload: Workload) -> dict[str, torch.Tensor | None]:
    """Every state tensor the workload's model and inputs hold, by path, cloned."""
    state = collect_state({"model": workload.model, "inputs": workload.inputs})
    return {slot.path: (None if (v := slot.get()) is None else v.detach().clone()) for slot in state}


def assert_same_state(before: dict, workload: Workload) -> None:
    """The workload holds the same state tensors as ``before`` (from :func:`state_values`), bit for bit."""
    after = state_values(workload)
    assert after.keys() == before.keys()
    for path, value in before.items():
        now = after[path]
        assert (value is None) == (now is None), f"{path} appeared or vanished"
        if value is not None:
            assert torch.equal(value, now), f"{path} changed"
