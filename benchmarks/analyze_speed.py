"""How fast `gpuadvisor analyze` is on a large trace.

Tiles a real trace (default: sample_traces/llama_decode.json.gz) end to end in time until the JSON reaches
--target-mb, shifting timestamps by the trace's span and offsetting correlation ids, External ids and
ProfilerStep numbers so the copies stay distinct steps. Then runs `python -m gpuadvisor analyze` on it in a
fresh process, --repeat times, and records wall time, CPU time (user + sys, less affected by other load on
the machine than wall time), the 1-minute load average before each run, and peak RSS (the analyze process's
plus its decode worker's, see run_once).

    python3 benchmarks/analyze_speed.py                 # writes benchmarks/results/analyze_speed.json
    python3 benchmarks/analyze_speed.py --trace other.json.gz --target-mb 450
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tile(source: Path, target_bytes: int, out: Path) -> dict:
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = (t1 - t0) * 1.01
    one = len(json.dumps(events).encode())
    copies = max(1, -(-target_bytes // one))
    max_corr = max((e.get("args", {}).get("correlation", 0) or 0) for e in events if isinstance(e.get("args"), dict))
    max_ext = max((e.get("args", {}).get("External id", 0) or 0) for e in events if isinstance(e.get("args"), dict))
    step_names = [e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps_per_copy = max(len(set(step_names)), 1)
    n_events = 0
    with open(out, "w") as f:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        first = True
        for c in range(copies):
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + c * span
                args = e2.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    if isinstance(args.get("correlation"), int):
                        args["correlation"] += c * (max_corr + 1)
                    if isinstance(args.get("External id"), int):
                        args["External id"] += c * (max_ext + 1)
                    e2["args"] = args
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] += c * (max_corr + 1)
                name = e2.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + c * steps_per_copy}"
                f.write(("" if first else ",\n") + json.dumps(e2))
                first = False
                n_events += 1
        f.write("\n]}\n")
    return {"copies": copies, "events": n_events, "bytes": out.stat().st_size}


def run_once(trace: Path) -> dict:
    """One analyze run in a fresh process: wall seconds, CPU seconds, peak RSS and exit code.

    The analyze process may fork one worker to decode half of the trace (gpuadvisor.trace.columns). Peak RSS
    is the sum of the analyze process's own peak (RUSAGE_SELF) and its worker's (RUSAGE_CHILDREN, printed by
    the analyze process itself after it reaped the worker; Linux gives the largest reaped descendant's peak
    there, which with one worker is that worker's). The sum is an upper bound on the peak of the two together:
    their peaks need not coincide, and pages they share after the fork count twice. CPU time (user + sys) is
    this script's RUSAGE_CHILDREN before and after the run: the analyze process plus its reaped worker.
    """
    code = (
        "import resource, runpy, sys;"
        "sys.argv=['gpuadvisor','analyze',sys.argv[1],'--format','json'];"
        "import gpuadvisor.cli as c\n"
        "try:\n c.main()\n"
        "except SystemExit as e:\n"
        " me, kids = (resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))\n"
        " print(me, kids, file=sys.stderr); raise\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, str(trace)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    self_kb, worker_kb = (int(v) for v in proc.stderr.strip().splitlines()[-1].split())
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "peak_rss_mb": round((self_kb + worker_kb) / 1024, 1),
        "peak_rss_parent_mb": round(self_kb / 1024, 1),
        "peak_rss_worker_mb": round(worker_kb / 1024, 1),
        "load_1min_before": round(load, 2),
        "exit_code": proc.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=ROOT / "sample_traces" / "llama_decode.json.gz")
    parser.add_argument("--target-mb", type=float, default=420.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "analyze_speed.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "tiled.json"
        info = tile(args.trace, int(args.target_mb * 1e6), big)
        print(f"tiled {args.trace.name} x{info['copies']}: {info['events']:,} events, {info['bytes'] / 1e6:.0f} MB")
        runs = [run_once(big) for _ in range(args.repeat)]
    for r in runs:
        print(
            f"analyze: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, {r['peak_rss_mb']:.0f} MB peak RSS "
            f"({r['peak_rss_parent_mb']:.0f} + worker {r['peak_rss_worker_mb']:.0f}), "
            f"load {r['load_1min_before']:.2f}, exit {r['exit_code']}"
        )
    result = {
        "command": "python3 benchmarks/analyze_speed.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "gpu": None,
        "source_trace": str(args.trace.relative_to(ROOT) if args.trace.is_relative_to(ROOT) else args.trace),
        "tiled": info,
        "runs": runs,
        "median_wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
        "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
        "max_peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
        "limits": {"wall_s": 6.0, "peak_rss_mb": 1536},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"median {result['median_wall_s']} s wall, {result['median_cpu_s']} s CPU, "
        f"max RSS {result['max_peak_rss_mb']} MB -> {args.out}"
    )


if __name__ == "__main__":
    main()
