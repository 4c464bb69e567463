"""Record the sample traces: a few profiled steps of each GPU example in examples/.

    python3 sample_traces/record.py                          # all four, into sample_traces/
    python3 sample_traces/record.py --only gemm --out /tmp/traces

Writes ``<example>.json.gz`` per example and ``recording.json`` (command, GPU, torch, date, and per
example the steps recorded; an entry recorded earlier with --only is kept). Each trace must stay
under 2 MB gzipped, so only 3 steps are recorded; the script exits with 1 when one is larger.
Without CUDA it records CPU-only traces of the examples' tiny CPU sizes (useful only to check this script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))  # the gpuadvisor of this checkout, installed or not

from gpuadvisor.capture.profiler import record_trace, warm_up  # noqa: E402
from gpuadvisor.workload import load_workload  # noqa: E402

MAX_TRACE_BYTES = 2 * 1024 * 1024
WARM_UP_STEPS = 3
EXAMPLES = ("llama_decode", "add_rmsnorm", "gemm", "input_pipeline")
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
# Python stacks give each operator its Python caller (`.item()` and `.to(device)` inside step() of
# input_pipeline.py; torch records the function's `def` line, not the line of the call). With them,
# 3 steps of llama_decode, the largest trace (436 kernels, 1852 operators per step), took 0.34 MB
# gzipped on the H200 (torch 2.11), so every example keeps them.
WITH_STACK = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the traces (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=EXAMPLES, metavar="NAME", help="record only these")
    args = parser.parse_args(argv)

    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    environment = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv] if argv is None else ["record.py", *argv]),
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if not cuda:
        print("no CUDA device: recording CPU-only traces of the tiny CPU sizes")

    recording_path = args.out / "recording.json"
    try:
        examples = json.loads(recording_path.read_text())["examples"]
    except (OSError, ValueError, KeyError, TypeError):
        examples = {}
    if not isinstance(examples, dict):
        examples = {}
    too_big = []
    for name in args.only or EXAMPLES:
        workload = load_workload(str(REPO / "examples" / f"{name}.py"))
        warm_up(workload, WARM_UP_STEPS)
        trace_path = record_trace(workload, args.out / f"{name}.json.gz", **SCHEDULE, with_stack=WITH_STACK)
        size = trace_path.stat().st_size
        del workload
        if cuda:
            torch.cuda.empty_cache()
        print(f"{trace_path}  {size / 1e6:.2f} MB  ({SCHEDULE['active']} steps)")
        if size > MAX_TRACE_BYTES:
            too_big.append(name)
        # Each entry says where and when it was recorded: --only re-records some traces and keeps the others.
        examples[name] = {
            "trace": trace_path.name,
            "bytes": size,
            "steps_recorded": SCHEDULE["active"],
            "schedule": SCHEDULE,
            "with_stack": WITH_STACK,
            "warm_up_steps": WARM_UP_STEPS,
            **{key: environment[key] for key in ("gpu", "torch", "date")},
        }

    recording = {**environment, "examples": dict(sorted(examples.items()))}
    _write_atomically(recording_path, json.dumps(recording, indent=2) + "\n")
    if too_big:
        print(f"over {MAX_TRACE_BYTES // 2**20} MB: {', '.join(too_big)}; record fewer steps or without stacks")
        return 1
    return 0


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
