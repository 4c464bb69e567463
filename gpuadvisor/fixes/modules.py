"""The modules the ``fusion`` and ``fp8`` fixes swap into a user's model.

Each replacement keeps the original's parameters and buffers (the same tensors, not copies, so a state
dict still loads) and falls back to plain PyTorch for shapes its Triton kernel does not cover:

- :class:`DecodeLinear` for ``nn.Linear``: with at most ``MAX_ROWS`` rows (decode at small batch) the
  weight is streamed once by ``gpuadvisor.kernels.decode_linear`` (bf16/fp16/fp32, or an FP8 weight
  with one fp32 scale per output row, upcast in registers); with more rows cuBLAS (``F.linear``), or
  ``torch._scaled_mm`` with per-row scales when the weight is FP8.
- :class:`FusedRMSNorm` for RMSNorm-like modules: ``gpuadvisor.kernels.rmsnorm``.
- :class:`FusedSwiGLU` for ``down(silu(gate(x)) * up(x))`` MLPs: at decode shapes one kernel computes
  both projections and the SiLU product, otherwise ``gpuadvisor.kernels.swiglu`` between two GEMMs.
- :class:`FusedDecodeAttention` for a gpt-fast style attention (fused ``wqkv``, ``wo``, a static
  KV cache written at ``input_pos``, causal mask by position): rotary + cache write in one kernel,
  split-T decode attention in another; more than ``MAX_ROWS`` query rows use the original forward.
- :class:`FusedPreNormBlock` for ``h = x + attn(norm1(x)); return h + mlp(norm2(h))``: the residual
  add and the second norm become one ``add_rmsnorm`` kernel.

The MLP, attention and block fusions are mixins installed over the user's own class (``install``): the
module keeps its attributes, submodule names and state-dict keys, and ``super().forward`` is the original
forward for the shapes the kernels do not cover.

Which module qualifies is decided by ``gpuadvisor.fixes.fusion``, which also checks each replacement
against the original on the inputs it really gets before swapping it in.
"""

from __future__ import annotations

import inspect
import os

import torch
import torch.nn.functional as F
from torch import nn

# Rows (product of the leading dimensions) up to which the decode-shape kernels run; above it cuBLAS.
MAX_ROWS = 16


def rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


def triton_usable(t: torch.Tensor) -> bool:
    """The Triton kernels run on CUDA tensors, or anywhere under the CPU interpreter (tests)."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


class DecodeLinear(nn.Module):
    """``nn.Linear`` with a decode-shape kernel for few rows and an optional FP8 weight (per-row scales)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        # float32 [out_features] when the weight is FP8; a buffer, so .to() moves it and the state dict holds it
        self.register_buffer("weight_scale", None)
        self.fp8_activations = False  # rows > MAX_ROWS: quantize activations per row and use torch._scaled_mm

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> DecodeLinear:
        return cls(linear.weight, linear.bias)

    @property
    def is_fp8(self) -> bool:
        return self.weight_scale is not None

    def to_fp8(self) -> None:
        """Quantize the weight to float8_e4m3fn with one scale per output row (amax / 448)."""
        from gpuadvisor.kernels.decode_linear import quantize_fp8_rows

        weight_fp8, scale = quantize_fp8_rows(self.weight.data)
        self.weight = nn.Parameter(weight_fp8, requires_grad=False)
        self.weight_scale = scale.float().contiguous()
        self.fp8_activations = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if 0 < rows_of(x) <= MAX_ROWS and triton_usable(x):
            from gpuadvisor.kernels.decode_linear import decode_linear

            return decode_linear(x, self.weight, self.weight_scale, self.bias)
        if self.weight_scale is None:
            return F.linear(x, self.weight, self.bias)
        return scaled_mm_linear(x, self.weight, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        kind = "fp8 weight, per-row scales" if self.is_fp8 else str(self.weight.dtype).replace("torch.", "")
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def scaled_mm_linear(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias) -> torch.Tensor:
    """``x @ W.T`` on FP8 tensor cores: activations quantized per row on the fly, weight per output row."""
    rows = x.reshape(-1, x.shape[-1])
    amax = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    x_scale = amax / 448.0
    x_fp8 = (rows.float() / x_scale).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(
        x_fp8,
        weight_fp8.t(),
        scale_a=x_scale,
        scale_b=weight_scale.view(1, -1),
        out_dtype=x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16,
    ).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight_fp8.shape[0])


class FusedRMSNorm(nn.Module):
    """``x * rsqrt(mean(x**2) + eps) * weight`` in one Triton kernel (math in fp32, one rounding)."""

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton_usable(x) and x.dtype == self.weight.dtype:
            from gpuadvisor.kernels.rmsnorm import rmsnorm

            return rmsnorm(x, self.weight, self.eps)
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def fused_class(mixin: type, base: type) -> type:
    """``mixin`` over the user's class: the module keeps its attributes, names and state-dict keys."""
    key = (mixin, base)
    if key not in _FUSED_CLASSES:
        _FUSED_CLASSES[key] = type(f"{mixin.__name__}[{base.__name__}]", (mixin, base), {"__module__": __name__})
    return _FUSED_CLASSES[key]


_FUSED_CLASSES: dict[tuple[type, type], type] = {}


def install(module: nn.Module, mixin: type, children: dict[str, nn.Module], **attributes):
    """Give ``module`` the ``mixin``'s forward and swap the named ``children``; returns a function undoing both."""
    original_class = module.__class__
    saved = {name: getattr(module, name) for name in children}
    for name, child in children.items():
        setattr(module, name, child)
    module.__class__ = fused_class(mixin, original_class)
    for key, value in attributes.items():
        object.__setattr__(module, key, value)

    def undo() -> None:
        module.__class__ = original_class
        for name, child in saved.items():
            setattr(module, name, child)
        for key in attributes:
            object.__delattr__(module, key)

    return undo


def as_decode_linear(linear: nn.Module) -> DecodeLinear:
    return linear if isinstance(linear, DecodeLinear) else DecodeLinear.from_linear(linear)


class FusedSwiGLU:
    """Mixin: ``down(silu(gate(x)) * up(x))`` with the gate/up projections and SiLU product fused at decode shapes.

    ``_fused_names`` holds the (gate, up, down) attribute names, e.g. ("w1", "w3", "w2").
    """

    _fused_names: tuple[str, str, str]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, name) for name in self._fused_names)
        if not triton_usable(x):
            return down(F.silu(gate(x)) * up(x))
        if 0 < rows_of(x) <= MAX_ROWS:
            from gpuadvisor.kernels.decode_linear import decode_gate_up_swiglu

            hidden = decode_gate_up_swiglu(x, gate.weight, up.weight, gate.weight_scale, up.weight_scale)
        else:
            from gpuadvisor.kernels.swiglu import swiglu

            hidden = swiglu(gate(x), up(x))
        return down(hidden)


# Parameter names of a gpt-fast style attention forward, by role (gpt-fast itself calls the rotary
# table ``freqs_cis``; examples/llama_decode.py calls it ``rope``).
ATTENTION_ARG_NAMES = {
    "x": ("x", "hidden_states"),
    "input_pos": ("input_pos", "position", "positions"),
    "rope": ("rope", "freqs_cis"),
    "mask": ("mask", "attn_mask", "attention_mask"),
}


def attention_arg_roles(forward) -> dict[str, str] | None:
    """Map roles (x, input_pos, rope, mask) to the forward's parameter names, or None when one is missing."""
    try:
        names = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return None
    roles = {}
    for role, candidates in ATTENTION_ARG_NAMES.items():
        found = [name for name in names if name in candidates]
        if len(found) != 1:
            return None
        roles[role] = found[0]
    return roles


class FusedDecodeAttention:
    """Mixin: a gpt-fast style attention with rotary + cache write and decode attention as two Triton kernels.

    ``_fused_roles`` maps (x, input_pos, rope, mask) to the forward's parameter names and
    ``_fused_signature`` is the original forward's signature, used to bind a call's arguments.
    """

    _fused_roles: dict[str, str]
    _fused_signature: inspect.Signature

    def forward(self, *args, **kwargs):
        values = self._fused_signature.bind(*args, **kwargs).arguments
        x = values[self._fused_roles["x"]]
        if not (triton_usable(x) and 0 < rows_of(x) <= MAX_ROWS):
            return super().forward(*args, **kwargs)
        input_pos, rope = values[self._fused_roles["input_pos"]], values[self._fused_roles["rope"]]
        from gpuadvisor.kernels.decode_attention import decode_attention
        from gpuadvisor.kernels.rope_cache import rope_kv_update

        cache = self.kv_cache
        qkv = self.wqkv(x)
        q = rope_kv_update(qkv, rope, input_pos, cache.k_cache, cache.v_cache, int(self.n_heads))
        y = decode_attention(q, cache.k_cache, cache.v_cache, input_pos)
        return self.wo(y)


class FusedPreNormBlock:
    """Mixin: ``h = x + attn(norm1(x)); return h + mlp(norm2(h))`` with ``x + attn`` and ``norm2`` fused.

    ``_fused_names`` holds the (norm1, attention, norm2, mlp) attribute names.
    """

    _fused_names: tuple[str, str, str, str]

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        norm1, attention, norm2, mlp = (getattr(self, name) for name in self._fused_names)
        attn_out = attention(norm1(x), *args, **kwargs)
        if not (triton_usable(x) and isinstance(norm2, FusedRMSNorm) and x.dtype == norm2.weight.dtype):
            h = x + attn_out
            return h + mlp(norm2(h))
        from gpuadvisor.kernels.add_rmsnorm import add_rmsnorm

        normed, h = add_rmsnorm(attn_out.contiguous(), x.contiguous(), norm2.weight, norm2.eps)
        return h + mlp(normed)
