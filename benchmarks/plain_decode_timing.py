"""The decode step of examples/llama_decode.py timed with plain PyTorch: the reference for `gpuadvisor profile`.

    python3 benchmarks/plain_decode_timing.py      # on a CUDA GPU; writes benchmarks/results/plain_decode_timing.json

No gpuadvisor code: the example's build() is loaded with importlib, warmed up, and its default step
(``model(*inputs)``) timed with CUDA events the way `gpuadvisor profile` times (steps back to
back, a start and an end event around each, one synchronize at the end), with profile's defaults: at least 3 s of
warm-up, then at least 30 steps and at least 5 s of them. --synchronized-steps more are then timed with a
synchronize after each step, for comparison. `gpuadvisor profile examples/llama_decode.py` should report a
median within 5% of ``median_us``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import time
from pathlib import Path

from bench_common import load_example

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llama_decode.py"


def load_build(example: Path = EXAMPLE):
    return load_example(example).build


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def back_to_back(step, steps: int) -> list[float]:
    """Events around each step, steps queued back to back, one synchronize at the end (µs per step)."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends):
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]


def synchronized(step, steps: int) -> list[float]:
    """Events around each step and a synchronize after each (µs per step)."""
    import torch

    samples = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples


def summary(samples: list[float]) -> dict:
    return {
        "median_us": round(statistics.median(samples), 2),
        "p10_us": round(percentile(samples, 10), 2),
        "p90_us": round(percentile(samples, 90), 2),
        "samples_us": [round(s, 2) for s in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=EXAMPLE, help="another model.py (default: the decode example)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps, at least (default 30, as profile)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5, as profile)")
    parser.add_argument(
        "--warmup-s", type=float, default=3.0, help="then more untimed steps until this many seconds (default 3)"
    )
    parser.add_argument(
        "--min-time", type=float, default=5.0, help="time more steps when --steps take less (seconds, default 5)"
    )
    parser.add_argument("--synchronized-steps", type=int, default=100, help="steps timed with a sync after each")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "plain_decode_timing.json")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("plain_decode_timing: needs a CUDA GPU", file=sys.stderr)
        return 2
    example = args.example.resolve()
    model, inputs = load_build(example)()

    def step():
        return model(*inputs)

    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warmed = args.warmup
    while time.perf_counter() - started < args.warmup_s:
        step()
        warmed += 1
    torch.cuda.synchronize()
    pace = (time.perf_counter() - started) / max(warmed, 1)
    steps = max(args.steps, math.ceil(args.min_time / pace))
    queued = back_to_back(step, steps)
    synced = synchronized(step, args.synchronized_steps)
    result = {
        "command": " ".join(["python3", *sys.argv]),
        "gpu": torch.cuda.get_device_name(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "example": str(example.relative_to(ROOT)) if example.is_relative_to(ROOT) else str(example),
        "warmup_steps": warmed,
        "steps": steps,
        "method": "CUDA events around each step, steps back to back, one synchronize at the end (as profile)",
        **summary(queued),
        "synchronized_each_step": summary(synced),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['gpu']}: median {result['median_us']:,.1f} µs (p10 {result['p10_us']:,.1f}, p90 "
        f"{result['p90_us']:,.1f}); synchronized each step: median {result['synchronized_each_step']['median_us']:,.1f}"
        f" µs -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
