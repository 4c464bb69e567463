"""Does `gpuadvisor profile`'s timing phase itself slow the step? Measured in one process, interleaved.

    python3 benchmarks/timing_overhead.py --rounds 30     # on a CUDA GPU

Comparing `profile` with a separate plain script means comparing two processes, and on a host whose CPU
speed wanders (benchmarks/results/host_noise.json) two processes disagree by more than the tools do. This
compares the ways of timing inside one process, on one model, block after block, so that adjacent blocks
share the host's state: ``plain`` is the loop of benchmarks/plain_decode_timing.py (``model(*inputs)``
between two CUDA events); ``tool`` is what the timing phase of `profile` runs (the loaded workload's step
through profile's step runner, gpuadvisor.capture.timing.time_steps); ``tool+nvml`` is the same with the
NVML sampler thread running, as in `profile` (``tool+nvml@100ms``: sampling every 100 ms instead). Each
round runs the variants in a rotating order, --steps steps each. Reported: each variant's median of block
medians and the median ratio of each to the ``plain`` block of the same round, with a bootstrap 95% interval. Writes
benchmarks/results/timing_overhead.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

VARIANTS = ("plain", "tool", "tool+nvml", "tool+nvml@100ms")


def bootstrap_median_ci(values: list[float], rounds: int = 5000) -> tuple[float, float]:
    import inspect

    import numpy as np
    from scipy import stats

    seed = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    result = stats.bootstrap(
        (np.asarray(values),), np.median, n_resamples=rounds, confidence_level=0.95, method="percentile", **{seed: 0}
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=100, help="steps per block")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "timing_overhead.json")
    args = parser.parse_args()

    import torch
    from plain_decode_timing import back_to_back

    from gpuadvisor.capture.nvml import DEFAULT_INTERVAL_S, open_sampler
    from gpuadvisor.capture.timing import time_steps
    from gpuadvisor.steps import step_runner
    from gpuadvisor.workload import load_workload

    if not torch.cuda.is_available():
        print("timing_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    workload = load_workload(str(ROOT / "examples" / "llama_decode.py"))
    model, inputs = workload.model, workload.inputs
    run_step = step_runner(workload.step_fn)

    def plain() -> float:
        return statistics.median(back_to_back(lambda: model(*inputs), args.steps))

    def tool() -> float:
        return time_steps(lambda i: run_step("timing", i, args.steps), args.steps, cuda=True).median_us

    def tool_nvml(interval_s: float = DEFAULT_INTERVAL_S) -> float:
        sampler, reason = open_sampler(torch.cuda.current_device(), interval_s=interval_s)
        if sampler is None:
            raise SystemExit(f"timing_overhead: NVML unavailable: {reason}")
        sampler.start()
        try:
            return tool()
        finally:
            sampler.stop()

    runs = {"plain": plain, "tool": tool, "tool+nvml": tool_nvml, "tool+nvml@100ms": lambda: tool_nvml(0.1)}
    deadline = time.perf_counter() + 3.0
    while time.perf_counter() < deadline:
        model(*inputs)
    torch.cuda.synchronize()
    blocks: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for t in range(args.rounds):
        order = VARIANTS[t % len(VARIANTS) :] + VARIANTS[: t % len(VARIANTS)]
        for variant in order:
            blocks[variant].append(round(runs[variant](), 1))
    ratios = {v: [b / p for b, p in zip(blocks[v], blocks["plain"])] for v in VARIANTS if v != "plain"}
    result = {
        "command": "python3 benchmarks/timing_overhead.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": " ".join(__doc__.split("\n\n")[2].split()),
        "steps_per_block": args.steps,
        "median_of_block_medians_us": {v: round(statistics.median(blocks[v]), 1) for v in VARIANTS},
        "ratio_to_plain_same_round": {
            v: {
                "median": round(statistics.median(r), 4),
                "ci95": [round(x, 4) for x in bootstrap_median_ci(r)],
            }
            for v, r in ratios.items()
        },
        "block_medians_us": blocks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "block_medians_us"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
