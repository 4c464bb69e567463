"""The scripts of benchmarks/ as modules, for the tests of what they derive without a GPU."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@functools.cache
def load(name: str) -> ModuleType:
    """benchmarks/NAME.py, imported once per test session under the name ``benchmark_NAME``."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
