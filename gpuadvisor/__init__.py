"""gpuadvisor: GPU profiling and optimization advisor for PyTorch.

``gpuadvisor.optimize(model, example_inputs, fixes=[...])`` is loaded on first use (a module ``__getattr__``),
so ``import gpuadvisor`` stays light and imports no torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "optimize":
        import importlib

        function = importlib.import_module("gpuadvisor.optimizer").optimize
        globals()["optimize"] = function
        return function
    raise AttributeError(f"module 'gpuadvisor' has no attribute {name!r}")
