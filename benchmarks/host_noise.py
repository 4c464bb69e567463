"""Where does the eager decode step's time vary: between processes, or over time inside one process?

    python3 benchmarks/host_noise.py --processes 6 --blocks 6     # on a CUDA GPU

The eager decode step of examples/llama_decode.py is bound by the host's launch rate, so its CUDA-event
median follows the CPU. This starts --processes fresh processes one after another; each warms up for
3 s, then times --blocks blocks of --steps steps (CUDA events, steps back to back, as `profile` and
benchmarks/plain_decode_timing.py time) with a pause between blocks. Around every block it also times a
fixed pure-Python loop (no CUDA) and reads the steal and idle counters of /proc/stat, so a slower block can
be told apart as a slower CPU (the loop slows too), a CPU taken by another tenant (steal rises) or
something on the CUDA path (neither moves). Writes benchmarks/results/host_noise.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_times() -> dict[str, int]:
    """System-wide jiffies from /proc/stat's first line (empty off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return {}
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    return dict(zip(names, map(int, fields)))


def python_loop_us() -> float:
    """Median of 5 runs of a fixed pure-Python loop: the interpreter's speed on this core right now."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i & 7
        runs.append((time.perf_counter() - start) * 1e6)
    return statistics.median(runs)


def loop_only(seconds: float) -> dict:
    """The pure-Python loop alone, no CUDA in this process, back to back for ``seconds``: is the CPU itself steady?"""
    runs, series = [], []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        runs.append(python_loop_us())
        series.append([round(time.time(), 3), round(runs[-1], 1)])  # wall clock: comparable across processes
    fast = min(runs)
    return {
        "seconds": seconds,
        "runs": len(runs),
        "fastest_us": round(fast, 1),
        "median_us": round(statistics.median(runs), 1),
        "slowest_us": round(max(runs), 1),
        "share_over_1_5x_fastest": round(sum(r > 1.5 * fast for r in runs) / len(runs), 3),
        "cpus": sorted(os.sched_getaffinity(0)),
        "series_unix_s_us": series,
    }


def child(args: argparse.Namespace) -> None:
    import torch
    from plain_decode_timing import load_build  # this file's folder is on sys.path when run as a script

    model, inputs = load_build()()

    def step():
        return model(*inputs)

    deadline = time.perf_counter() + 3.0
    while time.perf_counter() < deadline:
        step()
    torch.cuda.synchronize()
    blocks = []
    for _ in range(args.blocks):
        before = cpu_times()
        loop_before = python_loop_us()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        host_start = time.perf_counter()
        for start, end in zip(starts, ends):
            start.record()
            step()
            end.record()
        host_us = (time.perf_counter() - host_start) * 1e6 / args.steps
        torch.cuda.synchronize()
        loop_after = python_loop_us()
        after = cpu_times()
        delta = {k: after[k] - before.get(k, 0) for k in after}
        busy = sum(delta.values()) or 1
        blocks.append(
            {
                "median_us": round(statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)), 1),
                "host_launch_us_per_step": round(host_us, 1),
                "python_loop_us": round((loop_before + loop_after) / 2, 1),
                "steal_pct": round(100 * delta.get("steal", 0) / busy, 2),
                "idle_pct": round(100 * delta.get("idle", 0) / busy, 1),
            }
        )
        time.sleep(args.pause)
    print(json.dumps({"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)), "blocks": blocks}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between blocks")
    parser.add_argument("--cores", default="", help="taskset core list for the children ('' for none)")
    parser.add_argument(
        "--loop-only", type=float, default=0, help="only time the Python loop for this many seconds, no CUDA"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "host_noise.json")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if args.loop_only:
        result = {
            "command": "python3 benchmarks/host_noise.py " + " ".join(sys.argv[1:]),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "loop_only": loop_only(args.loop_only),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0
    runs = []
    for i in range(args.processes):
        cmd = [sys.executable, __file__, "--child", "--blocks", str(args.blocks), "--steps", str(args.steps)]
        cmd += ["--pause", str(args.pause)]
        if args.cores:
            cmd = ["taskset", "-c", args.cores, *cmd]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        medians = [b["median_us"] for b in run["blocks"]]
        run["process_median_us"] = statistics.median(medians)
        run["block_spread_pct"] = round(100 * (max(medians) - min(medians)) / min(medians), 1)
        runs.append(run)
        print(f"process {i}: blocks {medians}", flush=True)
    per_process = [r["process_median_us"] for r in runs]
    import torch

    result = {
        "command": "python3 benchmarks/host_noise.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": __doc__.split("\n\n")[2].replace("\n", " "),
        "between_process_spread_pct": round(100 * (max(per_process) - min(per_process)) / min(per_process), 1),
        "within_process_spread_pct_median": statistics.median(r["block_spread_pct"] for r in runs),
        "processes": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "processes"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
