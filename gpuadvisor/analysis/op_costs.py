"""FLOPs and bytes of one operator call, per operator family, from the shapes and dtypes the profiler recorded.

Every figure here is an estimate unless the profiler counted the FLOPs itself (``with_flops=True``; matmuls
and convolutions). Bytes assume each element an operator touches crosses HBM once: inputs read once, outputs
written once, no cache reuse. Each family counts what its kernels touch, not what its arguments hold:

- GEMM: A and B (and a bias) read, C written; FLOPs 2·M·N·K.
- convolution: input and weight read, output written; the output from the stride, padding and dilation the
  profiler's Concrete Inputs record (without them N·C_out·(input spatial size), exact at stride 1 and an upper
  bound otherwise), the input counted where its windows touch it (a 1x1 convolution of stride 2 reads a quarter:
  :func:`conv_input_read_share`); backward writes grad input and grad weight, and reads the output's grad
  twice: the grad-input and grad-weight GEMMs are separate kernels that each read it (the grad-weight one reads
  the input where the forward's windows touched it). Nsight Compute on the H200 measured ResNet-50's three
  downsampling backward calls at 355, 760 and 1,605 MB of DRAM traffic; counted so, 341, 752 and 1,597 MB (the
  whole input read: 379, 829 and 1,751).
- attention (SDPA): q, k, v (and a mask) read, the output written; FLOPs 2·B·H·Lq·Lk·(E + Ev), no causal
  halving (the trace does not say), backward 2.5x forward (FlashAttention-2's count).
- gather / scatter / index / embedding: the index tensor, the rows or elements selected and the output; for
  index_copy_ / index_put_ / scatter the written slice only (source read, slice written), never the whole
  table or cache they index into.
- copies: source read, destination written; fill / zero: written only.
- normalization (layer/batch/group/RMS norm, softmax): every tensor argument read, one output of the first
  argument's size written.
- reduction: the inputs read; the (small) output not counted.
- elementwise: the inputs read, the broadcast output written (in-place ops write their first operand).

``basis`` says in a few words which of these counts a figure comes from; NaN bytes mean the trace does not
hold what the count needs (a TensorList's dtype, the indices of ``aten::index``). ``written`` is the part of
the bytes the call writes (what the L2 may still hold when its kernel ends:
:func:`gpuadvisor.analysis.roofline.l2_deferred_writes`).
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

# Bytes per element of the dtypes the profiler names in "Input type".
ITEMSIZE = {
    "float": 4,
    "c10::Float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long": 8,
    "half": 2,
    "bfloat16": 2,
}
DTYPE_ORDER = ["c10::Float8_e4m3fn", "c10::Float8_e5m2", "c10::BFloat16", "c10::Half", "float", "double"]

MATMUL_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::_scaled_mm",
    "aten::addbmm",
    "aten::dot",
    "aten::mv",
    "aten::addmv",
}
_CONV_FORWARD = {
    "aten::convolution",
    "aten::_convolution",
    "aten::conv1d",
    "aten::conv2d",
    "aten::conv3d",
    "aten::cudnn_convolution",
    "aten::cudnn_convolution_relu",
    "aten::cudnn_convolution_add_relu",
    "aten::miopen_convolution",
}
_CONV_BACKWARD = {"aten::convolution_backward", "aten::cudnn_convolution_backward", "aten::miopen_convolution_backward"}
CONVOLUTION_OPS = frozenset(_CONV_FORWARD | _CONV_BACKWARD)
# Query layout of each attention op: "bhle" ([B, H, L, E], the SDPA ops) or "blhe" (the flash/efficient kernels').
_ATTENTION_FORWARD = {
    "aten::scaled_dot_product_attention": "bhle",
    "aten::_scaled_dot_product_flash_attention": "bhle",
    "aten::_scaled_dot_product_efficient_attention": "bhle",
    "aten::_scaled_dot_product_cudnn_attention": "bhle",
    "aten::_flash_attention_forward": "blhe",
    "aten::_efficient_attention_forward": "blhe",
}
_ATTENTION_BACKWARD = {
    "aten::_scaled_dot_product_flash_attention_backward": "bhle",
    "aten::_scaled_dot_product_efficient_attention_backward": "bhle",
    "aten::_scaled_dot_product_cudnn_attention_backward": "bhle",
    "aten::_flash_attention_backward": "blhe",
    "aten::_efficient_attention_backward": "blhe",
}
# FlashAttention-2 (Dao 2023, section 3.1): the backward pass does 2.5x the forward's matmul FLOPs.
_ATTENTION_BACKWARD_FLOP_RATIO = 2.5
_NORMALIZATION = re.compile(r"aten::(native_|_native_|cudnn_|miopen_|_fused_)?(layer|batch|group|rms|instance)_norm")
# FLOPs counted per element a normalization (or softmax) normalizes: mean, variance, scale, shift. Rules that need the
# element count of a normalization kernel read it back from its FLOPs through this figure.
NORMALIZATION_FLOPS_PER_ELEMENT = 5.0
_SOFTMAX = re.compile(r"aten::_?(log_)?(safe_)?softmax")
_SOFTMAX_BACKWARD = re.compile(r"aten::_(log_)?softmax_backward_data")
_REDUCTION = re.compile(r"aten::(sum|mean|norm|amax|amin|max|min|var|std|argmax|argmin|prod|all|any|_local_scalar)")
_FILL = {"aten::fill_", "aten::zero_", "aten::fill", "aten::ones_like", "aten::zeros_like", "aten::full_like"}
_COPY = {"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"}
_CLONE = {"aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to", "aten::cumsum", "aten::cumprod"}
_CONCAT = {"aten::cat", "aten::_cat", "aten::stack", "aten::concat", "aten::concatenate"}


class OpCost(NamedTuple):
    """One operator call's cost: flops and bytes (NaN unknown), the dtype that picks the compute roof,
    whether the FLOPs are an estimate (False only for the profiler's own count) and how bytes were counted."""

    flops: float
    bytes: float
    dtype: str | None
    estimated: bool
    basis: str
    written: float = math.nan  # of ``bytes``, those the call writes (NaN unknown)


class _Tensor(NamedTuple):
    numel: int
    itemsize: int
    dtype: str
    shape: list

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def _numel(dims) -> int | None:
    if not isinstance(dims, list) or any(not isinstance(d, int) for d in dims):
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def _arguments(dims: list, types: list) -> list[_Tensor | None]:
    """The call's arguments by position: a tensor (0-d ones included) or None for anything else."""
    out: list[_Tensor | None] = []
    for d, t in zip(dims, types):
        n = _numel(d)
        size = ITEMSIZE.get(t) if isinstance(t, str) else None
        out.append(_Tensor(n, size, t, d) if n is not None and size is not None else None)
    return out


def _broadcast_numel(shapes: list[list]) -> int | None:
    """Elements of the shape the shapes broadcast to, None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    result = []
    for axis in range(rank):
        sizes = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0} - {1}
        if len(sizes) > 1:
            return None
        result.append(sizes.pop() if sizes else 1)
    return _numel(result)


def _arg(args: list, i: int) -> _Tensor | None:
    return args[i] if i < len(args) else None


def _rows(t: _Tensor) -> int:
    """Elements per index along dim 0 (a row of an embedding table or cache)."""
    return t.numel // t.shape[0] if t.shape and t.shape[0] else t.numel


def _gather_like(name: str, args: list) -> tuple[float, str, float] | None:
    """(bytes, basis, bytes written) of gather / scatter / index / embedding calls, None when ``name`` is none of
    them."""
    base = name.rstrip("_")
    this, a1, a2, a3 = (_arg(args, i) for i in range(4))
    if name == "aten::embedding" and this and a1:  # (weight [V, D], indices)
        out = a1.numel * _rows(this)
        return (
            a1.nbytes + 2.0 * out * this.itemsize,
            "embedding: indices + selected rows read, rows written",
            out * this.itemsize,
        )
    if name == "aten::index_select" and this and a2:  # (self, dim, index); the trace keeps no dim: dim 0
        out = a2.numel * _rows(this)
        basis = "index_select: index + selected rows read, rows written (dim 0)"
        return a2.nbytes + 2.0 * out * this.itemsize, basis, out * this.itemsize
    if name in ("aten::gather", "aten::take_along_dim") and this and a2:  # (self, dim, index): out = index's shape
        basis = "gather: index + gathered elements read, output written"
        return a2.nbytes + 2.0 * a2.numel * this.itemsize, basis, a2.numel * this.itemsize
    if base in ("aten::index_copy", "aten::index_add") and this and a2 and a3:  # (self, dim, index, source)
        passes = 3 if base == "aten::index_add" else 2  # add reads the slice it writes
        total = a2.nbytes + passes * a3.nbytes
        basis = f"{base[6:]}: index + source read, the written slice ({a3.numel} elements) only"
        written = a3.nbytes
        if not name.endswith("_"):
            total += 2.0 * this.nbytes
            written += this.nbytes
            basis += ", plus the copy of self"
        return float(total), basis, written
    if base in ("aten::index_put", "aten::_index_put_impl") and this:  # (self, indices, values, accumulate)
        operands = [a for a in args[1:] if a is not None]
        same = [a for a in operands if a.dtype == this.dtype]
        values = (same or operands or [None])[-1]
        if values is None:
            return math.nan, "index_put: the trace records no index/value shapes", math.nan
        indices = sum(a.nbytes for a in operands if a is not values)
        total = 2.0 * values.numel * this.itemsize + indices
        return total, "index_put: indices + values read, the written slice only", values.numel * this.itemsize
    if base in ("aten::scatter", "aten::scatter_add", "aten::scatter_reduce") and this and a2:  # self, dim, index, src
        passes = 3 if base != "aten::scatter" else 2
        src = a3.itemsize * a2.numel if a3 is not None else 0
        total = a2.nbytes + src + (passes - 1) * a2.numel * this.itemsize
        basis = f"{base[6:]}: index + source read, the {a2.numel} written elements only"
        written = a2.numel * this.itemsize
        if not name.endswith("_"):
            total += 2.0 * this.nbytes
            written += this.nbytes
            basis += ", plus the copy of self"
        return float(total), basis, written
    if name in ("aten::index", "aten::_index"):
        return math.nan, "index: the trace records no index shapes (TensorList)", math.nan
    if name == "aten::embedding_dense_backward" and this and a1:  # (grad_output [*I, D], indices, ...)
        return (
            a1.nbytes + 2.0 * this.nbytes,
            "embedding backward: grad + indices read, touched rows written",
            this.nbytes,
        )
    if name in ("aten::nll_loss_forward", "aten::nll_loss2d_forward") and this and a1:  # (self, target, weight)
        weight = _arg(args, 2)
        total = a1.nbytes + 2.0 * a1.numel * this.itemsize + (weight.nbytes if weight else 0)
        return (
            float(total),
            "nll_loss: target + one picked element per target read, losses written",
            a1.numel * this.itemsize,
        )
    if name in ("aten::nll_loss_backward", "aten::nll_loss2d_backward") and this and a1 and a2:
        # (grad_output, self, target, weight, ...): one element per target written; the zero fill is its own op
        basis = "nll_loss backward: one element per target written"
        return this.nbytes + a2.nbytes + a2.numel * a1.itemsize, basis, a2.numel * a1.itemsize
    return None


def _attention(name: str, layout: str, args: list, backward: bool) -> tuple[float, float, str, float] | None:
    offset = 1 if backward else 0  # backward: (grad_out, q, k, v, out, ...)
    q, k, v = (_arg(args, offset + i) for i in range(3))
    if not (q and k and v) or len(q.shape) < 3 or len(k.shape) < 3:
        return None
    lk = k.shape[-2] if layout == "bhle" else k.shape[1]
    e, ev = q.shape[-1], v.shape[-1]
    if not e:
        return None
    flops = 2.0 * q.numel * lk + 2.0 * (q.numel // e) * ev * lk
    read = sum(a.nbytes for a in args if a is not None)
    if backward:
        flops *= _ATTENTION_BACKWARD_FLOP_RATIO
        written = q.nbytes + k.nbytes + v.nbytes
        return flops, float(read + written), "attention backward: all inputs read, dq/dk/dv written", written
    out = (q.numel // e) * ev * q.itemsize
    return flops, float(read + out), "attention: q, k, v (and mask) read, output written; no causal halving", out


# Where a convolution operator's stride, padding and dilation stand among its arguments (the profiler's
# "Concrete Inputs" hold their values as strings, e.g. "[2, 2]").
_CONV_GEOMETRY_AT = {
    "aten::cudnn_convolution": (3, 2, 4),  # (input, weight, padding, stride, dilation, groups, ...)
    "aten::miopen_convolution": (4, 3, 5),  # (input, weight, bias, padding, stride, dilation, groups, ...)
    "aten::mkldnn_convolution": (4, 3, 5),
    "aten::conv1d": (3, 4, 5),  # (input, weight, bias, stride, padding, dilation, groups)
    "aten::conv2d": (3, 4, 5),
    "aten::conv3d": (3, 4, 5),
    "aten::convolution": (3, 4, 5),  # (input, weight, bias, stride, padding, dilation, transposed, ...)
    "aten::_convolution": (3, 4, 5),
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, ...)
    "aten::convolution_backward": (4, 5, 6),
}


def _int_list(text: Any) -> list[int] | None:
    if not isinstance(text, str) or not re.fullmatch(r"\[\s*\d+(\s*,\s*\d+)*\s*\]", text):
        return None
    return [int(v) for v in text.strip("[] ").split(",")]


def _conv_geometry(name: str, x_shape: list, w_shape: list, concrete: list | None) -> tuple[list[int], ...] | None:
    """A forward convolution's (stride, padding, dilation), one number per spatial dim, from its Concrete Inputs;
    None when they are not recorded, the call is a transposed convolution, or they do not fit the shapes."""
    at = _CONV_GEOMETRY_AT.get(name)
    if at is None or not isinstance(concrete, list) or len(concrete) <= max(at):
        return None
    transposed_at = 7 if name == "aten::convolution_backward" else 6
    if name in ("aten::convolution", "aten::_convolution", "aten::convolution_backward") and (
        len(concrete) <= transposed_at or concrete[transposed_at] != "False"
    ):
        return None  # transposed (or not recorded)
    stride, padding, dilation = (_int_list(concrete[i]) for i in at)
    spatial, kernel = list(x_shape[2:]), list(w_shape[2:])
    if not spatial or len(kernel) != len(spatial) or stride is None or padding is None or dilation is None:
        return None
    rank = len(spatial)
    stride, padding, dilation = ([v[0]] * rank if len(v) == 1 else v for v in (stride, padding, dilation))
    if not (len(stride) == len(padding) == len(dilation) == rank) or min(stride) < 1:
        return None
    return stride, padding, dilation


def conv_output_spatial(name: str, x_shape: list, w_shape: list, concrete: list | None) -> list[int] | None:
    """A forward convolution's output spatial size from its recorded stride, padding and dilation
    (floor((H + 2p - d(k - 1) - 1) / s) + 1 per dim); None when they are not recorded, the call is a transposed
    convolution, or the numbers do not fit the shapes."""
    geometry = _conv_geometry(name, x_shape, w_shape, concrete)
    return None if geometry is None else _conv_output(x_shape, w_shape, geometry)


def _conv_output(x_shape: list, w_shape: list, geometry: tuple[list[int], ...]) -> list[int] | None:
    out = [(h + 2 * p - d * (k - 1) - 1) // s + 1 for h, k, (s, p, d) in zip(x_shape[2:], w_shape[2:], zip(*geometry))]
    return out if min(out) >= 1 else None


def conv_input_read_share(name: str, x_shape: list, w_shape: list, concrete: list | None) -> float:
    """The share of a forward convolution's input its windows touch: per spatial dim, the input positions
    ``o * stride - padding + j * dilation`` (o over the output, j over the kernel) inside the input, over its
    size. Under 1 where the stride steps over positions no window covers (a 1x1 convolution of stride 2 reads one
    pixel in four: Nsight Compute measured ResNet-50's two downsampling convolutions at 129.5 and 54.0 MB of
    DRAM traffic, where the whole input counted gives 283.8 and 131.2 MB and a quarter of it 129.7 and 54.2,
    benchmarks/results/ncu_classes/timm_resnet50_train.csv.gz); 1 where every position is read or the geometry
    is not recorded."""
    geometry = _conv_geometry(name, x_shape, w_shape, concrete)
    out = None if geometry is None else _conv_output(x_shape, w_shape, geometry)
    if out is None:
        return 1.0
    share = 1.0
    for h, k, o, (s, p, d) in zip(x_shape[2:], w_shape[2:], out, zip(*geometry)):
        if s <= d * (k - 1) + 1 and d == 1:
            continue  # consecutive windows overlap or abut: every position between the first and last is read
        touched = {i * s - p + j * d for i in range(o) for j in range(k)}
        share *= sum(1 for t in touched if 0 <= t < h) / h
    return share


# aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
# output_padding, groups, output_mask): its Concrete Inputs keep the output mask (grad_input, grad_weight,
# grad_bias) as text, "[True, True, False]".
_CONV_BACKWARD_MASK_AT = 10
_OUTPUT_MASK = re.compile(r"\[\s*(True|False)\s*,\s*(True|False)\s*(,\s*(True|False)\s*)?\]")


def conv_backward_mask(name: str, concrete: list | None) -> tuple[bool, bool] | None:
    """(grad_input, grad_weight): which gradients a convolution backward call computes, from the output_mask its
    Concrete Inputs record (a network's first convolution has no grad_input: "[False, True, False]"; a frozen
    layer's weight no grad_weight); None for other operators or where it is not recorded."""
    if name not in _CONV_BACKWARD or not isinstance(concrete, list) or len(concrete) <= _CONV_BACKWARD_MASK_AT:
        return None
    mask = concrete[_CONV_BACKWARD_MASK_AT]
    found = _OUTPUT_MASK.fullmatch(mask.strip()) if isinstance(mask, str) else None
    return (found.group(1) == "True", found.group(2) == "True") if found else None


def _convolution(name: str, args: list, concrete: list | None = None) -> tuple[float, float, str, float] | None:
    if name in _CONV_BACKWARD:
        grad_out, x, w = (_arg(args, i) for i in range(3))
        if not (grad_out and x and w) or len(w.shape) < 3:
            return None
        # the wgrad kernel reads the input where the forward's windows touched it (conv_input_read_share)
        x_read = x.nbytes * conv_input_read_share(name, x.shape, w.shape, concrete)
        per_output = _numel(w.shape[1:]) or 0
        mask = conv_backward_mask(name, concrete)
        if mask is not None and mask != (True, True) and any(mask):
            # One gradient computed: one GEMM as large as forward, grad read once; dgrad reads the weight and
            # writes grad input, wgrad reads the input and writes grad weight (both move the same three sizes).
            which = (
                "grad input only (output_mask): grad and weight read, grad input written"
                if mask[0]
                else "grad weight only (output_mask): grad and input read, grad weight written"
            )
            return (
                2.0 * grad_out.numel * per_output,
                float(grad_out.nbytes + (w.nbytes if mask[0] else x_read) + (x.nbytes if mask[0] else w.nbytes)),
                f"convolution backward, {which}",
                x.nbytes if mask[0] else w.nbytes,
            )
        flops = 2 * 2.0 * grad_out.numel * per_output  # grad input and grad weight, each a GEMM as large as forward
        read = 2 * grad_out.nbytes + x_read + w.nbytes  # dgrad and wgrad kernels each read the output's grad
        return (
            flops,
            float(read + x.nbytes + w.nbytes),
            "convolution backward: grad read by the dgrad and the wgrad kernels, input and weight read; grads written",
            x.nbytes + w.nbytes,
        )
    x, w = _arg(args, 0), _arg(args, 1)
    if not (x and w) or len(x.shape) < 3 or len(w.shape) != len(x.shape):
        return None
    spatial = conv_output_spatial(name, x.shape, w.shape, concrete)
    geometry = "stride, padding and dilation as recorded"
    if spatial is None:
        spatial, geometry = x.shape[2:], "stride 1 assumed"
    out = x.shape[0] * w.shape[0] * (_numel(spatial) or 0)
    flops = 2.0 * out * (_numel(w.shape[1:]) or 0)
    share = conv_input_read_share(name, x.shape, w.shape, concrete)
    read = sum(a.nbytes for a in args[1:] if a is not None) + x.nbytes * share
    if share < 1.0:
        geometry += f"; its windows read {100 * share:.0f}% of the input"
    basis = f"convolution: input, weight read, output written ({geometry})"
    return flops, float(read + out * x.itemsize), basis, out * x.itemsize


# cuDNN's NCHW<->NHWC layout transposes (nchwToNhwcKernel, nhwcToNchwKernel) move one tensor of their
# convolution in tiles of 32 x 32 elements, one block per (index of dim 0, 32 positions of the spatial dims, 32
# channels): dim0 x ceil(spatial / 32) x ceil(dim1 / 32) blocks. On the H200 every one of the 200 transposes of
# a timm ResNet-50 training step had exactly the grid of one tensor of its call (input, weight, output or grad;
# benchmarks/results/ncu_classes/timm_resnet50_train.csv.gz), so the grid names the tensor it moves.
LAYOUT_TILE = 32


def layout_tensors(
    name: str, dims: list | None, types: list | None, concrete: list | None = None
) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The tensors a convolution call's layout transposes can move, as (shape, itemsize): its tensor arguments
    of three or more dims and, for a forward call, its output (from its recorded stride, padding and dilation;
    without them stride 1 or 2 with "same" padding: the spatial dims divided by the stride, rounded up). Empty
    for other operators or without shapes."""
    if name not in _CONV_FORWARD and name not in _CONV_BACKWARD:
        return ()
    if not isinstance(dims, list) or not isinstance(types, list):
        return ()
    args = [a for a in _arguments(dims, types) if a is not None and len(a.shape) >= 3]
    out = [(tuple(a.shape), a.itemsize) for a in args]
    if name in _CONV_FORWARD and len(args) >= 2 and len(args[1].shape) == len(args[0].shape):
        x, w = args[0].shape, args[1].shape
        spatial = conv_output_spatial(name, x, w, concrete)
        if spatial is not None:
            out.append(((x[0], w[0], *spatial), args[0].itemsize))
        else:
            for stride in (1, 2):
                out.append(((x[0], w[0], *(-(-d // stride) for d in x[2:])), args[0].itemsize))
    return tuple(dict.fromkeys(out))


def conv_backward_weight(name: str, dims: list | None, types: list | None) -> tuple[int, ...] | None:
    """The shape of a convolution backward call's weight (its third argument: grad_output, input, weight, ...),
    the tensor its weight-gradient kernels write; None for other operators or without shapes."""
    if name not in _CONV_BACKWARD or not isinstance(dims, list) or not isinstance(types, list):
        return None
    args = _arguments(dims, types)
    weight = _arg(args, 2)
    if weight is None or len(weight.shape) < 2 or not weight.numel:
        return None
    return tuple(weight.shape)


def layout_tiles(shape: tuple[int, ...]) -> int:
    """Blocks of a cuDNN layout transpose of ``shape`` (:data:`LAYOUT_TILE`)."""
    spatial = math.prod(shape[2:])
    return shape[0] * -(-spatial // LAYOUT_TILE) * -(-shape[1] // LAYOUT_TILE)


def layout_transpose(tensors, blocks: int) -> tuple[tuple[int, ...], float, float] | None:
    """The tensor a cuDNN layout transpose of ``blocks`` blocks moves, among its call's :func:`layout_tensors`:
    (shape, bytes moved (read once, written once), tile fill: the tensor's elements over the tiles' 32 x 32
    slots), or None when no tensor has that grid."""
    for shape, itemsize in tensors if isinstance(tensors, (tuple, list)) else ():
        if blocks > 0 and layout_tiles(shape) == blocks:
            numel = math.prod(shape)
            return shape, 2.0 * numel * itemsize, numel / (blocks * LAYOUT_TILE * LAYOUT_TILE)
    return None


def op_cost(
    name: str, dims: list | None, types: list | None, recorded_flops: float, concrete: list | None = None
) -> OpCost:
    """(flops, bytes, dtype, estimated, basis) for one operator call, from its shapes (and, for a convolution, its
    recorded stride, padding and dilation: ``concrete``, the decoded "Concrete Inputs"); NaN when unknown."""
    recorded = recorded_flops if recorded_flops > 0 else math.nan
    if not isinstance(dims, list) or not isinstance(types, list):
        return OpCost(recorded, math.nan, None, math.isnan(recorded), "no shapes recorded")
    args = _arguments(dims, types)
    tensors = [a for a in args if a is not None]
    if not tensors:
        basis = "TensorList arguments: no dtype recorded" if "TensorList" in types else "no tensor shapes recorded"
        return OpCost(recorded, math.nan, None, math.isnan(recorded), basis)
    dtype = next((t for t in DTYPE_ORDER if any(x.dtype == t for x in tensors)), tensors[0].dtype)
    read = float(sum(t.nbytes for t in tensors))
    first = args[0] if args[0] is not None else tensors[0]
    flops = math.nan
    written = first.nbytes  # one output as large as the first argument, unless a family says otherwise
    gathered = _gather_like(name, args)
    if name in MATMUL_OPS:
        mats = [t.shape for t in tensors if len(t.shape) >= 2]
        if len(mats) >= 2:
            if name == "aten::linear":  # (input [..., K], weight [N, K], bias)
                a, b = mats[0], mats[1]
                k, n_cols = a[-1], b[0]
            elif name == "aten::_scaled_mm":  # (a [M, K], b [K, N], scales...)
                a, b = mats[0], mats[1]
                k, n_cols = a[-1], b[-1]
            else:  # mm, bmm, addmm(bias, a, b), baddbmm(...)
                a, b = mats[-2], mats[-1]
                k, n_cols = a[-1], b[-1]
            m_rows = _numel(a[:-1]) or 0
            flops = 2.0 * m_rows * k * n_cols
            written = m_rows * n_cols * tensors[-1].itemsize
            nbytes, basis = read + written, "GEMM: A, B (and bias) read, C written"
        else:  # dot / mv: the output is a vector
            written = max(t.numel for t in tensors) * first.itemsize
            nbytes, basis = read + written, "GEMV: inputs read, output written"
    elif name in _CONV_FORWARD or name in _CONV_BACKWARD:
        conv = _convolution(name, args, concrete)
        if conv is None:
            nbytes, basis = read + first.nbytes, "convolution: inputs read, one output as large as the input written"
        else:
            flops, nbytes, basis, written = conv
    elif name in _ATTENTION_FORWARD or name in _ATTENTION_BACKWARD:
        backward = name in _ATTENTION_BACKWARD
        attention = _attention(name, (_ATTENTION_BACKWARD if backward else _ATTENTION_FORWARD)[name], args, backward)
        if attention is None:
            nbytes, basis = read + first.nbytes, "attention: inputs read, output written"
        else:
            flops, nbytes, basis, written = attention
    elif gathered is not None:
        nbytes, basis, written = gathered
        flops = 0.0
    elif name in _FILL:
        nbytes, basis, flops = float(first.nbytes), "fill: output written only", 0.0
    elif name in _COPY and len(tensors) >= 2:
        nbytes, basis, flops = float(tensors[0].nbytes + tensors[1].nbytes), "copy: source read, target written", 0.0
        written = tensors[0].nbytes
    elif name in _CLONE:
        nbytes, basis, flops = 2.0 * first.nbytes, "copy: input read, a same-size output written", 0.0
    elif name in _CONCAT:
        nbytes, basis, flops = 2.0 * read, "concatenation: inputs read and written once", 0.0
        written = read
    elif _NORMALIZATION.match(name) or _SOFTMAX.match(name) or _SOFTMAX_BACKWARD.match(name):
        nbytes, basis = read + first.nbytes, "normalization: all tensors read, one output written"
        flops = NORMALIZATION_FLOPS_PER_ELEMENT * first.numel
    elif _REDUCTION.match(name):
        nbytes, basis = read, "reduction: inputs read (output not counted)"
        written = 0.0
        flops = float(max(t.numel for t in tensors))
    elif name.endswith("_") and not name.startswith("aten::_"):
        nbytes, basis = read + first.nbytes, "in-place elementwise: operands read, first operand written"
        flops = float(first.numel)
    else:
        out = _broadcast_numel([t.shape for t in tensors])
        if out is None:
            out = max(t.numel for t in tensors)
        written = out * first.itemsize
        nbytes, basis = read + written, "elementwise: inputs read, broadcast output written"
        flops = float(out)
    estimated = True
    if recorded_flops > 0:
        flops = recorded_flops
        estimated = False  # FLOPs are the profiler's own count; bytes are always estimated (module doc)
    return OpCost(flops, float(nbytes), dtype, estimated, basis, float(written))
