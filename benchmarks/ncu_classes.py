"""Nsight Compute's Speed-of-Light figures for every kernel of sample workloads (H200 ground truth).

For each workload behind a committed sample trace (by default the four examples
``examples/{gemm,add_rmsnorm,input_pipeline,llama_decode}.py``; a name that is not in ``examples/`` is looked up
in the real-model suite, ``examples/real/NAME.py``, whose traces are ``sample_traces/real/NAME.json.gz``) this
runs one step under::

    ncu --clock-control none --profile-from-start off --csv --print-units base --metrics <SOL metrics>
        python -m gpuadvisor.ncu.child examples/[real/]NAME.py --warmup W --steps 1

and keeps the raw CSV, gzipped, as ``OUT/NAME.csv.gz`` beside a JSON index (``OUT/index.json``, merged with what
is there) with the command, GPU and date. ``tests/test_ncu_classes.py`` reads those files on any machine and checks the
class gpuadvisor gives each kernel of the workload's sample trace against ncu's verdict (gpuadvisor/ncu/sol.py
says how a verdict is read off the Speed-of-Light figures).

Usage (on the GPU machine): ``python3 benchmarks/ncu_classes.py --out benchmarks/results/ncu_classes``;
the suite's decode, prefill, conv training and attention-heavy steps:
``--workloads hf_llama_decode,hf_llama_prefill,timm_resnet50_train,hf_gpt2_eager_attention``
(``--launch-count`` must cover one step: 737 kernels for the ResNet-50 training step). hf_llama_prefill has no
committed trace yet: ``bash sample_traces/record_real.sh OUT hf_llama_prefill`` records it in the same call.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
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


def workload_file(name: str) -> Path:
    """The model file behind a workload name: ``examples/NAME.py``, else the suite's ``examples/real/NAME.py``."""
    for path in (ROOT / "examples" / f"{name}.py", ROOT / "examples" / "real" / f"{name}.py"):
        if path.is_file():
            return path
    raise SystemExit(f"{name}: no examples/{name}.py or examples/real/{name}.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--launch-count", type=int, default=1000)
    parser.add_argument("--timeout-s", type=float, default=240)
    args = parser.parse_args(argv)
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu is not on PATH", file=sys.stderr)
        return 2
    files = {name: workload_file(name) for name in args.workloads.split(",")}
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
    run = {
        "gpu": gpu,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ncu": version[-1] if version else None,
    }
    index_path = args.out / "index.json"
    # Workloads recorded by an earlier run stay, each with the GPU, date and ncu of its own run.
    earlier = json.loads(index_path.read_text()) if index_path.is_file() else {}
    workloads = earlier.get("workloads", {})
    for entry in workloads.values():
        for key in run:
            entry.setdefault(key, earlier.get(key))
    index = {**run, "metrics": list(SOL_METRICS.values()), "workloads": workloads}
    for name, path in files.items():
        csv_path = args.out / f"{name}.csv"
        command = ncu_command(
            path,
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
        if csv_path.is_file():  # kept compressed, as tests/test_ncu_classes.py reads it
            with csv_path.open("rb") as raw, gzip.open(csv_path.with_name(csv_path.name + ".gz"), "wb") as packed:
                shutil.copyfileobj(raw, packed)
            csv_path.unlink()
        shown = [part if not part.startswith(str(ROOT)) else part[len(str(ROOT)) + 1 :] for part in command]
        shown[0] = "ncu"
        shown[shown.index(sys.executable)] = "python3"
        index["workloads"][name] = {
            **run,
            "command": " ".join(shown),
            "rc": rc,
            "seconds": round(time.monotonic() - started, 1),
            "csv": csv_path.name + ".gz",
            "log_tail": tail if rc else None,
        }
        print(f"{name}: rc {rc} in {index['workloads'][name]['seconds']} s", flush=True)
        # Written after every workload, so a run cut short keeps what it finished.
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
