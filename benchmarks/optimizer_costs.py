"""What an optimizer step costs the host and the GPU, foreach against fused, on the suite's training models.

    python3 benchmarks/optimizer_costs.py --out benchmarks/results/optimizer_costs.json

For each training model of the suite (``--models``: examples/real/*.py whose KIND is "train" and whose state
holds a ``torch.optim`` optimizer) the model is built as its file builds it, and for each implementation
(``foreach=True``, ``fused=True``) a fresh optimizer of the same class and hyperparameters is made over its
parameters, each parameter given a random gradient (never zeros). After ``--warmup`` steps (the state exists):

- ``host_us``: ``torch.cuda.synchronize()``, then ``time.perf_counter`` around one ``optimizer.step()`` (the
  host's time to run the update's Python and enqueue its kernels, the GPU idle at its start); median of
  ``--probes``.
- ``gpu_us``: the summed duration of the kernels of ``--profiled`` steps under ``torch.profiler`` (CUDA activity
  only), per step; ``kernels`` their count per step.
- ``step_us``: CUDA events around each step, steps back to back; median of ``--steps``.
- ``bytes``: what an update reads and writes at least once: parameter, gradient and the state tensors read,
  parameter and state written (``(3 + 2 x states) x itemsize`` per element), and ``roof_fraction`` =
  bytes / gpu_us over the peak HBM bandwidth (4.8 TB/s, the datasheet figure the peaks table holds).

The parameters of both implementations are the same tensors (the updates move them; the costs do not depend on
their values). Writes {gpu, date, command, torch, models: {name: {optimizer, tensors, elements, states,
implementations: {foreach: {...}, fused: {...}}}}}.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import inspect
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "real"
DEFAULT_MODELS = ("hf_bert_finetune_amp", "timm_resnet50_train", "hf_resnet_train", "hf_gpt2_train_foreach_off")
PEAK_HBM_BYTES_PER_S = 4.8e12
STATES = {"Adam": 2, "AdamW": 2, "SGD": 1, "Adagrad": 1}


def _load(name: str):
    sys.path.insert(0, str(SUITE))
    spec = importlib.util.spec_from_file_location(f"suite_{name}", SUITE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _kernel_us(trace_path: Path) -> tuple[float, int]:
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    return sum(float(e.get("dur", 0.0)) for e in kernels), len(kernels)


def measure(optimizer, args) -> dict:
    import torch

    for _ in range(args.warmup):
        optimizer.step()
    torch.cuda.synchronize()
    host = []
    for _ in range(args.probes):
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        host.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    for start, end in zip(starts, ends):
        start.record()
        optimizer.step()
        end.record()
    torch.cuda.synchronize()
    step = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profiled):
                optimizer.step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
        gpu_us, kernels = _kernel_us(path)
    return {
        "host_us": round(statistics.median(host), 1),
        "host_samples_us": [round(x, 1) for x in host],
        "step_us": round(statistics.median(step), 1),
        "gpu_us": round(gpu_us / args.profiled, 1),
        "kernels": kernels / args.profiled,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profiled", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: this benchmark needs a CUDA GPU")
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "torch": torch.__version__,
        "models": {},
    }
    for name in [m for m in args.models.split(",") if m]:
        module = _load(name)
        state, _ = module.build()
        original = state.optimizer
        cls = type(original)
        params = [p for group in original.param_groups for p in group["params"] if p.requires_grad]
        accepted = inspect.signature(cls.__init__).parameters
        hyper = {
            k: v
            for k, v in original.defaults.items()
            if k in accepted and k not in ("params", "foreach", "fused", "differentiable")
        }
        torch.manual_seed(1)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        elements = sum(p.numel() for p in params)
        states = STATES.get(cls.__name__, 1)
        if cls.__name__ == "SGD" and not hyper.get("momentum"):
            states = 0
        itemsize = params[0].element_size()
        moved = elements * itemsize * (3 + 2 * states)
        entry = {
            "optimizer": cls.__name__,
            "hyperparameters": {k: v for k, v in hyper.items() if isinstance(v, (int, float, bool, str))},
            "tensors": len(params),
            "elements": elements,
            "states": states,
            "bytes": moved,
            "floor_us": round(moved / PEAK_HBM_BYTES_PER_S * 1e6, 1),
            "implementations": {},
        }
        for kind in ("foreach", "fused"):
            optimizer = cls(params, **hyper, **{kind: True})
            row = measure(optimizer, args)
            row["roof_fraction"] = round(moved / (row["gpu_us"] * 1e-6) / PEAK_HBM_BYTES_PER_S, 3)
            entry["implementations"][kind] = row
            del optimizer
            torch.cuda.empty_cache()
            print(
                f"{name} {cls.__name__} {kind}: {json.dumps({k: v for k, v in row.items() if k != 'host_samples_us'})}"
            )
        result["models"][name] = entry
        del state, original, params
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
