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
- :class:`FusedHFAttention` for a transformers attention (``q_proj``/``k_proj``/``v_proj``/``o_proj``,
  grouped-query allowed, biases allowed) decoding into a static cache layer (``StaticLayer``: ``keys``,
  ``values``, a ``cumulative_length`` counter on the device): one GEMV for q, k and v together, rotary +
  cache write in one kernel, the counter advanced as the library does, split-T decode attention reading the
  grouped cache in place, and ``o_proj``. Other caches, more than ``MAX_ROWS`` rows or arguments it does not
  know run the original forward.
- :class:`FusedHFDecoderLayer` for a transformers decoder layer (``input_layernorm``/``self_attn``/
  ``post_attention_layernorm``/``mlp``): the residual add after the attention and the second norm become
  one ``add_rmsnorm`` kernel; every argument reaches ``self_attn`` as the original passes it.

The MLP, attention and block fusions are mixins installed over the user's own class (``install``): the
module keeps its attributes, submodule names and state-dict keys, and ``super().forward`` is the original
forward for the shapes the kernels do not cover.

Which module qualifies is decided by ``gpuadvisor.fixes.fusion``, which also checks each replacement
against the original on the inputs it really gets before swapping it in.
"""

from __future__ import annotations

import functools
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


# --- transformers (``q_proj``/``k_proj``/``v_proj``/``o_proj`` attention over a static cache layer) -------------

# The keyword a transformers attention takes its cache by: ``past_key_values`` up to 5.2x, ``cache`` in newer
# versions (which still accept the old name through a decorator that renames it).
HF_CACHE_ARGS = ("cache", "past_key_values")


def call_arguments(signature: inspect.Signature, args: tuple, kwargs: dict, *, defaults: bool = False) -> dict | None:
    """A call's arguments by parameter name, with what ``**kwargs`` caught merged in (``defaults``: the unpassed
    parameters' defaults too); None if they do not bind or extra positional arguments (``*args``) came."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    if defaults:
        bound.apply_defaults()
    values: dict = {}
    extra: dict = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            extra = dict(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None  # no name to pass them on by
        else:
            values[name] = value
    for name, value in extra.items():
        values.setdefault(name, value)
    return values


def hf_cache_of(values: dict):
    """The cache object of a transformers attention call (by either keyword), or None."""
    for name in HF_CACHE_ARGS:
        if values.get(name) is not None:
            return values[name]
    return None


@functools.cache
def _static_layer_update():
    """transformers' ``StaticLayer.update`` (the function), or None without transformers."""
    try:
        from transformers.cache_utils import StaticLayer
    except Exception:  # transformers missing or broken: no static layer can be recognised
        return None
    return getattr(StaticLayer, "update", None)


def static_cache_layer(cache, layer_idx) -> object | None:
    """``cache.layers[layer_idx]`` when it is an initialized transformers static layer whose write the fused
    kernel reproduces (``StaticLayer.update`` itself, not sliding, no offloading): ``keys``/``values``
    [B, KVH, T, hd] tensors and a one-element integer ``cumulative_length`` on their device; else None."""
    import torch

    if cache is None or getattr(cache, "offloading", False) or isinstance(layer_idx, bool):
        return None
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, (list, tuple)) or not isinstance(layer_idx, int) or not 0 <= layer_idx < len(layers):
        return None
    layer = layers[layer_idx]
    update = _static_layer_update()
    if update is None or getattr(type(layer), "update", None) is not update:
        return None
    if getattr(layer, "is_sliding", False) or not getattr(layer, "is_initialized", False):
        return None
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    counter = getattr(layer, "cumulative_length", None)
    if not all(isinstance(t, torch.Tensor) for t in (keys, values, counter)):
        return None
    if keys.dim() != 4 or values.shape != keys.shape or values.dtype != keys.dtype or keys.device != values.device:
        return None
    if counter.numel() != 1 or counter.dtype not in (torch.int64, torch.int32) or counter.device != keys.device:
        return None
    return layer


def fused_qkv_linear(module: nn.Module) -> DecodeLinear:
    """One DecodeLinear for ``q_proj``, ``k_proj`` and ``v_proj`` side by side (their weights and biases
    concatenated once; a missing bias is zeros when another projection has one). A copy, not a view: the
    model's own projections and state dict stay as they were."""
    parts = [module.q_proj, module.k_proj, module.v_proj]
    with torch.no_grad():
        weight = torch.cat([part.weight.detach() for part in parts]).contiguous()
        bias = None
        if any(part.bias is not None for part in parts):
            bias = torch.cat(
                [
                    part.bias.detach() if part.bias is not None else weight.new_zeros(part.weight.shape[0])
                    for part in parts
                ]
            ).contiguous()
    return DecodeLinear(weight, bias)


class FusedHFAttention:
    """Mixin: a transformers attention decoding into a static cache layer with three Triton launches and a GEMV.

    At most ``MAX_ROWS`` rows, with the layer's cache a static layer (``static_cache_layer``)::

        qkv = x @ [Wq | Wk | Wv]^T + [bq | bk | bv]      # one decode GEMV (``_fused_qkv``, built at install)
        q, positions = hf_rope_kv_update(qkv, cos, sin, layer.cumulative_length, layer.keys, layer.values)
        layer.cumulative_length.add_(S)                # as StaticLayer.update advances it
        y = decode_attention(q, layer.keys, layer.values, positions, scale)   # grouped cache read in place
        return o_proj(y), None

    The attention mask is not read: the fix installs this only where the recorded call's mask was causal by
    position (slot t visible iff t <= the slot written), which is what decode_attention computes. The second
    output (attention weights) is None, as transformers' sdpa and flash attentions return it. Anything else
    (more rows, another cache, a call that does not bind, tensors on another device or dtype than the fused
    weight) runs the original forward.

    ``_fused_signature`` is the original forward's signature; ``_fused_qkv`` the fused projection (a plain
    attribute, not a submodule: the state dict keeps its keys); ``_fused_heads`` (H, KVH).
    """

    _fused_signature: inspect.Signature
    _fused_qkv: DecodeLinear
    _fused_heads: tuple[int, int]

    def _fused_inputs(self, args: tuple, kwargs: dict):
        """(x, cos, sin, layer) when the fused path covers this call, else None."""
        values = call_arguments(self._fused_signature, args, kwargs)
        if values is None or self.training:
            return None
        x = values.get("hidden_states")
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or not (0 < rows_of(x) <= MAX_ROWS):
            return None
        weight = self._fused_qkv.weight
        if not triton_usable(x) or weight.dtype != x.dtype or weight.device != x.device:
            return None
        n_heads, n_kv_heads = self._fused_heads
        head_dim = weight.shape[0] // (n_heads + 2 * n_kv_heads)
        batch, seq = x.shape[0], x.shape[1]
        rotary = values.get("position_embeddings")
        if not isinstance(rotary, (tuple, list)) or len(rotary) != 2:
            return None
        cos, sin = rotary
        for table in (cos, sin):
            if not isinstance(table, torch.Tensor) or table.dim() != 3 or table.device != x.device:
                return None
            if table.shape[0] not in (1, batch) or tuple(table.shape[1:]) != (seq, head_dim):
                return None
        layer = static_cache_layer(hf_cache_of(values), getattr(self, "layer_idx", None))
        if layer is None:
            return None
        keys = layer.keys
        if (keys.shape[0], keys.shape[1], keys.shape[3]) != (batch, n_kv_heads, head_dim) or keys.dtype != x.dtype:
            return None
        if keys.device != x.device or keys.stride(-1) != 1 or layer.values.stride(-1) != 1:
            return None
        mask = values.get("attention_mask")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape[-1] != keys.shape[2]):
            return None  # a BlockMask, or a mask over other slots than the cache's
        return x, cos.contiguous(), sin.contiguous(), layer

    def forward(self, *args, **kwargs):
        inputs = self._fused_inputs(args, kwargs)
        if inputs is None:
            return super().forward(*args, **kwargs)
        from gpuadvisor.kernels.decode_attention import decode_attention
        from gpuadvisor.kernels.hf_rope_cache import hf_rope_kv_update

        x, cos, sin, layer = inputs
        n_heads, n_kv_heads = self._fused_heads
        qkv = self._fused_qkv(x)
        q, positions = hf_rope_kv_update(
            qkv, cos, sin, layer.cumulative_length, layer.keys, layer.values, n_heads, n_kv_heads
        )
        layer.cumulative_length.add_(x.shape[1])  # in place, as StaticLayer.update does (a static address)
        y = decode_attention(q, layer.keys, layer.values, positions, scale=self._fused_scale)
        return self.o_proj(y), None

    @property
    def _fused_scale(self) -> float:
        scaling = getattr(self, "scaling", None)
        if isinstance(scaling, (int, float)) and not isinstance(scaling, bool):
            return float(scaling)
        return float(self.head_dim) ** -0.5


class FusedHFDecoderLayer:
    """Mixin: a transformers decoder layer with the residual add after the attention and the second norm fused::

        residual = x;  h = x + self_attn(hidden_states=input_layernorm(x), <every other argument>)[0]
        return h + mlp(post_attention_layernorm(h))       # x + attn and the norm: one add_rmsnorm kernel

    Every argument of the call reaches ``self_attn`` by keyword, defaults included, as the library's own
    layer passes them. ``_fused_names`` holds the (norm1, attention, norm2, mlp) attribute names and
    ``_fused_signature`` the original forward's signature.
    """

    _fused_names: tuple[str, str, str, str]
    _fused_signature: inspect.Signature

    def _attention_arguments(self, args: tuple, kwargs: dict):
        """(x, the keyword arguments for self_attn but hidden_states) as the original passes them, or None."""
        signature = self._fused_signature
        params = list(signature.parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            return None
        passed = call_arguments(signature, args, kwargs, defaults=True)
        if passed is None:
            return None
        x = passed.pop(params[0].name)
        # Newer transformers rename ``past_key_values`` to ``cache`` in a decorator that this forward replaces.
        renamed = "past_key_values" in passed and "past_key_values" not in signature.parameters
        if renamed and "cache" in passed and passed["cache"] is None:
            passed["cache"] = passed.pop("past_key_values")
        return x, passed

    def forward(self, *args, **kwargs):
        norm1, attention, norm2, mlp = (getattr(self, name) for name in self._fused_names)
        call = self._attention_arguments(args, kwargs)
        if call is None:
            return super().forward(*args, **kwargs)
        x, passed = call
        out = attention(**{self._fused_first: norm1(x)}, **passed)
        attn_out = out[0] if isinstance(out, (tuple, list)) else out
        fused = (
            triton_usable(x)
            and isinstance(norm2, FusedRMSNorm)
            and x.dtype == norm2.weight.dtype
            and isinstance(attn_out, torch.Tensor)
            and attn_out.shape == x.shape
            and attn_out.dtype == x.dtype
        )
        if not fused:
            h = x + attn_out
            return h + mlp(norm2(h))
        from gpuadvisor.kernels.add_rmsnorm import add_rmsnorm

        normed, h = add_rmsnorm(attn_out.contiguous(), x.contiguous(), norm2.weight, norm2.eps)
        return h + mlp(normed)

    @property
    def _fused_first(self) -> str:
        return next(iter(self._fused_signature.parameters))
