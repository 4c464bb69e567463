"""The state a step reads and writes: found, snapshotted, restored, compared (DESIGN.md, "Steps are stateful").

Real steps write state: a decode step writes its KV cache (often inside a library cache object passed in the
inputs, such as transformers' ``StaticCache``), a training step writes gradients, weights, optimizer moments
and BatchNorm statistics. The numerics guard and the ``graphs`` fix both need to run a step and then put
everything back as it was, so that no run sees state another run left.

``collect_state({"model": model, "inputs": inputs})`` walks the objects a step can reach and returns a
:class:`StateMap`: one :class:`Slot` per tensor, named by its path (``model.layers.0.mlp.up_proj.weight``,
``inputs[2].layers[3].keys``, ``model.optimizer.state[17].exp_avg``, ``model.model.fc.weight.grad``). The walk
visits, in a fixed order (so that two copies of one model get the same paths):

- tensors (and the ``.grad`` of every leaf tensor that requires grad, present or not);
- ``nn.Module``: its parameters, buffers and submodules, then its other attributes (a module may keep a tensor
  or a cache object as a plain attribute);
- ``torch.optim.Optimizer``: its per-parameter state (moments, momentum buffers, step counters), named by the
  parameter's index in its param groups, present or not (a lazily created state is a slot that is absent);
- dicts, lists and tuples (namedtuples too), and any other object's ``__dict__`` (a cache object's layers).

A tensor reached twice (a tied weight, a cache buffer held by both a module and the cache object) is one slot,
under the first path. The walk stops at ``MAX_DEPTH`` levels and ``MAX_OBJECTS`` objects, and does not enter
modules, classes, functions or strings.

A tensor found in a dict, a list or an object's attributes is an "item" slot that reads its container again
on every look, so a step that binds a new tensor there (a growing ``DynamicCache``) is seen and put back.
A :class:`Snapshot` holds a detached clone of every slot (on the slot's device when it fits, else on the CPU,
``None`` for an absent slot). ``restore`` writes it back **in place** (``copy_`` into the same tensor), because a
CUDA graph reads state by address: an absent slot that exists now is emptied (a gradient set to ``None``; an
optimizer's state tensor, which a captured graph may read, zeroed in place: torch's optimizers start their
lazily created moments, momentum buffers and step counters from zero). ``changed(snapshot)`` names the slots
whose value differs from the snapshot: the state the step writes.

A ``GradScaler`` copied by deepcopy or pickle holds its scale and growth tracker as numbers until its next
``scale()``; the walk builds its tensors from them first, as that call would, so a copy has its original's slots.

Numbers a step may change in Python (a learning-rate scheduler's epoch and the lr it writes into the
optimizer's param groups, a counter on a cache object) are "scalar" slots, seen as 0-dim tensors: snapshotted,
restored and compared like the rest. Numbers inside modules (and in what modules hold, such as a config) are
configuration, not state, and are left out.
Torch is imported inside the functions.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 12  # model -> state object -> module tree -> cache -> layers -> tensor fits well inside
MAX_OBJECTS = 200_000  # objects visited before the walk gives up on the rest (a model holding a data set)
# A longer list of numbers is data (a log of losses), not state to restore number by number.
MAX_SCALAR_LIST = 64
# Snapshots go on the tensors' device while the total leaves this fraction of free device memory.
DEVICE_SNAPSHOT_FRACTION = 0.8

_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice, memoryview)
_OPAQUE_TYPES = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    property,
)


@dataclass
class Slot:
    """One piece of tensor state: a tensor itself, a leaf's ``.grad``, or one entry of an optimizer's state."""

    path: str
    kind: str  # "tensor" | "item" | "grad" | "optimizer" | "scalar"
    tensor: Any = None  # "tensor": the tensor (in a tuple, or a root); "item": the tensor found there by the walk
    # "item": the dict or list holding it (a module's _parameters/_buffers, an object's __dict__); "grad": the
    # parameter; "optimizer": the optimizer
    owner: Any = None
    key: Any = None  # "item": the key or index; "optimizer": (parameter, state key)
    # "item", "scalar": (container, key) where the walk found ``owner`` itself, when that is a dict or list a step
    # may replace whole (a scheduler rebinds its ``_last_lr`` list every step): the owner is looked up there again
    via: Any = None

    @property
    def container(self) -> Any:
        """The dict or list holding an "item" or "scalar" slot now: ``owner``, or what ``via`` names now."""
        if self.via is not None:
            holder, key = self.via
            try:
                current = holder[key]
            except (KeyError, IndexError, TypeError):
                return self.owner
            if type(current) is type(self.owner):
                return current
        return self.owner

    def get(self) -> Any:
        """The tensor now held here, or None when absent (no gradient yet, no optimizer state yet).

        An "item" slot reads its container again: a step may bind a new tensor there (transformers'
        ``DynamicCache`` concatenates each step's keys into a new tensor)."""
        if self.kind == "tensor":
            return self.tensor
        if self.kind == "scalar":  # a Python number in a dict, list or __dict__, seen as a 0-dim CPU tensor
            import torch

            value = _scalar_at(self.container, self.key)
            if value is None:
                return None
            return torch.tensor(float(value) if isinstance(value, float) else int(value), dtype=_scalar_dtype(value))
        if self.kind == "item":
            owner = self.container
            if isinstance(owner, list):
                value = owner[self.key] if self.key < len(owner) else None
            else:
                value = owner.get(self.key)
            return value if _is_tensor(value) else None
        if self.kind == "grad":
            return self.owner.grad
        parameter, name = self.key
        value = self.owner.state.get(parameter, {}).get(name)
        return value if _is_tensor(value) else None

    def put(self, value: Any) -> None:
        """Make the slot hold ``value`` (a tensor or None), in place where a tensor of that shape is there."""
        import torch

        if self.kind == "scalar":
            owner = self.container
            if value is not None and _scalar_at(owner, self.key) is not None:
                kind = type(_scalar_at(owner, self.key))
                owner[self.key] = kind(value.item())
            return
        current = self.get()
        with torch.no_grad():
            if value is None:
                if current is None:
                    return
                if self.kind == "grad":
                    self.owner.grad = None
                else:  # a tensor or an optimizer state a captured graph may read by address: zero it in place
                    current.zero_()
                return
            if current is not None and current.shape == value.shape and current.dtype == value.dtype:
                if current.data_ptr() != value.data_ptr():
                    current.copy_(value.to(current.device, non_blocking=False))
                return
            if self.kind == "item":  # another shape (a grown cache): bind a copy of the snapshot there again
                device = current.device if current is not None else self.tensor.device
                restored = value.to(device).clone()
                if isinstance(current if current is not None else self.tensor, torch.nn.Parameter):
                    restored = torch.nn.Parameter(restored, requires_grad=self.tensor.requires_grad)
                self.container[self.key] = restored
            elif self.kind == "tensor":  # a reshaped tensor cannot be written back in place: set its data
                self.tensor.data = value.to(self.tensor.device).clone()
            elif self.kind == "grad":
                self.owner.grad = value.to(self.owner.device).clone()
            else:
                parameter, name = self.key
                self.owner.state.setdefault(parameter, {})[name] = value.clone()


@dataclass
class Snapshot:
    """Detached clones of every slot of a :class:`StateMap` (None for an absent slot)."""

    values: dict[str, Any]
    on_cpu: bool = False

    def __getitem__(self, path: str) -> Any:
        return self.values[path]

    def __contains__(self, path: str) -> bool:
        return path in self.values


@dataclass
class StateMap:
    """The slots of the state reachable from some roots, by path (see the module docstring)."""

    slots: dict[str, Slot] = field(default_factory=dict)
    truncated: bool = False  # the walk hit MAX_OBJECTS or MAX_DEPTH somewhere

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots.values())

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, path: str) -> bool:
        return path in self.slots

    def __getitem__(self, path: str) -> Slot:
        return self.slots[path]

    def tensors(self) -> list[tuple[str, Any]]:
        """(path, tensor) of every slot that holds a tensor now."""
        return [(slot.path, value) for slot in self if (value := slot.get()) is not None]

    def nbytes(self, paths: Iterable[str] | None = None) -> int:
        chosen = self.slots.values() if paths is None else [self.slots[p] for p in paths if p in self.slots]
        total = 0
        for slot in chosen:
            value = slot.get()
            if value is not None:
                total += value.numel() * value.element_size()
        return total

    def snapshot(self, paths: Iterable[str] | None = None, *, device: str | None = None) -> Snapshot:
        """Clone the slots (all, or ``paths``); on their own device while that fits, else on the CPU.

        ``device="cpu"`` forces the CPU.
        """
        import torch

        chosen = list(self.slots) if paths is None else [p for p in paths if p in self.slots]
        on_cpu = device == "cpu"
        if not on_cpu:
            needed = self.nbytes(chosen)
            for index in _cuda_devices(self, chosen):
                free_bytes, _ = torch.cuda.mem_get_info(index)
                if needed > DEVICE_SNAPSHOT_FRACTION * free_bytes:
                    on_cpu = True
        values: dict[str, Any] = {}
        with torch.no_grad():
            for path in chosen:
                value = self.slots[path].get()
                if value is None:
                    values[path] = None
                else:
                    clone = value.detach().to("cpu", copy=True) if on_cpu else value.detach().clone()
                    values[path] = clone
        return Snapshot(values, on_cpu)

    def restore(self, snapshot: Snapshot, paths: Iterable[str] | None = None) -> None:
        """Write ``snapshot`` back into the slots (all it holds, or ``paths``), in place."""
        chosen = snapshot.values if paths is None else [p for p in paths if p in snapshot.values]
        for path in chosen:
            if path in self.slots:
                self.slots[path].put(snapshot.values[path])

    def changed(self, snapshot: Snapshot) -> list[str]:
        """Paths whose value differs from ``snapshot`` (appeared, vanished, reshaped or other values)."""
        import torch

        found = []
        for path, before in snapshot.values.items():
            slot = self.slots.get(path)
            if slot is None:
                continue
            now = slot.get()
            if before is None or now is None:
                if (before is None) != (now is None):
                    found.append(path)
                continue
            if now.shape != before.shape or now.dtype != before.dtype:
                found.append(path)
                continue
            if not torch.equal(now.detach(), before.to(now.device)):
                found.append(path)
        return found

    def load_from(self, other: StateMap, snapshot: Snapshot, paths: Iterable[str]) -> list[str]:
        """Write ``snapshot`` (taken of ``other``) into this map's slots of the same paths; return the paths
        that have no counterpart here (missing, or another shape or dtype)."""
        missing = []
        for path in paths:
            if path not in snapshot.values:
                continue
            slot = self.slots.get(path)
            value = snapshot.values[path]
            if slot is None:
                missing.append(path)
                continue
            current = slot.get()
            reshaped = value is not None and current is not None and current.shape != value.shape
            if reshaped or (value is not None and current is not None and current.dtype != value.dtype):
                missing.append(path)
                continue
            if other.slots.get(path) is not None and same_slot(other.slots[path], slot):
                continue  # shared with the other map: already restored there
            slot.put(value)
        return missing


def same_slot(a: Slot, b: Slot) -> bool:
    """Whether two slots (of two state maps) are the same piece of state: shared between two workloads."""
    if a.kind != b.kind:
        return False
    if a.kind == "tensor":
        return a.tensor is b.tensor
    if a.kind in ("item", "scalar"):
        return a.owner is b.owner and a.key == b.key
    if a.kind == "grad":
        return a.owner is b.owner
    return a.owner is b.owner and a.key[0] is b.key[0]


def _scalar_at(owner: Any, key: Any) -> Any:
    """The int, float or bool at owner[key], or None."""
    if isinstance(owner, list):
        value = owner[key] if key < len(owner) else None
    else:
        value = owner.get(key)
    return value if isinstance(value, (int, float)) else None


def _scalar_dtype(value: Any) -> Any:
    import torch

    return torch.float64 if isinstance(value, float) else torch.int64


def _cuda_devices(state: StateMap, paths: list[str]) -> set[int]:
    devices = set()
    for path in paths:
        value = state.slots[path].get()
        if value is not None and value.is_cuda:
            devices.add(value.device.index or 0)
    return devices


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


# ---------------------------------------------------------------------------------------------------------------
# The walk


def collect_state(roots: dict[str, Any]) -> StateMap:
    """Every tensor slot reachable from ``roots`` ({"model": model, "inputs": inputs}), by path."""
    import torch
    from torch import nn

    state = StateMap()
    # Whether numbers found at this level are state: not inside modules (their numbers are configuration:
    # eps, sizes, flags), nor in the objects and configs a module holds.
    scalars_here = [True]
    seen_objects: set[int] = set()
    seen_tensors: set[int] = set()
    budget = [MAX_OBJECTS]
    scaler_types = grad_scaler_types()

    def add(slot: Slot) -> None:
        state.slots.setdefault(slot.path, slot)

    def visit(value: Any, path: str, depth: int, owner: Any = None, key: Any = None, via: Any = None) -> None:
        if isinstance(value, (int, float)) and owner is not None and scalars_here[-1]:
            # A number a step may change in Python: a scheduler's epoch, an optimizer group's lr.
            add(Slot(path, "scalar", owner=owner, key=key, via=via))
            return
        if isinstance(value, _LEAF_TYPES) or isinstance(value, _OPAQUE_TYPES):
            return
        if isinstance(value, torch.Tensor):
            if id(value) in seen_tensors:
                return
            seen_tensors.add(id(value))
            if owner is not None:  # in a dict or list the step can bind a new tensor into
                add(Slot(path, "item", tensor=value, owner=owner, key=key, via=via))
            else:
                add(Slot(path, "tensor", tensor=value))
            if value.is_leaf and value.requires_grad:
                add(Slot(f"{path}.grad", "grad", owner=value))
            return
        if id(value) in seen_objects:
            return
        if depth > MAX_DEPTH or budget[0] <= 0:
            state.truncated = True
            return
        seen_objects.add(id(value))
        budget[0] -= 1
        if isinstance(value, nn.Module):
            for table in (value._parameters, value._buffers):
                for name, tensor in list(table.items()):
                    if tensor is not None:
                        visit(tensor, f"{path}.{name}", depth + 1, table, name)
            scalars_here.append(False)
            try:
                for name, module in value._modules.items():
                    if module is not None:
                        visit(module, f"{path}.{name}", depth + 1)
                attributes = vars(value)
                for name, item in list(attributes.items()):
                    if name.startswith("_") or name == "training":
                        continue
                    visit(item, f"{path}.{name}", depth + 1, attributes, name)
            finally:
                scalars_here.pop()
            return
        if isinstance(value, torch.optim.Optimizer):
            parameters = [p for group in value.param_groups for p in group["params"]]
            keys: list[str] = []
            for parameter in parameters:
                for key, item in value.state.get(parameter, {}).items():
                    if isinstance(item, torch.Tensor) and key not in keys:
                        keys.append(key)
            keys = keys or _lazy_state_keys(value)
            for index, parameter in enumerate(parameters):
                visit(parameter, f"{path}.param[{index}]", depth + 1)
                for key in keys:
                    add(Slot(f"{path}.state[{index}].{key}", "optimizer", owner=value, key=(parameter, key)))
            scalars_here.append(True)
            try:
                for index, group in enumerate(value.param_groups):  # lr, momentum, ...: a scheduler moves them
                    for key, item in group.items():
                        if key != "params":
                            visit(item, f"{path}.param_groups[{index}][{key!r}]", depth + 1, group, key)
            finally:
                scalars_here.pop()
            return
        # Where this dict or list itself sits (an object's attribute, a dict's value): its items look it up there.
        here = (owner, key) if isinstance(owner, (dict, list)) else None
        if isinstance(value, dict):
            for name, item in list(value.items()):
                visit(item, f"{path}[{name!r}]", depth + 1, value, name, here)
            return
        if isinstance(value, list):
            if len(value) > MAX_SCALAR_LIST and isinstance(value[0], _LEAF_TYPES):
                return  # a long list of numbers or strings: data (a log of losses, token strings), no tensors
            scalars_here.append(scalars_here[-1] and len(value) <= MAX_SCALAR_LIST)
            try:
                for index, item in enumerate(list(value)):
                    visit(item, f"{path}[{index}]", depth + 1, value, index, here)
            finally:
                scalars_here.pop()
            return
        if isinstance(value, tuple):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]", depth + 1)
            return
        if isinstance(value, (set, frozenset)):
            return  # unordered: no stable path
        materialize_scaler(value, scaler_types)
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            for name, item in list(attributes.items()):
                if not name.startswith("__"):
                    visit(item, f"{path}.{name}", depth + 1, attributes, name)

    for name, root in roots.items():
        visit(root, name, 0)
    return state


def grad_scaler_types() -> tuple[type, ...]:
    """``torch.amp.GradScaler`` and the older ``torch.cuda.amp.GradScaler``, those this torch has."""
    import torch

    kinds = (getattr(torch.amp, "GradScaler", None), getattr(torch.cuda.amp, "GradScaler", None))
    return tuple(kind for kind in kinds if isinstance(kind, type))


def materialize_scaler(value: Any, kinds: tuple[type, ...] | None = None) -> None:
    """A copied ``GradScaler`` (deepcopy, pickle) holds its scale and growth tracker as numbers until its next
    ``scale()`` builds the tensors from them; build them now, as that call would, so a copy has the same slots
    as its original from the start. Anything else is left alone. ``kinds``: :func:`grad_scaler_types`."""
    import torch

    kinds = grad_scaler_types() if kinds is None else kinds
    if not isinstance(value, kinds) or not getattr(value, "_enabled", False) or value._scale is not None:
        return
    init = getattr(value, "_lazy_init_scale_growth_tracker", None)
    device = getattr(value, "_device", None)
    if callable(init) and isinstance(device, str):
        init(torch.device(device))


def map_tensors(function: Any, value: Any) -> Any:
    """``value`` with ``function`` applied to every tensor in it: in tuples, namedtuples, lists and dicts, rebuilt
    with the same types; anything else (a cache object, a number) is passed as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(map_tensors(function, item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(function, item) for item in value)
    if isinstance(value, dict):
        return {key: map_tensors(function, item) for key, item in value.items()}
    return value


def step_globals(step: Any) -> dict[str, Any]:
    """What a step function reaches besides its two arguments: the module-level names its code refers to and
    its closure's cells (a training step that uses a module-level ``optimizer``), less modules, functions and
    classes. ``{}`` for anything that is not a plain Python function. A wrapper made with ``functools.wraps``
    (a fix's patched step around the user's, a ``@torch.no_grad()`` step) is looked through to the step it
    wraps: what that step reaches is what the wrapper reaches."""
    import inspect

    function = inspect.unwrap(getattr(step, "__func__", step))  # a bound method: its function
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    if code is None or not inspect.isfunction(function):
        return {}
    found: dict[str, Any] = {}
    namespace = function.__globals__
    names = set(code.co_names)
    for const in code.co_consts:  # names used by nested functions and comprehensions
        if hasattr(const, "co_names"):
            names.update(const.co_names)
    for name in sorted(names):
        if name in namespace and not isinstance(namespace[name], _OPAQUE_TYPES + _LEAF_TYPES):
            found[name] = namespace[name]
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not isinstance(value, _OPAQUE_TYPES + _LEAF_TYPES):
            found[name] = value
    return found


def workload_roots(workload: Any) -> dict[str, Any]:
    """The roots of a workload's state: its model, its inputs, and what its step reaches on its own."""
    roots = {"model": workload.model, "inputs": workload.inputs}
    extra = step_globals(workload.step)
    if extra:
        roots["step"] = extra
    return roots


def _lazy_state_keys(optimizer: Any) -> list[str]:
    """The state entries an optimizer creates on its first step (so an absent state is a slot too)."""
    name = type(optimizer).__name__
    defaults = optimizer.defaults
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        keys = ["step", "exp_avg", "exp_avg_sq"]
        if defaults.get("amsgrad"):
            keys.append("max_exp_avg_sq")
        return keys
    if name == "SGD":
        return ["momentum_buffer"] if defaults.get("momentum", 0) else []
    if name == "RMSprop":
        return ["step", "square_avg"] + (["momentum_buffer"] if defaults.get("momentum", 0) else [])
    if name == "Adagrad":
        return ["step", "sum"]
    return []


def optimizers_in(roots: dict[str, Any]) -> list[Any]:
    """The torch optimizers reachable from ``roots`` (the same walk as collect_state, stopping at optimizers)."""
    import torch
    from torch import nn

    found: list[Any] = []
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, (_LEAF_TYPES, _OPAQUE_TYPES, torch.Tensor)) or id(value) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(value))
        if len(seen) > MAX_OBJECTS:
            return
        if isinstance(value, torch.optim.Optimizer):
            found.append(value)
            return
        if isinstance(value, nn.Module):
            items = [*value._modules.values(), *(v for k, v in vars(value).items() if not k.startswith("_"))]
        elif isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            attributes = getattr(value, "__dict__", None)
            items = list(attributes.values()) if isinstance(attributes, dict) else []
        for item in items:
            visit(item, depth + 1)

    for root in roots.values():
        visit(root, 0)
    return found


# ---------------------------------------------------------------------------------------------------------------
# Comparing what two runs wrote


def delta(after: Any, before: Any) -> Any:
    """What a step wrote into one slot: ``after - before`` in float64 for floating state (``after`` when the slot
    was absent before), ``after`` itself for integer and bool state (compared exactly)."""

    if after is None:
        return None
    if not after.dtype.is_floating_point:
        return after
    after64 = after.detach().double()
    if before is None or before.shape != after.shape:
        return after64
    return after64 - before.detach().to(after.device).double()


def describe_paths(paths: list[str], limit: int = 3) -> str:
    """The first ``limit`` paths, then how many more ("a, b, c and 4 more"), for a message."""
    if len(paths) <= limit:
        return ", ".join(paths)
    return f"{', '.join(paths[:limit])} and {len(paths) - limit} more"
