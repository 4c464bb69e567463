"""The ``tf32`` fix: a float32 step's matmuls on the tensor cores in TF32, while the step runs.

Why: PyTorch computes float32 matmuls in full float32 by default (``torch.backends.cuda.matmul.allow_tf32`` is
off; cuDNN's convolutions have TF32 on by default), so a float32 model's Linear layers run as SIMT SGEMMs on the
CUDA cores (GA301). On the H200 (torch 2.11) an 8192^3 float32 matmul took 21,737 µs, 2,788 µs with TF32
allowed. TF32 keeps float32's range and storage and rounds only the multiplicands, to a 10-bit mantissa; unlike
bf16 autocast it stores nothing in 16 bits, which keeps it within the numerics guard on training steps where
bf16's rounding is amplified (AdamW's normalised update of a small-gradient LayerNorm weight: convnext-tiny on
the H100 moved by 2.09e-2 under bf16, bound 3.9e-3).

``check()`` refuses: off CUDA (TF32 is a tensor-core format of Ampere and later: compute capability 8.0), when
matmuls already may use TF32 (``allow_tf32`` on, or ``torch.set_float32_matmul_precision`` "high"/"medium"),
and when the workload's modules hold no float32 Linear, attention or convolution weights (a convolution-only
model gets TF32 from cuDNN already: nothing to change then either).

``apply()`` wraps the user's step: while it runs, ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32`` are on, and the previous values are back when it returns or raises. The
model, weights and optimizer are shared with the original. The numerics policy is "tf32"
(``gpuadvisor.fixes.numerics``): each output and state write against the original's, within
``TF32_NOISE_FACTOR`` times how far the original moves with its matmul operands rounded to TF32.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal

# Ampere (compute capability 8.0) is the first NVIDIA GPU with TF32 tensor cores.
MIN_CUDA_CAPABILITY = (8, 0)


@contextlib.contextmanager
def tf32_allowed():
    """TF32 on for cuBLAS matmuls and cuDNN convolutions inside the block; the previous settings after it."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def matmul_tf32_on() -> bool:
    """Whether float32 matmuls on CUDA may already run in TF32 (the flag, or a matmul precision below "highest")."""
    import torch

    return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


class Tf32Fix(Fix):
    """Allow TF32 for the step's float32 matmuls (see the module docstring)."""

    id = "tf32"
    title = "TF32 matmuls"
    numerics = "tf32"

    def check(self, workload: Any) -> Refusal | None:
        import torch
        from torch import nn

        from gpuadvisor.fixes.autocast import matmul_modules
        from gpuadvisor.fixes.safety import model_device

        device = model_device(workload.model, workload.inputs) or "cpu"
        if not device.startswith("cuda"):
            return Refusal(
                f"TF32 is a CUDA tensor-core format (the model is on {device})",
                "on a CPU, run float32 or try the bf16 fix",
            )
        capability = torch.cuda.get_device_capability(torch.device(device))
        if tuple(capability) < MIN_CUDA_CAPABILITY:
            return Refusal(
                f"this GPU has no TF32 tensor cores (compute capability {capability[0]}.{capability[1]}, TF32 needs"
                " 8.0 or newer)",
                "use torch.autocast(device_type='cuda', dtype=torch.float16) with a torch.amp.GradScaler instead",
            )
        if matmul_tf32_on():
            return Refusal(
                "float32 matmuls may already run in TF32 (torch.backends.cuda.matmul.allow_tf32 is on, or"
                f" torch.get_float32_matmul_precision() is {torch.get_float32_matmul_precision()!r})",
                "nothing to do; for a further step down see the bf16 fix",
            )
        found = matmul_modules(workload.model)
        matmuls = [(path, module) for path, module in found if not isinstance(module, nn.modules.conv._ConvNd)]
        if not matmuls:
            convolutions = bool(found)
            return Refusal(
                "no Linear or attention modules with float32 weights"
                + (
                    ", and cuDNN already runs float32 convolutions in TF32 (torch.backends.cudnn.allow_tf32 is on)"
                    if convolutions and torch.backends.cudnn.allow_tf32
                    else ""
                )
                + ": TF32 changes no matmul work",
                "nothing to do: TF32 speeds up float32 matmuls",
            )
        return None

    def apply(self, workload: Any) -> Applied:
        from gpuadvisor.fixes.autocast import matmul_modules

        refusal = self.check(workload)
        if refusal is not None:
            raise NothingToApply(refusal)
        return self.wrapped(workload, matmul_modules(workload.model))

    @staticmethod
    def wrapped(workload: Any, modules: list[tuple[str, Any]]) -> Applied:
        """The workload with its step run under ``tf32_allowed`` (no checks: ``apply`` checks first)."""
        from gpuadvisor.fixes.autocast import count_by_class
        from gpuadvisor.fixes.copying import wrap_step

        listed = count_by_class(modules) or "its float32 matmuls"
        changes = [
            "the step runs with torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 on (the"
            f" previous settings back after each call): {listed} multiply in TF32 on the tensor cores",
            "weights, activations, gradients and optimizer state stay float32 (shared with the original)",
        ]
        return Applied(workload.with_step(workload.model, wrap_step(workload.step, tf32_allowed)), changes)
