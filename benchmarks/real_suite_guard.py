"""The numerics guard and the ``graphs`` / ``fusion`` fixes on the real-model suite (examples/real/), on a GPU.

Per suite model, in one process: the fixes through ``apply_fixes`` (the guard on), their status and numbers;
the correct fixes judged again over 20 fresh-input trials; three planted wrong fixes (one weight scaled by
1.01; one cache write skipped for a decode step; the optimizer update skipped for a training step), each of
which must be rolled back naming the tensor that diverged; and eager against the patched step timed
interleaved with CUDA events (median of all steps of ``--rounds`` rounds), so each result says whether the
fix paid.

    python3 benchmarks/real_suite_guard.py [--models hf_llama_decode,...] [--out FILE] [--trials 20]

Writes ``benchmarks/results/real_suite_guard.json`` (merging by model name into an existing file).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SUITE = ROOT / "examples" / "real"
sys.path.insert(0, str(SUITE))
from _real import head_weight, kind_of, module_of  # noqa: E402


def time_interleaved(runners: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    import torch

    samples = {name: [] for name in runners}
    names = list(runners)
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            run = runners[name]
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
            for start, end in zip(starts, ends):
                start.record()
                run()
                end.record()
            torch.cuda.synchronize()
            samples[name] += [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]
    return samples


def planted_fixes(path: Path, kind: str):
    """(fix id, function workload -> patched workload, what must be named) for this model's kind."""
    import torch

    def scale_head(current):
        model = copy.deepcopy(current.model)
        name, parameter = head_weight(module_of(model))
        with torch.no_grad():
            parameter.mul_(1.01)
        return current.with_model(model)

    plants = [("planted_scaled_weight", scale_head)]
    if kind == "decode":

        def skip_cache_write(current):
            def step(model, inputs):
                kept = inputs[2].layers[-1].keys.clone()
                output = current.step(model, inputs)
                inputs[2].layers[-1].keys.copy_(kept)
                return output

            return current.with_step(copy.deepcopy(current.model), step)

        plants.append(("planted_skipped_cache_write", skip_cache_write))
    if kind == "train":

        def skip_update(current):
            def step(state, inputs):
                optimizer = next(v for v in vars(state).values() if isinstance(v, torch.optim.Optimizer))
                original = optimizer.step
                optimizer.step = lambda *args, **kwargs: None
                try:
                    return current.step(state, inputs)
                finally:
                    optimizer.step = original

            return current.with_step(copy.deepcopy(current.model), step)

        plants.append(("planted_skipped_update", skip_update))
    return plants


def measure(path: Path, trials: int, steps: int, rounds: int) -> dict:
    import torch

    from gpuadvisor.fixes.base import Applied, Fix
    from gpuadvisor.fixes.numerics import check_numerics
    from gpuadvisor.fixes.registry import apply_fixes, register_fix, unregister_fix
    from gpuadvisor.workload import load_workload

    kind = kind_of(path)
    started = time.perf_counter()
    workload = load_workload(str(path))
    for _ in range(5):
        workload.step_fn()
    torch.cuda.synchronize()
    entry: dict = {"name": path.stem, "kind": kind, "stacks": {}, "planted": {}}

    stacks = [["graphs"]] + ([["fusion", "graphs"]] if kind == "decode" else [])
    runners = {"eager": workload.step_fn}
    for stack in stacks:
        key = "+".join(stack)
        patched, outcomes = apply_fixes(workload, stack)
        record = {
            "outcomes": [
                {
                    "fix_id": o.fix_id,
                    "status": o.status,
                    "reason": o.reason,
                    "numerics": (o.numerics or {}).get("detail"),
                    "changes": o.changes[:4],
                }
                for o in outcomes
            ]
        }
        applied = [o.fix_id for o in outcomes if o.status == "applied"]
        record["applied"] = applied
        if applied:
            t0 = time.perf_counter()
            many = check_numerics(workload, patched, "model", trials=trials)
            record["trials"] = {
                "n": trials,
                "passed": many.passed,
                "value": many.value,
                "bound": many.bound,
                "detail": many.detail,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            for _ in range(5):
                patched.step_fn()
            runners[key] = patched.step_fn
        entry["stacks"][key] = record

    for fix_id, make in planted_fixes(path, kind):

        class Planted(Fix):
            id = fix_id
            title = fix_id
            numerics = "model"

            def check(self, current):
                return None

            def apply(self, current, make=make, fix_id=fix_id):
                return Applied(make(current), [fix_id])

        register_fix(Planted())
        try:
            _, outcomes = apply_fixes(workload, [fix_id])
        finally:
            unregister_fix(fix_id)
        entry["planted"][fix_id] = {"status": outcomes[0].status, "reason": outcomes[0].reason}

    samples = time_interleaved(runners, steps, rounds)
    entry["median_us"] = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    eager = entry["median_us"]["eager"]
    entry["speedup"] = {name: round(eager / value, 2) for name, value in entry["median_us"].items()}
    entry["seconds"] = round(time.perf_counter() - started, 1)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_suite_guard.json"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    paths = [SUITE / f"{n}.py" for n in names] if names else sorted(p for p in SUITE.glob("*.py") if p.stem[0] != "_")
    out = Path(args.out)
    existing = json.loads(out.read_text()) if out.exists() else {"models": []}
    results = {m["name"]: m for m in existing.get("models", [])}
    for path in paths:
        print(f"== {path.stem}", flush=True)
        try:
            entry = measure(path, args.trials, args.steps, args.rounds)
        except Exception as error:
            entry = {"name": path.stem, "error": f"{type(error).__name__}: {error}"[:500]}
            traceback.print_exc()
        print(json.dumps(entry, indent=1)[:600], flush=True)
        results[path.stem] = entry
        torch.cuda.empty_cache()
        # Written after every model, so a run cut short keeps the models it measured.
        document = {
            "gpu": torch.cuda.get_device_name(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python3 " + " ".join(sys.argv),
            "torch": torch.__version__,
            "models": sorted(results.values(), key=lambda m: m["name"]),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        temporary = out.with_suffix(".tmp")
        temporary.write_text(json.dumps(document, indent=1) + "\n")
        os.replace(temporary, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
