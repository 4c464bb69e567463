"""Pieces the GPU benchmarks share: loading an example model file, median CUDA-event timing, copy bandwidth.

Imported by the scripts in this folder (run as ``python3 benchmarks/<name>.py``, which puts the folder on
``sys.path``). torch is imported where it is used.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DECODE_EXAMPLE = ROOT / "examples" / "llama_decode.py"


def load_example(example: Path = DECODE_EXAMPLE) -> ModuleType:
    """Import an example model file as a module, without gpuadvisor's loader."""
    spec = importlib.util.spec_from_file_location(f"{example.stem}_example", example)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the example's dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def median_us(fn: Callable[[], object], iters: int, warmup: int, device) -> float:
    """Median time of one ``fn()`` in microseconds: CUDA events around each call (calls back to back, one
    synchronize at the end) on CUDA, perf_counter elsewhere; ``warmup`` untimed calls first."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples)
    import torch

    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def copy_bandwidth(copy_gib: float, iters: int, warmup: int, device) -> dict:
    """Device-to-device copy of a ``copy_gib`` GiB bf16 tensor: bytes read + written per second."""
    import torch

    src = torch.randn(int(copy_gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), iters, warmup, device)
    moved = 2 * src.numel() * src.element_size()
    return {"tensor_bytes": moved // 2, "bytes": moved, "us": us, "bytes_per_s": moved / (us * 1e-6)}
