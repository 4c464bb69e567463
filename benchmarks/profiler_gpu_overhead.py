"""Are steps slower on the GPU under torch.profiler, or do the clocks move? One process, three phases.

    python3 benchmarks/profiler_gpu_overhead.py [--model examples/ddp_train.py] [--out FILE]

After a 3 s warm-up: 30 steps timed with CUDA events (no profiler), 5 steps under torch.profiler (CPU + CUDA
activities, shapes, FLOPs, stacks: what `gpuadvisor profile` records) each timed with the same CUDA events,
then 30 more steps without the profiler. NVML's SM clock is read after each phase. If the profiled steps are
slower while the last phase is back to the first's pace, the profiler costs GPU time; if the last phase is as
slow, the clocks moved.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "examples" / "ddp_train.py"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "profiler_gpu_overhead.json")
    args = parser.parse_args()

    import pynvml
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpuadvisor.workload import load_workload

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def sm_mhz() -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)

    workload = load_workload(args.model)
    start = time.perf_counter()
    while time.perf_counter() - start < 3.0:
        workload.step_fn()
        torch.cuda.synchronize()

    def timed(steps: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for begin, end in events:
            begin.record()
            workload.step_fn()
            end.record()
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) * 1e3 for begin, end in events]

    phases = {}
    phases["before"] = {"samples_us": timed(30), "sm_mhz_after": sm_mhz()}
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_flops=True, with_stack=True
    ) as prof:
        profiled = timed(5)
    phases["profiled"] = {"samples_us": profiled, "sm_mhz_after": sm_mhz()}
    # What the trace says about the same 5 steps: GPU activity time, from the first activity's start to the last
    # one's end, and summed, against the 5 CUDA-event intervals.
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if kernels:
        first = min(e.time_range.start for e in kernels)
        last = max(e.time_range.end for e in kernels)
        phases["profiled"]["trace_gpu_span_us"] = round(last - first, 1)
        phases["profiled"]["trace_gpu_sum_us"] = round(sum(e.time_range.end - e.time_range.start for e in kernels), 1)
        phases["profiled"]["events_sum_us"] = round(sum(profiled), 1)
    phases["after"] = {"samples_us": timed(30), "sm_mhz_after": sm_mhz()}
    for phase in phases.values():
        phase["median_us"] = round(statistics.median(phase["samples_us"]), 1)
        phase["samples_us"] = [round(x, 1) for x in phase["samples_us"]]
    result = {
        "command": "python3 " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "model": args.model,
        "phases": phases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print({name: (p["median_us"], p["sm_mhz_after"]) for name, p in phases.items()})
    print({k: v for k, v in phases["profiled"].items() if k != "samples_us"})


if __name__ == "__main__":
    main()
