"""The real-model suite (examples/real/): ``apply --fix auto`` against eager, the decode fixes, torch.compile
and the floor of each model, all measured in one run per model.

    python3 benchmarks/real_models.py                                   # every model of examples/real/
    python3 benchmarks/real_models.py --models hf_llama_decode,hf_qwen2_decode --compile-modes default
    python3 benchmarks/real_models.py --models timm_resnet50_train \\
        --base benchmarks/results/real_models.json --out "$OUT/real_models.json" --markdown "$OUT/real_models.md"
    python3 benchmarks/real_models.py --auto-from benchmarks/results/real_models_auto.json   # auto vs compile modes
    python3 benchmarks/real_models.py --models timm_resnet50_train --compile-modes max-autotune \\
        --autotune-cache benchmarks/results/auto_vs_compile/max_autotune_h100_autotune_cache.json
        # max-autotune's operator benchmarks kept across runs: each run resumes where the last one stopped

Each suite file is a model.py workload (gpuadvisor/workload.py) with a module constant ``KIND``: ``decode``,
``prefill``, ``train`` or ``infer``. Files whose name starts with ``_`` hold shared code, not models.

One model at a time, each in a subprocess of this script (``--one NAME --json-out FILE``), so that no
model's GPU memory, CUDA graphs or torch.compile caches reach the next one; the parent merges what each
child wrote into ``--out``. Per model, in the child:

1. ``auto``: ``gpuadvisor.apply.run_apply(path, "auto", profile_after=False)``: profile, the fixes the
   findings recommend, the numerics guard, before/after timed interleaved. Kept from its report: its own
   before/after medians and speedup interval (``apply_report_*``), the fix outcomes, and the predicted
   saving: apply's own ``saving.predicted_us`` (``gpuadvisor.fixes.coverage.combined_saving``: the BEFORE
   findings the applied fixes address, added across the parts of the step they come from and combined as
   independent shares within one), as ``predicted_saving_pct`` of the before step; per applied fix, the summed
   ``estimated_saving_pct`` of the findings that name it (``predicted_saving_by_fix_pct``). With
   ``--auto-from FILE`` (an ``--auto-only`` run's results) the search is not run again: its kept choice (fixes
   and compile mode) is what step 2 re-applies, and ``auto_from`` names that run.
2. Fresh ``load_workload(path)`` per variant (build() seeds its random weights, so every variant is the
   same model with its own state: a decode variant writes its own KV cache, idempotently): ``eager``;
   ``auto`` = the fixes auto applied, applied again with ``registry.apply_fixes`` (guard on); for decode
   models ``fusion_graphs`` = ``apply_fixes(["fusion", "graphs"])``. Inference kinds (decode, prefill,
   infer) run every variant with grad disabled (torch.compile of a grad-enabled step that writes
   buffers in place was ~10x slower than eager on the H200); train steps keep grad on.
3. torch.compile in each ``--compile-modes`` mode: ``torch._dynamo.reset()``, a fresh load, the workload's
   nn.Module compiled (the model itself, or the first nn.Module field of a state object: a dict, dataclass
   or other object holding module and optimizer, put into a shallow copy of the state), run by the
   workload's own step. ``compile_s`` = wall time of the first 3 calls (the compilation is lazy). The
   cudagraph modes (reduce-overhead, max-autotune) call ``torch.compiler.cudagraph_mark_step_begin()``
   before each step, as a serving or training loop does. Because ``reset()`` drops the compiled code of
   earlier modes, each mode is timed in its own group against the same eager variant and released
   before the next mode compiles; a failure records ``{"error": ...}`` for that mode only.
4. Timing groups: ``fixes`` = [eager, auto, fusion_graphs], then one per compile mode = [eager,
   compile]. Each variant is warmed up (``--warmup`` steps, twice that after the compile calls), then
   ``--rounds`` rounds of ``--steps`` steps per variant, round-robin with the order rotated each round;
   each step timed with CUDA events, steps back to back, no profiler (gpuadvisor.capture.timing; on the
   CPU time.perf_counter). A variant's figure is the median of all its samples; a speedup is
   median(eager) / median(variant) with the eager samples of the same group, and its 95% interval the
   percentile bootstrap of ``gpuadvisor.apply.speedup_interval``. ``eager_us`` is the ``fixes`` group's.
5. Floor, ``floor_us = max(memory_us, compute_us)``:
   - memory: bytes the step must move at least once over the HBM bandwidth. Inference: every parameter
     and buffer once (an nn.Embedding table not shared with another module counts TOKENS_PER_STEP rows,
     one row without it), plus every tensor reachable from the inputs and from the state object (a KV
     cache object's tensors: the walk goes through ``__dict__``, lists, tuples and dicts), deduplicated
     by storage. Training: 3 x the trainable parameters (read the weights, write the gradients, read
     them in the optimizer) + the other parameters and buffers once + the optimizer state read and
     written (2 x its tensors, measured after the warm-up steps created it) + the inputs. Activations
     are left out, so this is a lower bound. Bandwidth: ``--floor-bandwidth peaks`` (default) takes
     gpuadvisor.device.peaks (a cached ``gpuadvisor calibrate`` result over the datasheet table), 4.24e12
     B/s (the H200's measured device copy) when the GPU is unknown; ``copy`` measures a 1 GiB device copy
     in the child.
   - compute: FLOPs of one step counted by ``torch.utils.flop_counter`` (forward and backward for
     training), each op at the peak of its dtype (fp32 matmuls at the tf32 rate when TF32 is enabled for
     them, convolutions likewise with cuDNN's flag).

The floor is worked out before the compile groups, and the child rewrites its entry after every stage,
so a run cut short (``--model-timeout-s``, or the command's own limit) still leaves what it measured.

Output (``--out``, written atomically after each model): {gpu, date, command, torch, transformers,
method, models, runs [every run merged into the file: date, command, argv, models]}. One entry per model:
name, kind, path, gpu, date, command, torch, transformers, steps, rounds, warmup, timing, grad_enabled,
parameters; eager_us, auto_us, auto_speedup, auto_speedup_ci [low, high], auto_fixes, fix_outcomes
[{fix_id, status, reason, numerics, changes, predicted_saving_us, measured_saving_us}],
predicted_saving_pct, predicted_saving_by_fix_pct, predicted_saving_us, measured_saving_pct (of eager_us,
this run's timing), why_no_fix (null when a fix applied), recommended_fixes, findings (the before
profile's, compact), profile (kernels and GPU busy per step, from apply's profile), apply_report_eager_us,
apply_report_auto_us, apply_report_speedup, apply_report_measured_saving_pct, apply_s;
fusion_graphs_us (decode only, else null) and fusion_graphs_outcomes; speedups {variant: {median, ci_low,
ci_high}}; compile {mode: µs | {error}}, compile_s, compile_speedup, compile_group_eager_us,
compile_dynamo {mode: {graphs, graph_breaks, graphs_before_timing, recompiles_while_timed}},
compile_target, compile_numerics (with ``--compile-numerics``); inductor_cache (what Inductor's cache held
before the compile groups: a cache an earlier run filled makes compile_s a warm-cache time; ``seeded``
{file, operator_inputs}: the autotuning results ``--autotune-cache`` put back first); best_compile
{mode, us, modes_timed, modes_failed, auto_over_best_compile (auto_us over the fastest mode's median)}; auto_from (with
``--auto-from``: the file, date and command of the ``--auto-only`` run whose choice the auto variant
re-applied); floor_us, floor {memory_bytes,
memory_parts_bytes, memory_factors, bandwidth_bytes_per_s, bandwidth_source, memory_us, flops,
flops_by_dtype, compute_us, compute_peak, floor_us, bound}; variant_errors; samples {variant: [µs per
step]} (``eager@compile_<mode>`` for each compile group's eager samples); elapsed_s, stage. A model whose
run failed keeps {name, error} and what it measured before failing. ``--base FILE`` names the results whose
other models are kept (default: ``--out`` itself), so the suite can be measured a few models per command
(the H200 allows 10 minutes a command).
A table is printed as each model finishes; ``--markdown FILE`` writes it for the README.
"""

from __future__ import annotations

import argparse
import ast
import collections
import copy
import dataclasses
import datetime as dt
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SUITE = ROOT / "examples" / "real"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "real_models.json"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # Inductor's cudagraph trees are on in both
INFERENCE_KINDS = ("decode", "prefill", "infer")
KINDS = (*INFERENCE_KINDS, "train")
DECODE_FIX_IDS = ["fusion", "graphs"]
COMPILE_CALLS = 3  # compile_s: the first calls, where dynamo traces and Inductor compiles (and autotunes)
FALLBACK_HBM_BYTES_PER_S = 4.24e12  # device-to-device copy, bytes read + written, measured on the H200
MAX_ERROR_CHARS = 300
WALK_DEPTH = 8  # how deep the tensor walk goes into input and state objects
WALK_OBJECTS = 20000  # and how many objects it visits at most


# --- plumbing -------------------------------------------------------------------------------------


def one_line(error: BaseException) -> str:
    """The exception's type and the first line of its message, at most MAX_ERROR_CHARS characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def plain(value: Any) -> Any:
    """JSON-ready: floats rounded (to 0.1 from 1000 up, 0.001 from 1 up, else 4 significant digits),
    NaN and infinities as None."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if abs(value) >= 1000 or value == 0:
            return round(value, 1)
        if abs(value) >= 1:
            return round(value, 3)
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` (floats rounded: :func:`plain`) atomically, its folder made if missing."""
    write_text_atomic(path, json.dumps(plain(doc), indent=1, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (gpuadvisor.outputs.write_atomic: no temporary file is left behind
    on an error), its folder made if missing."""
    from gpuadvisor.outputs import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def log(*parts: Any) -> None:
    print(*parts, flush=True)


# --- the suite -----------------------------------------------------------------------------------


def read_kind(path: Path) -> str | None:
    """The file's module constant ``KIND`` (read from its source, without importing it), or None."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "KIND" and isinstance(node.value, ast.Constant):
                return str(node.value.value)
    return None


def defines_build(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == "build" for node in tree.body)


def suite_models(suite: Path) -> dict[str, Path]:
    """The models of the suite folder by name (file stem): files that define build(), not starting with _."""
    return {
        path.stem: path for path in sorted(suite.glob("*.py")) if not path.name.startswith("_") and defines_build(path)
    }


# --- the auto fixes, through run_apply --------------------------------------------------------------


def numerics_summary(numerics: dict | None) -> str | None:
    if not numerics:
        return None
    try:
        from gpuadvisor.fixes.numerics import NumericsResult

        text = NumericsResult(**numerics).summary()
    except Exception:  # another version of the result's fields: its own detail line
        text = str(numerics.get("detail") or "")
    return f"{'passed' if numerics.get('passed') else 'FAILED'}: {text}"


def measure_auto(path: Path, apply_dir: Path | None) -> dict[str, Any]:
    """Run ``apply --fix auto`` on the model and keep what the suite reports from its report."""
    from gpuadvisor.apply import run_apply

    scratch = None
    if apply_dir is None:
        scratch = Path(tempfile.mkdtemp(prefix="real_models_apply_"))
        out_dir = scratch / f"{path.stem}-apply"  # run_apply wants a new (or an earlier apply's) folder
    else:
        out_dir = apply_dir / f"{path.stem}-apply"
    try:
        report = run_apply(str(path), "auto", out_dir=out_dir, progress=False, profile_after=False)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    before, after = report.get("before") or {}, report.get("after") or {}
    fixes = report.get("fixes") or []
    applied = [row["fix_id"] for row in fixes if row.get("status") == "applied"]
    findings = before.get("findings") or []
    by_fix: dict[str, float] = {}
    for finding in findings:
        fix_id, pct = finding.get("fix_id"), finding.get("estimated_saving_pct")
        if fix_id in applied and isinstance(pct, (int, float)):
            by_fix[fix_id] = by_fix.get(fix_id, 0.0) + float(pct)
    saving = report.get("saving") or {}
    # apply's own prediction: the findings the applied fixes address (compile: also fusion, sdpa and, in a
    # CUDA-graph mode, graphs), combined by gpuadvisor.fixes.coverage.combined_saving (parts of the step add,
    # shares within a part); coverage.predicted_from_report gives the same from a committed report.
    before_us = before.get("step_time_us")
    predicted_pct = (
        100.0 * saving["predicted_us"] / before_us
        if applied and saving.get("predicted_us") is not None and before_us
        else None
    )
    if applied:
        why_no_fix = None
    elif not fixes:
        why_no_fix = "no finding recommends a fix"
        if not before.get("kernel_classes"):
            why_no_fix += " (the profile holds no GPU kernels)"
    else:
        why_no_fix = "; ".join(
            f"{row['fix_id']} {row.get('status')}: {row.get('reason') or 'no reason given'}" for row in fixes
        )
    speedup = report.get("speedup") or {}
    search = report.get("search") or {}
    return {
        "auto_search": [
            {key: row.get(key) for key in ("fixes", "applied", "step_us", "status", "why", "apply_s")}
            for row in search.get("candidates") or []
        ],
        "auto_search_s": search.get("wall_s"),
        "auto_facts": {row["fix_id"]: row.get("facts") for row in fixes if row.get("status") == "applied"},
        "auto_fixes": applied,
        "fix_outcomes": [
            {
                "fix_id": row.get("fix_id"),
                "status": row.get("status"),
                "reason": row.get("reason"),
                "numerics": numerics_summary(row.get("numerics")),
                "changes": row.get("changes") or [],
                "predicted_saving_us": row.get("predicted_saving_us"),
                "measured_saving_us": row.get("measured_saving_us"),
            }
            for row in fixes
        ],
        "recommended_fixes": (report.get("source") or {}).get("fix_ids") or [],
        "predicted_saving_pct": predicted_pct,
        "predicted_saving_by_fix_pct": by_fix,
        "predicted_saving_us": saving.get("predicted_us"),
        "why_no_fix": why_no_fix,
        "findings": [
            {
                "rule_id": f.get("rule_id"),
                "title": f.get("title"),
                "fix_id": f.get("fix_id"),
                "estimated_saving_us_per_step": f.get("estimated_saving_us_per_step"),
                "estimated_saving_pct": f.get("estimated_saving_pct"),
            }
            for f in findings
        ],
        "profile": {
            key: before.get(key) for key in ("kernels_per_step", "launch_calls_per_step", "gpu_busy_us", "gpu_busy_pct")
        },
        "apply_report_eager_us": before.get("step_time_us"),
        "apply_report_auto_us": after.get("step_time_us"),
        "apply_report_speedup": {key: speedup.get(key) for key in ("median", "ci_low", "ci_high")},
        "apply_report_measured_saving_pct": saving.get("measured_pct"),
        "apply_report_samples": {
            "before": len(before.get("samples_us") or []),
            "after": len(after.get("samples_us") or []),
        },
    }


AUTO_FIELDS = (
    "auto_search",
    "auto_search_s",
    "auto_facts",
    "auto_fixes",
    "fix_outcomes",
    "recommended_fixes",
    "predicted_saving_pct",
    "predicted_saving_by_fix_pct",
    "predicted_saving_us",
    "why_no_fix",
    "findings",
    "profile",
    "apply_report_eager_us",
    "apply_report_auto_us",
    "apply_report_speedup",
    "apply_report_measured_saving_pct",
    "apply_report_samples",
)


def auto_from_results(results: Path, name: str) -> dict[str, Any]:
    """What an earlier ``--auto-only`` run kept of ``apply --fix auto`` on model ``name`` (its search, the fixes
    it applied and the compile mode it chose), so that this run re-applies and times that choice beside the
    torch.compile modes without searching again. ``auto_from`` says which run the choice came from."""
    doc = load_results(results)
    entries = [m for m in doc.get("models") or [] if isinstance(m, dict) and m.get("name") == name]
    if not entries:
        raise SystemExit(f"{results}: no entry for model {name!r} (an --auto-only run's results are needed)")
    earlier = entries[0]
    if earlier.get("error") or "auto_fixes" not in earlier:
        raise SystemExit(f"{results}: model {name!r} has no completed apply --fix auto run to take the choice from")
    fields = {key: earlier.get(key) for key in AUTO_FIELDS if key in earlier}
    fields["auto_from"] = {"file": str(results), "date": earlier.get("date"), "command": earlier.get("command")}
    return fields


def best_compile(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest torch.compile mode this run timed, and the auto variant's median over that mode's
    (``auto_over_best_compile``). The medians, not the speedups over each group's eager samples: a
    host-bound eager step drifts between the groups (8.6 and 11.2 ms for one prefill on the H200, minutes
    apart), the fixed and compiled steps it is compared with do not."""
    modes = {mode: us for mode, us in (entry.get("compile") or {}).items() if isinstance(us, (int, float))}
    if not modes:
        return None
    mode = min(modes, key=modes.get)
    row: dict[str, Any] = {"mode": mode, "us": modes[mode], "modes_timed": sorted(modes)}
    failed = sorted(m for m, us in (entry.get("compile") or {}).items() if not isinstance(us, (int, float)))
    if failed:
        row["modes_failed"] = failed
    auto_us = entry.get("auto_us")
    if isinstance(auto_us, (int, float)) and modes[mode] > 0:
        row["auto_over_best_compile"] = auto_us / modes[mode]
    return row


# --- variants --------------------------------------------------------------------------------------


def find_module(state: Any) -> tuple[Any, Callable[[Any], Any], str]:
    """The nn.Module to compile in a workload's model, a function that puts a compiled one in its place
    (a shallow copy of the state; the original stays as it was), and where it was found."""
    from torch import nn

    if isinstance(state, nn.Module):
        return state, lambda compiled: compiled, "the model"
    if isinstance(state, dict):
        for key, value in state.items():
            if isinstance(value, nn.Module):
                return value, lambda compiled, key=key: {**state, key: compiled}, f"model[{key!r}]"
    if isinstance(state, (list, tuple)):
        for index, value in enumerate(state):
            if isinstance(value, nn.Module):

                def put(compiled, index=index):
                    items = list(state)
                    items[index] = compiled
                    return type(state)(items) if isinstance(state, list) else tuple(items)

                return value, put, f"model[{index}]"
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        names = [f.name for f in dataclasses.fields(state)]
    else:
        names = list(getattr(state, "__dict__", {}))
    for name in names:
        value = getattr(state, name, None)
        if isinstance(value, nn.Module):

            def put(compiled, name=name):
                copied = copy.copy(state)
                object.__setattr__(copied, name, compiled)  # also for a frozen dataclass
                return copied

            return value, put, f"model.{name}"
    if callable(state):
        return state, lambda compiled: compiled, "the model (a callable, not an nn.Module)"
    raise TypeError(f"no nn.Module to compile in the workload's {type(state).__name__}")


def step_callable(workload: Any, mark_cudagraph_step: bool = False) -> Callable[[], Any]:
    if not mark_cudagraph_step:
        return workload.step_fn
    import torch

    mark = torch.compiler.cudagraph_mark_step_begin
    step_fn = workload.step_fn

    def run() -> Any:
        mark()
        return step_fn()

    return run


def synchronize(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def warm_up(fn: Callable[[], Any], steps: int, cuda: bool) -> None:
    for _ in range(steps):
        fn()
    synchronize(cuda)


def release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def time_group(
    variants: dict[str, Callable[[], Any]], steps: int, rounds: int, cuda: bool, errors: dict[str, str]
) -> dict[str, list[float]]:
    """``rounds`` rounds of ``steps`` timed steps per variant, the order rotated each round. A variant that
    raises is dropped (its error kept in ``errors``); the first variant (eager) may not fail."""
    from gpuadvisor.capture.timing import time_steps

    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        gc.collect()  # garbage of builds and warm-ups: no full collection inside a timed block
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            fn = variants[name]
            try:
                samples[name] += time_steps(lambda i, fn=fn: fn(), steps, cuda=cuda).samples_us
            except Exception as error:
                if name == names[0]:
                    raise
                errors[name] = f"failed while timed: {one_line(error)}"
                samples.pop(name, None)
                synchronize(cuda)
    return {name: values for name, values in samples.items() if name not in errors}


def median_us(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def speedup_of(eager: list[float], variant: list[float] | None) -> dict[str, Any] | None:
    if not eager or not variant:
        return None
    from gpuadvisor.stats import speedup_interval

    interval = speedup_interval(eager, variant)
    return {key: interval.get(key) for key in ("median", "ci_low", "ci_high")}


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


# --- the floor -------------------------------------------------------------------------------------


def _storage_key(tensor: Any) -> tuple:
    try:
        return (str(tensor.device), tensor.untyped_storage().data_ptr())
    except Exception:  # a tensor subclass without a plain storage
        return (str(tensor.device), tensor.data_ptr(), id(tensor))


def _tensor_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


class StepBytes:
    """The tensors a step touches, by storage (a storage counts once, at its largest tensor), in categories."""

    def __init__(self) -> None:
        self.bytes: dict[tuple, int] = {}
        self.category: dict[tuple, str] = {}
        self.zero_inputs = 0
        self.float_inputs = 0
        self._seen: set[int] = set()
        self._visited = 0

    def add(self, tensor: Any, category: str, nbytes: int | None = None) -> None:
        if tensor.is_meta or tensor.numel() == 0:
            return
        key = _storage_key(tensor)
        self.bytes[key] = max(self.bytes.get(key, 0), _tensor_bytes(tensor) if nbytes is None else nbytes)
        self.category.setdefault(key, category)

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = collections.Counter()
        for key, nbytes in self.bytes.items():
            out[self.category[key]] += nbytes
        return dict(out)

    def add_module(self, module: Any, training: bool, tokens: int | None) -> None:
        from torch import nn

        users: dict[tuple, set[bool]] = collections.defaultdict(set)  # storage -> {is an embedding table}
        entries = []
        for sub in module.modules():
            for name, param in sub.named_parameters(recurse=False):
                is_table = isinstance(sub, nn.Embedding) and name == "weight"
                users[_storage_key(param)].add(is_table)
                entries.append((sub, param, is_table))
            for buffer in sub.buffers(recurse=False):
                self.add(buffer, "buffers")
        for sub, param, is_table in entries:
            key = _storage_key(param)
            if training:
                self.add(param, "trainable_weights" if param.requires_grad else "weights")
            elif is_table and users[key] == {True}:
                rows = min(sub.num_embeddings, tokens or 1)
                self.add(param, "embedding_rows", rows * sub.embedding_dim * param.element_size())
            else:
                self.add(param, "weights")
        for sub in module.modules():  # tensors held as plain attributes (a KV cache object on a wrapper)
            for name, value in vars(sub).items():
                if not name.startswith("_"):
                    self.walk(value, "state", training, tokens, 1)

    def add_optimizer(self, optimizer: Any) -> None:
        import torch

        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    self.add(value, "optimizer_state")

    def walk(self, value: Any, category: str, training: bool, tokens: int | None, depth: int = 0) -> None:
        """Every tensor, module and optimizer reachable from ``value`` through containers and ``__dict__``."""
        import types

        import torch
        from torch import nn

        if depth > WALK_DEPTH or self._visited > WALK_OBJECTS or value is None:
            return
        if isinstance(value, (str, bytes, int, float, complex, bool, torch.dtype, torch.device, type)):
            return
        if id(value) in self._seen:
            return
        self._seen.add(id(value))
        self._visited += 1
        if isinstance(value, torch.Tensor):
            if category == "inputs" and value.is_floating_point() and value.numel():
                self.float_inputs += 1
                self.zero_inputs += int(not bool(value.any()))
            self.add(value, category)
        elif isinstance(value, nn.Module):
            self.add_module(value, training, tokens)
        elif isinstance(value, torch.optim.Optimizer):
            self.add_optimizer(value)
        elif isinstance(value, dict):
            for item in list(value.values()):
                self.walk(item, category, training, tokens, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in list(value):
                self.walk(item, category, training, tokens, depth + 1)
        elif isinstance(value, (types.FunctionType, types.MethodType, types.ModuleType, types.BuiltinFunctionType)):
            return
        elif hasattr(value, "__dict__"):
            for item in list(vars(value).values()):
                self.walk(item, category, training, tokens, depth + 1)


def memory_bytes(workload: Any, training: bool) -> dict[str, Any]:
    """The bytes a step moves at least once (module docstring, "Floor"), with the parts."""
    seen = StepBytes()
    seen.walk(workload.model, "state", training, workload.tokens_per_step)
    seen.walk(workload.inputs, "inputs", training, workload.tokens_per_step)
    parts = seen.totals()
    if training:
        # read the weights, write the gradients, read them in the optimizer; optimizer state read and written
        factors = {"trainable_weights": 3, "optimizer_state": 2}
    else:
        factors = {}
    total = sum(nbytes * factors.get(part, 1) for part, nbytes in parts.items())
    return {
        "memory_bytes": total,
        "memory_parts_bytes": parts,
        "memory_factors": factors,
        "float_input_tensors": seen.float_inputs,
        "all_zero_float_input_tensors": seen.zero_inputs,
    }


def count_flops(step_fn: Callable[[], Any], cuda: bool) -> tuple[int, dict[str, int]]:
    """FLOPs of one step (torch.utils.flop_counter), and the same split by the dtype class of each op's
    first tensor argument ("fp32" becomes "tf32" where TF32 is enabled for that op); {} when the counter's
    per-op hook is missing in this torch."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils.flop_counter import FlopCounterMode

    try:  # where a torch has other switches than these, TF32 is assumed on: the floor stays a lower bound
        tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    except Exception:
        tf32_matmul = True
    tf32_conv = bool(getattr(torch.backends.cudnn, "allow_tf32", True))
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}

    class FlopsByDtype(FlopCounterMode):
        def __init__(self) -> None:
            super().__init__(display=False)
            self.by_dtype: collections.Counter = collections.Counter()

        def _count_flops(self, func_packet, out, args, kwargs):
            formula = self.flop_registry.get(func_packet)
            if formula is not None:
                try:
                    flops = int(formula(*args, **kwargs, out_val=out))
                    first = next((a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)), None)
                    dtype = getattr(first, "dtype", None)
                    key = "fp8" if dtype is not None and "float8" in str(dtype) else names.get(dtype, "other")
                    if key == "fp32" and cuda:
                        conv = "convolution" in str(func_packet)
                        key = "tf32" if (tf32_conv if conv else tf32_matmul) else "fp32"
                    self.by_dtype[key] += flops
                except Exception:  # the totals then disagree and the split is dropped (below)
                    pass
            return super()._count_flops(func_packet, out, args, kwargs)

    counter = FlopsByDtype()
    with counter:
        step_fn()
    synchronize(cuda)
    total = int(counter.get_total_flops())
    by_dtype = dict(counter.by_dtype)
    if sum(by_dtype.values()) != total:
        by_dtype = {}
    return total, by_dtype


def device_peaks(cuda: bool) -> Any:
    """gpuadvisor's peaks for this GPU (a cached calibration over the datasheet table), or None on the CPU."""
    if not cuda:
        return None
    import torch

    from gpuadvisor.device.calibrate import load_calibration
    from gpuadvisor.device.peaks import lookup_peaks

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    device = SimpleNamespace(
        name=props.name, sm_count=props.multi_processor_count, total_memory_bytes=props.total_memory
    )
    return lookup_peaks(device, calibration=load_calibration(props.name))


def bandwidth_bytes_per_s(how: str, cuda: bool, peaks: Any) -> tuple[float | None, str]:
    if not cuda:
        return None, "no CUDA GPU: no bandwidth"
    if how == "copy":
        import torch
        from bench_common import copy_bandwidth

        measured = copy_bandwidth(1.0, 20, 5, torch.device("cuda"))
        release(cuda)
        return measured["bytes_per_s"], "device-to-device copy of 1 GiB measured in this run (read + written)"
    if peaks is not None and peaks.hbm_bytes_per_s:
        return peaks.hbm_bytes_per_s, f"gpuadvisor.device.peaks: {peaks.source}"
    return FALLBACK_HBM_BYTES_PER_S, "fallback: the H200's measured device copy, 4.24 TB/s (GPU not in the table)"


def step_floor(
    workload: Any, training: bool, cuda: bool, bandwidth: float | None, bandwidth_source: str, peaks
) -> dict:
    floor: dict[str, Any] = memory_bytes(workload, training)
    floor["bandwidth_bytes_per_s"] = bandwidth
    floor["bandwidth_source"] = bandwidth_source
    floor["memory_us"] = floor["memory_bytes"] / bandwidth * 1e6 if bandwidth else None
    floor["flops"] = floor["flops_by_dtype"] = floor["compute_us"] = None
    try:
        flops, by_dtype = count_flops(workload.step_fn, cuda)
        floor["flops"], floor["flops_by_dtype"] = flops, by_dtype
    except Exception as error:
        floor["flops_error"] = one_line(error)
    if peaks is not None and floor["flops"] is not None:
        rates = peaks.flops_per_s or {}
        parts = floor["flops_by_dtype"] or {}
        if not parts:  # no per-op split: the fastest non-fp8 rate, so the figure stays a lower bound
            fastest = max((rates.get(k) or 0.0 for k in ("bf16", "fp16", "tf32", "fp32")), default=0.0)
            floor["compute_us"] = floor["flops"] / fastest * 1e6 if fastest else None
            floor["compute_peak"] = "no per-op dtype split: every FLOP at the fastest bf16/fp16/tf32/fp32 rate"
        else:
            missing = [k for k, n in parts.items() if n and not rates.get(k)]
            floor["compute_us"] = sum(n / rates[k] for k, n in parts.items() if n and rates.get(k)) * 1e6
            floor["compute_peak"] = f"each op at its dtype's rate from {peaks.source}" + (
                f"; no rate for {', '.join(missing)} (left out)" if missing else ""
            )
    candidates = [x for x in (floor["memory_us"], floor["compute_us"]) if x is not None]
    floor["floor_us"] = max(candidates) if candidates else None
    floor["bound"] = (
        None
        if not candidates
        else "compute"
        if floor["compute_us"] is not None and floor["compute_us"] >= (floor["memory_us"] or 0)
        else "memory"
    )
    return floor


# --- one model (the child) ---------------------------------------------------------------------------


def run_one(args: argparse.Namespace) -> int:
    """Measure one model, writing its entry to ``--json-out`` after every stage (module docstring)."""
    models = suite_models(args.suite)
    if args.one not in models:
        raise SystemExit(f"{args.one}: no such model in {args.suite} (have: {', '.join(models) or 'none'})")
    path = models[args.one]
    kind = read_kind(path)
    entry: dict[str, Any] = {"name": args.one, "kind": kind, "path": str(path), "incomplete": True}
    started = time.perf_counter()

    def save(stage: str) -> None:
        entry["stage"] = stage
        entry["elapsed_s"] = time.perf_counter() - started
        write_json_atomic(args.json_out, entry)

    def note(text: str) -> None:
        log(f"[{args.one} {time.perf_counter() - started:6.1f} s] {text}")

    try:
        measure_one(args, path, kind, entry, save, note)
    except BaseException as error:
        what = "interrupted" if isinstance(error, KeyboardInterrupt) else one_line(error)
        entry["error"] = f"{what} (during stage {entry.get('stage', 'start')!r})"
        save(entry.get("stage", "start"))
        note(f"FAILED: {entry['error']}")
        return 1
    entry.pop("incomplete", None)
    save("done")
    note("done")
    return 0


def measure_one(args, path: Path, kind: str | None, entry: dict, save, note) -> None:
    import torch

    from gpuadvisor.fixes.registry import apply_fixes
    from gpuadvisor.workload import load_workload

    cuda = torch.cuda.is_available()
    entry.update(
        gpu=torch.cuda.get_device_name() if cuda else "cpu",
        date=utc_now(),
        torch=torch.__version__,
        transformers=package_version("transformers"),
        steps=args.steps,
        rounds=args.rounds,
        warmup=args.warmup,
        timing="CUDA events per step, steps back to back, no profiler"
        if cuda
        else "time.perf_counter per step (no CUDA GPU)",
    )
    if kind not in KINDS:
        entry["kind_note"] = f"KIND {kind!r} is not one of {', '.join(KINDS)}: grad mode left as the step sets it"

    # 1. apply --fix auto
    save("apply")
    t0 = time.perf_counter()
    if args.skip_auto:
        note("apply --fix auto skipped (--skip-auto)")
        entry["auto_skipped"] = True
    elif args.auto_from is not None:
        entry.update(auto_from_results(args.auto_from, path.stem))
        note(f"apply --fix auto's choice from {args.auto_from} ({entry['auto_from']['date']}): {entry['auto_fixes']}")
    else:
        note("apply --fix auto")
        try:
            entry.update(measure_auto(path, args.apply_dir))
        except Exception as error:
            entry["auto_error"] = one_line(error)
            entry["auto_fixes"] = []
            entry["why_no_fix"] = f"apply failed: {entry['auto_error']}"
    entry["apply_s"] = time.perf_counter() - t0
    note(
        f"apply: {entry.get('apply_report_eager_us')} -> {entry.get('apply_report_auto_us')} us, "
        f"fixes {entry.get('auto_fixes') or 'none'} ({entry['apply_s']:.1f} s)"
    )
    release(cuda)

    if args.auto_only:
        # apply's own interleaved before/after timing is the measurement; its search timed each candidate
        # (compile among them) against the original in the same process.
        speedup = entry.get("apply_report_speedup") or {}
        entry["eager_us"] = entry.get("apply_report_eager_us")
        entry["auto_us"] = entry.get("apply_report_auto_us")
        entry["auto_speedup"] = speedup.get("median")
        entry["auto_speedup_ci"] = [speedup.get("ci_low"), speedup.get("ci_high")]
        entry["measured_saving_pct"] = entry.get("apply_report_measured_saving_pct")
        compile_rows = [row for row in entry.get("auto_search") or [] if row.get("applied") == ["compile"]]
        entry["compile_in_search_us"] = compile_rows[0]["step_us"] if compile_rows else None
        entry["timing"] = "apply --fix auto's report: 5 interleaved rounds x 20 steps a side, CUDA events"
        return

    training = kind == "train"
    if kind in INFERENCE_KINDS:
        torch.set_grad_enabled(False)
    entry["grad_enabled"] = torch.is_grad_enabled()

    save("fixes")
    # 2. the eager and fixed variants, each from its own build
    errors: dict[str, str] = {}
    workloads: dict[str, Any] = {"eager": load_workload(str(path))}
    entry["parameters"] = sum(p.numel() for p in _modules_params(workloads["eager"].model))
    applied_ids = list(entry.get("auto_fixes") or [])
    fix_rows = {}
    if applied_ids:
        fix_rows["auto"] = applied_ids
    if kind == "decode":
        fix_rows["fusion_graphs"] = DECODE_FIX_IDS
    compile_mode = ((entry.get("auto_facts") or {}).get("compile") or {}).get("mode")
    for variant, fix_ids in fix_rows.items():
        t0 = time.perf_counter()
        saved_modes = os.environ.get("GPUADVISOR_COMPILE_MODES")
        if variant == "auto" and compile_mode:
            os.environ["GPUADVISOR_COMPILE_MODES"] = compile_mode  # the mode apply's search chose, not a new pick
        try:
            patched, outcomes = apply_fixes(load_workload(str(path)), fix_ids, guard=True)
        except Exception as error:
            errors[variant] = f"apply_fixes raised: {one_line(error)}"
            continue
        finally:
            if saved_modes is None:
                os.environ.pop("GPUADVISOR_COMPILE_MODES", None)
            else:
                os.environ["GPUADVISOR_COMPILE_MODES"] = saved_modes
        rows = [{"fix_id": o.fix_id, "status": o.status, "reason": o.reason} for o in outcomes]
        entry[f"{variant}_reapplied" if variant == "auto" else f"{variant}_outcomes"] = rows
        applied_now = [o.fix_id for o in outcomes if o.status == "applied"]
        entry[f"{variant}_apply_s"] = time.perf_counter() - t0
        if variant == "auto":
            entry["auto_fixes_timed"] = applied_now  # what the auto row below ran (apply's guard may differ)
        note(
            f"{variant}: apply_fixes {fix_ids} -> applied {applied_now or 'none'} ({entry[f'{variant}_apply_s']:.1f} s)"
        )
        if applied_now:
            workloads[variant] = patched
        else:
            errors[variant] = "no fix applied: " + "; ".join(
                f"{r['fix_id']} {r['status']}: {r['reason']}" for r in rows
            )
        del patched

    runners = {name: step_callable(w) for name, w in workloads.items()}
    for name, fn in list(runners.items()):
        try:
            warm_up(fn, args.warmup, cuda)
        except Exception as error:
            if name == "eager":
                raise
            errors[name] = f"failed in warm-up: {one_line(error)}"
            del runners[name]
    save("timing")
    note(f"timing {', '.join(runners)}: {args.rounds} rounds x {args.steps} steps")
    samples = time_group(runners, args.steps, args.rounds, cuda, errors)
    eager = samples["eager"]
    entry["samples"] = dict(samples)
    entry["eager_us"] = median_us(eager)
    entry["speedups"] = {name: speedup_of(eager, values) for name, values in samples.items() if name != "eager"}
    if "auto" in samples:
        entry["auto_us"] = median_us(samples["auto"])
        interval = entry["speedups"]["auto"]
        entry["auto_speedup"] = interval["median"]
        entry["auto_speedup_ci"] = [interval["ci_low"], interval["ci_high"]]
        entry["measured_saving_pct"] = 100.0 * (entry["eager_us"] - entry["auto_us"]) / entry["eager_us"]
    elif not applied_ids and "auto_error" not in entry:  # apply applied nothing: the auto step is the eager step
        entry["auto_us"] = entry["eager_us"]
        entry["auto_speedup"] = 1.0
        entry["auto_speedup_ci"] = None
        entry["measured_saving_pct"] = None
        entry["auto_same_as_eager"] = True
    else:  # applied in apply, but the same fixes could not be applied again or timed here (variant_errors)
        entry["auto_us"] = entry["auto_speedup"] = entry["auto_speedup_ci"] = entry["measured_saving_pct"] = None
    entry["fusion_graphs_us"] = median_us(samples.get("fusion_graphs"))
    entry["variant_errors"] = errors
    note(
        "  ".join(f"{name} {median_us(values):.1f} us" for name, values in samples.items())
        + (f"  (errors: {errors})" if errors else "")
    )
    for name in [n for n in workloads if n != "eager"]:
        runners.pop(name, None)
        del workloads[name]
    release(cuda)

    save("floor")
    # 4. the floor, on the eager workload (after its warm-up: the optimizer state exists)
    peaks = device_peaks(cuda)
    bandwidth, bandwidth_source = bandwidth_bytes_per_s(args.floor_bandwidth, cuda, peaks)
    try:
        floor = step_floor(workloads["eager"], training, cuda, bandwidth, bandwidth_source, peaks)
    except Exception as error:
        floor = {"error": one_line(error)}
    entry["floor"] = floor
    entry["floor_us"] = floor.get("floor_us")
    note(
        f"floor {floor.get('floor_us')} us: {floor.get('memory_bytes')} B -> {floor.get('memory_us')} us, "
        f"{floor.get('flops')} FLOP -> {floor.get('compute_us')} us"
    )

    # 3. torch.compile, one mode at a time, each timed against the same eager variant
    for field in ("compile", "compile_s", "compile_speedup", "compile_group_eager_us", "compile_dynamo"):
        entry[field] = {}
    seeded = seed_autotune_cache(args.autotune_cache) if args.autotune_cache and not args.skip_compile else None
    entry["inductor_cache"] = {**inductor_cache_state(), **({"seeded": seeded} if seeded else {})}
    modes = [] if args.skip_compile else args.compile_modes
    for mode in modes:
        key = f"compile_{mode}"
        save(f"compile {mode}")
        note(f"torch.compile mode={mode}")
        torch._dynamo.reset()
        compiled_workload = fn = None
        try:
            workload = load_workload(str(path))
            module, put, where = find_module(workload.model)
            entry["compile_target"] = where
            compiled_workload = workload.with_model(put(torch.compile(module, mode=mode)))
            del workload, module
            fn = step_callable(compiled_workload, mark_cudagraph_step=cuda and mode in CUDAGRAPH_MODES)
            start_counts = dynamo_counts()  # dynamo's counters survive reset(): differences per mode
            t0 = time.perf_counter()
            warm_up(fn, COMPILE_CALLS, cuda)
            entry["compile_s"][mode] = time.perf_counter() - t0
            compiled_counts = dynamo_counts()
            warm_up(fn, 2 * args.warmup, cuda)
            if args.compile_numerics:
                entry.setdefault("compile_numerics", {})[mode] = compile_numerics(
                    workloads["eager"], compiled_workload, training
                )
            timed_counts = dynamo_counts()
            mode_errors: dict[str, str] = {}
            mode_samples = time_group({"eager": runners["eager"], key: fn}, args.steps, args.rounds, cuda, mode_errors)
            if key in mode_errors:
                raise RuntimeError(mode_errors[key])
            end_counts = dynamo_counts()
            entry["compile"][mode] = median_us(mode_samples[key])
            entry["compile_speedup"][mode] = speedup_of(mode_samples["eager"], mode_samples[key])
            counts = {name: compiled_counts[name] - start_counts[name] for name in start_counts}
            entry["compile_dynamo"][mode] = {
                **counts,  # graphs compiled and graph breaks in the first COMPILE_CALLS calls
                "graphs_before_timing": timed_counts["graphs"] - start_counts["graphs"],
                "recompiles_while_timed": end_counts["graphs"] - timed_counts["graphs"],
            }
            entry["compile_group_eager_us"][mode] = median_us(mode_samples["eager"])
            entry["samples"][key] = mode_samples[key]
            entry["samples"][f"eager@{key}"] = mode_samples["eager"]
            note(
                f"compile {mode}: {entry['compile'][mode]:.1f} us (eager {median_us(mode_samples['eager']):.1f} us "
                f"in the same group), compiled in {entry['compile_s'][mode]:.1f} s, {counts['graphs']} graph(s), "
                f"{counts['graph_breaks']} graph break(s)"
            )
        except Exception as error:
            entry["compile"][mode] = {"error": one_line(error)}
            note(f"compile {mode} failed: {entry['compile'][mode]['error']}")
        finally:
            del compiled_workload, fn
            release(cuda)
    torch._dynamo.reset()
    entry["best_compile"] = best_compile(entry)
    if entry["best_compile"] and entry["best_compile"].get("auto_over_best_compile") is not None:
        note(
            f"auto {entry['auto_us']:.1f} us = {entry['best_compile']['auto_over_best_compile']:.3f}x the best "
            f"compile mode ({entry['best_compile']['mode']}, {entry['best_compile']['us']:.1f} us)"
        )


def inductor_cache_state() -> dict[str, Any]:
    """What Inductor's on-disk cache holds before the compile groups: its folder, the autotuning results
    (``*.best_config`` beside each kernel, the choices of ``select_algorithm``) and the compiled graphs already
    there. A run whose cache was filled by an earlier run (``TORCHINDUCTOR_CACHE_DIR``) skips that autotuning:
    its ``compile_s`` is a warm-cache time, not what a first compile costs; the step it times is the same code."""
    from_env = "TORCHINDUCTOR_CACHE_DIR" in os.environ  # before cache_dir(), which sets it for its workers
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())

    def count(pattern: str, under: str = "") -> int:
        base = root / under if under else root
        return sum(1 for _ in base.rglob(pattern)) if base.is_dir() else 0

    return {
        "dir": str(root),
        "from_env": from_env,
        "best_configs": count("*.best_config"),
        "select_algorithm_files": count("*", "cache"),
        "fx_graphs": count("*", "fxgraph"),
    }


AUTOTUNE_CACHE_KEY = "inductor_local_caches"


def _inductor_cache_root() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "cache"


def _choice_tables(cache: dict[str, Any]) -> int:
    """How many operator inputs an Inductor autotuning cache ({op: {inputs: {precision: {choice: ms}}}}) holds."""
    return sum(len(per_op) for per_op in cache.values() if isinstance(per_op, dict))


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with ``new``'s leaves put in (``new`` wins where both time the same choice)."""
    out = dict(old)
    for key, value in new.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_autotune_cache(path: Path) -> dict[str, Any]:
    """The autotuning caches kept in ``path`` ({system hash: {system, cache}}); {} when there is no such file."""
    return _autotune_cache_doc(path).get(AUTOTUNE_CACHE_KEY, {})


def _autotune_cache_doc(path: Path) -> dict[str, Any]:
    """The whole file :func:`read_autotune_cache` reads, checked; {} when there is none."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
        caches = doc[AUTOTUNE_CACHE_KEY]
        if not isinstance(caches, dict) or not all(
            isinstance(c, dict) and isinstance(c.get("cache"), dict) for c in caches.values()
        ):
            raise ValueError(f"{AUTOTUNE_CACHE_KEY} is not {{hash: {{system, cache}}}}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: {path}: not an autotuning cache file ({one_line(error)})") from None
    return doc


def seed_autotune_cache(path: Path) -> dict[str, Any]:
    """Put the autotuning results kept in ``path`` into Inductor's cache folder (``cache/<system hash>``, the
    file Inductor reads before it benchmarks an operator's choices), so the operators an earlier run on the same
    GPU, torch, Triton and CUDA already timed are not benchmarked again; what the folder holds wins. Inductor
    reads only its own system's file: the others sit unused. Returns {file, operator_inputs} seeded."""
    caches = read_autotune_cache(path)
    root = _inductor_cache_root()
    seeded = 0
    for system_hash, kept in caches.items():
        target = root / system_hash
        try:
            here = json.loads(target.read_text())["cache"] if target.is_file() else {}
        except (OSError, ValueError, KeyError, TypeError):
            here = {}
        merged = _merged(kept["cache"], here)  # times as Inductor wrote them: not rounded (plain())
        write_text_atomic(target, json.dumps({"system": kept.get("system"), "cache": merged}, indent=4))
        seeded += _choice_tables(kept["cache"])
    return {"file": str(path), "operator_inputs": seeded}


def save_autotune_cache(path: Path, command: str) -> int:
    """Merge every autotuning cache in Inductor's folder into ``path`` (what the folder holds wins), so a run
    cut short keeps what it benchmarked for the next; returns the operator inputs the file then holds."""
    earlier = _autotune_cache_doc(path)
    caches = dict(earlier.get(AUTOTUNE_CACHE_KEY, {}))
    root = _inductor_cache_root()
    for file in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            here = json.loads(file.read_text())
            system, cache = here.get("system"), here["cache"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not one of Inductor's autotuning caches
        if not isinstance(cache, dict):
            continue
        kept = caches.get(file.name, {})
        caches[file.name] = {"system": system, "cache": _merged(kept.get("cache", {}), cache)}
    if not caches:
        return 0
    devices = [
        c.get("system", {}).get("device") if isinstance(c.get("system"), dict) else None for c in caches.values()
    ]
    names = {d.get("name") for d in devices if isinstance(d, dict)}
    doc = {
        "gpu": ", ".join(sorted(n for n in names if isinstance(n, str))) or None,
        "date": utc_now(),
        "torch": package_version("torch"),
        "command": command,
        "commands": [*earlier.get("commands", [earlier.get("command")] if earlier.get("command") else []), command],
        "what": (
            "Inductor's local autotuning caches (TORCHINDUCTOR_CACHE_DIR/cache/<system hash>), per system: "
            "per operator and input layout, each choice's time in ms. real_models.py --autotune-cache puts them "
            "back before compiling, so a later run skips the operators already benchmarked (its compile time "
            "is then a warm-cache time), and merges what it benchmarked into this file after each model."
        ),
        AUTOTUNE_CACHE_KEY: caches,
    }
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return sum(_choice_tables(c["cache"]) for c in caches.values())


def compile_numerics(eager: Any, compiled: Any, training: bool) -> str:
    """The numerics guard ("model" policy) of the compiled step against the group's eager variant: both
    have run the same step on the same inputs, which leaves an inference step's state (a KV cache written
    at the same slot) alike; a training step's state has moved on differently, so it is not judged."""
    if training:
        return "not judged: a training step's weights and optimizer state have moved on from the eager variant's"
    from gpuadvisor.fixes.numerics import check_numerics

    try:
        return numerics_summary(check_numerics(eager, compiled, "model").to_dict())
    except Exception as error:
        return f"the guard could not run: {one_line(error)}"


def _modules_params(state: Any) -> list:
    try:
        module, _, _ = find_module(state)
        return list(module.parameters())
    except Exception:
        return []


# --- the parent: one child per model, merged results ------------------------------------------------


class Terminated(Exception):
    pass


def _on_sigterm(signum, frame) -> None:
    raise Terminated(f"signal {signum}")


def child_command(args: argparse.Namespace, name: str, json_out: Path) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--json-out", str(json_out)]
    command += ["--suite", str(args.suite), "--steps", str(args.steps), "--rounds", str(args.rounds)]
    command += ["--warmup", str(args.warmup), "--floor-bandwidth", args.floor_bandwidth]
    command += ["--compile-modes", ",".join(args.compile_modes)]
    if args.skip_compile:
        command.append("--skip-compile")
    if args.auto_only:
        command.append("--auto-only")
    if args.skip_auto:
        command.append("--skip-auto")
    if args.auto_from is not None:
        command += ["--auto-from", str(args.auto_from)]
    if args.compile_numerics:
        command.append("--compile-numerics")
    if args.apply_dir is not None:
        command += ["--apply-dir", str(args.apply_dir)]
    if args.autotune_cache is not None:
        command += ["--autotune-cache", str(args.autotune_cache)]
    return command


def load_results(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("models"), list) else {}


def merge(base: dict[str, Any], entries: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """``base``'s models with ``entries`` put in place of those of the same name (new names appended)."""
    models = [dict(m) for m in base.get("models") or [] if isinstance(m, dict)]
    index = {m.get("name"): i for i, m in enumerate(models)}
    for entry in entries:
        if entry["name"] in index:
            models[index[entry["name"]]] = entry
        else:
            index[entry["name"]] = len(models)
            models.append(entry)
    measured = [e for e in entries if e.get("gpu")]
    return {
        "gpu": measured[-1]["gpu"] if measured else base.get("gpu"),
        "date": run["date"],
        "command": run["command"],
        "torch": measured[-1].get("torch") if measured else package_version("torch"),
        "transformers": package_version("transformers"),
        "method": __doc__.split("Per model, in the child:")[1].split("Output (")[0].strip(),
        "models": models,
        "runs": [*(base.get("runs") or []), run],
    }


def run_parent(args: argparse.Namespace) -> int:
    models = suite_models(args.suite)
    if not models:
        raise SystemExit(f"{args.suite}: no model files (*.py defining build())")
    names = list(models) if not args.models else [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in models]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; {args.suite} has: {', '.join(models)}")
    if args.autotune_cache is not None:
        read_autotune_cache(args.autotune_cache)  # a file that is not one fails here, before any model runs
    base_path = args.base if args.base is not None else args.out
    base = load_results(base_path)
    run = {"date": utc_now(), "command": " ".join(["python3", *sys.argv]), "argv": list(sys.argv), "models": names}
    entries: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="real_models_"))
    code = 0
    try:
        for name in names:
            json_out = scratch / f"{name}.json"
            t0 = time.perf_counter()
            child = subprocess.Popen(child_command(args, name, json_out))
            status = None
            try:
                child.wait(timeout=args.model_timeout_s or None)
                status = child.returncode
            except subprocess.TimeoutExpired:
                status = f"killed after the {args.model_timeout_s} s per-model limit"
            except (Terminated, KeyboardInterrupt) as error:
                status = f"interrupted ({error or 'Ctrl-C'})"
                raise
            finally:
                if child.poll() is None:
                    child.terminate()
                    try:
                        child.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
                entry = collect(name, models[name], json_out, status, time.perf_counter() - t0, run)
                if args.autotune_cache is not None and not args.skip_compile:
                    kept = save_autotune_cache(args.autotune_cache, run["command"])
                    log(f"{args.autotune_cache}: {kept} operator input(s) of autotuning results kept")
                entries.append(entry)
                write_json_atomic(args.out, merge(base, entries, run))
            code = code or int(status != 0)
            log(header_line())
            log(table_line(entry))
    except (Terminated, KeyboardInterrupt):
        code = 124
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    doc = merge(base, entries, run)
    write_json_atomic(args.out, doc)
    log(f"\n{len(entries)} model(s) in {time.perf_counter() - started:.0f} s; wrote {args.out}")
    log(header_line())
    for entry in entries:
        log(table_line(entry))
    if args.markdown is not None:
        write_text_atomic(args.markdown, markdown_table(doc))
        log(f"wrote {args.markdown}")
    return code


def collect(name: str, path: Path, json_out: Path, status: Any, elapsed_s: float, run: dict) -> dict[str, Any]:
    """The child's entry (or what it wrote before it stopped), with the run's command and elapsed time."""
    try:
        entry = json.loads(json_out.read_text())
    except (OSError, ValueError):
        entry = {"name": name, "kind": read_kind(path), "path": str(path)}
    if status != 0 and "error" not in entry:
        where = f" during stage {entry['stage']!r}" if entry.get("stage") else ""
        entry["error"] = (
            f"the run stopped{where}: exit code {status}" if isinstance(status, int) else f"{status}{where}"
        )
    entry["name"] = name
    entry["elapsed_s"] = elapsed_s
    entry["command"] = run["command"]
    return entry


# --- tables ----------------------------------------------------------------------------------------


def _us(value: Any) -> str:
    if isinstance(value, dict):
        return "error"
    return f"{value:,.0f}" if isinstance(value, (int, float)) else "-"


def _ratio(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def _x(interval: dict | None) -> str:
    if not interval or interval.get("median") is None:
        return "-"
    text = f"{interval['median']:.2f}x"
    if interval.get("ci_low") is not None:
        text += f" [{interval['ci_low']:.2f}-{interval['ci_high']:.2f}]"
    return text


def row_cells(entry: dict[str, Any]) -> list[str]:
    compile_us = entry.get("compile") or {}
    speedups = entry.get("speedups") or {}
    auto = speedups.get("auto") or (
        {"median": entry.get("auto_speedup")} if entry.get("auto_speedup") is not None else None
    )
    fixes = ",".join(entry.get("auto_fixes") or []) or "none"
    return [
        entry.get("name", "?"),
        str(entry.get("kind") or "-"),
        _us(entry.get("eager_us")),
        _us(entry.get("auto_us")),
        _x(auto),
        fixes,
        _us(entry.get("fusion_graphs_us")),
        *(_us(compile_us.get(mode)) for mode in COMPILE_MODES),
        _ratio((entry.get("best_compile") or {}).get("auto_over_best_compile")),
        _us(entry.get("floor_us")),
        f"{entry.get('elapsed_s') or 0:.0f}",
    ]


HEADERS = [
    "model",
    "kind",
    "eager us",
    "auto us",
    "auto speedup [95% CI]",
    "auto fixes",
    "fusion+graphs us",
    "compile us",
    "reduce-overhead us",
    "max-autotune us",
    "auto / best compile",
    "floor us",
    "s",
]
WIDTHS = [26, 7, 9, 9, 22, 14, 9, 9, 9, 9, 7, 8, 5]


def header_line() -> str:
    short = ["model", "kind", "eager", "auto", "auto x [95% CI]", "fixes", "fus+gr", "cmp", "cmp r-o", "cmp m-a"]
    short += ["a/cmp", "floor", "s"]
    return " ".join(f"{h:>{w}}" if i > 1 else f"{h:<{w}}" for i, (h, w) in enumerate(zip(short, WIDTHS)))


def table_line(entry: dict[str, Any]) -> str:
    cells = row_cells(entry)
    line = " ".join(f"{c:>{w}}" if i > 1 else f"{c:<{w}}" for i, (c, w) in enumerate(zip(cells, WIDTHS)))
    if entry.get("error"):
        line += f"\n    error: {entry['error']}"
    if entry.get("why_no_fix"):
        line += f"\n    no fix: {entry['why_no_fix']}"
    for mode, value in (entry.get("compile") or {}).items():
        if isinstance(value, dict):
            line += f"\n    compile {mode}: {value.get('error')}"
    return line


def markdown_table(doc: dict[str, Any]) -> str:
    lines = [
        f"Measured on {doc.get('gpu')}, torch {doc.get('torch')}, transformers {doc.get('transformers')} "
        f"(benchmarks/real_models.py; each model's own date and command are in the JSON). Times in µs per step, "
        + ("median of per-step CUDA-event timings" if doc.get("gpu") != "cpu" else "median of time.perf_counter steps")
        + "; speedup = median(eager) / median(auto) with its 95% bootstrap interval; compile columns are "
        "torch.compile modes default, reduce-overhead, max-autotune; auto / best compile = auto's median over the "
        "fastest mode's, all timed in the same process.",
        "",
        "| " + " | ".join(HEADERS[:-1]) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * 3 + ["---"] + ["---:"] * 6) + "|",
    ]
    for entry in doc.get("models") or []:
        cells = row_cells(entry)[:-1]
        if entry.get("error"):
            cells[5] += f" (error: {entry['error']})"
        elif entry.get("why_no_fix"):
            cells[5] += f" ({entry['why_no_fix']})"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated model names (file stems); default: the whole suite")
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE, help="folder of model files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--base", type=Path, help="results whose other models are kept (default: --out)")
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per variant (x2 after compiling)")
    parser.add_argument("--compile-modes", default=",".join(COMPILE_MODES), help="comma-separated torch.compile modes")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument(
        "--skip-auto",
        action="store_true",
        help="no apply --fix auto: only eager, the decode fixes (fusion+graphs), torch.compile and the floor",
    )
    parser.add_argument(
        "--auto-only",
        action="store_true",
        help="only apply --fix auto (its report's timing and search); no re-timed variants, compile groups or floor",
    )
    parser.add_argument(
        "--auto-from",
        type=Path,
        help="take apply --fix auto's choice from this --auto-only run's results instead of searching again; "
        "the choice is re-applied (guard on) and timed as the auto variant",
    )
    parser.add_argument("--compile-numerics", action="store_true", help="run the numerics guard on compiled steps")
    parser.add_argument("--floor-bandwidth", choices=("peaks", "copy"), default="peaks")
    parser.add_argument("--apply-dir", type=Path, help="keep each model's apply report here (default: discarded)")
    parser.add_argument("--model-timeout-s", type=float, default=0, help="kill a model's run after this (0: never)")
    parser.add_argument(
        "--autotune-cache",
        type=Path,
        help="keep Inductor's autotuning results in this JSON: put back before compiling, merged after each model "
        "(a max-autotune compile longer than one run resumes where the last one stopped)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: measure this model only
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.compile_modes = [m.strip() for m in args.compile_modes.split(",") if m.strip()]
    if args.steps < 2 or args.rounds < 1 or args.warmup < 0:
        parser.error("--steps must be >= 2, --rounds >= 1, --warmup >= 0")
    if args.one and args.json_out is None:
        parser.error("--one needs --json-out")
    if args.auto_from is not None and (args.auto_only or args.skip_auto):
        parser.error("--auto-from re-times an earlier auto choice: not with --auto-only or --skip-auto")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        return run_one(args)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
