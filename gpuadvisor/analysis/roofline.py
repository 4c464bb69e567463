"""Roofline class of every kernel: compute-, memory-, latency- or launch-bound, and how far under its roof.

FLOPs and bytes come from the operator that launched the kernel (linked through External id): the
profiler's FLOP count when it recorded one (``with_flops=True``; matmuls and convolutions), otherwise an
estimate from the recorded input shapes and dtypes (``record_shapes=True``), counted per operator family
(:mod:`gpuadvisor.analysis.op_costs`; ``bytes_basis`` names the count). Bytes are always an estimate. When an
operator launches several kernels, its FLOPs and bytes are split among them in proportion to their durations
(FLOPs among its math kernels only); a cuDNN layout transpose whose grid names the tensor it moves
(:func:`~gpuadvisor.analysis.op_costs.layout_transpose`) counts that tensor instead of a share, and a foreach or
fused-optimizer kernel (``multi_tensor_apply_kernel``), whose TensorList arguments the profiler records without
shapes, counts the chunks its grid names (:func:`multi_tensor_bytes`, an upper bound), and cuDNN's split-K
weight-gradient reduction counts the partial weight gradients its call's wgrad GEMM wrote, as many as that GEMM's
grid holds tile grids (:func:`split_k_wgrad`). Bytes are what crosses DRAM while the kernel runs: on GPUs where
it was measured (:func:`l2_deferred_writes`), the part of a kernel's writes still in the L2 when it ends is left
out (the basis says how much); only where what the kernel writes is known: a kernel that is its operator's only
one, or a layout transpose.
``estimated`` marks every row whose % of roof or class rests on an estimate: FLOPs from shapes, bytes (a
kernel under the memory roof), or the name-family fallback below.

A % of roof above 100 is not a measurement: the kernel moved less than the estimate says (inputs aliased, data
served from L2, a count that does not fit the kernel). Such a row keeps ``pct_of_roof`` NaN (the figure is in
``pct_of_roof_implied``, the per-name summary says why in ``roof_note``) and is not classed by it.

Classes, in order of precedence:
- ``compute`` / ``memory``: at >= 60% of the roof it is under (compute past the ridge point of its dtype,
  memory below), whatever its grid;
- ``launch``: the kernel ran shorter than a launch call of its own took on the host (never a kernel replayed
  from a CUDA graph: the whole graph shares one ``cudaGraphLaunch``);
- ``latency``: its grid is under one wave, so most of the GPU idles. A wave is what the SMs hold at once:
  SMs x the blocks one SM can keep resident, limited by the block's threads, registers and shared memory
  (:func:`resident_blocks`, from the kernel's launch record and the trace's ``deviceProperties``), as Nsight
  Compute's ``launch__waves_per_multiprocessor`` counts it; without those records, fewer blocks than SMs;
- ``compute`` (issue-bound): PyTorch's generic TensorIterator loops (``elementwise_kernel<...>``,
  ``unrolled_elementwise_kernel<...>``: not the vectorized path) under 60% of the memory roof with a full
  wave spend their time on per-element index arithmetic: on the H200 Nsight Compute measured three of them at
  56-71% of SM throughput and 33-55% of DRAM (benchmarks/results/ncu_classes). So do the row-wise
  normalization and pooling kernels (PyTorch's softmax and LayerNorm forward, cuDNN's batch-norm forward,
  PyTorch's max pooling: per-row reductions through warp shuffles, exp/rsqrt, window index arithmetic): every
  full-wave launch of them Nsight Compute measured on the H200 under 60% of DRAM used more of the SM than of DRAM
  (``softmax_warp_forward`` 82% SM / 37% DRAM, ``vectorized_layer_norm_kernel`` 74 / 13,
  ``bn_fw_tr_1C11_singleread`` 42 / 36, ``max_pool_forward_nchw`` 83 / 35, ``max_pool_backward_nchw`` 80 / 13),
  and so do cuDNN's layout transposes whose issue work outweighs their DRAM traffic (:data:`LAYOUT_ISSUE_SHARE`:
  mostly empty 32x32-element tiles, a 3-channel image at 78% SM / 9% DRAM, or a tensor whose writes stay in the
  L2) and cuDNN's implicit-GEMM convolution that gathers its operands through an index table straight
  from global memory, without staging them in shared memory (``implicit_gemm_indexed_wo_smem``: the
  3-channel stem convolution of the ResNet-50 training step, 55% SM / 12% DRAM over 369 µs). Estimated, by
  name or by a transpose's tiles and bytes; their roof side stays memory, so a fused kernel is still the fix.
  Not cuDNN's batch-norm backward: of ``bn_bw_1C11_singleread``'s full-wave launches in the ResNet-50 training
  step, 8 (587 µs per step) used more of DRAM (33-38% against 32% SM) and 9 (280 µs) more of the SM (34-45%
  against 11-26% DRAM); it keeps the memory class its intensity gives;
- ``compute`` / ``memory``: arithmetic intensity above / below the ridge point;
- without FLOPs/bytes or peaks, GEMM/convolution/attention families count as compute and the rest as
  memory (``estimated`` = True); communication kernels (NCCL) are ``unknown``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import factorize_names, gpu_activities, match_names
from gpuadvisor.analysis.op_costs import (
    CONVOLUTION_OPS,
    DTYPE_ORDER,
    ITEMSIZE,
    LAYOUT_TILE,
    conv_backward_weight,
    layout_tensors,
    layout_transpose,
    op_cost,
)
from gpuadvisor.device.peaks import DevicePeaks, peak_flops
from gpuadvisor.trace.kineto import concrete_inputs_raw, input_shapes_raw
from gpuadvisor.trace.model import Trace

FAMILY_PATTERNS = [
    ("communication", r"nccl|rccl|all_?reduce|allgather|reduce_?scatter|sendrecv"),
    ("attention", r"flash|fmha|attention|sdpa|mha_"),
    # cuDNN's split-K weight-gradient reduction (cudnn::cnn::reduce_wgrad_nchw_helper) sums the wgrad kernel's
    # partial results: a reduction, none of the convolution's multiply-adds.
    ("reduction", r"reduce_wgrad"),
    # CUTLASS's split-K reduction (cutlass::reduction::kernel::ReduceSplitK) sums a GEMM's or convolution's
    # partial tiles: a reduction, though its name carries "cutlass" and the convolution's template arguments.
    ("reduction", r"ReduceSplitK"),
    # cuDNN's workspace initialisation before an implicit-GEMM convolution
    # (cask_plugin::xmma::init_device_workspace_kernel<...implicit_gemm::fprop...>): a fill, no multiply-adds.
    ("copy", r"init_device_workspace"),
    # Before gemm: cuDNN's and CUTLASS's implicit-GEMM convolutions carry "gemm" in their names
    # (sm90_xmma_fprop_implicit_gemm_..., ImplicitGemmConvolution); "convert" kernels are not convolutions.
    ("convolution", r"conv(?!ert)|fprop|dgrad|wgrad|implicit_convolve|implicit_gemm|winograd"),
    ("gemm", r"gemm|gemv|xmma|wgmma|cutlass|nvjet|sgemm|hgemm|matmul|_mm_|cublas|splitk|dot_kernel"),
    # cuDNN's BatchNorm kernels: cudnn::bn_fw_tr_1C11_kernel_NCHW, bn_bw_1C11_singleread, ...
    ("normalization", r"norm|softmax|\bbn_(fw|bw)|::bn_(fw|bw)"),
    ("reduction", r"reduce|triton_red|triton_per|sum_kernel|mean|argmax|topk|cub::"),
    # cuDNN's layout transposes around NHWC convolutions (nchwToNhwcKernel, nhwcToNchwKernel).
    ("copy", r"copy|catarray|transpose|gather|scatter|index|cat_|fill|memcpy|permute|nchwToNhwc|nhwcToNchw"),
    ("elementwise", r"elementwise|triton_poi|vectorized|unrolled|pointwise|activation|silu|gelu|relu|mul|add"),
]
COMPUTE_FAMILIES = {"gemm", "attention", "convolution"}
_FAMILY_RES = [(fam, re.compile(pat, re.IGNORECASE)) for fam, pat in FAMILY_PATTERNS]
# Nsight Compute's SpeedOfLight rule calls a kernel latency-limited when both its compute and its memory
# throughput are under 60% of peak; at or above 60% of the roof it is under, a kernel is bound by that roof
# whatever its grid (the 126-block lm-head GEMV of the H200 decode sample runs at 81% of the HBM roof).
NEAR_ROOF_PCT = 60.0
# PyTorch's generic (non-vectorized) TensorIterator loops: per-element offset arithmetic, issue-bound.
_GENERIC_LOOP = re.compile(r"(?<![\w])(elementwise_kernel|unrolled_elementwise_kernel)<")
# cuDNN's NCHW<->NHWC layout transposes around its NHWC convolutions (GA203's kernels).
LAYOUT_CONVERSION_KERNEL = r"(?i)nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw"
# A layout transpose issues the same instructions for every slot of its 32x32-element tiles, filled or not, while
# DRAM sees the tensor read and written less the writes the L2 still holds when it ends (l2_deferred_writes). Its
# issue work, in the bytes the same time would move at the DRAM roof, is taken as LAYOUT_ISSUE_SHARE x the tensor
# read and written / the tiles' fill; where that exceeds its DRAM bytes, the SM is the nearer unit (issue-bound).
# Nsight Compute on the H200 (benchmarks/results/ncu_classes/timm_resnet50_train.csv.gz) measured the 9%- and
# 28%-filled transposes (a 3-channel image, 3x3 weights) at up to 79% SM against 9-21% DRAM; the 88%-filled
# 64x1024x14x14 one nearer DRAM (43-52% SM, 61-63% DRAM; its writes partly stay in the L2: 77.8 of 102.8 MB
# reach DRAM) and the 88%-filled 64x256x14x14 one nearer the SM (43% SM, 32% DRAM; all 12.8 MB of its writes
# stay in the L2); the 98%-filled 64x128x28x28 one nearer DRAM (41-44% SM, 45-50% DRAM) and the 88%-filled
# 64x512x14x14 one of the same size nearer the SM (51%, 48%; another launch of it nearer DRAM, 38%, 42%). For a
# share from 0.45 to 0.50 every transpose of the export but that one launch (15 µs a step) lands on ncu's side
# (ncu agreement on the step 95.3%); 0.51 or more puts the 98%-filled ones on the SM (94.4%), 0.44 or less the
# 88%-filled small ones on DRAM (95.2% at 0.44, 94.8% at 0.40). A GPU whose L2 holds no writes past a kernel's
# end (no deferral) reads a transpose issue-bound only under 47.5% full.
LAYOUT_ISSUE_SHARE = 0.475
# The row-wise normalization and pooling kernels Nsight Compute measured issue-bound (module docstring):
# PyTorch's softmax and LayerNorm forward, cuDNN's batch-norm forward, PyTorch's max pooling. cuDNN's batch-norm
# backward is not among them: most of its full-wave time was nearer the DRAM roof. Kernels it has not measured at
# a full wave (softmax and LayerNorm backward, PyTorch's own batch norm, average pooling, Triton's fused ones)
# keep the class their arithmetic intensity gives.
_ISSUE_BOUND_ROWS = re.compile(
    r"softmax_warp_forward|vectorized_layer_norm_kernel|\bbn_fw_|::bn_fw_|max_pool_(forward|backward)"
    r"|implicit_gemm_indexed_wo_smem"  # cuDNN's convolution without shared memory (module docstring)
)
# cuDNN's two-pass BatchNorm kernels (``bn_fw_tr_1C11_kernel_NCHW``, ``bn_bw_1C11_kernel_new``; not the
# ``singleread`` ones) read their input twice: once for the statistics, once to normalize (forward: x read
# twice, y written: 3 tensors against the 2 counted; backward: x and dy read twice, dx written: 5 against 3).
# Nsight Compute on the H200 measured them at 1.5x and 1.7x the DRAM traffic of the single-read count
# (benchmarks/results/ncu_classes/timm_resnet50_train.csv.gz).
_TWO_PASS_BN = (
    (re.compile(r"\bbn_fw_tr_1C11_kernel"), 3.0 / 2.0, "cuDNN two-pass BatchNorm: input read twice, output written"),
    (
        re.compile(r"\bbn_bw_1C11_kernel"),
        5.0 / 3.0,
        "cuDNN two-pass BatchNorm backward: input and grad read twice, grad input written",
    ),
)
# PyTorch's foreach and fused-optimizer kernels (``multi_tensor_apply_kernel<TensorListMetadata<D>, Functor<T,
# depth, r_args_depth, res_arg_index>, ...>``) give each block one chunk of MULTI_TENSOR_CHUNK elements of every
# list (ATen's MultiTensorApply.cuh, kChunkSize). The profiler records their TensorList inputs without shapes, so
# the grid is the only size there is: blocks x chunk elements per list, read r_args_depth times and written once
# (a functor that does not name its read depth, such as apex's ``AdamFunctor<float>``, whose chunk is the same
# 2048 x 32: every list read and written). An upper bound: a tensor's last chunk is partial, so a launch over many
# small tensors (a model's biases and norms) moves less.
MULTI_TENSOR_CHUNK = 65536
_MULTI_TENSOR = re.compile(r"multi_tensor_apply_kernel<[^<>]*TensorList\w*Metadata<(?:[\w:]+,\s*)?(\d+)>")
_MULTI_TENSOR_FUNCTOR = re.compile(r"Functor<\s*([\w:]+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*>")
_MULTI_TENSOR_SCALAR = re.compile(r"Functor<\s*([\w:]+)\s*[,>]")


def multi_tensor_bytes(name: str, blocks: int) -> tuple[float, str, str] | None:
    """(bytes, dtype, basis) of a multi-tensor-apply launch from its grid and template arguments
    (``MULTI_TENSOR_CHUNK``); None for another kernel, an unknown grid or an element type not in ITEMSIZE."""
    found = _MULTI_TENSOR.search(name)
    if found is None or blocks <= 0:
        return None
    depth = int(found.group(1))
    functor = _MULTI_TENSOR_FUNCTOR.search(name)
    if functor is not None:
        dtype, accesses = functor.group(1), int(functor.group(3)) + 1
        how = f"{int(functor.group(3))} list(s) read, 1 written"
    else:
        scalar = _MULTI_TENSOR_SCALAR.search(name)
        dtype, accesses = (scalar.group(1) if scalar else None), 2 * depth
        how = f"each of {depth} list(s) read and written"
    itemsize = ITEMSIZE.get(dtype or "")
    if not itemsize:
        return None
    basis = (
        f"multi-tensor apply: {blocks} chunks of {MULTI_TENSOR_CHUNK} {dtype} elements per list, {how}; an upper "
        "bound (a tensor's last chunk is partial)"
    )
    return float(blocks) * MULTI_TENSOR_CHUNK * itemsize * accesses, dtype, basis


# cuDNN's split-K weight gradient: the wgrad GEMM (``cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_
# tn_align4>``, ``sm90_xmma_gemm_..._tilesize128x64x32_...``) splits its reduction dimension (batch x spatial) into
# ``splits`` slices, one grid of output tiles each, and writes a partial weight gradient per slice; the reduction
# after it in the same call (``cudnn::cnn::reduce_wgrad_nchw_helper<T, T>``, one thread per weight element) reads
# the partials and writes the weight gradient. Its grid names the tensor (blocks x threads = the weight's elements),
# the GEMM's names the slices: splits = GEMM blocks / (ceil(C_out / tile_m) x ceil(C_in*kh*kw / tile_n)), the tile
# from the GEMM's name. On the H200 each of the 27 reductions of a timm ResNet-50 training step (1x1 weights,
# 64x64 to 1024x256; 32-2048 blocks of 128 threads, one per weight element) came out at 64 splits, and (64 + 1) x
# the weight matched the DRAM traffic Nsight Compute measured within 2.1% on every launch (68.2 MB counted, 69.5
# measured, for a 1024x256 weight; benchmarks/results/ncu_classes/timm_resnet50_train.csv.gz), where the share of
# its call's bytes had given a third of that; the asymmetric tiles (128x64 for a 256x64 weight, 64x128 for 64x256)
# fix the orientation, the other one giving half the traffic measured.
SPLIT_K_WGRAD_REDUCE = re.compile(r"\breduce_wgrad_\w*helper<\s*([\w:]+)\s*,\s*([\w:]+)\s*>")
# A GEMM's output tile, M x N: CUTLASS's ``_128x128_32x3_tn_`` (tile, then K-step x stages, then layouts) and
# cuBLAS/cuDNN's ``tilesize128x64x32``.
_GEMM_TILE = re.compile(r"_(\d+)x(\d+)_\d+x\d+_[nt]{2}_|tilesize(\d+)x(\d+)x\d+")


def gemm_tile(name: str) -> tuple[int, int] | None:
    """(tile_m, tile_n) of a GEMM kernel whose name spells its output tile (:data:`_GEMM_TILE`), else None."""
    found = _GEMM_TILE.search(name)
    if found is None:
        return None
    m, n = (int(v) for v in (found.group(1, 2) if found.group(1) else found.group(3, 4)))
    return (m, n) if m > 0 and n > 0 else None


def split_k_wgrad(
    reduce_name: str,
    reduce_blocks: int,
    reduce_threads: int,
    gemm_name: str,
    gemm_blocks: int,
    weight_shape: tuple[int, ...],
) -> tuple[int, float, str] | None:
    """(splits, bytes, basis) of cuDNN's split-K weight-gradient reduction (:data:`SPLIT_K_WGRAD_REDUCE`): the
    wgrad GEMM ``gemm_name`` of ``gemm_blocks`` blocks wrote ``splits`` partial weight gradients of
    ``weight_shape`` (C_out, C_in, kh, kw), the reduction reads them and writes one: (splits + 1) x the weight's
    elements x the element size its name gives. None unless every input is known and fits: a reduction of one
    element type, a GEMM tile in the GEMM's name, a GEMM grid that is a whole number (>= 2) of tile grids, and a
    reduction grid of one thread per weight element."""
    found = SPLIT_K_WGRAD_REDUCE.search(reduce_name)
    tile = gemm_tile(gemm_name)
    if found is None or tile is None or found.group(1) != found.group(2) or len(weight_shape) < 2:
        return None
    itemsize = ITEMSIZE.get(found.group(1))
    numel = int(np.prod(weight_shape))
    if not itemsize or numel <= 0 or gemm_blocks <= 0 or reduce_blocks <= 0 or reduce_threads <= 0:
        return None
    if reduce_blocks != -(-numel // reduce_threads):
        return None
    rows, cols = weight_shape[0], numel // weight_shape[0]
    tiles = -(-rows // tile[0]) * -(-cols // tile[1])
    if gemm_blocks % tiles or gemm_blocks // tiles < 2:
        return None
    splits = gemm_blocks // tiles
    basis = (
        f"split-K partial sums: {splits} splits from the wgrad grid ({gemm_blocks} blocks of {tile[0]}x{tile[1]} "
        f"tiles over the {'x'.join(map(str, weight_shape))} weight) read, the weight gradient written"
    )
    return splits, float(splits + 1) * numel * itemsize, basis


# Tensor-core kernels that take fp32 operands run them as TF32: cuBLAS and cuDNN say ``tf32`` in the name
# (``sm90_xmma_gemm_f32f32_tf32f32_f32_...``), CUTLASS says ``tensorop`` (``cutlass_80_tensorop_s1688gemm_...``:
# fp32 in, the 16x8x8 TF32 MMA) or names the element type (``cutlass::tfloat32_t``, ``10tfloat32_t`` where the
# profiler left the name mangled). On fp32 operands these run under the TF32 roof, not the CUDA cores' fp32 one.
_TF32_TENSOR_CORE = re.compile(r"(?i)tf32|tfloat32|tensorop")
# Resident blocks per SM by compute capability (CUDA C Programming Guide, "Compute Capabilities" table).
MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 2): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32}
REGISTER_ALLOCATION_UNIT = 256  # registers are allocated per warp in units of 256
SHARED_MEMORY_RESERVED_PER_BLOCK = 1024  # bytes the driver reserves per resident block (cc >= 8.0)
# A % of roof above this is not a measurement: the FLOP or byte estimate behind it is wrong for this kernel.
MAX_CONSISTENT_PCT = 100.0
__all__ = ["DTYPE_ORDER", "ITEMSIZE", "graph_replayed", "kernel_family", "kernel_summary", "kernel_table", "op_cost"]

KERNEL_COLUMNS = [
    "name",
    "family",
    "ts_us",
    "dur_us",
    "stream",
    "step_index",
    "blocks",
    "op",
    "flops",
    "bytes",
    "intensity",
    "dtype",
    "estimated",
    "bound",
    "pct_of_roof",
    "launch_dur_us",
    "bytes_basis",
    "roof_side",
    "pct_of_roof_implied",
    "graph_replay",
    "waves",
]


def two_pass_factor(names) -> np.ndarray:
    """Per kernel name, how many times the single-read byte count its launching operator gives it moves:
    1.5 / 1.67 for cuDNN's two-pass BatchNorm kernels (``_TWO_PASS_BN``), 1 for every other kernel."""
    return np.array([next((f for p, f, _ in _TWO_PASS_BN if p.search(n)), 1.0) for n in names], dtype=float)


def _two_pass_basis(name: str) -> str | None:
    return next((why for p, _, why in _TWO_PASS_BN if p.search(name)), None)


def kernel_family(name: str) -> str:
    """A coarse family for a kernel name: gemm, attention, convolution, normalization, reduction, copy,
    elementwise, communication or other."""
    for fam, pattern in _FAMILY_RES:
        if pattern.search(name):
            return fam
    return "other"


def _raw_codes(raws: pd.Series) -> tuple[np.ndarray, list[bytes]]:
    """A code per row for the raw JSON it holds (equal bytes, equal code), and the bytes of each code. Each
    distinct object is converted once: the reader shares one Raw object per distinct shape, so the 118k
    linked operators of a 425 MB trace need ~100 conversions instead of 118k."""
    objects = raws.to_numpy(dtype=object)
    by_object, _ = pd.factorize(np.fromiter(map(id, objects), dtype=np.uintp, count=len(objects)))
    _, first = np.unique(by_object, return_index=True)
    index: dict[bytes, int] = {}
    by_content = [index.setdefault(bytes(objects[i]), len(index)) for i in first.tolist()]
    return np.asarray(by_content, dtype=np.intp)[by_object], list(index)


def kernel_table(trace: Trace, peaks: DevicePeaks, acts: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kernel launch, classified. Columns:

    name, family, ts_us, dur_us, stream, step_index (-1 outside steps), blocks (-1 unknown), op (launching
    operator or None), flops (FLOP, NaN unknown), bytes (estimated bytes moved, NaN unknown), intensity
    (FLOP/byte), dtype (profiler dtype name), estimated (bool), bound (compute | memory | latency | launch |
    unknown), pct_of_roof (% of the attainable rate at this intensity; NaN without peaks or costs, or above
    100), launch_dur_us (host launch call duration, NaN unknown), bytes_basis (how bytes were counted, None
    without a linked operator), roof_side (compute | memory | None: the roof the kernel is under),
    pct_of_roof_implied (the % of roof the estimates give, above 100 included), graph_replay (bool: launched by
    a CUDA graph replay, see :func:`graph_replayed`).
    """
    if acts is None:
        acts = gpu_activities(trace)
    k = acts[acts["kind"] == "kernel"].reset_index(drop=True)
    if not len(k):
        return pd.DataFrame({c: [] for c in KERNEL_COLUMNS})
    ops = trace.cpu_ops
    names = k["name"]
    name_codes, unique_names = factorize_names(names)
    family_of = np.array([kernel_family(n) for n in unique_names], dtype=object)
    family = pd.Series(family_of[name_codes], index=names.index, dtype=object)

    flops = np.full(len(k), np.nan)
    nbytes = np.full(len(k), np.nan)
    dtype = np.full(len(k), None, dtype=object)
    estimated = np.ones(len(k), dtype=bool)
    op_name = np.full(len(k), None, dtype=object)
    basis = np.full(len(k), None, dtype=object)
    written = np.full(len(k), np.nan)  # of nbytes, those the kernel writes (NaN unknown)
    own_bytes = np.full(len(k), np.nan)  # bytes a kernel moves by its own shape (a layout transpose's tensor)
    own_basis = np.full(len(k), None, dtype=object)
    layout_bytes = np.full(len(k), np.nan)  # a layout transpose's tensor, read and written once
    tile_fill = np.full(len(k), np.nan)  # a layout transpose's share of its tiles' slots that hold elements
    if len(ops):
        linked = ops[ops["external_id"].isin(k["external_id"][k["external_id"] >= 0].unique())]
        linked = linked.drop_duplicates(["rank", "external_id"])
        if len(linked):
            # Steps repeat the same calls with the same shapes: cost each distinct signature once.
            dims_code, dims_raw = _raw_codes(linked["input_dims_raw"])
            types_code, types_raw = _raw_codes(linked["input_types_raw"])
            if "concrete_inputs_raw" in linked:
                concrete_code, concrete_raw = _raw_codes(linked["concrete_inputs_raw"])
            else:
                concrete_code, concrete_raw = np.zeros(len(linked), dtype=np.intp), [b"null"]
            signature = list(
                zip(
                    linked["name"],
                    dims_code.tolist(),
                    types_code.tolist(),
                    np.nan_to_num(linked["flops"].to_numpy(float)).tolist(),
                    concrete_code.tolist(),
                )
            )
            distinct = list(dict.fromkeys(signature))
            dims, types = input_shapes_raw(
                [dims_raw[key[1]] for key in distinct], [types_raw[key[2]] for key in distinct]
            )
            # Only a convolution reads its concrete inputs (stride, padding, dilation): decode those alone.
            concretes = [
                concrete_inputs_raw([concrete_raw[key[4]]])[0] if key[0] in CONVOLUTION_OPS else None
                for key in distinct
            ]
            cost_of = {key: op_cost(key[0], d, t, key[3], c) for key, d, t, c in zip(distinct, dims, types, concretes)}
            layout_of = {key: layout_tensors(key[0], d, t, c) for key, d, t, c in zip(distinct, dims, types, concretes)}
            weight_of = {key: conv_backward_weight(key[0], d, t) for key, d, t in zip(distinct, dims, types)}
            cost = [cost_of[key] for key in signature]
            costs = pd.DataFrame(
                {
                    "rank": linked["rank"].to_numpy(),
                    "external_id": linked["external_id"].to_numpy(),
                    "op": linked["name"].to_numpy(),
                    "op_flops": [c[0] for c in cost],
                    "op_bytes": [c[1] for c in cost],
                    "op_dtype": [c[2] for c in cost],
                    "op_estimated": [c[3] for c in cost],
                    "op_basis": [c[4] for c in cost],
                    "op_written": [c.written for c in cost],
                    "op_layout": [layout_of[key] for key in signature],
                    "op_weight": [weight_of[key] for key in signature],
                }
            )
            merged = k[["rank", "external_id", "dur_us"]].merge(costs, on=["rank", "external_id"], how="left")
            # A cuDNN layout transpose whose grid names the tensor it moves (op_costs.layout_transpose) counts
            # that tensor read and written; the call's other kernels share its cost by duration. Its FLOPs go
            # only to its math kernels (GEMM, convolution, attention) when it has any: a layout transpose or a
            # split-K reduction cuDNN runs beside a convolution moves bytes and does none of its multiply-adds.
            blocks_all = k["blocks"].to_numpy()
            layout_name = match_names(pd.Series(unique_names, dtype=object), LAYOUT_CONVERSION_KERNEL)[name_codes]
            layouts = merged["op_layout"].to_numpy(object)
            found: dict = {}  # steps repeat the same calls: match each (call's tensors, grid) once
            for i in np.flatnonzero(layout_name & (blocks_all > 0)):
                key = (layouts[i] if isinstance(layouts[i], tuple) else (), int(blocks_all[i]))
                if key not in found:
                    found[key] = layout_transpose(*key)
                hit = found[key]
                if hit is not None:
                    shape, own_bytes[i], tile_fill[i] = hit
                    own_basis[i] = (
                        f"layout transpose of the call's {'x'.join(map(str, shape))} tensor (its grid's "
                        f"{LAYOUT_TILE}x{LAYOUT_TILE}-element tiles, {100 * tile_fill[i]:.0f}% filled): read and "
                        "written once"
                    )
            # cuDNN's split-K weight-gradient reduction counts the partial sums its call's wgrad GEMM wrote
            # (split_k_wgrad) instead of its share. Unlike a layout transpose's, its share is not handed to the
            # call's other kernels: the operator's count holds none of the partial sums, and the split by duration
            # is no measure of its GEMMs' own traffic (Nsight Compute measured a dgrad GEMM under its share and the
            # wgrad GEMM, partials written, over it), so they keep the share they had.
            reduce_name = np.array([bool(SPLIT_K_WGRAD_REDUCE.search(n)) for n in unique_names], dtype=bool)
            split_k = np.zeros(len(k), dtype=bool)
            for i, moved_bytes, why in _split_k_reductions(
                trace, k, reduce_name[name_codes], unique_names, name_codes, merged["op_weight"].to_numpy(object)
            ):
                own_bytes[i], own_basis[i], split_k[i] = moved_bytes, why, True
            moved = np.isfinite(own_bytes)
            layout_bytes = np.where(np.isfinite(tile_fill), own_bytes, np.nan)
            keys = [merged["rank"], merged["external_id"]]
            dur_all = merged["dur_us"].to_numpy(float)
            dur_shared = np.where(moved & ~split_k, 0.0, dur_all)
            math_kernel = np.isin(family.to_numpy(object), list(COMPUTE_FAMILIES))
            dur_math = np.where(math_kernel, dur_all, 0.0)
            total = pd.Series(dur_shared).groupby(keys).transform("sum").to_numpy(float)
            total_math = pd.Series(dur_math).groupby(keys).transform("sum").to_numpy(float)
            share = np.divide(dur_shared, total, out=np.where(moved, 0.0, 1.0), where=total > 0)
            math_share = np.where(
                total_math > 0, np.divide(dur_math, total_math, out=np.zeros(len(merged)), where=total_math > 0), share
            )
            flops = merged["op_flops"].to_numpy(float) * math_share
            nbytes = np.where(moved, own_bytes, merged["op_bytes"].to_numpy(float) * share)
            # What each kernel writes, for l2_deferred_writes: a layout transpose the tensor it reads, a kernel
            # that is its operator's only one what the operator writes. A split-K reduction writes one weight
            # gradient, and kernels that share an operator's count are not told apart by what they write: no
            # deferral is claimed for them.
            written = np.where(
                moved,
                np.where(split_k, np.nan, own_bytes / 2.0),
                np.where(share >= 1.0, merged["op_written"].to_numpy(float), np.nan),
            )
            dtype = merged["op_dtype"].to_numpy(object)
            estimated = merged["op_estimated"].fillna(True).to_numpy(bool)
            op_name = merged["op"].to_numpy(object)
            basis = np.where(moved, own_basis, merged["op_basis"].to_numpy(object)).astype(object)

    passes = two_pass_factor(unique_names)[name_codes]
    if (passes != 1.0).any():
        nbytes = nbytes * passes
        whys = np.array([_two_pass_basis(n) for n in unique_names], dtype=object)[name_codes]
        basis = np.where((passes != 1.0) & np.isfinite(nbytes), whys, basis).astype(object)
    dur = k["dur_us"].to_numpy(float)
    blocks = k["blocks"].to_numpy()
    # Foreach / fused-optimizer kernels: their operator's TensorLists carry no shapes; the grid bounds the bytes.
    multi = {}
    nbytes, dtype, basis = np.array(nbytes, dtype=float), np.array(dtype, dtype=object), np.array(basis, dtype=object)
    for i in np.flatnonzero(~np.isfinite(nbytes) & (blocks > 0)):
        key = (int(name_codes[i]), int(blocks[i]))
        if key not in multi:
            multi[key] = multi_tensor_bytes(unique_names[key[0]], key[1])
        if multi[key] is not None:
            nbytes[i], dtype_i, basis[i] = multi[key]
            dtype[i] = dtype[i] if isinstance(dtype[i], str) else dtype_i
    launch_dur = k["launch_dur_us"].to_numpy(float)
    deferred = l2_deferred_writes(peaks)
    if deferred:
        held = np.where(np.isfinite(written) & np.isfinite(nbytes), np.minimum(written, deferred), 0.0)
        nbytes = nbytes - held
        basis = np.array(basis, dtype=object)
        for i in np.flatnonzero(held > 0):
            if isinstance(basis[i], str):
                basis[i] = f"{basis[i]}; less {held[i] / 1e6:.1f} MB of its writes still in the L2 at its end"
    intensity = np.divide(flops, nbytes, out=np.full(len(k), np.nan), where=nbytes > 0)
    graph = graph_replayed(k)

    # Peak FLOP/s per kernel from its dtype (fp32 operands on TF32 tensor cores when the name says so).
    kind = pd.Series(dtype, dtype=object)
    tf32_name = np.array([bool(_TF32_TENSOR_CORE.search(n)) for n in unique_names], dtype=bool)[name_codes]
    tf32 = kind.isin(["float", "c10::Float"]).to_numpy() & tf32_name
    kind[tf32] = "tf32"
    peak_of = {d: (peak_flops(peaks, d) or np.nan) for d in kind.dropna().unique()}
    peak = kind.map(peak_of).to_numpy(float)
    bw = peaks.hbm_bytes_per_s or np.nan
    fam = family.to_numpy(object)
    with np.errstate(invalid="ignore", divide="ignore"):
        # The roof a kernel is under: compute when its intensity is past the ridge point, memory otherwise;
        # with only bytes known, memory; with only FLOPs known, compute.
        roofline_known = np.isfinite(intensity) & np.isfinite(peak) & np.isfinite(bw)
        bytes_only = ~roofline_known & np.isfinite(nbytes) & np.isfinite(bw)
        flops_only = ~roofline_known & ~np.isfinite(nbytes) & (flops > 0) & np.isfinite(peak)
        compute_side = (roofline_known & (intensity * bw >= peak)) | flops_only
        memory_side = (roofline_known & ~compute_side) | bytes_only
        implied = np.full(len(k), np.nan)
        implied[compute_side] = (100.0 * flops / (dur * 1e-6) / peak)[compute_side]
        implied[memory_side] = (100.0 * nbytes / (dur * 1e-6) / bw)[memory_side]
    implied[~(dur > 0)] = np.nan
    # Above the roof is no measurement: the estimate is wrong for this kernel, and it classes nothing.
    consistent = ~(implied > MAX_CONSISTENT_PCT)
    pct = np.where(consistent, implied, np.nan)
    roof_side = np.where(compute_side, "compute", np.where(memory_side, "memory", None)).astype(object)
    sm_count = peaks.sm_count or 0
    by_family = np.where(np.isin(fam, list(COMPUTE_FAMILIES)), "compute", "memory")
    own_launch = ~graph & (dur < launch_dur)  # False where launch_dur is NaN
    waves = kernel_waves(trace, k, blocks, sm_count)
    under_one_wave = np.where(np.isfinite(waves), waves < 1.0, (blocks > 0) & (blocks < sm_count))
    issue_bound_name = np.array(
        [bool(_GENERIC_LOOP.search(n) or _ISSUE_BOUND_ROWS.search(n)) for n in unique_names], dtype=bool
    )[name_codes]
    # A layout transpose's issue work against its DRAM traffic (LAYOUT_ISSUE_SHARE): False where NaN.
    issue_leaning = LAYOUT_ISSUE_SHARE * layout_bytes / tile_fill > nbytes
    issue_bound = (issue_bound_name | issue_leaning) & (roof_side == "memory") & (pct < NEAR_ROOF_PCT)
    bound = np.select(
        [
            (pct >= NEAR_ROOF_PCT) & (fam != "communication"),
            own_launch,
            under_one_wave,
            fam == "communication",
            issue_bound,
            (roofline_known | bytes_only | flops_only) & consistent,
        ],
        [roof_side, "launch", "latency", "unknown", "compute", roof_side],
        default=by_family,
    ).astype(object)
    fallback = (bound == by_family) & ~((roofline_known | bytes_only | flops_only) & consistent)
    # Estimated: FLOPs from shapes, a % of roof that rests on bytes (always estimated), or the family fallback.
    flops_estimated = estimated.copy()  # FLOPs from shapes, not the profiler's own count
    estimated = estimated | (memory_side & np.isfinite(implied)) | fallback | (bound == "compute") & issue_bound
    return pd.DataFrame(
        {
            "name": names,
            "family": family,
            "ts_us": k["ts_us"],
            "dur_us": dur,
            "stream": k["stream"],
            "step_index": k["step_index"],
            "blocks": blocks,
            "op": op_name,
            "flops": flops,
            "bytes": nbytes,
            "intensity": intensity,
            "dtype": dtype,
            "estimated": estimated,
            "flops_estimated": flops_estimated,
            "bound": bound,
            "pct_of_roof": pct,
            "launch_dur_us": launch_dur,
            "bytes_basis": basis,
            "roof_side": roof_side,
            "pct_of_roof_implied": implied,
            "graph_replay": graph,
            "waves": waves,
        }
    )


def _split_k_reductions(trace: Trace, k: pd.DataFrame, is_reduce, unique_names, name_codes, weights):
    """(row, bytes, basis) for each split-K weight-gradient reduction in ``k`` that
    :func:`split_k_wgrad` can count: its call's weight (``weights``, per row: its shape or None), its
    threads per block (the trace's launch record) and its wgrad GEMM, the call's last kernel before it whose name
    spells a tile."""
    blocks = k["blocks"].to_numpy()
    ext = k["external_id"].to_numpy()
    rows = np.flatnonzero(is_reduce & (blocks > 0) & (ext >= 0))
    kernels = trace.kernels
    if not len(rows) or "row" not in k or "threads_per_block" not in kernels or len(k) != len(kernels):
        return []
    threads = kernels["threads_per_block"].to_numpy()[k["row"].to_numpy()]
    rank = k["rank"].to_numpy()
    ts = k["ts_us"].to_numpy(float)
    calls: dict = {}  # (rank, external_id) -> the call's kernels
    wanted = {(rank[i], ext[i]) for i in rows}
    for j in np.flatnonzero(np.isin(ext, [e for _, e in wanted])):
        if (rank[j], ext[j]) in wanted:
            calls.setdefault((rank[j], ext[j]), []).append(j)
    found: dict = {}  # steps repeat the same calls: count each (reduction, GEMM, weight) once
    out = []
    for i in rows:
        weight = weights[i]
        if not isinstance(weight, tuple):
            continue
        before = [j for j in calls[(rank[i], ext[i])] if ts[j] < ts[i] and gemm_tile(unique_names[name_codes[j]])]
        if not before:
            continue
        gemm = max(before, key=lambda j: ts[j])
        key = (name_codes[i], int(blocks[i]), int(threads[i]), name_codes[gemm], int(blocks[gemm]), weight)
        if key not in found:
            found[key] = split_k_wgrad(unique_names[key[0]], key[1], key[2], unique_names[key[3]], key[4], weight)
        if found[key] is not None:
            out.append((i, *found[key][1:]))
    return out


def resident_blocks(
    threads: np.ndarray,
    registers: np.ndarray,
    shared: np.ndarray,
    *,
    max_threads: int,
    registers_per_sm: int,
    shared_per_sm: int,
    max_blocks: int,
) -> np.ndarray:
    """Blocks of each kernel one SM can hold at once (NaN where the launch record lacks its resources): the
    least of the block limit, threads, registers (allocated per warp in units of 256) and shared memory (plus
    the 1 KiB the driver reserves per block)."""
    threads = threads.astype(float)
    registers = registers.astype(float)
    shared = shared.astype(float)
    warps = np.ceil(threads / 32.0)
    regs_per_warp = np.ceil(registers * 32.0 / REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    with np.errstate(divide="ignore", invalid="ignore"):
        by_threads = np.floor(max_threads / threads)
        by_registers = np.where(registers > 0, np.floor(registers_per_sm / (regs_per_warp * warps)), np.inf)
        by_shared = np.floor(shared_per_sm / (shared + SHARED_MEMORY_RESERVED_PER_BLOCK))
    out = np.minimum.reduce([np.full(len(threads), float(max_blocks)), by_threads, by_registers, by_shared])
    known = (threads > 0) & (registers >= 0) & (shared >= 0)
    return np.where(known & (out >= 1), out, np.nan)


# What a kernel's writes leave in the L2 when it ends (write-back): Nsight Compute on the H200 (L2 flushed before
# each kernel, so every read comes from DRAM) measured PyTorch's in-place ReLU and residual add in the ResNet-50
# training step 24-27 MB short of their once-per-element count at every size (26.5 MB of DRAM traffic for 51.4
# counted, 76.8 for 102.8, 179.5 for 205.5, 384 for 411, 592 for 617), a 1x1 convolution writing 51 MB 25 MB short
# and cuDNN's two-pass batch norm (x read twice, 205 MB written) within 1% of its count less 25 MB: about half
# the 50 MB L2 of a kernel's writes is still in the cache when it ends, written back during later kernels, and
# costs it no DRAM time. Measured on the H200; the H100 and GH200 have its GH100 die and 50 MB L2. Elsewhere no
# deferral is counted.
L2_DEFERRED_WRITE_BYTES = {"h100": 25e6, "h200": 25e6, "gh200": 25e6}


def l2_deferred_writes(peaks: DevicePeaks) -> float:
    """Bytes of a kernel's writes still in the L2 when it ends, on the peaks' GPU (0 where not measured)."""
    family = (peaks.key or "").split("-")[0]
    return L2_DEFERRED_WRITE_BYTES.get(family, 0.0)


def kernel_waves(trace: Trace, k: pd.DataFrame, blocks: np.ndarray, sm_count: int) -> np.ndarray:
    """Each kernel's grid in waves (blocks / (SMs x resident blocks per SM)); NaN where unknown."""
    out = np.full(len(k), np.nan)
    device = trace.device
    kernels = trace.kernels
    if (
        device is None
        or not sm_count
        or device.compute_capability not in MAX_BLOCKS_PER_SM
        or not (device.max_threads_per_sm and device.registers_per_sm and device.shared_memory_per_sm_bytes)
        or "row" not in k
        or not {"threads_per_block", "registers_per_thread", "shared_memory_bytes"} <= set(kernels.columns)
        or len(k) != len(kernels)
    ):
        return out
    rows = k["row"].to_numpy()
    resident = resident_blocks(
        kernels["threads_per_block"].to_numpy()[rows],
        kernels["registers_per_thread"].to_numpy()[rows],
        kernels["shared_memory_bytes"].to_numpy()[rows],
        max_threads=device.max_threads_per_sm,
        registers_per_sm=device.registers_per_sm,
        shared_per_sm=device.shared_memory_per_sm_bytes,
        max_blocks=MAX_BLOCKS_PER_SM[device.compute_capability],
    )
    with np.errstate(invalid="ignore"):
        out = np.where(blocks > 0, blocks / (sm_count * resident), np.nan)
    return out


def graph_replayed(kernel_acts: pd.DataFrame) -> np.ndarray:
    """Which kernels a CUDA graph replay launched: their launch call is a graph launch, or they share it with
    other kernels (a replay links every kernel of the graph to the one ``cudaGraphLaunch``). Such a kernel has
    no launch call of its own, so comparing it with that call says nothing about launch overhead."""
    if not len(kernel_acts):
        return np.zeros(0, dtype=bool)
    by_name = match_names(kernel_acts["launch_name"].fillna("").astype(str), "GraphLaunch")
    correlation = kernel_acts["correlation"].to_numpy()
    keyed = pd.DataFrame({"rank": kernel_acts["rank"].to_numpy(), "correlation": correlation})
    shared = keyed.groupby(["rank", "correlation"])["correlation"].transform("size").to_numpy() > 1
    return by_name | (shared & (correlation >= 0) & kernel_acts["launch_name"].notna().to_numpy())


def kernel_summary(kernels: pd.DataFrame, peaks: DevicePeaks, n_steps: int) -> pd.DataFrame:
    """Kernels grouped by name. Columns: name, family, count, count_per_step, total_us, us_per_step,
    mean_us, pct_of_gpu_time, flops, bytes, intensity, achieved_flops_per_s, achieved_bytes_per_s, bound
    (the class holding most of the name's time), pct_of_roof (time-weighted over the launches at or under
    100%), estimated, blocks (median), dtype, bytes_basis, roof_note (None, or why launches above the roof are
    not shown). Sorted by total_us, largest first. When the trace has steps, only kernels inside steps count.
    """
    if not len(kernels):
        return pd.DataFrame()
    # With steps, describe the steps: kernels outside every step (spill-over from the step before the
    # profiler's active window) have no recorded operator and would blur the figures.
    k = kernels[kernels["step_index"] >= 0] if (kernels["step_index"] >= 0).any() else kernels
    k = k.copy()
    k["in_step"] = k["step_index"] >= 0
    k["roof_weight"] = np.where(k["pct_of_roof"].notna(), k["dur_us"], 0.0)
    k["roof_weighted"] = k["pct_of_roof"].fillna(0.0) * k["roof_weight"]
    over = (k["pct_of_roof_implied"] > MAX_CONSISTENT_PCT).to_numpy()
    k["over_weight"] = np.where(over, k["dur_us"], 0.0)
    k["over_weighted"] = np.where(over, k["pct_of_roof_implied"], 0.0) * k["over_weight"]
    k["over_count"] = over.astype(np.int64)
    # Grouped by name codes (first-seen order, as groupby(sort=False) orders names); names go back at the end.
    codes, unique_names = factorize_names(k["name"])
    k["name"] = codes
    g = k.groupby("name", sort=False)
    out = g.agg(
        family=("family", "first"),
        count=("dur_us", "size"),
        total_us=("dur_us", "sum"),
        mean_us=("dur_us", "mean"),
        flops=("flops", lambda s: s.sum(min_count=1)),
        bytes=("bytes", lambda s: s.sum(min_count=1)),
        estimated=("estimated", "any"),
        flops_estimated=("flops_estimated", "any"),
        blocks=("blocks", "median"),
        dtype=("dtype", "first"),
        roof_weight=("roof_weight", "sum"),
        roof_weighted=("roof_weighted", "sum"),
        over_weight=("over_weight", "sum"),
        over_weighted=("over_weighted", "sum"),
        over_count=("over_count", "sum"),
        bytes_basis=("bytes_basis", "first"),
        roof_side=("roof_side", "first"),
    )
    in_step = k[k["in_step"]].groupby("name", sort=False)["dur_us"].agg(["size", "sum"])
    out["count_per_step"] = (in_step["size"] / n_steps) if n_steps else np.nan
    out["us_per_step"] = (in_step["sum"] / n_steps) if n_steps else np.nan
    by_class = k.groupby(["name", "bound"], sort=False)["dur_us"].sum().reset_index()
    dominant = by_class.sort_values("dur_us", ascending=False).drop_duplicates("name").set_index("name")["bound"]
    out["bound"] = dominant
    out["pct_of_roof"] = np.where(out["roof_weight"] > 0, out["roof_weighted"] / out["roof_weight"], np.nan)
    out["intensity"] = np.where(out["bytes"] > 0, out["flops"] / out["bytes"], np.nan)
    seconds = out["total_us"] * 1e-6
    out["achieved_flops_per_s"] = out["flops"] / seconds
    out["achieved_bytes_per_s"] = out["bytes"] / seconds
    out["pct_of_gpu_time"] = 100.0 * out["total_us"] / k["dur_us"].sum()
    out["roof_note"] = [
        _roof_note(r.over_count, r.count, r.over_weighted / r.over_weight if r.over_weight > 0 else np.nan, r)
        if r.over_count
        else None
        for r in out.itertuples()
    ]
    out = out.drop(
        columns=["roof_weight", "roof_weighted", "over_weight", "over_weighted", "over_count", "flops_estimated"]
    )
    out = out.reset_index()
    out["name"] = pd.Series(unique_names[out["name"].to_numpy()], index=out.index, dtype=object)
    columns = [
        "name",
        "family",
        "count",
        "count_per_step",
        "total_us",
        "us_per_step",
        "mean_us",
        "pct_of_gpu_time",
        "flops",
        "bytes",
        "intensity",
        "achieved_flops_per_s",
        "achieved_bytes_per_s",
        "bound",
        "pct_of_roof",
        "estimated",
        "blocks",
        "dtype",
        "bytes_basis",
        "roof_note",
    ]
    return out[columns].sort_values("total_us", ascending=False).reset_index(drop=True)


def _roof_note(over: int, count: int, implied_pct: float, row) -> str:
    """Why a kernel's % of roof is not shown (all its launches above the roof) or leaves some launches out."""
    what = "FLOP" if row.roof_side == "compute" else "bytes"
    if what == "bytes" and isinstance(row.bytes_basis, str) and row.bytes_basis.startswith("multi-tensor apply:"):
        # The grid's chunks bound the bytes (multi_tensor_bytes): past the roof, the tensors fill few of them.
        launches = f"{over} of {count} launches" if over < count else f"{row.bytes / count / 1e6:,.3g} MB per call"
        return (
            f"bytes upper bound above the HBM roof ({launches}): the lists' tensors fill less of the "
            f"{MULTI_TENSOR_CHUNK}-element chunks the grid names (small or one-element tensors, such as an "
            "optimizer's step counts); left out of % of roof"
        )
    if over < count:
        return f"{what} estimate inconsistent for {over} of {count} launches (above the roof): left out of % of roof"
    if what == "FLOP":
        per_call = f"{row.flops / count / 1e9:,.3g} GFLOP per call"
    else:
        per_call = f"{row.bytes / count / 1e6:,.3g} MB per call"
    basis = f"; {row.bytes_basis}" if isinstance(row.bytes_basis, str) and what == "bytes" else ""
    if what == "FLOP" and not row.flops_estimated:
        # The profiler counted these FLOPs: the roof is what is off (a calibration that measured less than this
        # kernel reaches), not the count.
        return (
            f"above the compute roof in use: {per_call} in {row.mean_us:,.3g} µs is {implied_pct:,.0f}% of it; the"
            " peak is lower than this kernel achieves (calibrate again, or pass --peaks)"
        )
    return (
        f"{what} estimate inconsistent: {per_call} in {row.mean_us:,.3g} µs would be {implied_pct:,.0f}% of the "
        f"{'compute' if what == 'FLOP' else 'HBM'} roof (data reused from cache, aliased inputs, or a wrong count"
        f"{basis})"
    )
