"""The ``bf16`` fix: a float32 model's step under ``torch.autocast(device_type, dtype=torch.bfloat16)``.

Why: float32 matmuls and convolutions run without the tensor cores (PyTorch does not allow TF32 for matmuls by
default): measured on the H200 (examples/real/hf_vit_infer.py, torch 2.11), the ViT-B/16 step's GPU work was
nearly all fp32 SIMT SGEMMs. Under bf16 autocast they run on the tensor cores at a fraction of the time, while
the weights, the optimizer and the loss stay float32 (no loss scaling: bf16 keeps float32's exponent range).

``check()`` looks at the modules the workload holds (the model, or a training state's ``.model``) and refuses when
their floating parameters are already 16-bit, when none of them does matmul work in float32 (``nn.Linear``,
convolutions, ``nn.MultiheadAttention``, transformers' ``Conv1D``), when the step already runs under
``torch.autocast`` (read from its source), and on a GPU without bf16 (CUDA compute capability below 8.0). The
CPU has bf16 autocast (slower than float32 on many CPUs: the measured search decides).

``apply()`` wraps the user's step in the autocast context; the model, its weights and optimizer are shared with
the original, which between calls is unchanged. The numerics policy is "bf16" (``gpuadvisor.fixes.numerics``):
each output and state write of the patched step against the original's, within ``BF16_NOISE_FACTOR`` times how
far the original itself moves when its weights and inputs are rounded to bf16 (at least ``BF16_FLOOR``), and
no systematic scale.
"""

from __future__ import annotations

import re
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal

# Ampere (compute capability 8.0) is the first NVIDIA GPU with bf16 tensor cores.
MIN_CUDA_CAPABILITY = (8, 0)
SIXTEEN_BIT = ("bfloat16", "float16")


def matmul_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of the modules that do matmul or convolution work with float32 weights."""
    import torch
    from torch import nn

    from gpuadvisor.fixes.copying import held_modules

    kinds = (nn.Linear, nn.Bilinear, nn.MultiheadAttention, nn.modules.conv._ConvNd)
    found = []
    for root_path, root in held_modules(model):
        for name, module in root.named_modules():
            is_matmul = isinstance(module, kinds) or type(module).__name__ == "Conv1D"  # transformers' GPT-2 Conv1D
            if not is_matmul:
                continue
            weights = [p for p in module.parameters(recurse=False) if p.is_floating_point()]
            if weights and all(p.dtype == torch.float32 for p in weights):
                found.append((f"{root_path}.{name}" if name else root_path, module))
    return found


def count_by_class(modules: list[tuple[str, Any]]) -> str:
    """ "12 Linear, 1 Conv2d": how many of each module class, in first-seen order."""
    counts: dict[str, int] = {}
    for _, module in modules:
        counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in counts.items())


class Bf16Fix(Fix):
    """Run the step under bf16 autocast (see the module docstring)."""

    id = "bf16"
    title = "bf16 autocast"
    numerics = "bf16"

    def check(self, workload: Any) -> Refusal | None:
        import torch

        from gpuadvisor.fixes.copying import held_modules, step_source
        from gpuadvisor.fixes.safety import model_device

        modules = held_modules(workload.model)
        parameters = [p for _, module in modules for p in module.parameters() if p.is_floating_point()]
        if not parameters:
            return Refusal(
                "no floating-point parameters: nothing for autocast to compute in bf16",
                "autocast pays for models with Linear or convolution layers in float32",
            )
        dtypes = {str(p.dtype).removeprefix("torch.") for p in parameters}
        if dtypes <= set(SIXTEEN_BIT):
            return Refusal(
                f"the model's weights are already {', '.join(sorted(dtypes))}: autocast has nothing to lower",
                "nothing to do; for a further step down see the fp8 fix (Hopper GPUs)",
            )
        matmuls = matmul_modules(workload.model)
        if not matmuls:
            return Refusal(
                "no Linear, convolution or attention modules with float32 weights: autocast changes no matmul work",
                "nothing to do: bf16 autocast speeds up matmuls and convolutions",
            )
        source = step_source(workload.step)
        if source is not None:
            text, filename, first = source
            for offset, line in enumerate(text.splitlines()):
                code = line.split("#", 1)[0]
                if re.search(r"\bautocast\s*\(", code):
                    return Refusal(
                        f"the step already runs under torch.autocast ({filename}:{first + offset}: {line.strip()})",
                        "nothing to do, or change the dtype there: torch.autocast(device_type, dtype=torch.bfloat16)",
                    )
        device = model_device(workload.model, workload.inputs) or "cpu"
        if device.startswith("cuda"):
            capability = torch.cuda.get_device_capability(torch.device(device))
            if tuple(capability) < MIN_CUDA_CAPABILITY:
                return Refusal(
                    f"this GPU has no bf16 tensor cores (compute capability {capability[0]}.{capability[1]}, bf16"
                    " needs 8.0 or newer)",
                    "use torch.autocast(device_type='cuda', dtype=torch.float16) with a torch.amp.GradScaler instead",
                )
        elif not device.startswith("cpu"):
            return Refusal(
                f"bf16 autocast is checked on CUDA and the CPU only (the model is on {device})",
                "run torch.autocast(device_type, dtype=torch.bfloat16) by hand where the device supports it",
            )
        return None

    def apply(self, workload: Any) -> Applied:
        import torch

        from gpuadvisor.fixes.copying import wrap_step
        from gpuadvisor.fixes.safety import model_device

        refusal = self.check(workload)
        if refusal is not None:
            raise NothingToApply(refusal)
        device_type = (model_device(workload.model, workload.inputs) or "cpu").split(":")[0]
        step = wrap_step(workload.step, lambda: torch.autocast(device_type=device_type, dtype=torch.bfloat16))
        listed = count_by_class(matmul_modules(workload.model))
        changes = [
            f"the step runs under torch.autocast(device_type={device_type!r}, dtype=torch.bfloat16): {listed} compute"
            " in bf16",
            "weights, gradients and optimizer state stay float32 (shared with the original); no loss scaling is"
            " needed for bf16",
        ]
        return Applied(workload.with_step(workload.model, step), changes)
