"""The ``fp8`` fix: linear layers with float8_e4m3fn weights and one fp32 scale per output row.

At decode shapes (at most 16 rows) the layer is bound by streaming its weight, so an FP8 weight
upcast in registers by ``gpuadvisor.kernels.decode_linear`` halves the bytes of a bf16 weight: the
route below the bf16 memory floor. Measured on the H200 at one row (benchmarks/results/
decode_linear_bench.json, CUDA-graph replays): 2048x2048 3.49 against 4.29 us in bf16, 6144x2048 5.69
against 7.86, 32000x2048 19.3 against 30.6, the fused 2 x 5632x2048 gate/up 8.67 against 12.7.

Layers the step calls with more rows are left alone: FP8 there needs the activations quantized on the fly,
and with per-row scaling plus ``torch._scaled_mm`` that was slower than bf16 cuBLAS on every decoder shape
measured below 1024 rows (benchmarks/results/fp8_linear_bench.json: 4096x4096 at 256 rows 40.6 against
15.9 us; only the 32000x2048 logits layer gained, 1.28x at 1024 rows). Should a converted layer later get
more rows (a prefill), it still computes correctly, through ``torch._scaled_mm``.

Where it applies (each layer it leaves alone is listed with the reason):

- a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell: FP8 tensor cores and e4m3
  conversions);
- ``nn.Linear`` (or a fused layer's :class:`DecodeLinear`) with bf16 or fp16 weights whose two
  dimensions are multiples of 16 (``torch._scaled_mm``'s layout rule);
- weights of at least ``MIN_WEIGHT_ELEMENTS`` elements: below that a layer's time is its launch, not
  its bytes, and FP8 only adds quantization error (see the constant for the measurement);
- called by the workload's step with at most 16 rows (the step runs once, with hooks, to see).

The numerics guard judges this fix by the signal-to-quantization-noise ratio of the model's output
against the original: at least 25 dB (DESIGN.md).
"""

from __future__ import annotations

import copy
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, Refusal

MIN_COMPUTE_CAPABILITY = (8, 9)
# Weights smaller than this keep their dtype: 2048 x 2048 (8 MB in bf16) is the smallest decode weight measured
# on the H200, where FP8 still paid 1.23x at one row (3.49 against 4.29 us); below it the launch dominates.
MIN_WEIGHT_ELEMENTS = 2048 * 2048
MAX_ROWS = 16  # the decode kernel's limit (gpuadvisor.kernels.decode_linear.MAX_ROWS)
ALIGNMENT = 16


class Fp8Fix(Fix):
    id = "fp8"
    title = "FP8 weights (e4m3, per-row scales)"
    numerics = "fp8"

    def check(self, workload: Any) -> Refusal | None:
        try:
            import torch
            from torch import nn
        except ImportError:
            return Refusal("fp8 needs PyTorch", "pip install torch")
        model = workload.model
        if not isinstance(model, nn.Module):
            return Refusal(f"the model is a {type(model).__name__}, not a torch.nn.Module", None)
        if not torch.cuda.is_available():
            return Refusal(
                "fp8 needs a CUDA GPU of compute capability >= 8.9 (no CUDA device here)",
                "run apply on an Ada, Hopper or newer GPU",
            )
        from gpuadvisor.fixes.safety import model_device

        device = model_device(model)
        if device is None or not device.startswith("cuda"):
            return Refusal(f"the model is on {device}, not on the GPU", "build the model on the GPU: .cuda()")
        if model.training:
            return Refusal(
                "the model is in training mode; FP8 weights here are frozen and their kernel has no backward",
                "call model.eval() (and run the step under torch.no_grad()) before apply",
            )
        capability = torch.cuda.get_device_capability(device)
        if tuple(capability) < MIN_COMPUTE_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            return Refusal(
                f"fp8 needs compute capability >= 8.9; {name} is {capability[0]}.{capability[1]}",
                "FP8 tensor cores start with Ada (8.9) and Hopper (9.0)",
            )
        _, eligible, skipped = self._plan(workload)
        if not eligible:
            first = skipped[0]["reason"] if skipped else "the model has no linear layers"
            return Refusal(f"no linear layer qualifies for fp8 ({first})", "see docs/apply.md for the thresholds")
        return None

    def _plan(self, workload: Any) -> tuple[Any, list[str], list[dict[str, str]]]:
        """A copy of the model, the layers to convert in it (by shape, dtype and the rows the step gives them)
        and those left alone. The step runs once on the copy, never on the user's model; check() and apply()
        share the result."""
        cached = getattr(self, "_planned", None)
        if cached is not None and cached[0] is workload:
            return cached[1]
        model = copy.deepcopy(workload.model)
        eligible, skipped = plan_layers(model)
        rows = rows_per_layer(workload.with_model(model), eligible)
        kept = []
        for name in eligible:
            if name not in rows:
                skipped.append({"target": name, "reason": "not called by the step"})
            elif rows[name] > MAX_ROWS:
                skipped.append(
                    {
                        "target": name,
                        "reason": f"called with {rows[name]} rows: FP8 pays at decode shapes (at most {MAX_ROWS} "
                        "rows); with more, on-the-fly activation scaling measured slower than bf16",
                    }
                )
            else:
                kept.append(name)
        self._planned = (workload, (model, kept, skipped))
        return model, kept, skipped

    def apply(self, workload: Any) -> Applied:
        from gpuadvisor.fixes.modules import DecodeLinear

        model, eligible, skipped = self._plan(workload)
        self._planned = None  # the copy becomes the patched model: never hand it out twice
        weight_bytes_before = weight_bytes_after = 0
        for name in eligible:
            module = model.get_submodule(name)
            weight_bytes_before += module.weight.numel() * module.weight.element_size()
            layer = module if isinstance(module, DecodeLinear) else DecodeLinear.from_linear(module)
            layer.to_fp8()
            weight_bytes_after += layer.weight.numel() * layer.weight.element_size()
            if layer is not module:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, layer)
        changes = [
            f"{len(eligible)} linear layer{'s' if len(eligible) != 1 else ''} -> float8_e4m3fn weights with per-row "
            f"scales ({weight_bytes_before / 1e6:.0f} MB -> {weight_bytes_after / 1e6:.0f} MB of weights)"
        ]
        return Applied(workload.with_model(model), changes=changes, skipped=skipped)


def plan_layers(model) -> tuple[list[str], list[dict[str, str]]]:
    """Names of the layers the fix converts, and each layer it leaves alone with the reason."""
    import torch
    from torch import nn

    from gpuadvisor.fixes.modules import DecodeLinear

    eligible: list[str] = []
    skipped: list[dict[str, str]] = []
    for name, module in model.named_modules():
        if isinstance(module, DecodeLinear):
            if module.is_fp8:
                continue
        elif type(module) is not nn.Linear:
            continue
        if not name:
            skipped.append({"target": "(model)", "reason": "the model itself is one linear layer"})
            continue
        weight = module.weight
        out_features, in_features = weight.shape
        if weight.dtype not in (torch.bfloat16, torch.float16):
            skipped.append({"target": name, "reason": f"{weight.dtype} weights (fp8 is for bf16/fp16 models)"})
        elif out_features % ALIGNMENT or in_features % ALIGNMENT:
            skipped.append(
                {"target": name, "reason": f"{out_features}x{in_features}: dimensions not multiples of {ALIGNMENT}"}
            )
        elif weight.numel() < MIN_WEIGHT_ELEMENTS:
            skipped.append(
                {
                    "target": name,
                    "reason": f"{out_features}x{in_features}: under {MIN_WEIGHT_ELEMENTS:,} weights, too small to pay",
                }
            )
        else:
            eligible.append(name)
    return eligible, skipped


def rows_per_layer(workload, names: list[str]) -> dict[str, int]:
    """Run the step once with forward pre-hooks: the most rows each named layer was called with.

    A fused SwiGLU MLP streams its gate and up weights itself (one kernel, no call of those layers), so its
    own input's rows stand for theirs.
    """
    import torch

    from gpuadvisor.fixes.modules import FusedSwiGLU

    rows: dict[str, int] = {}
    handles = []

    def hook_for(targets):
        def hook(module, args):
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.dim() and x.shape[-1]:
                for name in targets:
                    rows[name] = max(rows.get(name, 0), x.numel() // x.shape[-1])

        return hook

    model = workload.model
    wanted = set(names)
    for name in names:
        handles.append(model.get_submodule(name).register_forward_pre_hook(hook_for([name])))
    for name, module in model.named_modules():
        if isinstance(module, FusedSwiGLU):
            inner = [f"{name}.{attr}" if name else attr for attr in module._fused_names[:2]]
            inner = [child for child in inner if child in wanted]
            if inner:
                handles.append(module.register_forward_pre_hook(hook_for(inner)))
    try:
        with torch.no_grad():
            workload.step_fn()
    finally:
        for handle in handles:
            handle.remove()
    return rows
