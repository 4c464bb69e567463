"""What the model-wide fixes (sdpa, channels_last, bf16, fused_optimizer) share: finding the modules a workload's
model holds, wrapping the user's step, and copying the model together with the state that drives it.

- ``held_modules(model)``: the ``nn.Module`` the model is, or the modules a training state holds (a dataclass
  or object with ``.model``, ``.loss_fn``; a dict; a list), one level down, with their paths.
- ``wrap_step(step, around)``: the user's two-argument step run inside a context manager (an attention switch,
  autocast), made with ``functools.wraps`` so that ``state.step_globals`` still sees what the user's step
  reaches (a module-level optimizer).
- ``copy_workload(workload)``: the model and the inputs deep-copied together (one memo), so that an optimizer
  in a ``TrainState`` updates the copied parameters, not the original's. Objects the inputs carry (a cache, an
  optimizer) become the copy's own: the patched step swaps them in for the originals when it is called with
  the original's objects (the numerics guard's fresh inputs keep the original's non-tensor objects). A
  ``GradScaler`` pickles (and so deep-copies) without its scale and growth-tracker tensors, to rebuild them on
  its next ``scale()`` from the numbers it keeps; the copy builds them at once, so the two hold the same state
  from the start.
- ``step_state_refusal(workload, fix_title, suggestion)``: a copy cannot take along what the step reaches
  through its module's globals (an optimizer built at module level holds the original's parameters): such a
  workload is refused, naming the line where that object is built.

Torch is imported inside the functions.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuadvisor.fixes.base import Refusal


def held_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) for the model itself when it is an ``nn.Module``, else for each module it holds one level
    down (a dataclass field, an attribute, a dict value, a list item), in a fixed order, each module once."""
    from torch import nn

    if isinstance(model, nn.Module):
        return [("model", model)]
    if dataclasses.is_dataclass(model) and not isinstance(model, type):
        items = [(f"model.{item.name}", getattr(model, item.name, None)) for item in dataclasses.fields(model)]
    elif isinstance(model, dict):
        items = [(f"model[{key!r}]", value) for key, value in model.items()]
    elif isinstance(model, (list, tuple)):
        items = [(f"model[{index}]", value) for index, value in enumerate(model)]
    else:
        items = [(f"model.{name}", value) for name, value in vars(model).items() if not name.startswith("_")]
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for path, value in items:
        if isinstance(value, nn.Module) and id(value) not in seen:
            seen.add(id(value))
            found.append((path, value))
    return found


def wrap_step(step: Callable[[Any, tuple], Any], around: Callable[[], Any]) -> Callable[[Any, tuple], Any]:
    """``step`` run inside the context manager ``around()`` returns, a new one per call."""

    @functools.wraps(step)
    def patched_step(model: Any, inputs: tuple) -> Any:
        with around():
            return step(model, inputs)

    return patched_step


@dataclasses.dataclass
class WorkloadCopy:
    """The model and inputs deep-copied together, and the inputs' objects paired with their copies."""

    model: Any
    inputs: tuple
    carried: list[tuple[Any, Any]]  # (the original's object in the inputs, its copy): a cache, an optimizer

    def step(self, step: Callable[[Any, tuple], Any]) -> Callable[[Any, tuple], Any]:
        """``step`` itself when the inputs carry no objects; else ``step`` called with the copies in place of the
        original's objects (tensors are passed as they come)."""
        if not self.carried:
            return step
        carried = self.carried

        @functools.wraps(step)
        def patched_step(model: Any, inputs: tuple) -> Any:
            return step(model, _swap(inputs, carried))

        return patched_step


def copy_workload(workload: Any, copies: float = 1.1) -> WorkloadCopy | None:
    """``workload``'s model and inputs deep-copied with one memo (see the module docstring); None when the copy does
    not fit in device memory (``copies`` copies of the model's state, as ``safety.private_copy``) or the model
    cannot be deep-copied."""
    from gpuadvisor.fixes.safety import copy_fits

    if not copy_fits(workload.model, copies):
        return None
    memo: dict[int, Any] = {}
    try:
        model, inputs = deepcopy_state((workload.model, tuple(workload.inputs)), memo)
    except Exception:  # a lock, a file, a tensor with autograd history: deepcopy raises many kinds
        return None
    carried = [(value, memo[id(value)]) for value in _objects(workload.inputs) if id(value) in memo]
    return WorkloadCopy(model, inputs, carried)


def deepcopy_state(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy(value, memo)``, with each ``GradScaler`` in it given its tensors again (module docstring;
    ``state.materialize_scaler``): every copy of a workload's state that a step runs on is made with it."""
    from gpuadvisor.fixes.state import grad_scaler_types, materialize_scaler

    memo = {} if memo is None else memo
    copied = copy.deepcopy(value, memo)
    kinds = grad_scaler_types()
    for item in list(memo.values()):
        materialize_scaler(item, kinds)
    return copied


def _objects(value: Any) -> list[Any]:
    """The non-tensor, non-number objects inside tuples, lists and dicts of ``value`` (not inside the objects)."""
    import torch

    if isinstance(value, (tuple, list)):
        return [item for inner in value for item in _objects(inner)]
    if isinstance(value, dict):
        return [item for inner in value.values() for item in _objects(inner)]
    if isinstance(value, (torch.Tensor, str, bytes, int, float, complex, bool, type(None))):
        return []
    return [value]


def _swap(value: Any, carried: list[tuple[Any, Any]]) -> Any:
    for original, replacement in carried:
        if value is original:
            return replacement
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_swap(item, carried) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_swap(item, carried) for item in value)
    if isinstance(value, dict):
        return {key: _swap(item, carried) for key, item in value.items()}
    return value


def step_state_refusal(workload: Any, fix_title: str, suggestion: str) -> Refusal | None:
    """A refusal when the step reaches, through its module's globals or closure, an optimizer or a tensor of the
    model: a copy of the model would leave that object working on the original's parameters."""
    from gpuadvisor.fixes.state import collect_state, optimizers_in, step_globals

    outside = step_globals(workload.step)
    if not outside:
        return None
    model_tensors = {
        id(slot.get()) for slot in collect_state({"model": workload.model}) if slot.kind in ("tensor", "item")
    }
    for name, value in outside.items():
        holds_optimizer = bool(optimizers_in({name: value}))
        holds_model_tensor = any(
            slot.kind in ("tensor", "item") and id(slot.get()) in model_tensors for slot in collect_state({name: value})
        )
        if holds_optimizer or holds_model_tensor:
            what = type(value).__name__
            where = defined_at(workload.step, name)
            at = f" ({where})" if where else ""
            return Refusal(
                f"the step uses {name} ({what}) from its module{at}: {fix_title} works on a copy of the model,"
                f" and that {what} would go on updating the original's parameters",
                suggestion,
            )
    return None


def defined_at(step: Any, name: str) -> str | None:
    """'train.py:12: optimizer = torch.optim.AdamW(...)': the first line of the step's file that assigns ``name``
    at any indentation, or None when the source cannot be read."""
    function = inspect.unwrap(getattr(step, "__func__", step))
    try:
        filename = inspect.getsourcefile(function)
        lines = Path(filename).read_text().splitlines() if filename else []
    except (OSError, TypeError):
        return None
    pattern = re.compile(rf"^\s*(global\s+)?{re.escape(name)}\s*(:[^=]*)?=(?!=)")
    for number, line in enumerate(lines, start=1):
        if pattern.match(line):
            return f"{Path(filename).name}:{number}: {line.strip()}"
    return None


def step_source(step: Any) -> tuple[str, str, int] | None:
    """(source, file name, first line) of the user's step, or None when it cannot be read (a lambda in a REPL,
    a builtin)."""
    function = inspect.unwrap(getattr(step, "__func__", step))
    try:
        lines, first = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or "<step>"
    except (OSError, TypeError):
        return None
    return "".join(lines), Path(filename).name, first
