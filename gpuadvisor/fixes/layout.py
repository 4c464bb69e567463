"""The ``channels_last`` fix: convolution models in NHWC memory layout.

Why: cuDNN's fast convolution kernels (and its tensor-core paths) work on NHWC; a model in PyTorch's default
NCHW layout pays a transpose around each convolution. Measured on the H200 (examples/real/hf_resnet_train.py,
torch 2.11): 129 ``nchwToNhwc`` transposes per ResNet-50 training step, beside the convolutions.

``check()`` looks for ``nn.Conv2d`` in the modules the workload holds (the model, or a training state's
``.model``). ``apply()`` deep-copies the model and the inputs together (one memo, so an optimizer in a
``TrainState`` updates the copied parameters; ``copying.copy_workload``), converts the copied modules with
``.to(memory_format=torch.channels_last)`` (the 4-D weights change layout in place: parameter objects, and so
the copied optimizer's references, stay the same; its state buffers and any gradients of those weights are
converted too, so its foreach update keeps its multi-tensor path), and wraps the step so that each call converts the 4-D
floating input tensors with ``.contiguous(memory_format=torch.channels_last)`` before the user's step: the
conversion's cost is part of the measured step, as it would be in the user's loop. Values do not change, only
the order in memory; the guard's "model" policy judges it (fp32: relative L2 1e-4).

Refused: no ``Conv2d`` (channels_last changes nothing), every convolution weight already channels_last, a
step that drives state through its module's globals (a module-level optimizer would go on updating the
original's parameters: convert where the model is built instead), a model that cannot be copied.
"""

from __future__ import annotations

import functools
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal

SUGGESTION = (
    "convert where the model is built: model = model.to(memory_format=torch.channels_last), and the images with"
    " images.contiguous(memory_format=torch.channels_last)"
)


def conv2d_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every ``nn.Conv2d`` in the modules the workload's model is or holds."""
    from torch import nn

    from gpuadvisor.fixes.copying import held_modules

    return [
        (f"{root_path}.{name}", module)
        for root_path, root in held_modules(model)
        for name, module in root.named_modules()
        if isinstance(module, nn.Conv2d)
    ]


def to_channels_last(value: Any) -> Any:
    """``value`` with every 4-D floating tensor in it (in tuples, namedtuples, lists, dicts) made channels_last."""
    import torch

    from gpuadvisor.fixes.state import map_tensors

    def convert(tensor: Any) -> Any:
        if tensor.dim() == 4 and tensor.is_floating_point():
            return tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    return map_tensors(convert, value)


class ChannelsLastFix(Fix):
    """Run the model's convolutions in channels_last (see the module docstring)."""

    id = "channels_last"
    title = "convolutions in channels_last (NHWC) memory layout"
    numerics = "model"

    def check(self, workload: Any) -> Refusal | None:
        import torch

        from gpuadvisor.fixes.copying import step_state_refusal

        convolutions = conv2d_modules(workload.model)
        if not convolutions:
            return Refusal(
                "no 2-D convolutions (nn.Conv2d): channels_last changes nothing",
                "nothing to do: the memory layout matters for convolutions only",
            )
        pending = [
            path for path, module in convolutions if not module.weight.is_contiguous(memory_format=torch.channels_last)
        ]
        if not pending:
            return Refusal(
                f"the model is already channels_last (all {len(convolutions)} Conv2d weights are NHWC)",
                "nothing to do; keep the inputs channels_last too"
                " (images.contiguous(memory_format=torch.channels_last))",
            )
        return step_state_refusal(workload, "channels_last", SUGGESTION)

    def apply(self, workload: Any) -> Applied:
        import torch

        from gpuadvisor.fixes.copying import copy_workload, held_modules

        refusal = self.check(workload)
        if refusal is not None:
            raise NothingToApply(refusal)
        copied = copy_workload(workload)
        if copied is None:
            raise NothingToApply(
                Refusal(
                    "the model cannot be copied (it holds an object deepcopy refuses, or a copy does not fit in"
                    " device memory), and this fix never changes the user's model",
                    SUGGESTION,
                )
            )
        converted = []
        for path, module in held_modules(copied.model):
            if any(isinstance(inner, torch.nn.Conv2d) for inner in module.modules()):
                module.to(memory_format=torch.channels_last)
                converted.append(f"{path} ({type(module).__name__})")
        count = len(conv2d_modules(copied.model))
        moved_state = _optimizer_state_to_channels_last(copied.model, copied.inputs)
        inputs_4d = _count_4d(workload.inputs)
        step = _channels_last_step(copied.step(workload.step))
        patched = workload.with_step(copied.model, step, copied.inputs)
        changes = [
            f"{', '.join(converted)} converted to channels_last on a copy: {count} Conv2d modules' weights in NHWC",
            f"each step converts its {inputs_4d} 4-D floating input(s) with .contiguous(memory_format="
            "torch.channels_last) before the model runs (counted in the step's time)",
        ]
        if moved_state:
            changes.append(
                f"{moved_state} optimizer state tensor(s) and gradient(s) of those weights converted too (a "
                "foreach optimizer whose momentum or moment buffers keep NCHW strides beside channels_last "
                "weights falls back to a kernel per tensor)"
            )
        if copied.carried:
            changes.append(
                f"the inputs' {len(copied.carried)} object(s) ({type(copied.carried[0][0]).__name__}, ...) are the"
                " copy's own; the step passes them in place of the original's"
            )
        return Applied(patched, changes)


def _optimizer_state_to_channels_last(model: Any, inputs: Any) -> int:
    """Give the optimizer state and the gradients of channels_last 4-D parameters the parameters' layout; how
    many tensors changed.

    A workload that has run steps holds momentum (SGD) or moment (Adam) buffers in NCHW. ``torch._foreach_*``
    takes its multi-tensor fast path only when corresponding tensors share strides, so beside channels_last
    weights and gradients those buffers send every update through a kernel per tensor: on the H200, timm
    ResNet-50's SGD step took 5,152 µs of host time after the conversion against 1,707 before, as much as
    ``foreach=False`` (5,679 µs; 1,199 µs with buffers made after the conversion)."""
    import torch

    from gpuadvisor.fixes.state import optimizers_in

    changed = 0
    for optimizer in optimizers_in({"model": model, "inputs": inputs}):
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.dim() != 4 or not parameter.is_contiguous(memory_format=torch.channels_last):
                    continue
                state = optimizer.state.get(parameter, {})
                for key, value in list(state.items()):
                    if _needs_channels_last(value, parameter):
                        state[key] = value.contiguous(memory_format=torch.channels_last)
                        changed += 1
                if _needs_channels_last(parameter.grad, parameter):
                    with torch.no_grad():
                        parameter.grad = parameter.grad.contiguous(memory_format=torch.channels_last)
                    changed += 1
    return changed


def _needs_channels_last(value: Any, parameter: Any) -> bool:
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.shape == parameter.shape
        and not value.is_contiguous(memory_format=torch.channels_last)
    )


def _channels_last_step(step: Any) -> Any:
    """``step`` called with its 4-D floating inputs made channels_last."""

    @functools.wraps(step)
    def channels_last_step(model: Any, inputs: tuple) -> Any:
        return step(model, to_channels_last(inputs))

    return channels_last_step


def _count_4d(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.dim() == 4 and value.is_floating_point())
    if isinstance(value, (tuple, list)):
        return sum(_count_4d(item) for item in value)
    if isinstance(value, dict):
        return sum(_count_4d(item) for item in value.values())
    return 0
