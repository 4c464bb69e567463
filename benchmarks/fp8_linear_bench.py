"""Where an FP8 linear pays on this GPU: bf16 ``F.linear`` vs the ``fp8`` fix's layer, by rows and weight size.

    python3 benchmarks/fp8_linear_bench.py        # on a CUDA GPU; writes benchmarks/results/fp8_linear_bench.json

For each weight shape (N, K) and row count M: the bf16 layer (cuBLAS, or the decode-shape Triton kernel
at M <= 16 as the ``fusion`` fix runs it) against the ``fp8`` fix's DecodeLinear (FP8 weight with per-row
scales: the Triton kernel at M <= 16, per-row activation quantization + ``torch._scaled_mm`` above),
20 calls captured in one CUDA graph (no Python launch cost, as in a graphed step), median of 30 replays,
random normal data. Rows M <= 16 take the decode kernel and are timed by benchmarks/decode_linear_bench.py.
The fix's thresholds (gpuadvisor/fixes/fp8.py) cite this file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [(2048, 2048), (6144, 2048), (5632, 2048), (2048, 5632), (4096, 4096), (32000, 2048), (1024, 1024)]
ROWS = [64, 256, 1024, 4096]  # M <= 16 runs the decode kernel: benchmarks/decode_linear_bench.py


def median_us(fn, replays: int = 30, calls: int = 20) -> float:
    """Median time of one call: ``calls`` calls captured in one CUDA graph (no Python launch cost in the
    figure, as in a graphed step), each replay timed with CUDA events, median over ``replays``, / calls."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def measure(torch, x, weight, bf16, fp8, n: int, k: int, m: int) -> dict:
    cublas_us = median_us(lambda: torch.nn.functional.linear(x, weight))
    bf16_us = median_us(lambda: bf16(x))
    fp8_us = median_us(lambda: fp8(x))
    ref = torch.nn.functional.linear(x.float(), weight.float())
    err = fp8(x).float() - ref
    sqnr_db = float(10 * torch.log10(ref.pow(2).sum() / err.pow(2).sum()))
    return {
        "n": n,
        "k": k,
        "m": m,
        "cublas_bf16_us": round(cublas_us, 2),
        "fix_bf16_us": round(bf16_us, 2),
        "fix_fp8_us": round(fp8_us, 2),
        "fp8_speedup_vs_best_bf16": round(min(cublas_us, bf16_us) / fp8_us, 2),
        "fp8_sqnr_db": round(sqnr_db, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fp8_linear_bench.json")
    args = parser.parse_args()

    import torch
    import triton

    from gpuadvisor.fixes.modules import DecodeLinear

    torch.manual_seed(0)
    rows_out = []
    with torch.no_grad():
        for n, k in SHAPES:
            weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            bf16 = DecodeLinear(weight.clone(), None)
            fp8 = DecodeLinear(weight.clone(), None)
            fp8.to_fp8()
            for m in ROWS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                try:
                    entry = measure(torch, x, weight, bf16, fp8, n, k, m)
                except Exception as error:  # record it and go on: one failing shape must not lose the rest
                    entry = {"n": n, "k": k, "m": m, "error": f"{type(error).__name__}: {error}"[:300]}
                rows_out.append(entry)
                print(json.dumps(entry), flush=True)
            del weight, bf16, fp8
    result = {
        "command": "python3 " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "method": "20 calls captured in one CUDA graph, CUDA events around each replay, median of 30 replays / 20; "
        "bf16 random normal data",
        "rows": rows_out,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
