"""The ``fused_optimizer`` fix: torch optimizers run their update fused (or, without a fused kernel, foreach).

Why: ``foreach=False`` (or ``foreach=None`` where PyTorch's default is the loop: parameters off CUDA) runs the
update as a Python loop, about a dozen small kernels per parameter tensor: some 1,800 launches for GPT-2 small's
148 tensors with AdamW (examples/real/hf_gpt2_train_foreach_off.py; rule GA204). ``foreach=True`` (PyTorch's
default on CUDA) groups the tensors into multi-tensor kernels, but makes one pass over parameters, gradients and
state per line of the update, and AdamW's step counters stay on the CPU, read with ``.item()`` per tensor (rule
GA205: BERT-base's AdamW, 48 kernels and 415 operator calls directly inside optimizer.step(), 402 of them
``.item()``, per step). ``fused=True`` does the update in one pass per
chunk of tensors, counters on the device.

``check()`` finds the ``torch.optim`` optimizers the workload reaches (a training state's ``.optimizer``, the
inputs, the step's module globals) and refuses when there is none, when every one already runs fused, or when
the rest run foreach and have no fused implementation for their parameters (the class has none, or the
parameters are not floating tensors on a device it supports). An optimizer built at module level
(a global of the step) is refused, naming the line that builds it: a copy of the model would leave it updating
the original's parameters.

``apply()`` copies the model and inputs together (one deepcopy memo, ``copying.copy_workload``: the copied
optimizer holds the copied parameters and its state), then switches each copied optimizer's param groups to
``fused=True`` where the class has a fused implementation for those parameters (Adam, AdamW, SGD and Adagrad in
torch 2.13: floating parameters on CUDA or the CPU, not ``differentiable``), else a loop to ``foreach=True`` (on
CUDA).
Existing state is converted in the copy as the fused kernels expect it: the step counters become float32 tensors
on the parameter's device (the loop keeps them on the CPU). The original optimizer is untouched. The update is
the same arithmetic in another order: the guard's "model" policy judges it.
"""

from __future__ import annotations

from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal

SUGGESTION = "build the optimizer with fused=True (torch.optim.AdamW(params, ..., fused=True))"


def _fused_classes() -> tuple[type, ...]:
    import torch

    return (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)


def implementation(optimizer: Any) -> str:
    """'fused', 'foreach' or 'loop': what ``optimizer.step()`` runs for its param groups (the slowest group's)."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    supported = _get_foreach_kernels_supported_devices()
    kinds = []
    for group in optimizer.param_groups:
        if group.get("fused"):
            kinds.append("fused")
        elif group.get("foreach"):
            kinds.append("foreach")
        elif group.get("foreach") is None and not group.get("differentiable"):
            params = group["params"]
            on_foreach_device = bool(params) and all(p.device.type in supported for p in params)
            kinds.append("foreach" if on_foreach_device else "loop")
        else:
            kinds.append("loop")
    for kind in ("loop", "foreach", "fused"):
        if kind in kinds:
            return kind
    return "fused"


def faster_option(optimizer: Any) -> str | None:
    """'fused' or 'foreach' (the faster one this optimizer supports for its parameters), or None."""
    from torch.utils._foreach_utils import (
        _get_foreach_kernels_supported_devices,
        _get_fused_kernels_supported_devices,
    )

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or any(group.get("differentiable") for group in optimizer.param_groups):
        return None
    if isinstance(optimizer, _fused_classes()) and "fused" in optimizer.defaults:
        devices = _get_fused_kernels_supported_devices()
        if all(p.is_floating_point() and p.device.type in devices for p in params):
            return "fused"
    if "foreach" in optimizer.defaults:
        devices = _get_foreach_kernels_supported_devices()
        if all(p.device.type in devices for p in params):
            return "foreach"
    return None


def _switch(optimizer: Any) -> str | None:
    """What this fix switches an optimizer to: the faster option for a loop, ``fused`` for foreach where the
    class has a fused kernel for its parameters, None when nothing pays (already fused, or foreach without one)."""
    kind = implementation(optimizer)
    if kind == "fused":
        return None
    option = faster_option(optimizer)
    if kind == "foreach" and option != "fused":
        return None
    return option


def _default_note(optimizer: Any) -> str:
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused=True"
    if group.get("foreach"):
        return "foreach=True"
    return "PyTorch's default on CUDA"


class FusedOptimizerFix(Fix):
    """Switch optimizer updates to fused (a loop without a fused kernel to foreach; see the module docstring)."""

    id = "fused_optimizer"
    title = "optimizer: per-parameter loop or foreach -> fused update"
    numerics = "model"

    def check(self, workload: Any) -> Refusal | None:
        from gpuadvisor.fixes.copying import defined_at
        from gpuadvisor.fixes.state import optimizers_in, step_globals

        own = step_globals(workload.step)
        in_globals = {id(opt) for opt in optimizers_in({"step": own})} if own else set()
        optimizers = optimizers_in({"model": workload.model, "inputs": workload.inputs, "step": own})
        if not optimizers:
            return Refusal(
                "no torch.optim optimizer in the workload (its model, inputs or the step's module globals)",
                "nothing to do: the fix changes how an optimizer's step() runs",
            )
        able = [opt for opt in optimizers if _switch(opt) is not None]
        if not able:
            loops = [opt for opt in optimizers if implementation(opt) == "loop"]
            foreach = [opt for opt in optimizers if implementation(opt) == "foreach"]
            if loops:
                first = loops[0]
                device = next((p.device.type for g in first.param_groups for p in g["params"]), "no parameters")
                return Refusal(
                    f"{type(first).__name__} has no fused or foreach implementation that pays for its parameters"
                    f" (on {device}; foreach runs the same per-tensor loop off CUDA)",
                    "move the model to a CUDA GPU, or use Adam, AdamW, SGD or Adagrad with fused=True",
                )
            if foreach:
                first = foreach[0]
                return Refusal(
                    f"{type(first).__name__} already runs foreach ({_default_note(first)}) and has no fused"
                    " implementation for its parameters",
                    "nothing to do: fused=True exists for Adam, AdamW, SGD and Adagrad on floating parameters",
                )
            first = optimizers[0]
            return Refusal(f"{type(first).__name__} already runs fused ({_default_note(first)})", "nothing to do")
        for optimizer in able:
            if id(optimizer) in in_globals:
                name = next((key for key, value in own.items() if optimizers_in({key: value}) == [optimizer]), None)
                name = name or next(key for key, value in own.items() if optimizer in optimizers_in({key: value}))
                where = defined_at(workload.step, name)
                at = f" at {where}" if where else ""
                return Refusal(
                    f"{type(optimizer).__name__} {name} is a module global of the step (built{at}): a copy would"
                    " leave it updating the original's parameters, and this fix never changes the user's optimizer",
                    SUGGESTION,
                )
        return None

    def apply(self, workload: Any) -> Applied:
        import torch

        from gpuadvisor.fixes.copying import copy_workload
        from gpuadvisor.fixes.state import optimizers_in

        refusal = self.check(workload)
        if refusal is not None:
            raise NothingToApply(refusal)
        copied = copy_workload(workload)
        if copied is None:
            raise NothingToApply(
                Refusal(
                    "the model and its optimizer cannot be copied (deepcopy refuses an object in them, or a copy"
                    " does not fit in device memory), and this fix never changes the user's optimizer",
                    SUGGESTION,
                )
            )
        changes, skipped = [], []
        for optimizer in optimizers_in({"model": copied.model, "inputs": copied.inputs}):
            name = type(optimizer).__name__
            kind = implementation(optimizer)
            if kind == "fused":
                continue
            option = _switch(optimizer)
            if option is None:
                if kind == "loop":
                    skipped.append({"target": name, "reason": "no fused or foreach implementation for its parameters"})
                continue
            flag = optimizer.param_groups[0].get("foreach")
            before = {False: "foreach=False", True: "foreach=True"}.get(flag, "foreach=None")
            moved = 0
            for group in optimizer.param_groups:
                if option == "fused":
                    group["fused"], group["foreach"] = True, False
                else:
                    group["foreach"] = True
            if option == "fused":
                optimizer.defaults["fused"], optimizer.defaults["foreach"] = True, False
                # What the constructor sets for fused=True: GradScaler may unscale inside the fused step, and
                # the first step checks the parameters' devices and dtypes.
                optimizer._step_supports_amp_scaling = True
                optimizer._need_device_dtype_check_for_fused = True
                for group in optimizer.param_groups:
                    for parameter in group["params"]:
                        entry = optimizer.state.get(parameter)
                        step = entry.get("step") if entry else None
                        if isinstance(step, torch.Tensor) and (
                            step.device != parameter.device or step.dtype != torch.float32
                        ):
                            entry["step"] = step.to(parameter.device, torch.float32)
                            moved += 1
            else:
                optimizer.defaults["foreach"] = True
            count = sum(len(group["params"]) for group in optimizer.param_groups)
            line = f"{name} ({count} parameter tensors): {before} -> {option}=True on a copy of model and optimizer"
            if moved:
                line += f"; {moved} step counters moved to the parameters' device as float32 (fused kernels read them)"
            changes.append(line)
        if not changes:
            raise NothingToApply(
                Refusal(
                    "no optimizer in a copyable place runs a loop or a foreach update that fused=True replaces",
                    SUGGESTION,
                    [],
                )
            )
        changes.append("the original model and optimizer are untouched (foreach/fused flags, state)")
        patched = workload.with_step(copied.model, copied.step(workload.step), copied.inputs)
        return Applied(patched, changes, skipped)
