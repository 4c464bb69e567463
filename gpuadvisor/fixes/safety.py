"""What one step does that a CUDA graph cannot capture, found by running it under a dispatch mode.

``analyze_step(workload)`` runs the workload's step three times (a warm-up, then two calls to compare) under a
``torch.utils._python_dispatch.TorchDispatchMode`` that sees every aten op the step calls, with its
tensor arguments, and records the user's source line of each (the innermost stack frame outside torch,
gpuadvisor and the standard library). From those records it finds what makes a step uncapturable
(the PyTorch CUDA-graph rules: no host synchronization, no CPU work inside the captured region, static
shapes and addresses, no data-dependent control flow):

- host syncs: ``aten._local_scalar_dense`` is ``.item()``, ``int()``/``float()``/``bool()`` of a tensor
  and what Python's ``if tensor:`` does; copies from a CUDA tensor to the CPU (``.cpu()``, ``.tolist()``,
  ``.numpy()``) are ``_to_copy``/``copy_`` with a CPU destination;
- data-dependent output shapes: ``nonzero``, ``masked_select``, ``unique*``, ``repeat_interleave``
  without ``output_size``, boolean-mask indexing and assignment (``index``/``index_put_`` with a bool index);
- CPU work in a CUDA step: an op whose non-scalar tensor arguments (or, for a factory, whose result) live
  on the CPU while the model is on CUDA (0-dim CPU tensors are fine: they become kernel arguments);
- shapes or ops that change between two calls of the step (e.g. the step makes an input of random length).

The host-sync, data-dependent-shape and changing-shape checks work on a CPU model too (they look at the
ops, not at the device), so CI sees the same reasons as the H200.

The analysis runs the user's step, which may write state (a KV cache, an optimizer step). It runs on a
private deep copy of the model and its inputs together (so a cache object in the inputs is copied too)
where memory allows; otherwise, or when they cannot be deep-copied (a buffer with autograd history), on
the workload's own state, which ``gpuadvisor.fixes.state`` snapshots first and restores after. It also
records which state tensors the step writes in place (``writes_state``, by path).

Host syncs inside a library (the innermost library frame is not the user's) whose values are the same
on the example inputs and on fresh ones are not findings: they pick a fixed path for these shapes
(transformers' packed-sequence check on position ids it derives from the shape), and the graphs fix
answers them from its warm-up during capture (``baked_syncs``). One whose value changes with the inputs
(an all-ones attention-mask check) stays a finding, with what the user can do about it.

The model-state helpers (``state_tensors``, ``state_bytes``, ``model_device``, ``private_copy``) live here
because the numerics guard and the graphs fix ask the same questions about a model. Torch is imported
inside the functions.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Ops whose output shape depends on tensor values: a graph records one shape, so they cannot be captured
# (and on CUDA they sync the host to learn the size).
_DATA_DEPENDENT_OPS = {
    "nonzero": "nonzero() / torch.where(cond) with one argument",
    "masked_select": "masked_select()",
    "_unique": "unique()",
    "_unique2": "unique()",
    "unique_dim": "unique(dim=...)",
    "unique_consecutive": "unique_consecutive()",
    "unique_dim_consecutive": "unique_consecutive(dim=...)",
}

SUGGEST_WHERE = "keep the value on the GPU with torch.where (or masked arithmetic), or move the .item() out of the step"
SUGGEST_CPU_COPY = "keep the value on the GPU; copy it to the CPU outside the step (every N steps)"
SUGGEST_FIXED_SHAPE = (
    "use a fixed-shape form: torch.where(mask, x, 0) instead of x[mask], nonzero_static, or pass output_size"
)
SUGGEST_GPU_TENSOR = "create the tensor on the GPU: torch.zeros(..., device=x.device)"
SUGGEST_INPUT_ON_GPU = "return the inputs on the GPU from build() (a graph replays a copy from the same host buffer)"
SUGGEST_PAD = "pad inputs to a fixed shape (or capture one graph per shape)"
BAKE_CHECK_SEED = 7_919  # the fresh inputs on which a library's host syncs must take the example's values


@dataclass
class SafetyFinding:
    """One thing in the step that a CUDA graph cannot capture."""

    # host_sync | cpu_copy | data_dependent_shape | cpu_op | host_to_device_copy | changing_shape | python_state
    kind: str
    op: str  # the aten op, e.g. "aten._local_scalar_dense"
    where: str | None  # "model.py:12", the user's line; None when no user frame was on the stack
    reason: str  # one line: "host sync: .item() at model.py:12 (aten._local_scalar_dense)"
    suggestion: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "op": self.op,
            "where": self.where,
            "reason": self.reason,
            "suggestion": self.suggestion,
        }


@dataclass
class StepAnalysis:
    """What the step did: findings (first seen first), the ops of each run, and the state it writes."""

    findings: list[SafetyFinding] = field(default_factory=list)
    ops_per_run: list[int] = field(default_factory=list)
    writes_state: list[str] = field(default_factory=list)  # names of parameters/buffers written in place
    model_device: str | None = None  # "cuda:0", "cpu", or None for a model without tensors
    ran_on_copy: bool = True
    # Host syncs inside libraries whose values were the same on the example and on fresh inputs, in call order
    # (the graphs fix replays them during capture instead of syncing), and the library functions they are in.
    baked_syncs: list[Any] = field(default_factory=list)
    baked_where: list[str] = field(default_factory=list)


@dataclass
class _OpRecord:
    op: str
    shapes: tuple
    where: str | None
    source: str  # the user's source line, stripped ("" when unknown)


# ---------------------------------------------------------------------------------------------------------------
# Model state: shared with the numerics guard and the graphs fix


def state_tensors(model: Any) -> list[tuple[str, Any]]:
    """(name, tensor) of every parameter and buffer of a module (or of the modules/tensors in a dict or object)."""
    import torch

    if isinstance(model, torch.nn.Module):
        return [*model.named_parameters(), *model.named_buffers()]
    values = model.items() if isinstance(model, dict) else getattr(model, "__dict__", {}).items()
    found: list[tuple[str, Any]] = []
    for name, value in values:
        if isinstance(value, torch.nn.Module):
            found += [(f"{name}.{inner}", tensor) for inner, tensor in state_tensors(value)]
        elif isinstance(value, torch.Tensor):
            found.append((str(name), value))
    return found


def state_bytes(model: Any) -> int:
    """Bytes held by the model's parameters and buffers (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for _, tensor in state_tensors(model):
        key = tensor.data_ptr()
        if key and key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def model_device(model: Any, inputs: tuple = ()) -> str | None:
    """The device of the model's first parameter or buffer, else of the first tensor input; None if neither."""
    import torch

    for _, tensor in state_tensors(model):
        return str(tensor.device)
    for value in _iter_tensors(inputs):
        if isinstance(value, torch.Tensor):
            return str(value.device)
    return None


def copy_fits(model: Any, copies: float = 1.0) -> bool:
    """Whether ``copies`` more copies of the model's state fit: always on the CPU, on CUDA by free memory."""
    import torch

    device = model_device(model)
    if device is None or not device.startswith("cuda"):
        return True
    free_bytes, _ = torch.cuda.mem_get_info(torch.device(device))
    return state_bytes(model) * copies <= free_bytes


def private_copy(model: Any, copies: float = 1.1) -> Any | None:
    """A deep copy of the model, or None when ``copies`` copies of its state do not fit (1.1: 10% headroom for
    the allocator's rounding) or the model cannot be deep-copied (it holds a lock, a file, a compiled artifact,
    a buffer with autograd history): the caller then runs on the model itself and says so."""
    if not copy_fits(model, copies):
        return None
    from gpuadvisor.fixes.copying import deepcopy_state

    try:
        return deepcopy_state(model)
    except Exception:  # deepcopy raises TypeError, RuntimeError, pickling errors... for such members
        return None


def _iter_tensors(value: Any):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _iter_tensors(item)


# ---------------------------------------------------------------------------------------------------------------
# Where an op came from


def _library_folders() -> tuple[str, ...]:
    import torch

    folders = {os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.path.dirname(__file__))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):  # site-packages too (a venv keeps it apart)
        if folder := sysconfig.get_paths().get(key):
            folders.add(os.path.abspath(folder))
    try:
        import triton

        folders.add(os.path.dirname(os.path.abspath(triton.__file__)))
    except ImportError:
        pass
    return tuple(os.path.join(folder, "") for folder in folders)


def _user_frame(library_folders: tuple[str, ...]) -> tuple[str | None, str, str]:
    """("model.py:12", "return x.item()", via) for the innermost frame of the user's code on the stack.

    ``via`` names the innermost library function between the op and that frame ("torch.optim.adamw._get_value"),
    or is "" when the user's line called the op itself.
    """
    frame = sys._getframe(2)
    via = ""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not os.path.abspath(filename).startswith(library_folders):
            line = linecache.getline(filename, frame.f_lineno).strip()
            return f"{Path(filename).name}:{frame.f_lineno}", line, via
        if not via and not filename.startswith("<") and not filename.startswith(_OWN_FOLDER):
            module = frame.f_globals.get("__name__", "")
            if module and not module.startswith(_THIN_WRAPPERS):
                via = f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back
    return None, "", via


# Library frames that only pass a call through (dispatch machinery, Tensor methods, functional wrappers,
# modules' forward, decorators): an op inside them is the user's line's own op, not a library's hidden one.
_THIN_WRAPPERS = (
    "torch._",  # private machinery: torch._dynamo, torch._compile, torch._ops, torch._tensor, ...
    "torch.utils._",
    "torch.overrides",
    "torch.functional",
    "torch.nn.functional",
    "torch.nn.modules",
    "torch.autograd.grad_mode",
    "contextlib",
    "functools",
)
_OWN_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


# ---------------------------------------------------------------------------------------------------------------
# The analysis


def analyze_step(workload: Any, *, runs: int = 3) -> StepAnalysis:
    """Run the workload's step ``runs`` times and report what blocks capture.

    The first run stands for the warm-up (lazy initialization); the findings come from the last run and the
    changing-shape check compares the last two, so ``runs`` must be at least 2 to see changing shapes.

    Raises :class:`gpuadvisor.errors.UserCodeError` when the user's step raises.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpuadvisor.fixes.state import collect_state, step_globals
    from gpuadvisor.workload import make_step_fn

    device = model_device(workload.model, workload.inputs)
    on_cuda = device is not None and device.startswith("cuda")
    # The step runs on a private deep copy of the model and its inputs together (a cache object in the inputs
    # is copied with it) where memory allows; otherwise, or when they cannot be deep-copied (a buffer with
    # autograd history, a lock), on the workload's own state, snapshotted first and restored after (Python-side
    # counters are then not restored).
    model, inputs = workload.model, workload.inputs
    copied = None
    # A step that reaches state of its own (a module-level optimizer) would drive it from a copy of the model:
    # run it on the workload itself then, with that state snapshotted too.
    outside = step_globals(workload.step)
    if not collect_state({"step": outside}).slots and copy_fits(model, 1.1):
        from gpuadvisor.fixes.copying import deepcopy_state

        try:
            copied = deepcopy_state((model, inputs))
        except Exception:
            copied = None
    if copied is not None:
        model, inputs = copied
    analysis = StepAnalysis(model_device=device, ran_on_copy=copied is not None)
    reachable = collect_state({"model": model, "inputs": inputs, "step": outside})
    before = reachable.snapshot() if copied is None else None
    state = [(slot.path, value) for slot in reachable if (value := slot.get()) is not None]
    # Keyed by storage, so that a write through a view (cache[:, :, pos] = k) counts as a write to the buffer.
    state_by_pointer = {_storage_pointer(tensor): name for name, tensor in state if _storage_pointer(tensor)}
    library_folders = _library_folders()
    written: dict[str, None] = {}

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[_OpRecord] = []
            self.findings: list[SafetyFinding] = []
            self.syncs: list[tuple[str, Any, SafetyFinding | None]] = []  # (library function, value, finding)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            where, source, via = _user_frame(library_folders)
            is_sync = func._schema.name.endswith("::_local_scalar_dense")
            if via:  # the op ran inside a library called from the user's line: say so, the line alone misleads
                source = ""
                where = f"{where} (inside {via})" if where else f"inside {via}"
            op = f"aten.{func._schema.name.split('::')[-1]}"
            tensors = [value for value in _iter_tensors((args, kwargs))]
            self.records.append(_OpRecord(op, tuple(tuple(t.shape) for t in tensors), where, source))
            for argument, value in zip(func._schema.arguments, args):
                if argument.alias_info is not None and argument.alias_info.is_write:
                    pointer = _storage_pointer(value) if isinstance(value, torch.Tensor) else 0
                    if pointer in state_by_pointer:
                        written[state_by_pointer[pointer]] = None
            finding = _classify(func, args, kwargs, tensors, result, on_cuda, op, where, source)
            if finding is not None:
                if via:
                    finding.suggestion = _library_suggestion(via, finding)
                self.findings.append(finding)
            if is_sync:
                self.syncs.append((via, result, finding))
            return result

    step_fn = make_step_fn(workload.step, model, inputs, workload.path)
    recorders = []
    fresh_syncs = None
    try:
        numbers = [slot for slot in reachable if slot.kind == "scalar"]
        numbers_after: list[dict[str, Any]] = []
        for _ in range(runs):
            recorder = Recorder()
            with recorder:
                step_fn()
            recorders.append(recorder)
            numbers_after.append({slot.path: _scalar_value(slot) for slot in numbers})
        if recorders[-1].syncs and all(via for via, _, _ in recorders[-1].syncs):
            # Host syncs inside a library (transformers' mask checks): do they take the same values on fresh
            # inputs? Then they pick a fixed path for these shapes and can be baked into a graph.
            from gpuadvisor.fixes.numerics import fresh_inputs

            fresh = Recorder()
            try:
                fresh_step = make_step_fn(workload.step, model, fresh_inputs(inputs, BAKE_CHECK_SEED), workload.path)
                with fresh:
                    fresh_step()
                fresh_syncs = fresh.syncs
            except Exception:  # the step may reject random inputs: then nothing is baked
                fresh_syncs = None
    finally:
        if before is not None:
            reachable.restore(before)
        del before, copied, model, inputs, reachable, state
        if on_cuda:
            torch.cuda.empty_cache()

    # The last run decides: what happens only in the first call (lazy initialization such as an optimizer
    # creating its state, a module building a cache) happens during the graph's warm-up, not in the capture.
    last_syncs = recorders[-1].syncs
    values = [_plain(value) for _, value, _ in last_syncs]
    if fresh_syncs is not None and [_plain(value) for _, value, _ in fresh_syncs] == values:
        # The same values for the example and for fresh inputs, all inside libraries: bakeable.
        bakeable = {id(finding) for _, _, finding in last_syncs if finding is not None}
        analysis.baked_syncs = values
        analysis.baked_where = list(dict.fromkeys(via for via, _, _ in last_syncs))
    else:
        bakeable = set()
    seen: set[tuple[str, str | None]] = set()
    for finding in recorders[-1].findings:
        if id(finding) in bakeable:
            continue
        key = (finding.kind, finding.where if finding.where else finding.op)
        if key not in seen:
            seen.add(key)
            analysis.findings.append(finding)
    if len(recorders) > 1:
        change = _first_change(recorders[-2].records, recorders[-1].records)
        if change is not None:
            analysis.findings.append(change)
        moved = [path for path, value in numbers_after[-1].items() if numbers_after[-2].get(path) != value]
        if moved:
            shown = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
            analysis.findings.append(
                SafetyFinding(
                    "python_state",
                    "",
                    None,
                    f"the step changes Python numbers on every call ({shown}), which a replayed graph would not",
                    "step a learning-rate scheduler (or other Python-side counter) outside the captured step, or"
                    " keep the value in a tensor (capturable optimizers take a tensor lr)",
                )
            )
    analysis.ops_per_run = [len(recorder.records) for recorder in recorders]
    analysis.writes_state = list(written)
    return analysis


def _classify(func, args, kwargs, tensors, result, on_cuda, op, where, source) -> SafetyFinding | None:
    """The finding one op makes, or None."""
    import torch

    name = func._schema.name.split("::")[-1]
    at = f" at {where}" if where else ""
    if name == "_local_scalar_dense":
        label = _sync_label(source)
        return SafetyFinding("host_sync", op, where, f"{label}{at} ({op})", SUGGEST_WHERE)
    if name in ("_to_copy", "copy_") and on_cuda:
        source_tensor = args[1] if name == "copy_" and len(args) > 1 else (args[0] if args else None)
        destination = result if name == "_to_copy" else (args[0] if args else None)
        if isinstance(source_tensor, torch.Tensor) and isinstance(destination, torch.Tensor):
            if source_tensor.is_cuda and destination.device.type == "cpu":
                return SafetyFinding(
                    "cpu_copy",
                    op,
                    where,
                    f"host sync: copy to the CPU (.cpu()/.tolist()/.numpy()){at} ({op})",
                    SUGGEST_CPU_COPY,
                )
            if source_tensor.device.type == "cpu" and destination.is_cuda:
                # A copy from pageable host memory cannot be captured (capture raises); one from pinned memory
                # would replay from the same host buffer, which a tensor built inside the step is not.
                memory = "pinned" if source_tensor.is_pinned() else "pageable"
                what = "a scalar" if source_tensor.dim() == 0 else "a"
                return SafetyFinding(
                    "host_to_device_copy",
                    op,
                    where,
                    f"copy of {what} {memory} CPU tensor to the GPU inside the step{at} ({op})",
                    SUGGEST_INPUT_ON_GPU if source_tensor.dim() else SUGGEST_GPU_TENSOR,
                )
    if name == "lift_fresh" and on_cuda and isinstance(result, torch.Tensor) and result.is_cuda:
        # torch.tensor(data, device="cuda"): the data is put in a pageable host tensor and copied below the
        # dispatcher, so no copy op is seen; the capture raises on that copy.
        return SafetyFinding(
            "host_to_device_copy",
            op,
            where,
            f"torch.tensor(...) on the GPU copies host data from pageable memory inside the step{at} ({op})",
            "build the tensor once outside the step (a buffer), or use torch.full(..., device=...)",
        )
    if name in _DATA_DEPENDENT_OPS:
        what = _DATA_DEPENDENT_OPS[name]
        return SafetyFinding(
            "data_dependent_shape", op, where, f"data-dependent output shape: {what}{at} ({op})", SUGGEST_FIXED_SHAPE
        )
    if name == "repeat_interleave" and kwargs.get("output_size") is None and not _has_output_size(func, args):
        return SafetyFinding(
            "data_dependent_shape",
            op,
            where,
            f"data-dependent output shape: repeat_interleave() without output_size{at} ({op})",
            SUGGEST_FIXED_SHAPE,
        )
    if name in ("index", "index_put_", "index_put", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in indices or ()):
            what = "boolean-mask assignment x[mask] = v" if name != "index" else "boolean-mask indexing x[mask]"
            return SafetyFinding(
                "data_dependent_shape",
                op,
                where,
                f"data-dependent output shape: {what}{at} ({op})",
                "use torch.where(mask, v, x) or masked arithmetic (fixed shapes, no sync)",
            )
    if on_cuda:
        cpu_arguments = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
        if cpu_arguments:
            return SafetyFinding("cpu_op", op, where, f"CPU op: {op} on a CPU tensor{at}", SUGGEST_GPU_TENSOR)
        if not tensors and isinstance(result, torch.Tensor) and result.device.type == "cpu" and result.dim() > 0:
            return SafetyFinding(
                "cpu_op", op, where, f"CPU tensor: {op} creates a tensor on the CPU{at}", SUGGEST_GPU_TENSOR
            )
    return None


def _scalar_value(slot: Any) -> Any:
    value = slot.get()
    return None if value is None else value.item()


def _plain(value: Any) -> Any:
    """A sync's value as a plain Python number (NaN compares equal to NaN here)."""
    if isinstance(value, float) and value != value:
        return "nan"
    return value


def host_sync_mode(replay: list[Any] | None = None) -> Any:
    """A dispatch mode for the step's host syncs (``aten._local_scalar_dense``).

    Without ``replay`` it records their values in ``mode.values``. With ``replay`` it answers them from that
    list instead of syncing: inside a CUDA graph capture a sync would raise, and the values were checked to be
    the same for fresh inputs.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostSyncs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.values: list[Any] = [] if replay is None else list(replay)
            self.used = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func._schema.name.endswith("::_local_scalar_dense"):
                return func(*args, **(kwargs or {}))
            if replay is None:
                self.values.append(func(*args, **(kwargs or {})))
                return self.values[-1]
            if self.used >= len(self.values):
                raise RuntimeError(f"the step made more host syncs during capture than the {len(self.values)} recorded")
            self.used += 1
            return self.values[self.used - 1]

    return HostSyncs()


def _library_suggestion(via: str, finding: SafetyFinding) -> str:
    """What a user can do about a blocker inside a library they did not write."""
    package = via.split(".", 1)[0]
    if package == "transformers" and "mask" in via:
        return (
            "transformers inspects the attention mask on the host to pick its attention path: pass"
            " attention_mask=None when nothing is padded, or use torch.compile, which splits its graph at the sync"
        )
    if package == "transformers" and "cache_utils" in via:
        # A model called with its default use_cache=True builds a new cache object (DynamicCache) in every forward,
        # where a training step or a full-sequence pass needs none.
        return (
            "transformers builds a new KV cache object in every forward (use_cache defaults to True): pass"
            " use_cache=False when the step does not decode token by token, or use torch.compile"
        )
    return (
        f"the {finding.kind.replace('_', ' ')} is inside {package} ({via}), not in your code: look for an option of"
        f" {package} that avoids it, or use torch.compile, which splits its graph there"
    )


def _storage_pointer(tensor: Any) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
        return 0


def _has_output_size(func, args) -> bool:
    names = [argument.name for argument in func._schema.arguments]
    if "output_size" in names:
        position = names.index("output_size")
        return len(args) > position and args[position] is not None
    return False


def _sync_label(source: str) -> str:
    """Name a ``_local_scalar_dense`` by the source line that caused it."""
    if ".item()" in source:
        return "host sync: .item()"
    if re.match(r"(if|elif|while|assert)\b", source) or re.search(r"\b(and|or|not)\b", source):
        return "host sync or data-dependent control flow: a tensor used as a Python bool"
    if re.search(r"\b(int|float|bool)\(", source):
        return "host sync: int()/float()/bool() of a tensor"
    return "host sync or data-dependent control flow"


def _first_change(first: list[_OpRecord], second: list[_OpRecord]) -> SafetyFinding | None:
    """A finding at the first op whose name or argument shapes differ between two calls of the step."""
    for before, after in zip(first, second):
        if before.op != after.op:
            at = f" at {after.where}" if after.where else ""
            return SafetyFinding(
                "changing_shape",
                after.op,
                after.where,
                f"the ops change between two calls of the step: {before.op} then {after.op}{at}",
                SUGGEST_PAD,
            )
        if before.shapes != after.shapes:
            at = f" at {after.where}" if after.where else ""
            return SafetyFinding(
                "changing_shape",
                after.op,
                after.where,
                f"shapes change between two calls of the step: {after.op} got {_shapes(before.shapes)}"
                f" then {_shapes(after.shapes)}{at}",
                SUGGEST_PAD,
            )
    if len(first) != len(second):
        return SafetyFinding(
            "changing_shape",
            "",
            None,
            f"the number of ops changes between two calls of the step: {len(first)} then {len(second)}",
            SUGGEST_PAD,
        )
    return None


def _shapes(shapes: tuple) -> str:
    return ", ".join("(" + ", ".join(map(str, shape)) + ")" for shape in shapes) or "no tensors"
