"""Nsight Compute's Speed-of-Light figures for every kernel of the four sample workloads (H200 ground truth).

For each example behind a committed sample trace (``examples/{gemm,add_rmsnorm,input_pipeline,llama_decode}.py``)
this runs one step under::

    ncu --clock-control none --profile-from-start off --csv --print-units base --metrics <SOL metrics>
        python -m gpuadvisor.ncu.child examples/NAME.py --warmup W --steps 1

and keeps the raw CSV as ``benchmarks/results/ncu_classes/NAME.csv`` beside a JSON index with the command, GPU
and date. ``tests/test_ncu_classes.py`` reads those files on any machine and checks the class gpuadvisor gives
each kernel of ``sample_traces/NAME.json.gz`` against ncu's verdict (gpuadvisor/ncu/sol.py says how a verdict is
read off the Speed-of-Light figures).

Usage (on the GPU machine): ``python3 benchmarks/ncu_classes.py --out benchmarks/results/ncu_classes``
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuadvisor.ncu.run import ncu_command  # noqa: E402
from gpuadvisor.ncu.sol import SOL_METRICS  # noqa: E402

WORKLOADS = ("gemm", "add_rmsnorm", "input_pipeline", "llama_decode")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--launch-count", type=int, default=600)
    parser.add_argument("--timeout-s", type=float, default=240)
    args = parser.parse_args(argv)
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu is not on PATH", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = None
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    index = {
        "gpu": gpu,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ncu": version[-1] if version else None,
        "metrics": list(SOL_METRICS.values()),
        "workloads": {},
    }
    for name in args.workloads.split(","):
        csv_path = args.out / f"{name}.csv"
        command = ncu_command(
            ROOT / "examples" / f"{name}.py",
            csv_path,
            warmup=args.warmup,
            steps=1,
            launch_count=args.launch_count,
            kernel_regex=None,
            entry=None,
            metrics=list(SOL_METRICS.values()),
        )
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s, cwd=ROOT)
            rc, tail = done.returncode, (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            rc, tail = 124, "timed out"
        shown = [part if not part.startswith(str(ROOT)) else part[len(str(ROOT)) + 1 :] for part in command]
        shown[0] = "ncu"
        shown[shown.index(sys.executable)] = "python3"
        index["workloads"][name] = {
            "command": " ".join(shown),
            "rc": rc,
            "seconds": round(time.monotonic() - started, 1),
            "csv": csv_path.name,
            "log_tail": tail if rc else None,
        }
        print(f"{name}: rc {rc} in {index['workloads'][name]['seconds']} s", flush=True)
    (args.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
