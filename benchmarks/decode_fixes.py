"""The decode example under each fix, torch.compile and the memory floor, timed in one run.

    python3 benchmarks/decode_fixes.py            # on a CUDA GPU; writes benchmarks/results/decode_fixes.json

Rows: eager; ``apply`` graphs; graphs+fusion; graphs+fusion+fp8 (each through
``gpuadvisor.fixes.registry.apply_fixes`` with its numerics guard); torch.compile reduce-overhead and
max-autotune (judged by the same guard, "model" policy); and the memory floor: bytes one step must read
(every weight but the embedding table, of which one row is read, plus the whole KV cache) over the copy
bandwidth measured in this run.

Timing: CUDA events around each step, steps back to back (gpuadvisor.capture.timing), after warm-up, no
profiler; the rows are timed in interleaved rounds (every row once per round, the order rotating) so a
drift of clocks or of the host hits them alike. The JSON is rewritten after each row, so a run cut short
still leaves what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIX_ROWS = {
    "graphs": ["graphs"],
    "graphs+fusion": ["fusion", "graphs"],
    "graphs+fusion+fp8": ["fusion", "fp8", "graphs"],
}
COMPILE_ROWS = {"compile reduce-overhead": "reduce-overhead", "compile max-autotune": "max-autotune"}


def copy_bandwidth_bytes_per_s(torch) -> float:
    """Device-to-device copy of 1 GiB, bytes read + written over the median of 20 timed copies."""
    src = torch.randn(256 * 1024 * 1024, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * 256 * 1024 * 1024 * 4 / statistics.median(samples)


def bytes_read_per_step(model) -> int:
    """Weights (the embedding table counts one row: one token) plus every buffer (KV caches, rotary table)."""
    from torch import nn

    total = 0
    for module in model.modules():
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if isinstance(module, nn.Embedding) and name == "weight":
                total += tensor.shape[1] * tensor.element_size()
            elif "mask" not in name:  # the bool causal mask: one row of it is read
                total += tensor.numel() * tensor.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "decode_fixes.json")
    args = parser.parse_args()

    import torch
    import triton

    from gpuadvisor.capture.timing import time_steps
    from gpuadvisor.fixes.numerics import check_numerics
    from gpuadvisor.fixes.registry import apply_fixes
    from gpuadvisor.workload import load_workload

    started = time.perf_counter()
    result: dict = {
        "command": "python3 " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "model": "examples/llama_decode.py (8 layers, d=2048, MLP 5632, vocab 32000, bf16, batch 1, "
        "1024-slot KV cache)",
        "method": f"CUDA events per step, steps back to back, {args.rounds} interleaved rounds x {args.steps} steps "
        "per row after warm-up; median over all samples of a row",
        "rows": {},
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    bandwidth = copy_bandwidth_bytes_per_s(torch)
    workload = load_workload(str(ROOT / "examples" / "llama_decode.py"))
    step_bytes = bytes_read_per_step(workload.model)
    result["copy_bandwidth_tb_per_s"] = round(bandwidth / 1e12, 3)
    result["bytes_read_per_step"] = step_bytes
    result["floor_us"] = round(step_bytes / bandwidth * 1e6, 1)
    result["parameters"] = sum(p.numel() for p in workload.model.parameters())
    save()

    variants: dict[str, object] = {"eager": workload}
    torch.set_grad_enabled(False)
    for row, fix_ids in FIX_ROWS.items():
        t0 = time.perf_counter()
        patched, outcomes = apply_fixes(workload, fix_ids)
        statuses = {o.fix_id: o.status for o in outcomes}
        result["rows"][row] = {
            "fixes": [o.to_dict() for o in outcomes],
            "all_applied": all(s == "applied" for s in statuses.values()),
            "apply_s": round(time.perf_counter() - t0, 1),
        }
        print(f"{row}: {statuses} ({time.perf_counter() - t0:.1f} s)", flush=True)
        variants[row] = patched
        save()

    def time_rows(names: list[str], rounds: int) -> dict[str, list[float]]:
        for name in names:  # warm-up
            for _ in range(5):
                variants[name].step_fn()
        torch.cuda.synchronize()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for round_index in range(rounds):
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in order:
                step_fn = variants[name].step_fn
                samples[name] += time_steps(lambda i, fn=step_fn: fn(), args.steps, cuda=True).samples_us
        return samples

    # A first timing of the fix rows, saved before torch.compile runs (max-autotune can take minutes).
    first = time_rows(list(variants), max(2, args.rounds // 2))
    result["before_compile"] = {name: round(statistics.median(values), 1) for name, values in first.items()}
    save()

    if not args.skip_compile:
        for row, mode in COMPILE_ROWS.items():
            t0 = time.perf_counter()
            torch._dynamo.reset()
            compiled = torch.compile(workload.model, mode=mode)
            compiled_workload = workload.with_model(compiled)
            for _ in range(3):
                compiled_workload.step_fn()
            torch.cuda.synchronize()
            numerics = check_numerics(workload, compiled_workload, "model")
            result["rows"][row] = {"compile_s": round(time.perf_counter() - t0, 1), "numerics": numerics.to_dict()}
            print(f"{row}: compiled in {time.perf_counter() - t0:.1f} s, numerics {numerics.passed}", flush=True)
            variants[row] = compiled_workload
            save()

    names = list(variants)
    samples = time_rows(names, args.rounds)
    for name in names:
        entry = result["rows"].setdefault(name, {})
        entry["median_us"] = round(statistics.median(samples[name]), 1)
        entry["p10_us"] = round(statistics.quantiles(samples[name], n=10)[0], 1)
        entry["p90_us"] = round(statistics.quantiles(samples[name], n=10)[-1], 1)
        entry["samples"] = len(samples[name])
    eager_us = result["rows"]["eager"]["median_us"]
    for name in names:
        entry = result["rows"][name]
        entry["speedup_vs_eager"] = round(eager_us / entry["median_us"], 2)
        entry["x_floor"] = round(entry["median_us"] / result["floor_us"], 2)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    save()
    print(f"{'row':28} {'median us':>10} {'p10':>8} {'p90':>8} {'vs eager':>9} {'x floor':>8}")
    for name in names:
        e = result["rows"][name]
        cells = (e["median_us"], e["p10_us"], e["p90_us"], e["speedup_vs_eager"], e["x_floor"])
        print(f"{name:28} " + " ".join(f"{cell:>9}" for cell in cells))
    print(f"floor {result['floor_us']} us ({step_bytes / 1e9:.3f} GB at {bandwidth / 1e12:.2f} TB/s)")


if __name__ == "__main__":
    main()
