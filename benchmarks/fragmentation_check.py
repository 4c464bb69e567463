"""Reserved vs allocated memory of a fragmenting workload, with and without expandable segments (GA601's fix).

Runs ``examples/variable_batches.py`` (or --model) in two fresh processes, one per allocator setting
(``PYTORCH_CUDA_ALLOC_CONF`` unset, then ``expandable_segments:True``): warm-up steps, then timed steps with
CUDA events, then the allocator's peak statistics. Writes one JSON with the command, GPU, date and per setting:
allocated and reserved peaks, reserved minus allocated, retries, cudaMalloc calls and the median step time.

Usage (GPU): ``python3 benchmarks/fragmentation_check.py --out benchmarks/results/fragmentation_check.json``
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"default": None, "expandable_segments": "expandable_segments:True"}

CHILD = r"""
import json, statistics, sys
sys.path.insert(0, {root!r})
import torch
from gpuadvisor.workload import load_workload
w = load_workload({model!r})
for _ in range({warmup}):
    w.step_fn()
torch.cuda.synchronize()
times = []
for _ in range({steps}):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); w.step_fn(); b.record(); b.synchronize()
    times.append(a.elapsed_time(b) * 1000.0)
s = torch.cuda.memory_stats()
print(json.dumps({{
    "allocated_peak_bytes": s.get("allocated_bytes.all.peak"),
    "reserved_peak_bytes": s.get("reserved_bytes.all.peak"),
    "reserved_now_bytes": s.get("reserved_bytes.all.current"),
    "num_alloc_retries": s.get("num_alloc_retries"),
    "segments_allocated": s.get("segment.all.allocated"),
    "step_us_median": statistics.median(times),
    "steps": len(times),
}}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "examples" / "variable_batches.py"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    result = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "command": "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]),
        "model": os.path.relpath(args.model, ROOT),
        "method": "one fresh process per setting; warm-up steps, then CUDA-event timed steps; peaks from "
        "torch.cuda.memory_stats() at the end",
        "settings": {},
    }
    for name, conf in SETTINGS.items():
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        code = CHILD.format(root=str(ROOT), model=args.model, warmup=args.warmup, steps=args.steps)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            result["settings"][name] = {"error": done.stderr[-2000:]}
            continue
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["PYTORCH_CUDA_ALLOC_CONF"] = conf
        if figures["allocated_peak_bytes"] is not None and figures["reserved_peak_bytes"]:
            slack = figures["reserved_peak_bytes"] - figures["allocated_peak_bytes"]
            figures["reserved_minus_allocated_peak_bytes"] = slack
            figures["fragmentation_pct"] = round(100.0 * slack / figures["reserved_peak_bytes"], 2)
        result["settings"][name] = figures
        print(name, json.dumps(figures), flush=True)
    base, exp = result["settings"].get("default", {}), result["settings"].get("expandable_segments", {})
    if base.get("reserved_peak_bytes") and exp.get("reserved_peak_bytes"):
        result["reserved_peak_ratio"] = round(exp["reserved_peak_bytes"] / base["reserved_peak_bytes"], 4)
        result["step_time_ratio"] = round(exp["step_us_median"] / base["step_us_median"], 4)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
