"""Runs a model.py's steps under Nsight Compute: ``python -m gpuadvisor.ncu.child model.py --warmup 1 --steps 2``.

Warm-up steps run before the profiler range opens (``ncu --profile-from-start off``), so compilation and
autotuning kernels are not profiled; the timed steps run between cudaProfilerStart and cudaProfilerStop.
Exit codes as the CLI's: 2 bad model file, 3 the model's own code failed.
"""

from __future__ import annotations

import argparse
import sys


def _profiler(action: str) -> None:
    """cudaProfilerStart/Stop through torch, else cupy; the model imported one of them."""
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            (torch.cuda.profiler.start if action == "start" else torch.cuda.profiler.stop)()
            return
    if "cupy" in sys.modules:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
        (cupy.cuda.profiler.start if action == "start" else cupy.cuda.profiler.stop)()


def _synchronize() -> None:
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    if "cupy" in sys.modules:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def main(argv: list[str] | None = None) -> int:
    from gpuadvisor.errors import GpuAdvisorError
    from gpuadvisor.workload import load_workload

    parser = argparse.ArgumentParser(prog="gpuadvisor.ncu.child")
    parser.add_argument("model")
    parser.add_argument("--entry", default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        workload = load_workload(args.model, entry=args.entry)
        for _ in range(args.warmup):
            workload.step_fn()
        _synchronize()
        _profiler("start")
        for _ in range(args.steps):
            workload.step_fn()
        _synchronize()
        _profiler("stop")
    except GpuAdvisorError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
