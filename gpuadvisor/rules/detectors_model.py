"""Detectors of model-level patterns that a library switch fixes: eager attention (GA202), cuDNN layout
conversions (GA203), per-parameter optimizer loops (GA204), foreach updates a fused one would do in one pass
(GA205), fp32/TF32 compute that bf16 would halve (GA302)
and 16-bit GEMMs on misaligned shapes (GA303). Each reads the :class:`~gpuadvisor.analysis.bundle.Analysis`
tables and the operator tree, and returns a finding with its evidence and estimated saving per step."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from gpuadvisor.analysis.bundle import Analysis
from gpuadvisor.analysis.linking import assign_steps, match_names, step_windows
from gpuadvisor.analysis.op_costs import NORMALIZATION_FLOPS_PER_ELEMENT
from gpuadvisor.analysis.operators import kernels_launched, operator_inputs, operator_parents, tensor_dims
from gpuadvisor.analysis.roofline import LAYOUT_CONVERSION_KERNEL, two_pass_factor
from gpuadvisor.device.peaks import peak_flops
from gpuadvisor.report.formatting import short_kernel_name
from gpuadvisor.rules.engine import MEASURED_ALTERNATIVE, ROOF, Finding, Rule, SkipRule, make_finding

_SIXTEEN_BIT = {"c10::Half", "c10::BFloat16", "half", "bfloat16"}
_FP32 = {"float", "c10::Float"}


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None or x != x else round(float(x), digits)


def _kernels_in_steps(a: Analysis) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kernel_table rows, gpu_activities kernel rows) in the same order, both restricted to the steps."""
    acts = a.activities[a.activities["kind"] == "kernel"].reset_index(drop=True)
    inside = (a.kernels["step_index"] >= 0).to_numpy()
    return a.kernels[inside].reset_index(drop=True), acts[inside].reset_index(drop=True)


# ----------------------------------------------------------------------------------------------------
# GA202 unfused attention

_SOFTMAX_OPS = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax"}
_MATMUL_OPS = {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum"}
# Operators seen between the score matmul and the softmax (scale, mask, soft-capping, casts, views) and
# between the softmax and the second matmul (casts, dropout).
_SCORE_OPS = {
    "aten::mul",
    "aten::mul_",
    "aten::div",
    "aten::div_",
    "aten::add",
    "aten::add_",
    "aten::sub",
    "aten::where",
    "aten::masked_fill",
    "aten::masked_fill_",
    "aten::tanh",
    "aten::clamp",
    "aten::to",
    "aten::_to_copy",
    "aten::type_as",
    "aten::float",
    "aten::view",
    "aten::reshape",
    "aten::contiguous",
    "aten::expand",
    "aten::full",
    "aten::scalar_tensor",
    "aten::fill_",
    "aten::lift_fresh",
    "aten::detach",
    "aten::dropout",
    "aten::native_dropout",
    "aten::feature_dropout",
    "aten::clone",
    "aten::copy_",
}
_MAX_OPS_BETWEEN = 8
_CAUSAL_FRAME = r"(?i)causal"


def _is_score_matmul(dims: list | None, n: int) -> bool:
    """An [..., N, d] x [..., d, N] product (shapes unknown: accepted)."""
    mats = [d for d in tensor_dims(dims) if len(d) >= 2]
    if len(mats) < 2:
        return True
    return mats[-2][-2] == n and mats[-1][-1] == n


def _is_value_matmul(dims: list | None, n: int) -> bool:
    """An [..., N, N] x [..., N, d] product (shapes unknown: accepted)."""
    mats = [d for d in tensor_dims(dims) if len(d) >= 2]
    if len(mats) < 2:
        return True
    return mats[-2][-1] == n and mats[-2][-2] == n and mats[-1][-2] == n


def _causal_steps(a: Analysis) -> np.ndarray:
    """Per step: whether it builds a causal mask (a Python frame naming one, or aten::triu/tril)."""
    windows = step_windows(a.trace)
    causal = np.zeros(len(windows), dtype=bool)
    frames = a.trace.python_frames
    if len(frames):
        hit = frames[match_names(frames["name"], _CAUSAL_FRAME)]
        idx = assign_steps(hit["ts_us"].to_numpy(float), windows)
        causal[idx[idx >= 0]] = True
    ops = a.trace.cpu_ops
    tri = ops[ops["name"].isin(["aten::triu", "aten::tril", "aten::triu_", "aten::tril_"])]
    idx = assign_steps(tri["ts_us"].to_numpy(float), windows)
    causal[idx[idx >= 0]] = True
    return causal


def find_eager_attention(a: Analysis, min_seq_len: int) -> list[dict]:
    """Matmul -> (scale, mask) -> softmax -> matmul chains over [..., N, N] scores with N >= ``min_seq_len``,
    found among sibling CPU operators. One dict per chain: rows (positions into cpu_ops, in order), ops
    (names), score_shape, head_dim, dtype, step_index."""
    ops = a.trace.cpu_ops
    if not len(ops):
        return []
    names = ops["name"].to_numpy(object)
    soft_rows = np.flatnonzero(np.isin(names, list(_SOFTMAX_OPS)))
    if not len(soft_rows):
        return []
    soft_inputs = operator_inputs(ops, soft_rows)
    wanted = []
    for row in soft_rows.tolist():
        dims, types = soft_inputs[row]
        shapes = tensor_dims(dims)
        if shapes and len(shapes[0]) >= 3 and shapes[0][-1] == shapes[0][-2] >= min_seq_len:
            wanted.append(row)
    if not wanted:
        return []
    parents = operator_parents(ops)
    soft_set = set(soft_rows.tolist())
    # Siblings: the operators sharing a parent (top-level operators: per thread), in start order.
    ts = ops["ts_us"].to_numpy(float)
    thread = ops["tid"].astype(str).to_numpy(object)
    windows = step_windows(a.trace)
    chains = []
    for row in wanted:
        if parents[row] in soft_set:  # aten::_softmax inside aten::softmax: the outer one stands for both
            continue
        ancestor, fused_math = parents[row], False
        while ancestor >= 0:
            if "scaled_dot_product" in names[ancestor] or "multi_head_attention" in names[ancestor]:
                fused_math = True  # SDPA's math fallback or MHA's fast path: not the user's eager code
                break
            ancestor = parents[ancestor]
        if fused_math:
            continue
        siblings = np.flatnonzero((parents == parents[row]) & (thread == thread[row]))
        siblings = siblings[np.argsort(ts[siblings], kind="stable")]
        at = int(np.searchsorted(ts[siblings], ts[row]))
        while siblings[at] != row:
            at += 1
        n = tensor_dims(soft_inputs[row][0])[0][-1]
        near = siblings[max(0, at - _MAX_OPS_BETWEEN - 1) : at + _MAX_OPS_BETWEEN + 2].tolist()
        inputs = operator_inputs(ops, near)
        first = None
        for j in range(at - 1, max(-1, at - _MAX_OPS_BETWEEN - 2), -1):
            r = int(siblings[j])
            if names[r] in _MATMUL_OPS:
                first = j if _is_score_matmul(inputs[r][0], n) else None
                break
            if names[r] not in _SCORE_OPS:
                break
        last = None
        for j in range(at + 1, min(len(siblings), at + _MAX_OPS_BETWEEN + 2)):
            r = int(siblings[j])
            if names[r] in _MATMUL_OPS:
                last = j if _is_value_matmul(inputs[r][0], n) else None
                break
            if names[r] not in _SCORE_OPS:
                break
        if first is None or last is None:
            continue
        rows = [int(r) for r in siblings[first : last + 1]]
        score = tensor_dims(soft_inputs[row][0])[0]
        query = tensor_dims(inputs[rows[0]][0])
        head_dim = query[0][-1] if query and len(query[0]) >= 2 else None
        step = int(assign_steps(np.array([ts[row]]), windows)[0])
        chains.append(
            {
                "rows": rows,
                "ops": [str(names[r]) for r in rows if names[r] not in ("aten::view", "aten::reshape")],
                "score_shape": list(score),
                "head_dim": head_dim,
                "dtype": (soft_inputs[row][1] or [None])[0],
                "step_index": step,
            }
        )
    return chains


def unfused_attention(a: Analysis, rule: Rule) -> Finding | None:
    if not a.n_steps or not a.step_time_us:
        return None
    chains = [c for c in find_eager_attention(a, int(rule.threshold("min_seq_len"))) if c["step_index"] >= 0]
    if not chains:
        return None
    acts = a.activities
    causal_by_step = _causal_steps(a)
    ops = a.trace.cpu_ops
    eager_us = 0.0
    fused_us = 0.0
    flops_total = 0.0
    kernels = 0
    rates = {}
    for chain in chains:
        mask = kernels_launched(acts, ops, chain["rows"]) & (acts["step_index"] >= 0).to_numpy()
        chain_us = float(acts["dur_us"].to_numpy(float)[mask].sum())
        score = chain["score_shape"]
        n = score[-1]
        heads = math.prod(score[:-2])
        d = chain["head_dim"] or 64
        causal = bool(causal_by_step[chain["step_index"]])
        flops = 4.0 * heads * n * n * d * (0.5 if causal else 1.0)
        sixteen = chain["dtype"] in _SIXTEEN_BIT
        rate = rule.threshold("sdpa_tflops_16bit" if sixteen else "sdpa_tflops_fp32") * 1e12
        rates[chain["dtype"]] = rate
        eager_us += chain_us
        fused_us += min(chain_us, flops / rate * 1e6)
        flops_total += flops
        kernels += int(mask.sum())
        chain["causal"] = causal
    per_step = eager_us / a.n_steps
    saving = (eager_us - fused_us) / a.n_steps
    if 100.0 * saving / a.step_time_us < rule.threshold("min_share_of_step_pct"):
        return None
    first = chains[0]
    shapes = sorted({tuple(c["score_shape"]) for c in chains})
    causal = any(c["causal"] for c in chains)
    rate_text = ", ".join(f"{r / 1e12:.0f} TFLOP/s ({dt})" for dt, r in rates.items())
    basis = (
        f"the chains' kernels ({per_step:,.0f} µs/step) minus fused SDPA's FLOPs (4·B·H·N²·d"
        + (", halved: the step builds a causal mask" if causal else "")
        + f", {flops_total / a.n_steps / 1e9:,.1f} GFLOP/step) at {rate_text}"
    )
    message = (
        f"{len(chains) / a.n_steps:.0f} attention block(s) per step compute softmax(QKᵀ)V eagerly over a "
        f"{list(shapes[0])} score tensor ({' → '.join(first['ops'])}): each kernel writes or re-reads the whole "
        f"N×N matrix. Their {kernels / a.n_steps:.0f} kernels take {per_step:,.0f} µs/step "
        f"({100 * per_step / a.step_time_us:.0f}% of the step); fused scaled_dot_product_attention would take "
        f"about {fused_us / a.n_steps:,.0f} µs."
    )
    evidence = {
        "attention_blocks_per_step": _r(len(chains) / a.n_steps),
        "score_shape": list(shapes[0]),
        "score_shapes": [list(s) for s in shapes],
        "head_dim": first["head_dim"],
        "dtype": first["dtype"],
        "causal": causal,
        "ops": first["ops"],
        "kernels_per_step": _r(kernels / a.n_steps),
        "eager_us_per_step": _r(per_step),
        "fused_estimate_us_per_step": _r(fused_us / a.n_steps),
        "sdpa_flops_per_step": float(flops_total / a.n_steps),
        "basis": basis,
    }
    return make_finding(rule, a, message, evidence, saving)


# ----------------------------------------------------------------------------------------------------
# GA203 layout conversions

# cuDNN's batch-norm kernels for NCHW tensors (the "spatial" per-channel ones: bn_fw_tr_1C11_kernel_NCHW,
# bn_bw_1C11_kernel_new, bn_*_1C11_singleread, bn_fw_inf_1C11_kernel_NCHW); in channels_last cuDNN runs its
# NHWC kernels (batchnorm_fwtr_nhwc_semiPersist, batchnorm_bwtr_nhwc_semiPersist) instead.
_NCHW_BATCHNORM_KERNEL = r"(?i)\bbn_(?:fw|bw)\w*_1C11"
# Launch calls per step above which a host probe may include waits for a full launch queue (the host started
# to wait between 512 and 1,024 queued launches on the H200: benchmarks/results/host_bound_check.json).
MAX_PROBED_LAUNCHES = 1000


def layout_conversions(a: Analysis, rule: Rule) -> Finding | None:
    k, _ = _kernels_in_steps(a)
    if not len(k) or not a.n_steps or not a.step_time_us:
        return None
    conv = k[match_names(k["name"], LAYOUT_CONVERSION_KERNEL)]
    if not len(conv):
        return None
    per_step = conv["dur_us"].sum() / a.n_steps
    share = 100.0 * per_step / a.step_time_us
    if share < rule.threshold("min_share_of_step_pct"):
        return None
    convolutions = k[k["family"] == "convolution"]
    by_name = conv.groupby("name")["dur_us"].sum().sort_values(ascending=False)
    to_nhwc = int(match_names(conv["name"], r"(?i)nchwToNhwc|nchw2nhwc").sum())
    ops = conv["op"].dropna().value_counts()
    # The NCHW batch-norm kernels: in channels_last their NHWC counterparts, which read their input once, move
    # its bytes at nhwc_batchnorm_fraction_of_roof of the memory roof; a kernel whose roof share is unknown
    # counts zero. A two-pass NCHW kernel's roof time counts its bytes once (the NHWC kernel's count).
    bn = k[match_names(k["name"], _NCHW_BATCHNORM_KERNEL) & (k["family"] == "normalization").to_numpy()]
    fraction = rule.threshold("nhwc_batchnorm_fraction_of_roof")
    bn_dur = bn["dur_us"].to_numpy(float)
    bn_roof = bn_dur * np.clip(bn["pct_of_roof"].to_numpy(float), 0.0, 100.0) / 100.0
    bn_roof = bn_roof / two_pass_factor(bn["name"].tolist())
    bn_saving = float(np.clip(bn_dur - bn_roof / fraction, 0.0, None)[np.isfinite(bn_roof)].sum()) / a.n_steps
    gpu_saving = per_step + bn_saving
    # What channels_last does to the host's time per step (layout_conversions_timed): the conversion kernels'
    # launch calls go with them, at their durations as the trace timed them (a trace without launch records
    # counts none; the rule's TOML has the measurement).
    conv_calls, _ = forward_fp32_compute_calls(a, _CONVOLUTION_OPS, fp32_only=False)
    launch_us = float(np.nansum(conv["launch_dur_us"].to_numpy(float))) / a.n_steps
    launched = int(np.isfinite(conv["launch_dur_us"].to_numpy(float)).sum())
    message = (
        f"{len(conv) / a.n_steps:.0f} NCHW↔NHWC layout conversion kernels per step ({to_nhwc / a.n_steps:.0f} to "
        f"NHWC, {(len(conv) - to_nhwc) / a.n_steps:.0f} back) take {per_step:,.0f} µs/step ({share:.1f}% of the "
        f"step): cuDNN runs its tensor-core convolutions in NHWC and transposes NCHW tensors in and out of each "
        f"of the {len(convolutions) / a.n_steps:.0f} convolution kernels per step."
        + (
            f" Its NCHW batch-norm kernels ({len(bn) / a.n_steps:.0f} per step, {bn_dur.sum() / a.n_steps:,.0f} µs) "
            f"would run as NHWC ones, about {bn_saving:,.0f} µs/step faster."
            if bn_saving > 0
            else ""
        )
    )
    evidence = {
        "conversion_kernels_per_step": _r(len(conv) / a.n_steps),
        "conversion_us_per_step": _r(per_step),
        "share_of_step_pct": _r(share),
        "convolution_kernels_per_step": _r(len(convolutions) / a.n_steps),
        "convolution_us_per_step": _r(convolutions["dur_us"].sum() / a.n_steps),
        "nchw_batchnorm_kernels_per_step": _r(len(bn) / a.n_steps),
        "nchw_batchnorm_us_per_step": _r(bn_dur.sum() / a.n_steps),
        "batchnorm_saving_us_per_step": _r(bn_saving),
        "gpu_saving_us": _r(gpu_saving),
        "forward_convolution_calls_per_step": _r(conv_calls),
        "conversion_launch_host_us_per_step": _r(launch_us),
        "conversion_launch_calls_per_step": _r(launched / a.n_steps),
        "channels_last_host_us_per_step": _r(-launch_us),
        "launching_ops": {str(op): int(c) for op, c in ops.head(4).items()},
        "top_kernels": [short_kernel_name(n) for n in by_name.index[:3]],
        "basis": "GPU time: the conversion kernels' own time (in channels_last the convolutions read and write "
        f"NHWC directly and cuDNN launches none of them) plus the NCHW batch-norm kernels' time above "
        f"{fraction:.2f} of their memory roof (what cuDNN's NHWC batch-norm kernels reach)",
    }
    return make_finding(rule, a, message, evidence, gpu_saving)


def separable_host(timed: dict) -> tuple[float | None, str | None]:
    """The host's time to enqueue a step (``host_enqueue_us``, timed from an idle GPU), or None and why: not
    measured, or not the host's alone (the step syncs, so the probe includes GPU waits, or it launches more than
    the GPU's launch queue holds)."""
    host = timed.get("host_enqueue_us")
    syncs = timed.get("host_syncs_per_step") or 0
    launches = timed.get("launch_calls_per_step") or 0
    if not isinstance(host, (int, float)) or host <= 0:
        return None, "host time not measured (no timed steps on a GPU)"
    if syncs:
        why = f"the step synchronizes with the GPU {syncs:g} times, so its host time includes GPU waits"
    elif launches > MAX_PROBED_LAUNCHES:
        why = f"{launches:,.0f} launches per step are more than the GPU's launch queue holds"
    else:
        return float(host), None
    return None, f"host time not separable ({why})"


def host_capped_saving(
    finding: dict, timed_us: float, timed: dict, fix_name: str, extra_host_us: float = 0.0, extra_what: str = ""
) -> tuple[float, str | None]:
    """A kernel-time saving (``evidence["gpu_saving_us"]``) against a step whose host may bound it.

    The step runs eagerly after the fix, so it takes at least the host's time to enqueue it
    (``host_enqueue_us``, timed from an idle GPU: capture.timing.probe_host) plus what the fix adds to it
    (``extra_host_us``), and at least its GPU time less the saving: after ≈ max(host + extra, step - saving)
    (benchmarks/results/host_bound_check.json: the step was within 4% of max(host, GPU) for every stack measured).
    The signed difference step - after goes in ``evidence["expected_alone_us"]`` (negative: the fix alone
    makes the step slower); the saving is never below 0. Where the host time is unknown, the step syncs (the
    probe then includes GPU waits) or it launches more than a launch queue holds, the kernel saving stands."""
    evidence = finding.setdefault("evidence", {})
    gpu_saving = evidence.get("gpu_saving_us")
    if not isinstance(gpu_saving, (int, float)):
        return finding.get("estimated_saving_us_per_step") or 0.0, None
    gpu_saving = float(gpu_saving)
    probed, why = separable_host(timed)
    if probed is None:
        evidence["host_bound_basis"] = f"{why}: the GPU's saving stands"
        return gpu_saving, None
    # A probe starts from an idle GPU and pays what steps run back to back do not (on the H100 the single-image
    # ViT's probe read 8,408 µs against its 8,302 µs step): in a loop of steps the host's time per step is at
    # most the step's own time.
    host = min(probed, float(timed_us))
    host_after = host + float(extra_host_us)
    after = max(host_after, timed_us - gpu_saving)
    expected = timed_us - after
    evidence["host_enqueue_us"] = _r(probed)
    evidence["host_after_fix_us"] = _r(host_after)
    evidence["expected_alone_us"] = _r(expected)
    evidence["host_bound_basis"] = (
        "after the fix ≈ max(host time per step + what the fix adds to it, step - GPU saving); host time timed "
        "from an idle GPU without the profiler, at most the step's own time"
    )
    if host_after <= timed_us - gpu_saving:
        return gpu_saving, None
    gpu_part = f"It takes {gpu_saving:,.0f} µs of GPU time off the step, but the host needs {float(host):,.0f} µs to "
    if extra_host_us > 0:
        added = f" (+{extra_host_us:,.0f} µs for {extra_what})"
    elif extra_host_us < 0:
        added = f" ({extra_host_us:,.0f} µs: {extra_what})".replace("-", "−", 1)
    else:
        added = ""
    if expected >= 0:
        text = (
            f"{gpu_part}enqueue it{added}: alone, on this eager step, {fix_name} would bring the step to "
            f"about {after:,.0f} µs, a saving of {expected:,.0f} µs; the rest shows with compile or graphs, which "
            "take the host's time out of the step."
        )
    else:
        text = (
            f"{gpu_part}enqueue it{added}: alone, on this eager step, {fix_name} would make the step about "
            f"{-expected:,.0f} µs slower ({after:,.0f} µs); it pays with compile or graphs, which take the host's "
            "time out of the step."
        )
    return max(expected, 0.0), text


def layout_conversions_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str | None]:
    """GA203's GPU saving capped by the step's host time (:func:`host_capped_saving`), with what channels_last
    does to the host's time: ``channels_last_host_us_per_step``, minus the conversion kernels' launch calls."""
    evidence = finding.get("evidence") or {}
    extra = float(evidence.get("channels_last_host_us_per_step") or 0.0)
    launches = evidence.get("conversion_launch_calls_per_step") or 0
    what = f"the {launches:.0f} conversion kernels' launch calls per step go"
    return host_capped_saving(finding, timed_us, timed or {}, "channels_last", extra, what)


# ----------------------------------------------------------------------------------------------------
# GA302 fp32/TF32 compute that bf16 would halve

# The same name test GA301 (fp32_matmul) uses for tensor-core kernels: a kernel outside it is fp32 SIMT.
_TENSOR_CORE_NAME = r"(?i)tf32|bf16|f16|fp16|h884|h1688|s16816|tensorop|i8"
_SIXTEEN_BIT_NAME = r"(?i)bf16|f16|fp16|h884|h1688|hgemm|s16816|hsh|e4m3|e5m2|i8"
# fp32 operands by kernel name (TF32 tensor-core and fp32 SIMT kernels of cuBLAS, CUTLASS and cuDNN).
_FP32_NAME = r"(?i)tf32|sgemm|f32f32|s1688|ffma|implicit_convolve_sgemm"
_CONV_NAME = r"(?i)fprop|dgrad|wgrad|conv"


# The operators that run a forward convolution or matmul (one per call: conv2d -> ... -> cudnn_convolution,
# linear -> addmm or matmul -> mm); the calls on the thread of the forward pass (the one that runs aten::conv*d
# and aten::linear, which autograd's backward thread never does) are the forward ones.
_FORWARD_COMPUTE_OPS = {
    "aten::cudnn_convolution",
    "aten::miopen_convolution",
    "aten::convolution_overrideable",
    "aten::mkldnn_convolution",
    "aten::addmm",
    "aten::mm",
    "aten::bmm",
    "aten::baddbmm",
}
_CONVOLUTION_OPS = {
    "aten::cudnn_convolution",
    "aten::miopen_convolution",
    "aten::convolution_overrideable",
    "aten::mkldnn_convolution",
}
_FORWARD_ONLY_OPS = {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear", "aten::matmul"}
_BACKWARD_OP = r"(?i)backward|autograd::engine"


def forward_fp32_compute_calls(
    a: Analysis, names: set[str] | None = None, fp32_only: bool = True
) -> tuple[float, bool]:
    """(forward calls per step of ``names`` (default: the conv/matmul operators) on float32 inputs, or on any
    inputs with ``fp32_only=False``; whether the steps run a backward pass)."""
    wanted = _FORWARD_COMPUTE_OPS if names is None else names
    ops = a.trace.cpu_ops
    if not len(ops) or not a.n_steps:
        return 0.0, False
    inside = assign_steps(ops["ts_us"].to_numpy(float), step_windows(a.trace)) >= 0
    names = ops["name"]
    training = bool((match_names(names, _BACKWARD_OP) & inside).any())
    forward_only = ops[names.isin(_FORWARD_ONLY_OPS).to_numpy() & inside]
    if not len(forward_only):
        return 0.0, training
    forward_tid = forward_only["tid"].mode().iloc[0]
    rows = np.flatnonzero(names.isin(wanted).to_numpy() & inside & (ops["tid"] == forward_tid).to_numpy())
    fp32 = 0
    for _, types in operator_inputs(ops, rows).values():
        kinds = {str(t) for t in types or []}
        if not fp32_only or (kinds & _FP32 and not kinds & _SIXTEEN_BIT):
            fp32 += 1
    return fp32 / a.n_steps, training


def fp32_compute(a: Analysis, rule: Rule) -> Finding | None:
    k, _ = _kernels_in_steps(a)
    if not len(k) or not a.n_steps:
        return None
    cc = a.trace.device.compute_capability if a.trace.device else None
    bf16 = peak_flops(a.peaks, "bf16")
    tf32 = peak_flops(a.peaks, "tf32")
    fp32 = peak_flops(a.peaks, "fp32")
    if (cc is not None and cc < (8, 0)) or (cc is None and not bf16):
        raise SkipRule("the GPU has no bf16 tensor cores (compute capability below 8.0, or unknown)")
    if not (bf16 and tf32 and fp32):
        raise SkipRule("the GPU's bf16/tf32/fp32 peaks are unknown (use --peaks FILE)")
    # fp32 by the launching operator's input dtype; where the trace has no shapes, by the kernel's name.
    dtype = k["dtype"]
    fp32_inputs = dtype.isin(list(_FP32)).to_numpy() | (dtype.isna().to_numpy() & match_names(k["name"], _FP32_NAME))
    sel = k[
        k["family"].isin(["gemm", "convolution"]).to_numpy() & fp32_inputs & ~match_names(k["name"], _SIXTEEN_BIT_NAME)
    ]
    if not len(sel):
        return None
    share = 100.0 * sel["dur_us"].sum() / k["dur_us"].sum()
    if share < rule.threshold("min_share_of_gpu_time_pct"):
        return None
    # fp32 SIMT GEMMs are GA301's: it counts their move to TF32; here they count at the time TF32 would take.
    simt = (sel["family"] == "gemm").to_numpy() & ~match_names(sel["name"], _TENSOR_CORE_NAME)
    dur = sel["dur_us"].to_numpy(float)
    as_tf32 = np.where(simt, dur * fp32 / tf32, dur)
    bound = sel["bound"].to_numpy(object)
    # A grid under one wave (latency) still runs each block at the dtype's rate on the SMs it occupies: it
    # counts by the roof it is under; launch-bound kernels (shorter than their launch) count zero.
    side = sel["roof_side"].to_numpy(object) if "roof_side" in sel else np.full(len(sel), None, dtype=object)
    bound = np.where(bound == "latency", side, bound)
    compute_factor = 1.0 - tf32 / bf16
    memory_factor = rule.threshold("memory_bound_saving_fraction")
    factor = np.select([bound == "compute", bound == "memory"], [compute_factor, memory_factor], default=0.0)
    matmul_saving = float((as_tf32 * factor).sum()) / a.n_steps
    per_step = dur.sum() / a.n_steps
    # Autocast casts each float32 weight to bf16 once per call (and, training, its gradient back in the
    # backward pass): host work an eager step adds (fp32_compute_timed), and a small kernel each on the GPU.
    calls, training = forward_fp32_compute_calls(a)
    casts = calls * (2 if training else 1)
    activations = _autocast_activation_change(k, rule, a.n_steps, fp32)
    # The cast kernels' GPU time, as measured in BatchNorm nets (the rule's TOML); elsewhere it is not measured and
    # left out, as the casts fuse into their neighbours under compile (a ViT at batch 1 kept bf16 + compile).
    cast_us = casts * rule.threshold("autocast_gpu_us_per_cast") if activations["batchnorm_net"] else 0.0
    saving = matmul_saving + activations["elementwise_saving_us"] - activations["batchnorm_cost_us"] - cast_us
    # cuDNN's implicit-GEMM convolutions carry "gemm" in their names: the pass names them.
    convs = (sel["family"] == "convolution").to_numpy() | match_names(sel["name"], _CONV_NAME)
    by_name = sel.groupby("name")["dur_us"].sum().sort_values(ascending=False)
    message = (
        f"{share:.0f}% of GPU time ({per_step:,.0f} µs/step) is fp32/TF32 matrix work: "
        f"{(~convs).sum() / a.n_steps:.0f} GEMM and {convs.sum() / a.n_steps:.0f} convolution kernels per step "
        f"on float32 tensors, on a GPU whose bf16 roof ({bf16 / 1e12:.0f} TFLOP/s) is "
        f"{bf16 / tf32:.1f}x its TF32 roof; under bf16 autocast the compute-bound ones would take "
        f"{100 * tf32 / bf16:.0f}% of their TF32 time and the memory-bound ones move half the bytes."
        + (
            f" {dur[simt].sum() / a.n_steps:,.0f} µs/step of it are fp32 GEMMs on the CUDA cores (GA301 moves them "
            "to TF32 first); they count here at their TF32 time."
            if simt.any()
            else ""
        )
    )
    evidence = {
        "share_of_gpu_time_pct": _r(share),
        "us_per_step": _r(per_step),
        "kernels_per_step": _r(len(sel) / a.n_steps),
        "convolution_us_per_step": _r(dur[convs].sum() / a.n_steps),
        "gemm_us_per_step": _r(dur[~convs].sum() / a.n_steps),
        "compute_bound_us_per_step": _r(dur[bound == "compute"].sum() / a.n_steps),
        "memory_bound_us_per_step": _r(dur[bound == "memory"].sum() / a.n_steps),
        "simt_us_per_step_left_to_ga301": _r(dur[simt].sum() / a.n_steps),
        "top_kernels": [short_kernel_name(n) for n in by_name.index[:3]],
        "matmul_saving_us": _r(matmul_saving),
        **{key: value if isinstance(value, bool) else _r(value) for key, value in activations.items()},
        "autocast_cast_kernels_us_per_step": _r(cast_us),
        "gpu_saving_us": _r(saving),
        "forward_fp32_compute_calls_per_step": _r(calls),
        "autocast_casts_per_step": _r(casts),
        "autocast_host_us_per_step": _r(casts * rule.threshold("autocast_host_us_per_cast")),
        "basis": f"compute-bound kernels x (1 - tf32/bf16 peak = {compute_factor:.2f}), memory-bound x "
        f"{memory_factor:.2f} (bytes halve), latency- and launch-bound x 0; fp32 SIMT GEMMs (GA301) counted at "
        "their TF32 time (x fp32/tf32 peak) so the two findings add up"
        + (
            f"; in a BatchNorm net the activations between the convolutions become bf16 too: its memory-bound "
            f"fp32 elementwise kernels x {rule.threshold('batchnorm_net_elementwise_saving_fraction'):.2f}, and "
            f"cuDNN's NCHW batch-norm kernels turn into PyTorch's native bf16 ones, which take "
            f"{rule.threshold('native_batchnorm_forward_ps_per_element'):g} ps (forward) and "
            f"{rule.threshold('native_batchnorm_backward_ps_per_element'):g} ps (backward) per element at "
            f"{rule.threshold('native_batchnorm_reference_fp32_tflops'):g} fp32 TFLOP/s (measured; scaled by this "
            f"GPU's {fp32 / 1e12:.0f})"
            if activations["batchnorm_net"]
            else ""
        )
        + (
            f"; minus {rule.threshold('autocast_gpu_us_per_cast'):g} µs of GPU time per cast autocast adds"
            if cast_us
            else ""
        ),
    }
    if activations["batchnorm_cost_us"] > 0:
        message += (
            f" BatchNorm leaves cuDNN under autocast (PyTorch runs bf16 batch norm in its own kernels), which in "
            f"NCHW costs about {activations['batchnorm_cost_us']:,.0f} µs/step: channels_last first avoids it."
        )
    # A GPU saving below zero (batch norm's NCHW cost above what the matmuls gain) stays signed in the evidence,
    # where the timed step's host cap reads it; the finding claims nothing.
    return make_finding(rule, a, message, evidence, max(saving, 0.0))


# Batch-norm kernels of any backend: cuDNN's NCHW (bn_*_1C11) and NHWC (batchnorm_*_nhwc) ones, PyTorch's own.
_BATCHNORM_KERNEL = r"(?i)\bbn_(?:fw|bw)|batchnorm|batch_norm"
# cuDNN's NCHW batch-norm backward kernels (bn_bw_1C11_kernel_new, bn_bw_1C11_singleread).
_BATCHNORM_BACKWARD_KERNEL = r"(?i)\bbn_bw"
# The optimizer's fused/foreach kernels update float32 weights and state: autocast leaves them float32.
_OPTIMIZER_KERNEL = r"(?i)multi_tensor|foreach|fused_adam|fused_sgd"


def _autocast_activation_change(k: pd.DataFrame, rule: Rule, n_steps: int, fp32_peak: float) -> dict:
    """What bf16 autocast changes beyond the matmuls in a step's kernels ``k``: the activations' dtype.

    In a BatchNorm net (a batch-norm kernel in the step) the tensors between the convolutions become bf16:
    autocast runs the convolutions in bf16 and batch norm, ReLU and the residual adds in their inputs' dtype
    (batch_norm is on none of autocast's float32 lists, unlike layer_norm and group_norm, whose float32 outputs
    keep a transformer's residual stream in float32; there the elementwise kernels count zero). So the step's
    memory-bound float32 elementwise kernels (the optimizer's excepted) move half the bytes. And PyTorch never
    sends a bf16 input to cuDNN's batch norm (``_select_batch_norm_backend``): its native kernels replace
    cuDNN's. In channels_last they took the time of cuDNN's NHWC ones; in NCHW they take a time per element
    that does not follow the memory bandwidth (they move ~0.5 TB/s on an H100 and an H200 alike): the forward
    and backward kernels' elements (from their FLOPs) x the rule's picoseconds per element, scaled by the GPU's
    fp32 CUDA-core peak against the reference GPU's (SM count x clock), minus cuDNN's float32 time. Kernels
    without recorded shapes count ``nchw_batchnorm_bf16_time_ratio`` x their time instead (the rule's TOML gives
    the measurements)."""
    name = k["name"]
    bn = (k["family"] == "normalization").to_numpy() & match_names(name, _BATCHNORM_KERNEL)
    out = {"batchnorm_net": bool(bn.any()), "elementwise_saving_us": 0.0, "batchnorm_cost_us": 0.0}
    if not bn.any() or not n_steps:
        return out
    fp32 = k["dtype"].isin(list(_FP32)).to_numpy()
    elementwise = (
        (k["family"] == "elementwise").to_numpy()
        & (k["bound"] == "memory").to_numpy()
        & fp32
        & ~match_names(name, _OPTIMIZER_KERNEL)
    )
    nchw_bn = bn & fp32 & match_names(name, _NCHW_BATCHNORM_KERNEL)
    dur = k["dur_us"].to_numpy(float)
    fraction = rule.threshold("batchnorm_net_elementwise_saving_fraction")
    out["elementwise_saving_us"] = float(dur[elementwise].sum()) * fraction / n_steps
    # PyTorch's native bf16 batch norm in NCHW: a time per element, set by the SMs (module docstring above).
    elements = k["flops"].to_numpy(float) / NORMALIZATION_FLOPS_PER_ELEMENT
    counted = nchw_bn & np.isfinite(elements) & (elements > 0)
    ps_per_element = np.where(
        match_names(name, _BATCHNORM_BACKWARD_KERNEL),
        rule.threshold("native_batchnorm_backward_ps_per_element"),
        rule.threshold("native_batchnorm_forward_ps_per_element"),
    )
    scale = rule.threshold("native_batchnorm_reference_fp32_tflops") * 1e12 / fp32_peak
    native_us = float((elements * ps_per_element * scale)[counted].sum()) * 1e-6
    ratio = rule.threshold("nchw_batchnorm_bf16_time_ratio")
    uncounted_us = float(dur[nchw_bn & ~counted].sum())
    out["batchnorm_cost_us"] = (native_us - float(dur[counted].sum()) + uncounted_us * (ratio - 1.0)) / n_steps
    out["nchw_batchnorm_us_per_step"] = float(dur[nchw_bn].sum()) / n_steps
    out["nchw_batchnorm_elements_per_step"] = float(elements[counted].sum()) / n_steps
    out["native_bf16_batchnorm_us_per_step"] = (native_us + uncounted_us * ratio) / n_steps
    out["activation_elementwise_us_per_step"] = float(dur[elementwise].sum()) / n_steps
    return out


def fp32_compute_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str | None]:
    """GA302's GPU saving capped by the step's host time (:func:`host_capped_saving`), with the host time
    autocast's casts add: ``autocast_casts_per_step`` x the rule's ``autocast_host_us_per_cast``."""
    evidence = finding.get("evidence") or {}
    extra = float(evidence.get("autocast_host_us_per_step") or 0.0)
    casts = evidence.get("autocast_casts_per_step") or 0
    return host_capped_saving(
        finding, timed_us, timed or {}, "bf16 autocast", extra, f"autocast's {casts:.0f} casts per step"
    )


# ----------------------------------------------------------------------------------------------------
# GA204 optimizer per-parameter loop

_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(?P<cls>[A-Za-z0-9_]+)\.step$")
# State tensors per parameter an optimizer's update reads and writes (moments, momentum buffers, ...).
_STATE_TENSORS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adafactor": 2, "Lion": 1}
_ITEMSIZE = {"float": 4, "c10::Float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8}
# foreach's kernels (at::native multi_tensor_apply_kernel over TensorListMetadata), and those of a fused update
# (FusedAdamMathFunctor, FusedSgdMathFunctor, fused_adagrad...: multi-tensor too, with "Fused" in the functor).
_MULTI_TENSOR_KERNEL = r"multi_tensor_apply"
_FUSED_UPDATE_KERNEL = r"(?i)fused_?(?:adam|sgd|adagrad)"


def _parameters_per_step(a: Analysis) -> tuple[float, float, int] | None:
    """(parameter tensors, parameter elements, bytes per element) per step, from the backward pass's
    AccumulateGrad calls (one per parameter that gets a gradient); None without them."""
    ops = a.trace.cpu_ops
    rows = np.flatnonzero((ops["name"] == "torch::autograd::AccumulateGrad").to_numpy())
    if not len(rows):
        return None
    step = assign_steps(ops["ts_us"].to_numpy(float)[rows], step_windows(a.trace))
    rows = rows[step >= 0]
    if not len(rows):
        return None
    inputs = operator_inputs(ops, rows.tolist())
    numel = 0
    itemsize = 4
    for dims, types in inputs.values():
        shapes = tensor_dims(dims)
        if shapes:
            numel += math.prod(shapes[0])
        if types and isinstance(types[0], str) and types[0] in _ITEMSIZE:
            itemsize = _ITEMSIZE[types[0]]
    steps = len(set(step[step >= 0].tolist()))
    return len(rows) / steps, numel / steps, itemsize


def _fused_update_bytes(optimizer: str, numel: float, itemsize: int) -> tuple[int, float]:
    """(state tensors per parameter, bytes) of a fused update: it reads parameter, gradient and state once and
    writes parameter and state once."""
    states = _STATE_TENSORS.get(optimizer, 1)
    return states, numel * itemsize * (3 + 2 * states)


def _optimizer_regions(a: Analysis) -> dict | None:
    """What the profiled steps' ``optimizer.step()`` calls (the Optimizer.step#<Class>.step annotations) did,
    per step (a step may call it more than once: its calls add up; medians over the steps, as for the step
    figures): ``kernels`` launched inside, host ``wall_us``, ``gpu_us`` of those kernels, ``multi_tensor_us`` and
    ``fused_kernels`` (foreach's multi-tensor kernels, and kernels of a fused update), ``ops`` (operators called
    inside the region, nested ones included), and the ``optimizer`` class. None without such calls."""
    ann = a.trace.annotations
    regions = ann[(~ann["on_gpu"]) & ann["name"].str.match(_OPTIMIZER_STEP.pattern)] if len(ann) else ann
    if not len(regions):
        return None
    windows = step_windows(a.trace)
    region_step = assign_steps(regions["ts_us"].to_numpy(float), windows)
    regions = regions[region_step >= 0]
    if not len(regions):
        return None
    acts = a.activities
    kern = acts[(acts["kind"] == "kernel") & (acts["step_index"] >= 0)]
    launch = kern["launch_ts_us"].to_numpy(float)
    names = kern["name"].astype(str)
    multi = names.str.contains(_MULTI_TENSOR_KERNEL, regex=True).to_numpy()
    fused = names.str.contains(_FUSED_UPDATE_KERNEL, regex=True).to_numpy()
    dur = kern["dur_us"].to_numpy(float)
    ops = a.trace.cpu_ops
    op_ts = ops["ts_us"].to_numpy(float)
    op_end = ops["end_us"].to_numpy(float)
    per_step: dict[int, list[float]] = {}
    for step, (_, region) in zip(region_step[region_step >= 0].tolist(), regions.iterrows()):
        inside = (launch >= region["ts_us"]) & (launch <= region["end_us"])
        start, end = float(region["ts_us"]), float(region["end_us"])
        # Annotations carry no thread: every operator inside the region's interval, nested ones included (the
        # update's own, in a training loop; a data-loading thread running beside it would add its own too).
        in_region = (op_ts >= start) & (op_end <= end)
        totals = per_step.setdefault(step, [0.0] * 6)
        totals[0] += int(inside.sum())
        totals[1] += float(region["dur_us"])
        totals[2] += float(dur[inside].sum())
        totals[3] += float(dur[inside & multi & ~fused].sum())
        totals[4] += int((inside & fused).sum())
        totals[5] += int(in_region.sum())
    medians = np.median(list(per_step.values()), axis=0)
    keys = ("kernels", "wall_us", "gpu_us", "multi_tensor_us", "fused_kernels", "ops")
    out = {key: float(value) for key, value in zip(keys, medians)}
    out["optimizer"] = _OPTIMIZER_STEP.match(regions["name"].iloc[0]).group("cls")
    return out


def optimizer_loop(a: Analysis, rule: Rule) -> Finding | None:
    if not a.n_steps or not a.step_time_us:
        return None
    region = _optimizer_regions(a)
    if region is None:
        return None
    kernels_per_step, wall_per_step, gpu_per_step = region["kernels"], region["wall_us"], region["gpu_us"]
    if kernels_per_step < rule.threshold("min_kernels_per_step"):
        return None
    params = _parameters_per_step(a)
    if params is None:
        raise SkipRule("no AccumulateGrad calls in the steps: the number of parameter tensors is unknown")
    tensors, numel, itemsize = params
    per_param = kernels_per_step / max(tensors, 1.0)
    if per_param < rule.threshold("min_kernels_per_parameter"):
        return None
    optimizer = region["optimizer"]
    states, bytes_moved = _fused_update_bytes(optimizer, numel, itemsize)
    bandwidth = (a.peaks.hbm_bytes_per_s or 4.8e12) * rule.threshold("bandwidth_fraction_of_peak")
    fused_us = bytes_moved / bandwidth * 1e6 + rule.threshold("fused_launches") * rule.threshold("launch_us")
    saving = max(0.0, wall_per_step - fused_us)
    message = (
        f"optimizer.step() ({optimizer}) launches {kernels_per_step:,.0f} kernels per step for {tensors:.0f} "
        f"parameter tensors ({per_param:.1f} per tensor, {gpu_per_step:,.0f} µs of GPU work): "
        f"the update runs as a Python loop over the parameters. The region takes {wall_per_step:,.0f} µs of the "
        f"{a.step_time_us:,.0f} µs step; a fused update moving its {bytes_moved / 1e9:.2f} GB once would take "
        f"about {fused_us:,.0f} µs."
    )
    evidence = {
        "optimizer": optimizer,
        "kernels_per_step": _r(kernels_per_step),
        "parameter_tensors": _r(tensors, 0),
        "parameter_elements": int(numel),
        "kernels_per_parameter": _r(per_param, 2),
        "region_us_per_step": _r(wall_per_step),
        "region_gpu_us_per_step": _r(gpu_per_step),
        "fused_bytes": int(bytes_moved),
        "fused_estimate_us": _r(fused_us),
        "basis": f"the optimizer.step() region's host wall time minus a fused update: {3 + 2 * states} x "
        f"{itemsize}-byte elements per parameter (read param, grad, {states} state; write param, state) at "
        f"{bandwidth / 1e12:.2f} TB/s, plus {rule.threshold('fused_launches'):.0f} launches of "
        f"{rule.threshold('launch_us'):.0f} µs",
    }
    return make_finding(rule, a, message, evidence, saving)


def optimizer_loop_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str | None]:
    """The region's wall time is host time (a Python loop of launches), which the profiler's per-operator cost
    stretches far more than the rest of the step. Where the timed steps measured optimizer.step() itself
    (``optimizer_step_host_us``: torch.optim's step hooks, no profiler; gpuadvisor/capture/timing.py), the
    saving is that time minus the fused update; otherwise the profiled region scaled by timed / profiled step."""
    evidence = finding.setdefault("evidence", {})
    region = evidence.get("region_us_per_step")
    fused = float(evidence.get("fused_estimate_us") or 0.0)
    measured = (timed or {}).get("optimizer_step_host_us")
    if measured:
        evidence["region_timed_us_per_step"] = _r(float(measured))
        saving = max(0.0, float(measured) - fused)
        evidence["basis"] = (
            f"optimizer.step()'s host time in the timed steps ({float(measured):,.0f} µs per step, measured "
            "through torch.optim's step hooks without the profiler) minus a fused update: "
            + str(evidence.get("basis", "")).split(" minus a fused update: ", 1)[-1]
        )
        return saving, (
            f"Timed without the profiler, optimizer.step() takes {float(measured):,.0f} µs of the {timed_us:,.0f} µs "
            f"step (profiled: {float(region or 0):,.0f} µs), so a fused update would save about {saving:,.0f} µs."
        )
    if not region or not profiled_us or profiled_us <= timed_us:
        return finding.get("estimated_saving_us_per_step") or 0.0, None
    region_timed = float(region) * timed_us / profiled_us
    evidence["region_timed_us_per_step"] = _r(region_timed)
    saving = max(0.0, region_timed - fused)
    return saving, (
        f"Timed without the profiler the step takes {timed_us:,.0f} µs (profiled {profiled_us:,.0f} µs), so the "
        f"region takes about {region_timed:,.0f} µs of it and a fused update would save about {saving:,.0f} µs."
    )


# ----------------------------------------------------------------------------------------------------
# GA205 foreach optimizer update where a fused one exists

# torch.optim classes with fused=True (CUDA, floating parameters): the fused_optimizer fix's list.
_FUSED_CAPABLE = {"Adam", "AdamW", "SGD", "Adagrad"}


# The share of optimizer.step()'s host time fused=True takes off, by class (threshold names): Adam and AdamW
# read their CPU step counters with .item() per tensor under foreach; SGD's foreach path groups and checks each
# tensor in Python. Adagrad's was not measured: its host saving is taken as 0.
_HOST_SHARE_THRESHOLD = {"Adam": "host_share_adam", "AdamW": "host_share_adam", "SGD": "host_share_sgd"}


def _fused_update_costs(region: dict, params: tuple[float, float, int], rule: Rule, a: Analysis) -> dict:
    """A fused update's GPU time (the bytes it moves once at the measured fraction of the HBM peak) and the share
    of the region's host time it takes off (measured per optimizer class)."""
    _, numel, itemsize = params
    states, bytes_moved = _fused_update_bytes(region["optimizer"], numel, itemsize)
    bandwidth = (a.peaks.hbm_bytes_per_s or 4.8e12) * rule.threshold("fused_bandwidth_fraction_of_peak")
    fused_gpu = bytes_moved / bandwidth * 1e6
    share_key = _HOST_SHARE_THRESHOLD.get(region["optimizer"])
    share = rule.threshold(share_key) if share_key else 0.0
    return {
        "states": states,
        "bytes": bytes_moved,
        "bandwidth": bandwidth,
        "fused_gpu_us": fused_gpu,
        "gpu_saving_us": max(region["gpu_us"] - fused_gpu, 0.0),
        "host_share": share,
        "host_saving_us": share * region["wall_us"],
    }


def _bound_saving(host_us: float, gpu_us: float, host_saving: float, gpu_saving: float) -> float:
    """What a step bound by max(host, GPU) saves when the host loses ``host_saving`` and the GPU ``gpu_saving``:
    max(host, gpu) - max(host - host_saving, gpu - gpu_saving)."""
    return max(host_us, gpu_us) - max(host_us - host_saving, gpu_us - gpu_saving)


def optimizer_foreach(a: Analysis, rule: Rule) -> Finding | None:
    if not a.n_steps or not a.step_time_us:
        return None
    region = _optimizer_regions(a)
    if region is None or region["optimizer"] not in _FUSED_CAPABLE:
        return None
    if region["fused_kernels"] > 0 or region["multi_tensor_us"] <= 0:
        return None  # already fused, or no foreach kernels (a per-parameter loop: GA204's, or nothing on a GPU)
    params = _parameters_per_step(a)
    if params is None:
        raise SkipRule("no AccumulateGrad calls in the steps: the parameters' size is unknown")
    if region["kernels"] / max(params[0], 1.0) >= rule.threshold("max_kernels_per_parameter"):
        return None  # a Python loop of per-parameter kernels: GA204
    costs = _fused_update_costs(region, params, rule, a)
    step = float(a.step_time_us)
    busy = min(float(a.median("gpu_busy_us") or 0.0), step)
    # Without a timed host figure the trace's step is the host's bound (the GPU's busy time is the other).
    saving = _bound_saving(step, busy, costs["host_saving_us"], costs["gpu_saving_us"])
    # The profiler stretches a region of many small operator calls far more than a step bound by its GPU, so the
    # absolute floor is judged on what the update would save without it: its operator calls at their measured
    # unprofiled cost, the class's share of that, plus the GPU's part.
    unprofiled = costs["host_share"] * region["ops"] * rule.threshold("host_us_per_operator_call")
    unprofiled += costs["gpu_saving_us"]
    if unprofiled < rule.threshold("min_saving_us") or 100.0 * saving / step < rule.threshold("min_saving_pct"):
        return None
    optimizer = region["optimizer"]
    tensors = params[0]
    message = (
        f"optimizer.step() ({optimizer}, foreach) runs {region['kernels']:,.0f} multi-tensor kernels per step "
        f"({region['gpu_us']:,.0f} µs of GPU work) and {region['ops']:,.0f} operator calls in "
        f"{region['wall_us']:,.0f} µs on the host for {tensors:.0f} parameter tensors; fused=True updates them in "
        f"one pass: about {costs['fused_gpu_us']:,.0f} µs of GPU time for its {costs['bytes'] / 1e9:.2f} GB, and "
        f"{100 * costs['host_share']:.0f}% less host time (~{costs['host_saving_us']:,.0f} µs). The step is bound "
        f"by the larger of its host and GPU time, so this saves about {saving:,.0f} µs per step; beside compile or "
        "graphs, which take the rest of the host's time out of the step, the optimizer's share grows."
    )
    evidence = {
        "optimizer": optimizer,
        "implementation": "foreach",
        "kernels_per_step": _r(region["kernels"]),
        "parameter_tensors": _r(tensors, 0),
        "parameter_elements": int(params[1]),
        "region_us_per_step": _r(region["wall_us"]),
        "region_gpu_us_per_step": _r(region["gpu_us"]),
        "region_ops_per_step": _r(region["ops"]),
        "fused_bytes": int(costs["bytes"]),
        "fused_gpu_us": _r(costs["fused_gpu_us"]),
        "optimizer_gpu_saving_us": _r(costs["gpu_saving_us"]),
        "host_share_saved": costs["host_share"],
        "optimizer_host_saving_us": _r(costs["host_saving_us"]),
        "unprofiled_saving_us": _r(unprofiled),
        "gpu_busy_us": _r(busy),
        "basis": (
            f"step - max(host - host saving, GPU busy - GPU saving): the GPU saving is the update's kernel time "
            f"minus {3 + 2 * costs['states']} x {params[2]}-byte elements per parameter at "
            f"{costs['bandwidth'] / 1e12:.2f} TB/s (fused updates' measured rate); the host saving is "
            f"{100 * costs['host_share']:.0f}% of optimizer.step()'s host time ({region['optimizer']}'s measured "
            "share, foreach against fused on the H200 without the profiler)"
        ),
    }
    return make_finding(rule, a, message, evidence, saving)


def optimizer_foreach_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str | None]:
    """GA205 against the timed step: the host side is the host's time to enqueue the step (timed from an idle
    GPU) where it is separable from GPU waits, else the timed step itself; the host saving is the class's share of
    optimizer.step()'s host time as the timed steps measured it (torch.optim's step hooks), or of the profiled
    region scaled by timed / profiled step."""
    timed = timed or {}
    evidence = finding.setdefault("evidence", {})
    host_saving = float(evidence.get("optimizer_host_saving_us") or 0.0)
    gpu_saving = float(evidence.get("optimizer_gpu_saving_us") or 0.0)
    measured = timed.get("optimizer_step_host_us")
    share = float(evidence.get("host_share_saved") or 0.0)
    region = evidence.get("region_us_per_step")
    if isinstance(measured, (int, float)) and measured > 0:
        evidence["region_timed_us_per_step"] = _r(float(measured))
        host_saving = share * float(measured)
    elif isinstance(region, (int, float)) and profiled_us and profiled_us > timed_us:
        evidence["region_timed_us_per_step"] = _r(float(region) * timed_us / profiled_us)
        host_saving = share * float(region) * timed_us / profiled_us
    evidence["optimizer_host_saving_timed_us"] = _r(host_saving)
    busy = timed.get("gpu_busy_us")
    busy = float(busy) if isinstance(busy, (int, float)) and busy > 0 else float(evidence.get("gpu_busy_us") or 0.0)
    busy = min(busy, timed_us)
    host, why = separable_host(timed)
    host_us = timed_us if host is None else min(host, timed_us)
    saving = _bound_saving(host_us, busy, host_saving, gpu_saving)
    evidence["host_bound_basis"] = (
        f"host {host_us:,.0f} µs per step ("
        + (
            "timed from an idle GPU"
            if host is not None
            else f"the timed step: the host's own time is not separable; {why}"
        )
        + f"), GPU busy {busy:,.0f} µs"
    )
    return saving, (
        f"Timed without the profiler the step takes {timed_us:,.0f} µs (GPU busy {busy:,.0f} µs); "
        f"fused=True would save about {saving:,.0f} µs of it "
        f"({host_saving:,.0f} µs of host time, {gpu_saving:,.0f} µs of GPU time)."
    )


# ----------------------------------------------------------------------------------------------------
# GA303 misaligned 16-bit GEMMs

_ALIGN_NAME = r"align[12](?!\d)"
_GEMM_SHAPE_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}


def _gemm_mnk(op: str, dims: list | None) -> tuple[int, int, int] | None:
    mats = [d for d in tensor_dims(dims) if len(d) >= 2]
    if len(mats) < 2:
        return None
    if op == "aten::linear":
        a, b = mats[0], mats[1]
        k, n = a[-1], b[0]
    else:
        a, b = mats[-2], mats[-1]
        k, n = a[-1], b[-1]
    return math.prod(a[:-1]), n, k


def misaligned_gemm(a: Analysis, rule: Rule) -> Finding | None:
    k, acts = _kernels_in_steps(a)
    if not len(k) or not a.n_steps or not a.step_time_us:
        return None
    bf16 = peak_flops(a.peaks, "bf16")
    sixteen = (k["family"] == "gemm").to_numpy() & k["dtype"].isin(list(_SIXTEEN_BIT)).to_numpy()
    sixteen &= (k["flops"].to_numpy(float) > 0) & (k["dur_us"].to_numpy(float) > 0)
    if not sixteen.any():
        return None
    ops = a.trace.cpu_ops
    # Shapes of the launching operators, through the kernels' External ids.
    key = pd.MultiIndex.from_arrays([ops["rank"], ops["external_id"]])
    position = pd.Series(np.arange(len(ops)), index=key)
    position = position[~position.index.duplicated()]
    kernel_key = pd.MultiIndex.from_arrays([acts["rank"], acts["external_id"]])
    op_row = position.reindex(kernel_key).to_numpy(float)
    op_row[acts["external_id"].to_numpy() < 0] = np.nan  # no launching operator recorded
    candidates = np.flatnonzero(sixteen & np.isfinite(op_row))
    inputs = operator_inputs(ops, sorted({int(op_row[i]) for i in candidates}))
    multiple = int(rule.threshold("alignment_elements"))
    shape_of = {}
    misaligned = np.zeros(len(k), dtype=bool)
    for i in candidates:
        r = int(op_row[i])
        mnk = _gemm_mnk(str(ops["name"].iloc[r]), inputs[r][0])
        if mnk is None:
            continue
        shape_of[i] = mnk
        misaligned[i] = any(x % multiple for x in mnk)
    align_name = match_names(k["name"], _ALIGN_NAME)
    aligned = sixteen & ~misaligned & ~align_name & (k["bound"] == "compute").to_numpy()
    min_flops = rule.threshold("min_gemm_gflop") * 1e9
    aligned &= k["flops"].to_numpy(float) >= min_flops
    if aligned.any():
        ref = k["flops"].to_numpy(float)[aligned].sum() / (k["dur_us"].to_numpy(float)[aligned].sum() * 1e-6)
        ref_basis = (
            f"{ref / 1e12:.0f} TFLOP/s, what this trace's {aligned.sum() // a.n_steps} aligned 16-bit GEMMs per step "
            f"of at least {min_flops / 1e9:.0f} GFLOP achieve"
        )
    elif bf16:
        fraction = rule.threshold("fallback_fraction_of_peak")
        ref = bf16 * fraction
        ref_basis = f"{ref / 1e12:.0f} TFLOP/s, {100 * fraction:.0f}% of the bf16 peak"
    else:
        raise SkipRule("no aligned 16-bit GEMMs to compare with and no bf16 peak for this GPU")
    flops = k["flops"].to_numpy(float)
    dur = k["dur_us"].to_numpy(float)
    achieved = np.divide(flops, dur * 1e-6, out=np.zeros(len(k)), where=dur > 0)
    slow = achieved <= ref * rule.threshold("max_fraction_of_reference")
    hits = np.flatnonzero(sixteen & (misaligned | align_name) & slow & (flops >= min_flops))
    if not len(hits):
        return None
    per_step = dur[hits].sum() / a.n_steps
    share = 100.0 * per_step / a.step_time_us
    if share < rule.threshold("min_share_of_step_pct"):
        return None
    saving = float(np.clip(dur[hits] - flops[hits] / ref * 1e6, 0, None).sum()) / a.n_steps
    biggest = hits[np.argmax(dur[hits])]
    m, n, kk = shape_of.get(biggest, (None, None, None))
    odd = [f"{label}={v}" for label, v in (("M", m), ("N", n), ("K", kk)) if v is not None and v % multiple]
    groups = {}
    for i in hits:
        entry = groups.setdefault(
            (k["name"].iloc[i], shape_of.get(i)), {"us": 0.0, "count": 0, "flops": 0.0, "op": k["op"].iloc[i]}
        )
        entry["us"] += dur[i]
        entry["count"] += 1
        entry["flops"] += flops[i]
    top = sorted(groups.items(), key=lambda kv: -kv[1]["us"])[:3]
    message = (
        f"{len(hits) / a.n_steps:.0f} 16-bit GEMM(s) per step run at {achieved[biggest] / 1e12:.0f} TFLOP/s where "
        f"the aligned ones reach {ref / 1e12:.0f}: {short_kernel_name(k['name'].iloc[biggest])} "
        + (f"on M×N×K = {m}×{n}×{kk} ({', '.join(odd)} not a multiple of {multiple}) " if m else "")
        + f"takes {dur[biggest]:,.0f} µs. {per_step:,.0f} µs/step ({share:.0f}% of the step) in all; the rows of an "
        "operand whose length is not a multiple of 8 elements (16 bytes) cannot be loaded with aligned vector "
        "instructions, and cuBLAS falls back to a slow kernel."
    )
    evidence = {
        "gemms_per_step": _r(len(hits) / a.n_steps),
        "us_per_step": _r(per_step),
        "share_of_step_pct": _r(share),
        "reference_tflops": _r(ref / 1e12),
        "gemms": [
            {
                "kernel": short_kernel_name(name),
                "op": g["op"],
                "m_n_k": list(shape) if shape else None,
                "us_per_step": _r(g["us"] / a.n_steps),
                "achieved_tflops": _r(g["flops"] / (g["us"] * 1e-6) / 1e12),
                "align_kernel": bool(re.search(_ALIGN_NAME, name)),
            }
            for (name, shape), g in top
        ],
        "basis": f"the kernels' time minus their FLOPs at {ref_basis}",
    }
    # The aligned GEMMs of this trace measure the alternative on this GPU; without them, a share of the roof.
    basis = MEASURED_ALTERNATIVE if aligned.any() else ROOF
    return make_finding(rule, a, message, evidence, saving, basis=basis)
