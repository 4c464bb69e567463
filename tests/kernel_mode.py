"""How the test modules that run Triton kernels pick their mode: compiled on CUDA, Triton's CPU interpreter without.

``TRITON_INTERPRET=1`` must be set before triton is first imported (``triton.jit`` reads it when each function,
triton.language's own included, is defined), so a test module calls :func:`kernel_mode` at its top, before it
imports anything from gpuadvisor.kernels. Skips the module without torch or triton, or when triton was already
imported in compiled mode on a machine without CUDA.
"""

from __future__ import annotations

import os
import sys

import pytest


def kernel_mode():
    """``(torch, cuda, interpret)``: the torch module, whether CUDA is available, whether kernels are interpreted."""
    torch = pytest.importorskip("torch")
    cuda = torch.cuda.is_available()
    if not cuda:
        if "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ:
            pytest.skip("triton was imported before TRITON_INTERPRET could be set", allow_module_level=True)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    return torch, cuda, os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
