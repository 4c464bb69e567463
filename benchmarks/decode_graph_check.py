"""Check GA101's prediction on the decode sample: eager step vs the same step replayed as one CUDA graph.

    python3 benchmarks/decode_graph_check.py          # on a CUDA GPU; writes benchmarks/results/decode_graph_check.json

Times examples/llama_decode.py's step with CUDA events (no profiler), after warm-up, median of --steps runs,
eager and captured in one graph in the same process, and checks the graph's logits equal eager's. It also
runs `gpuadvisor analyze` on sample_traces/llama_decode.json.gz and records GA101's predicted step time with
a graph (GPU busy time from the trace + 0.33 µs per kernel) beside the measured one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def time_steps(fn, steps: int) -> list[float]:
    import torch

    samples = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "decode_graph_check.json")
    args = parser.parse_args()

    import torch

    from gpuadvisor.pipeline import analyze_path
    from gpuadvisor.workload import load_workload

    workload = load_workload(str(ROOT / "examples" / "llama_decode.py"))
    model, inputs = workload.model, workload.inputs
    with torch.no_grad():
        for _ in range(10):
            eager_out = model(*inputs)
        torch.cuda.synchronize()
        eager = time_steps(lambda: model(*inputs), args.steps)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(*inputs)
        graph.replay()
        torch.cuda.synchronize()
        reference = model(*inputs)
        graph.replay()
        torch.cuda.synchronize()
        max_abs_diff = float((static_out.float() - reference.float()).abs().max())
        for _ in range(10):
            graph.replay()
        replay = time_steps(graph.replay, args.steps)
    del eager_out

    report = analyze_path(ROOT / "sample_traces" / "llama_decode.json.gz")
    ga101 = next(f for f in report["findings"] if f["rule_id"] == "GA101")
    predicted = ga101["evidence"]["predicted_step_us_with_graph"]
    eager_median, graph_median = statistics.median(eager), statistics.median(replay)
    result = {
        "command": "python3 benchmarks/decode_graph_check.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": f"CUDA events per step, median of {args.steps} after warm-up, no profiler, same process",
        "eager_us": {
            "median": round(eager_median, 1),
            "p10": round(statistics.quantiles(eager, n=10)[0], 1),
            "p90": round(statistics.quantiles(eager, n=10)[-1], 1),
        },
        "graph_us": {
            "median": round(graph_median, 1),
            "p10": round(statistics.quantiles(replay, n=10)[0], 1),
            "p90": round(statistics.quantiles(replay, n=10)[-1], 1),
        },
        "graph_max_abs_diff_vs_eager": max_abs_diff,
        "speedup": round(eager_median / graph_median, 2),
        "ga101_predicted_graph_step_us": predicted,
        "prediction_error_pct": round(100 * (predicted - graph_median) / graph_median, 1),
        "trace_gpu_busy_us": report["summary"]["gpu_busy_us"],
        "trace_kernels_per_step": report["summary"]["kernels_per_step"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
