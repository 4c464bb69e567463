"""How much of a step is the host's: per suite model and fix stack, the step time, the host's time to enqueue
one step, and the GPU's time for it with the host out of the way, all in one process.

    python3 benchmarks/host_bound_check.py --models timm_resnet50_train --stacks ,channels_last,bf16 \\
        --out benchmarks/results/host_bound_check.json

Per model and stack (comma-separated stacks, ``+`` inside one: ``channels_last+bf16``; an empty item is the
eager model): a fresh ``load_workload`` with ``registry.apply_fixes(stack, guard=False)``, ``--warmup`` steps,
then

- ``step_us``: ``--rounds`` rounds of ``--steps`` steps, round-robin over the stacks, each step timed with CUDA
  events, steps back to back (gpuadvisor.capture.timing, as ``apply`` times); the median of all samples.
- ``host_us``: ``torch.cuda.synchronize()``, then ``time.perf_counter`` around one call of the step (the host's
  time to run the step's Python and enqueue its kernels, the GPU idle at its start), then a synchronize; the
  median of ``--probes`` such steps. A step that waits for the GPU itself (``.item()``, a host sync) includes
  that wait; so does one whose launches fill the GPU's queue (the ``queue`` test below says when).
- ``gpu_us``: the GPU's time for one step when every launch is queued before the GPU starts it: a
  ``torch.cuda._sleep`` kernel of twice the host time holds the stream, then start event, the step, end event;
  the median of ``--probes``. It is the step with the host out of the way (the floor a CUDA graph approaches).

Then ``queue``: the host's time per launch of N tiny kernels (``x.add_(1)`` on 1 element) queued behind a
``_sleep`` that holds the GPU, for N = 256 ... 8192: the launch count at which the host starts to wait for
the GPU (the launch queue's depth), which bounds what ``host_us`` can measure.

And ``autocast_cost``: the host time bf16 autocast and channels_last add to an eager training step, with the GPU
out of the picture: a stack of ``BLOCKS`` Conv2d(8, 8, 3)+BatchNorm2d+ReLU blocks on a 2x8x8x8 input (tiny, so
every kernel is shorter than its launch), forward and backward, each probe queued behind a ``_sleep`` that holds
the GPU, so that the host's clock sees only the host's work; fp32 NCHW, bf16 autocast and channels_last
interleaved, ``--probes`` x 3 each. Per cast: (autocast - fp32) / (2 x BLOCKS): autocast casts each
convolution's weight to bf16 in the forward pass and its gradient back in the backward pass.

Writes {gpu, date, command, torch, models: {name: {stack: {step_us, host_us, gpu_us, samples}}}, queue,
autocast_cost}.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated names of examples/real/*.py")
    parser.add_argument("--stacks", default=",channels_last,bf16", help="comma-separated fix stacks ('+' inside)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probes", type=int, default=7)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only-costs", action="store_true", help="skip the models: the queue and autocast costs")
    args = parser.parse_args(argv)

    import torch

    from gpuadvisor.capture.timing import time_steps
    from gpuadvisor.fixes.registry import apply_fixes
    from gpuadvisor.workload import load_workload

    if not torch.cuda.is_available():
        print("host_bound_check: needs a CUDA GPU", file=sys.stderr)
        return 2
    # _sleep spins for a number of GPU clock cycles: measure the cycles per second once.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    torch.cuda.synchronize()
    clock_hz = 50_000_000 / (start.elapsed_time(end) / 1e3)
    doc = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "torch": torch.__version__,
        "method": __doc__.split("\n\n", 3)[2].strip(),
        "models": {},
    }

    def hold_gpu(seconds: float) -> None:
        torch.cuda._sleep(int(seconds * clock_hz))

    stacks = [item.strip() for item in args.stacks.split(",")]
    for name in [] if args.only_costs else [m.strip() for m in args.models.split(",") if m.strip()]:
        path = ROOT / "examples" / "real" / f"{name}.py"
        variants = {}
        outcomes = {}
        for stack in stacks:
            fixes = [f for f in stack.split("+") if f]
            workload = load_workload(str(path))
            if fixes:
                workload, result = apply_fixes(workload, fixes, guard=False)
                outcomes[stack or "eager"] = [(o.fix_id, o.status, o.reason) for o in result]
            variants[stack or "eager"] = workload.step_fn
        for fn in variants.values():
            for _ in range(args.warmup):
                fn()
        torch.cuda.synchronize()
        samples = {key: [] for key in variants}
        keys = list(variants)
        for r in range(args.rounds):
            gc.collect()
            order = keys[r % len(keys) :] + keys[: r % len(keys)]
            for key in order:
                samples[key] += time_steps(lambda i, fn=variants[key]: fn(), args.steps, cuda=True).samples_us
        rows = {}
        for key, fn in variants.items():
            host = []
            for _ in range(args.probes):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                host.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
            host_med = statistics.median(host)
            gpu = []
            for _ in range(args.probes):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                hold_gpu(2.0 * host_med / 1e6 + 0.002)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                gpu.append(start.elapsed_time(end) * 1e3)
            rows[key] = {
                "step_us": round(statistics.median(samples[key]), 1),
                "host_us": round(host_med, 1),
                "gpu_us": round(statistics.median(gpu), 1),
                "samples": {
                    "step_us": [round(v, 1) for v in samples[key]],
                    "host_us": [round(v, 1) for v in host],
                    "gpu_us": [round(v, 1) for v in gpu],
                },
                "fixes": outcomes.get(key),
            }
            print(name, key, {k: rows[key][k] for k in ("step_us", "host_us", "gpu_us")}, flush=True)
        doc["models"][name] = rows
        del variants
        gc.collect()
        torch.cuda.empty_cache()

    x = torch.zeros(1, device="cuda")
    queue = []
    for n in (256, 512, 1024, 2048, 4096, 8192):
        torch.cuda.synchronize()
        hold_gpu(0.5)
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        queue.append({"launches": n, "host_us_per_launch": round((time.perf_counter() - t0) * 1e6 / n, 2)})
        torch.cuda.synchronize()
        print("queue", queue[-1], flush=True)
    doc["queue"] = queue
    doc["autocast_cost"] = autocast_cost(torch, hold_gpu, args.probes * 3)
    print("autocast_cost", {k: v for k, v in doc["autocast_cost"].items() if k != "samples"}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


BLOCKS = 24  # ~200 launches a step with autocast's casts: well under the launch queue (see ``queue``)


def autocast_cost(torch, hold_gpu, probes: int) -> dict:
    from torch import nn

    def build(channels_last: bool):
        torch.manual_seed(0)
        layers = []
        for _ in range(BLOCKS):
            layers += [nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
        model = nn.Sequential(*layers).cuda()
        x = torch.randn(2, 8, 8, 8, device="cuda")
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        return model, x

    def step(model, x, bf16: bool):
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().sum().backward()

    variants = {
        "fp32": (build(False), False),
        "bf16_autocast": (build(False), True),
        "channels_last": (build(True), False),
    }
    for (model, x), bf16 in variants.values():
        for _ in range(5):
            step(model, x, bf16)
    torch.cuda.synchronize()
    samples = {name: [] for name in variants}
    for _ in range(probes):
        for name, ((model, x), bf16) in variants.items():
            torch.cuda.synchronize()
            hold_gpu(0.05)
            t0 = time.perf_counter()
            step(model, x, bf16)
            samples[name].append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    med = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "blocks": BLOCKS,
        "host_us": {name: round(v, 1) for name, v in med.items()},
        "autocast_us_per_cast": round((med["bf16_autocast"] - med["fp32"]) / (2 * BLOCKS), 2),
        "channels_last_us_per_block": round((med["channels_last"] - med["fp32"]) / BLOCKS, 2),
        "samples": {name: [round(v, 1) for v in values] for name, values in samples.items()},
    }


if __name__ == "__main__":
    raise SystemExit(main())
