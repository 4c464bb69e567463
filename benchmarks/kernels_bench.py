"""Time the Triton kernels in gpuadvisor/kernels against eager PyTorch and torch.compile, as bandwidth.

For each kernel (add_rmsnorm, rmsnorm, swiglu) at one shape (default 16384x4096 bf16, a Llama-size
hidden width over a 16k-token batch), on random data:

- median time of eager PyTorch, the Triton kernel and torch.compile of the eager code (CUDA events around
  each call, after warm-up; every tensor is >= 128 MiB, over twice the L2, so no cache flush is needed);
- the largest error of the Triton kernel (and of eager) against the float64 reference on that data;
- bytes moved (each input read once, each output written once) and the bandwidth this implies, against
  the device-to-device copy bandwidth measured in the same run (a >= 2 GiB tensor, bytes read + written).

The acceptance target: add_rmsnorm at 16384x4096 bf16 reaches >= 85% of the measured copy bandwidth.
add_rmsnorm is also timed with other warp counts and on its two-pass (chunked) path, the evidence for
the launch settings in gpuadvisor/kernels/rmsnorm.py.

    python3 benchmarks/kernels_bench.py [--out benchmarks/results/kernels_bench.json] [--no-compile]

Without CUDA it runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1, small --rows/--cols,
--copy-gib 0.01): a smoke test of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import copy_bandwidth, median_us  # noqa: E402

from gpuadvisor.kernels import add_rmsnorm as add_rmsnorm_module  # noqa: E402
from gpuadvisor.kernels import rmsnorm as rmsnorm_module  # noqa: E402
from gpuadvisor.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_reference  # noqa: E402
from gpuadvisor.kernels.rmsnorm import rmsnorm, rmsnorm_reference  # noqa: E402
from gpuadvisor.kernels.swiglu import swiglu, swiglu_reference  # noqa: E402

TARGET_PCT_OF_COPY = 85.0
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Pass/fail tolerance on the float64 reference, per output dtype: a few roundings of the output's mantissa
# (bf16 8 bits, fp16 11, fp32 24); a wrong kernel is off by O(1).
TOLERANCES = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def eager_add_rmsnorm(x, residual, weight, eps):
    """A Llama-style decoder's residual add then ``LlamaRMSNorm`` (fp32 statistics, weight in the model dtype)."""
    h = x + residual
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight, h


def eager_rmsnorm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def eager_swiglu(gate, up):
    return torch.nn.functional.silu(gate) * up


def max_errors(out: torch.Tensor, ref64: torch.Tensor) -> dict:
    err = (out.double() - ref64).abs()
    tol = TOLERANCES[out.dtype]
    return {
        "max_abs_error": err.max().item(),
        "max_abs_reference": ref64.abs().max().item(),
        "within_tolerance": bool((err <= tol + tol * ref64.abs()).all().item()),
        "tolerance_rtol_atol": tol,
    }


def compile_or_none(fn: Callable, enabled: bool) -> tuple[Callable | None, str | None]:
    if not enabled:
        return None, "disabled (--no-compile)"
    try:
        return torch.compile(fn), None
    except Exception as exc:  # an unsupported platform: record why and go on
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0]


def time_kernel(
    name: str,
    eager: Callable[[], object],
    fused: Callable[[], object],
    compiled: Callable[[], object] | None,
    compile_note: str | None,
    moved: int,
    copy_bytes_per_s: float,
    args: argparse.Namespace,
    device: torch.device,
) -> dict:
    row: dict = {"bytes": moved, "floor_us": moved / copy_bytes_per_s * 1e6}
    row["eager_us"] = median_us(eager, args.iters, args.warmup, device)
    row["triton_us"] = median_us(fused, args.iters, args.warmup, device)
    row["compiled_us"] = None
    if compiled is not None:
        try:
            started = time.perf_counter()
            compiled()
            row["compile_s"] = time.perf_counter() - started
            row["compiled_us"] = median_us(compiled, args.iters, args.warmup, device)
        except Exception as exc:
            compile_note = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if compile_note:
        row["compiled_note"] = compile_note
    row["triton_bytes_per_s"] = moved / (row["triton_us"] * 1e-6)
    row["eager_bytes_per_s"] = moved / (row["eager_us"] * 1e-6)
    row["pct_of_copy_bandwidth"] = 100.0 * row["triton_bytes_per_s"] / copy_bytes_per_s
    row["speedup_vs_eager"] = row["eager_us"] / row["triton_us"]
    print(
        f"{name:<12} eager {row['eager_us']:8.1f} us  triton {row['triton_us']:8.1f} us  "
        f"compiled {row['compiled_us'] if row['compiled_us'] is None else round(row['compiled_us'], 1)!s:>8} us  "
        f"floor {row['floor_us']:7.1f} us  {row['triton_bytes_per_s'] / 1e12:5.2f} TB/s "
        f"= {row['pct_of_copy_bandwidth']:5.1f}% of copy",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels_bench.json"))
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--iters", type=int, default=100, help="timed calls per median (>= 50)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copied tensor, GiB (>= 2 on a GPU)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("no CUDA: running in Triton's interpreter as a smoke test; the timings mean nothing", flush=True)
    dtype = DTYPES[args.dtype]
    m, n, eps = args.rows, args.cols, args.eps
    es = torch.empty((), dtype=dtype).element_size()

    result: dict = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU, Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shape": [m, n],
        "dtype": args.dtype,
        "eps": eps,
        "iters": args.iters,
        "warmup": args.warmup,
        "timing": "median of CUDA-event timings per call after warm-up" if device.type == "cuda" else "perf_counter",
        "target_pct_of_copy_bandwidth": TARGET_PCT_OF_COPY,
    }
    copy = copy_bandwidth(args.copy_gib, args.iters, args.warmup, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the copy's 2 x copy_gib back before the kernels allocate
    result["copy"] = copy
    print(f"copy {copy['tensor_bytes'] / 2**30:.2f} GiB: {copy['us']:.1f} us = {copy['bytes_per_s'] / 1e12:.2f} TB/s")
    copy_bps = copy["bytes_per_s"]

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn((m, n), generator=g, device=device, dtype=dtype)
    residual = torch.randn((m, n), generator=g, device=device, dtype=dtype)
    weight = (1 + 0.1 * torch.randn((n,), generator=g, device=device)).to(dtype)
    kernels: dict = {}

    # add_rmsnorm: read x, residual, weight; write y, h.
    y_ref, h_ref = add_rmsnorm_reference(x, residual, weight, eps)
    y, h = add_rmsnorm(x, residual, weight, eps)
    y_eager, _ = eager_add_rmsnorm(x, residual, weight, eps)
    compiled, note = compile_or_none(eager_add_rmsnorm, not args.no_compile)
    row = time_kernel(
        "add_rmsnorm",
        lambda: eager_add_rmsnorm(x, residual, weight, eps),
        lambda: add_rmsnorm(x, residual, weight, eps),
        (lambda: compiled(x, residual, weight, eps)) if compiled else None,
        note,
        4 * m * n * es + n * weight.element_size(),
        copy_bps,
        args,
        device,
    )
    row["triton_error"] = max_errors(y, y_ref)
    row["eager_error"] = max_errors(y_eager, y_ref)
    row["h_bit_exact"] = bool(torch.equal(h, h_ref))
    row["meets_target"] = row["pct_of_copy_bandwidth"] >= TARGET_PCT_OF_COPY
    variants = {}
    for warps in (4, 8, 16, 32):
        us = median_us(
            lambda w=warps: add_rmsnorm_module._launch(x, residual, weight, eps, num_warps=w),
            args.iters,
            args.warmup,
            device,
        )
        variants[f"single_pass_num_warps_{warps}"] = {
            "us": us,
            "pct_of_copy_bandwidth": 100 * row["bytes"] / us / 1e-6 / copy_bps,
        }
    for chunk in (1024, 2048):
        us = median_us(
            lambda c=chunk: add_rmsnorm_module._launch(x, residual, weight, eps, chunk_n=c),
            args.iters,
            args.warmup,
            device,
        )
        variants[f"two_pass_chunk_{chunk}"] = {
            "us": us,
            "pct_of_copy_bandwidth": 100 * row["bytes"] / us / 1e-6 / copy_bps,
        }
    row["variants"] = variants
    print("  add_rmsnorm variants: " + ", ".join(f"{k} {v['us']:.1f} us" for k, v in variants.items()), flush=True)
    kernels["add_rmsnorm"] = row
    del y_ref, h_ref, y, h, y_eager

    # rmsnorm: read x, weight; write y.
    y_ref = rmsnorm_reference(x, weight, eps)
    y = rmsnorm(x, weight, eps)
    compiled, note = compile_or_none(eager_rmsnorm, not args.no_compile)
    row = time_kernel(
        "rmsnorm",
        lambda: eager_rmsnorm(x, weight, eps),
        lambda: rmsnorm(x, weight, eps),
        (lambda: compiled(x, weight, eps)) if compiled else None,
        note,
        2 * m * n * es + n * weight.element_size(),
        copy_bps,
        args,
        device,
    )
    row["triton_error"] = max_errors(y, y_ref)
    row["eager_error"] = max_errors(eager_rmsnorm(x, weight, eps), y_ref)
    row["two_pass_chunk_1024_us"] = median_us(
        lambda: rmsnorm_module._launch(x, weight, eps, chunk_n=1024), args.iters, args.warmup, device
    )
    kernels["rmsnorm"] = row
    del y_ref, y

    # swiglu: read gate, up; write out. x is the gate (reaches silu's tails), residual the up projection.
    out_ref = swiglu_reference(x, residual)
    out = swiglu(x, residual)
    compiled, note = compile_or_none(eager_swiglu, not args.no_compile)
    row = time_kernel(
        "swiglu",
        lambda: eager_swiglu(x, residual),
        lambda: swiglu(x, residual),
        (lambda: compiled(x, residual)) if compiled else None,
        note,
        3 * m * n * es,
        copy_bps,
        args,
        device,
    )
    row["triton_error"] = max_errors(out, out_ref)
    row["eager_error"] = max_errors(eager_swiglu(x, residual), out_ref)
    kernels["swiglu"] = row
    del out_ref, out

    result["kernels"] = kernels
    correct = (
        all(k["triton_error"]["within_tolerance"] for k in kernels.values()) and kernels["add_rmsnorm"]["h_bit_exact"]
    )
    result["all_correct"] = correct
    result["add_rmsnorm_meets_target"] = kernels["add_rmsnorm"]["meets_target"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"add_rmsnorm {kernels['add_rmsnorm']['pct_of_copy_bandwidth']:.1f}% of copy bandwidth "
        f"(target {TARGET_PCT_OF_COPY:.0f}%): {'met' if result['add_rmsnorm_meets_target'] else 'NOT met'}; "
        f"all outputs within tolerance: {correct}; wrote {args.out}"
    )
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
