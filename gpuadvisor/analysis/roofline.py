"""Roofline class of every kernel: compute-, memory-, latency- or launch-bound, and how far under its roof.

FLOPs and bytes come from the operator that launched the kernel (linked through External id): the
profiler's FLOP count when it recorded one (``with_flops=True``; matmuls and convolutions), otherwise an
estimate from the recorded input shapes and dtypes (``record_shapes=True``). Bytes are always an
estimate (inputs read once, output written once). When an operator launches several kernels, its FLOPs
and bytes are split among them in proportion to their durations. ``estimated`` marks every row whose FLOPs
are not the profiler's own count, or whose class comes from the name-family fallback below.

Classes, in order of precedence:
- ``launch``: the kernel ran shorter than its own launch call took on the host;
- ``latency``: its grid has fewer blocks than the GPU has SMs (less than one wave), so most SMs idle;
- ``compute`` / ``memory``: arithmetic intensity above / below the ridge point of the kernel's dtype;
- without FLOPs/bytes or peaks, GEMM/convolution/attention families count as compute and the rest as
  memory (``estimated`` = True); communication kernels (NCCL) are ``unknown``.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import factorize_names, gpu_activities
from gpuadvisor.device.peaks import DevicePeaks, peak_flops
from gpuadvisor.trace.kineto import input_shapes_raw
from gpuadvisor.trace.model import Trace

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

FAMILY_PATTERNS = [
    ("communication", r"nccl|rccl|all_?reduce|allgather|reduce_?scatter|sendrecv"),
    ("attention", r"flash|fmha|attention|sdpa|mha_"),
    ("gemm", r"gemm|gemv|xmma|wgmma|cutlass|nvjet|sgemm|hgemm|matmul|_mm_|cublas|splitk|dot_kernel"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit_convolve|winograd"),
    ("normalization", r"norm|softmax"),
    ("reduction", r"reduce|triton_red|triton_per|sum_kernel|mean|argmax|topk|cub::"),
    ("copy", r"copy|catarray|transpose|gather|scatter|index|cat_|fill|memcpy|permute"),
    ("elementwise", r"elementwise|triton_poi|vectorized|unrolled|pointwise|activation|silu|gelu|relu|mul|add"),
]
COMPUTE_FAMILIES = {"gemm", "attention", "convolution"}
_FAMILY_RES = [(fam, re.compile(pat, re.IGNORECASE)) for fam, pat in FAMILY_PATTERNS]
_MATMUL_OPS = {
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
_REDUCTION_OP = re.compile(r"aten::(sum|mean|norm|amax|amin|max|min|var|std|argmax|argmin|prod|all|any|_local_scalar)")

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
]


def kernel_family(name: str) -> str:
    """A coarse family for a kernel name: gemm, attention, convolution, normalization, reduction, copy,
    elementwise, communication or other."""
    for fam, pattern in _FAMILY_RES:
        if pattern.search(name):
            return fam
    return "other"


def _numel(dims) -> int | None:
    if not isinstance(dims, list) or any(not isinstance(d, int) for d in dims):
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def op_cost(
    name: str, dims: list | None, types: list | None, recorded_flops: float
) -> tuple[float, float, str | None, bool]:
    """(flops, bytes, dtype, estimated) for one operator call, from its shapes; NaN when unknown."""
    if not isinstance(dims, list) or not isinstance(types, list):
        flops = recorded_flops if recorded_flops > 0 else math.nan
        return flops, math.nan, None, True
    tensors = []  # (numel, itemsize, dtype name)
    for d, t in zip(dims, types):
        n = _numel(d)
        size = ITEMSIZE.get(t) if isinstance(t, str) else None
        if n is not None and size is not None and isinstance(d, list) and len(d) > 0:
            tensors.append((n, size, t, d))
    if not tensors:
        flops = recorded_flops if recorded_flops > 0 else math.nan
        return flops, math.nan, None, True
    dtype = next((t for t in DTYPE_ORDER if any(x[2] == t for x in tensors)), tensors[0][2])
    read = sum(n * s for n, s, _, _ in tensors)
    estimated = True
    flops = math.nan
    if name in _MATMUL_OPS:
        mats = [d for _, _, _, d in tensors if len(d) >= 2]
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
            out_numel = m_rows * n_cols
            flops = 2.0 * m_rows * k * n_cols
            write = out_numel * tensors[-1][1]
        else:
            write = max(n for n, _, _, _ in tensors) * tensors[0][1]
    elif name.endswith("_") and not name.startswith("aten::_"):
        # In-place op: writes its first operand.
        write = tensors[0][0] * tensors[0][1]
        flops = float(tensors[0][0])
    elif _REDUCTION_OP.match(name):
        write = 0
        flops = float(max(n for n, _, _, _ in tensors))
    else:
        biggest = max(tensors, key=lambda x: x[0])
        write = biggest[0] * tensors[0][1]
        flops = float(biggest[0])
    if recorded_flops > 0:
        flops = recorded_flops
        estimated = False  # FLOPs are the profiler's own count; bytes are always estimated (module doc)
    return flops, float(read + write), dtype, estimated


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
    unknown), pct_of_roof (% of the attainable rate at this intensity; NaN without peaks or costs),
    launch_dur_us (host launch call duration, NaN unknown).
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
    if len(ops):
        linked = ops[ops["external_id"].isin(k["external_id"][k["external_id"] >= 0].unique())]
        linked = linked.drop_duplicates(["rank", "external_id"])
        if len(linked):
            # Steps repeat the same calls with the same shapes: cost each distinct signature once.
            dims_code, dims_raw = _raw_codes(linked["input_dims_raw"])
            types_code, types_raw = _raw_codes(linked["input_types_raw"])
            signature = list(
                zip(
                    linked["name"],
                    dims_code.tolist(),
                    types_code.tolist(),
                    np.nan_to_num(linked["flops"].to_numpy(float)).tolist(),
                )
            )
            distinct = list(dict.fromkeys(signature))
            dims, types = input_shapes_raw(
                [dims_raw[d] for _, d, _, _ in distinct], [types_raw[t] for _, _, t, _ in distinct]
            )
            cost_of = {key: op_cost(key[0], d, t, key[3]) for key, d, t in zip(distinct, dims, types)}
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
                }
            )
            merged = k[["rank", "external_id", "dur_us"]].merge(costs, on=["rank", "external_id"], how="left")
            # Split each operator call's cost among its kernels by duration.
            total = merged.groupby(["rank", "external_id"])["dur_us"].transform("sum").to_numpy(float)
            share = np.divide(merged["dur_us"].to_numpy(float), total, out=np.ones(len(merged)), where=total > 0)
            flops = merged["op_flops"].to_numpy(float) * share
            nbytes = merged["op_bytes"].to_numpy(float) * share
            dtype = merged["op_dtype"].to_numpy(object)
            estimated = merged["op_estimated"].fillna(True).to_numpy(bool)
            op_name = merged["op"].to_numpy(object)

    dur = k["dur_us"].to_numpy(float)
    blocks = k["blocks"].to_numpy()
    launch_dur = k["launch_dur_us"].to_numpy(float)
    intensity = np.divide(flops, nbytes, out=np.full(len(k), np.nan), where=nbytes > 0)

    # Peak FLOP/s per kernel from its dtype (fp32 operands on TF32 tensor cores when the name says so).
    kind = pd.Series(dtype, dtype=object)
    tf32_name = np.array([bool(re.search(r"(?i)tf32", n)) for n in unique_names], dtype=bool)[name_codes]
    tf32 = kind.isin(["float", "c10::Float"]).to_numpy() & tf32_name
    kind[tf32] = "tf32"
    peak_of = {d: (peak_flops(peaks, d) or np.nan) for d in kind.dropna().unique()}
    peak = kind.map(peak_of).to_numpy(float)
    bw = peaks.hbm_bytes_per_s or np.nan
    fam = family.to_numpy(object)
    with np.errstate(invalid="ignore", divide="ignore"):
        attainable = np.minimum(peak, intensity * bw)
        roofline_known = np.isfinite(attainable)
        pct = np.where(roofline_known, 100.0 * flops / (dur * 1e-6) / attainable, np.nan)
        bytes_only = ~roofline_known & np.isfinite(nbytes) & np.isfinite(bw)
        pct = np.where(bytes_only, 100.0 * nbytes / (dur * 1e-6) / bw, pct)
    pct[~(dur > 0)] = np.nan
    sm_count = peaks.sm_count or 0
    by_family = np.where(np.isin(fam, list(COMPUTE_FAMILIES)), "compute", "memory")
    by_roofline = np.where(intensity * bw >= peak, "compute", "memory")
    bound = np.select(
        [
            dur < launch_dur,  # False where launch_dur is NaN
            (blocks > 0) & (blocks < sm_count),
            fam == "communication",
            roofline_known,
        ],
        ["launch", "latency", "unknown", by_roofline],
        default=by_family,
    ).astype(object)
    estimated = estimated | (bound == by_family) & ~roofline_known
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
            "bound": bound,
            "pct_of_roof": pct,
            "launch_dur_us": launch_dur,
        }
    )


def kernel_summary(kernels: pd.DataFrame, peaks: DevicePeaks, n_steps: int) -> pd.DataFrame:
    """Kernels grouped by name. Columns: name, family, count, count_per_step, total_us, us_per_step,
    mean_us, pct_of_gpu_time, flops, bytes, intensity, achieved_flops_per_s, achieved_bytes_per_s, bound
    (the class holding most of the name's time), pct_of_roof (time-weighted), estimated, blocks (median),
    dtype. Sorted by total_us, largest first. When the trace has steps, only kernels inside steps count.
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
        blocks=("blocks", "median"),
        dtype=("dtype", "first"),
        roof_weight=("roof_weight", "sum"),
        roof_weighted=("roof_weighted", "sum"),
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
    out = out.drop(columns=["roof_weight", "roof_weighted"]).reset_index()
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
    ]
    return out[columns].sort_values("total_us", ascending=False).reset_index(drop=True)
