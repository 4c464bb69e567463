"""Check `gpuadvisor calibrate` against the H200 ceilings in GPU.md, and its one-minute budget.

    python3 benchmarks/calibrate_check.py      # on a CUDA GPU; writes benchmarks/results/calibrate_check.json

Runs run_calibration(force=True) (measures again, rewrites the cache) in this process, timing the whole
call (torch import and CUDA start included), and writes the measured roofs beside the reference values
measured on the H200 before calibrate existed (GPU.md: 4.24 TB/s device copy, bytes read + written;
786 TFLOP/s bf16 GEMM 8192³; 1451 TFLOP/s fp8 e4m3 GEMM 8192³) with the % difference.
Acceptance: copy and bf16 within 10% of the reference, the whole calibration under 60 s.

Then, after the calibration, it records why calibrate takes GEMM roofs from short bursts: bf16 8192³ GEMMs
queued back to back for --sustained-s seconds, the rate per 100 ms window beside NVML's SM clock and power
(the card reaches its power limit and the clocks come down). --sustained-s 0 leaves that out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# GPU.md, "Ceilings measured there" (NVIDIA H200, torch 2.11, 2026-11-29).
REFERENCE = {
    "hbm_bytes_per_s": 4.24e12,
    "flops_per_s.bf16": 786e12,
    "flops_per_s.fp8": 1451e12,
}
TOLERANCE_PCT = 10.0
BUDGET_S = 60.0


def _measured(result: dict, key: str) -> float | None:
    if key.startswith("flops_per_s."):
        return (result.get("flops_per_s") or {}).get(key.split(".", 1)[1])
    return result.get(key)


def sustained_bf16(seconds: float, n: int = 8192, window_ms: float = 100.0) -> dict:
    """bf16 n³ GEMMs back to back for ``seconds`` after 1 s idle: TFLOP/s per window, with NVML clocks/power."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.matmul(a, b, out=out)
    end.record()
    end.synchronize()
    calls = max(10, int(seconds * 1e3 / start.elapsed_time(end)))

    nvml_samples: list[tuple[float, int, float]] = []
    stop = threading.Event()

    def sample_nvml() -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            t0 = time.perf_counter()
            while not stop.is_set():
                clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                power_w = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
                nvml_samples.append((round(time.perf_counter() - t0, 3), clock, round(power_w, 1)))
                time.sleep(0.02)
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - the diagnostic works without NVML
            nvml_samples.append((-1.0, -1, -1.0))
            print(f"NVML sampling failed: {exc}")

    time.sleep(1.0)
    thread = threading.Thread(target=sample_nvml, daemon=True)
    thread.start()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for first, last in events:
        first.record()
        torch.matmul(a, b, out=out)
        last.record()
    torch.cuda.synchronize()
    stop.set()
    thread.join(timeout=5)

    times_ms = [first.elapsed_time(last) for first, last in events]
    flop = 2.0 * n**3
    windows, elapsed, bucket = [], 0.0, []
    for ms in times_ms:
        bucket.append(ms)
        elapsed += ms
        if sum(bucket) >= window_ms:
            windows.append({"end_ms": round(elapsed, 1), "tflops": round(flop / (statistics.median(bucket) * 1e9), 1)})
            bucket = []
    return {
        "what": f"torch.matmul bf16 {n}x{n}x{n}, {calls} calls back to back after 1 s idle",
        "calls": calls,
        "first_10_calls_tflops": round(flop / (statistics.median(times_ms[:10]) * 1e9), 1),
        "median_tflops": round(flop / (statistics.median(times_ms) * 1e9), 1),
        "last_10pct_tflops": round(flop / (statistics.median(times_ms[-max(1, calls // 10) :]) * 1e9), 1),
        "windows": windows,
        "nvml_time_s_sm_mhz_power_w": nvml_samples[:: max(1, len(nvml_samples) // 100)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "calibrate_check.json")
    parser.add_argument("--sustained-s", type=float, default=1.5, help="seconds of back-to-back bf16 GEMMs; 0: none")
    args = parser.parse_args()

    from gpuadvisor.device.calibrate import run_calibration

    started = time.perf_counter()
    result = run_calibration(force=True, progress=False)
    wall_s = time.perf_counter() - started

    comparison = {}
    for key, reference in REFERENCE.items():
        measured = _measured(result, key)
        diff = None if measured is None else 100.0 * (measured - reference) / reference
        comparison[key] = {
            "measured": measured,
            "reference": reference,
            "diff_pct": None if diff is None else round(diff, 2),
            "within_tolerance": None if diff is None else abs(diff) <= TOLERANCE_PCT,
        }
    accepted = (
        bool(comparison["hbm_bytes_per_s"]["within_tolerance"])
        and bool(comparison["flops_per_s.bf16"]["within_tolerance"])
        and wall_s < BUDGET_S
    )
    doc = {
        "command": "python3 benchmarks/calibrate_check.py " + " ".join(sys.argv[1:]),
        "gpu": result.get("gpu"),
        "driver": result.get("driver"),
        "cuda": result.get("cuda"),
        "torch": result.get("torch"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "reference_source": "GPU.md, ceilings measured on the H200 (device copy, torch bf16 / fp8 GEMM 8192^3)",
        "tolerance_pct": TOLERANCE_PCT,
        "budget_s": BUDGET_S,
        "calibrate_wall_s": round(wall_s, 2),
        "accepted": accepted,
        "comparison": comparison,
        "calibration": result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")  # kept if the diagnostic fails
    if args.sustained_s > 0:
        try:
            doc["sustained_bf16"] = sustained_bf16(args.sustained_s)
        except Exception as exc:  # noqa: BLE001 - the calibration above is the result; this only explains it
            doc["sustained_bf16"] = {"error": f"{type(exc).__name__}: {exc}"}
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")

    env = f"driver {result.get('driver')} · CUDA {result.get('cuda')} · torch {result.get('torch')}"
    print(f"{result.get('gpu')} · {env}")
    print(f"calibrate took {wall_s:.1f} s (budget {BUDGET_S:g} s)")
    for key, row in comparison.items():
        measured = "skipped" if row["measured"] is None else f"{row['measured'] / 1e12:8.2f}"
        diff = "" if row["diff_pct"] is None else f"{row['diff_pct']:+.1f}%"
        print(f"{key:22s} measured {measured} T/s  reference {row['reference'] / 1e12:8.2f} T/s  {diff}")
    for key in ("host_to_device_bytes_per_s", "device_to_host_bytes_per_s"):
        value = result.get(key)
        print(f"{key:28s} {'skipped' if value is None else f'{value / 1e9:.1f} GB/s'}")
    for key, value in (result.get("flops_per_s") or {}).items():
        spread = result["stats"]["flops_per_s"][key]["spread_pct"]
        print(f"GEMM {key:5s} {value / 1e12:8.1f} TFLOP/s  (spread p10-p90 {spread:.1f}%)")
    for key, reason in (result.get("skipped") or {}).items():
        print(f"skipped {key}: {reason}")
    for key, value in (result.get("stats") or {}).get("flops_per_s", {}).items():
        bursts = ", ".join(f"{rate / 1e12:.0f}" for rate in value.get("burst_medians", []))
        print(f"GEMM {key:5s} burst medians: {bursts} TFLOP/s")
    sustained = doc.get("sustained_bf16")
    if sustained and "error" not in sustained:
        print(
            f"sustained bf16: first 10 calls {sustained['first_10_calls_tflops']}, "
            f"median {sustained['median_tflops']}, last 10% {sustained['last_10pct_tflops']} TFLOP/s "
            f"over {sustained['calls']} calls"
        )
        print("  windows:", " ".join(str(w["tflops"]) for w in sustained["windows"]))
        print("  nvml (s, MHz, W):", sustained["nvml_time_s_sm_mhz_power_w"][::5])
    elif sustained:
        print(f"sustained bf16: {sustained['error']}")
    print(f"accepted: {accepted}; wrote {args.out}")


if __name__ == "__main__":
    main()
