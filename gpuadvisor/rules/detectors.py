"""Built-in detectors. Each reads the :class:`~gpuadvisor.analysis.bundle.Analysis` tables and its rule's
thresholds, and returns a finding with evidence and an estimated saving per step (or None). They are registered
by name in :data:`gpuadvisor.rules.engine.DETECTORS`, with the ``*_timed`` functions that re-derive a saving
against a step timed without the profiler."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuadvisor.analysis.bundle import Analysis
from gpuadvisor.analysis.linking import factorize_names, match_names
from gpuadvisor.analysis.roofline import LAYOUT_CONVERSION_KERNEL, NEAR_ROOF_PCT
from gpuadvisor.analysis.sources import DIRECTION_KINDS
from gpuadvisor.analysis.timeline import call_sources
from gpuadvisor.device.peaks import peak_flops
from gpuadvisor.report.formatting import as_number, short_kernel_name
from gpuadvisor.rules.engine import Finding, Rule, SkipRule, make_finding

_CHAIN_FAMILIES = {"elementwise", "normalization", "reduction", "copy"}
_SYNC_OP_HINTS = {
    "aten::_local_scalar_dense": ".item() / a Python number from a tensor",
    "aten::item": ".item()",
    "aten::nonzero": "nonzero / boolean-mask indexing",
    "aten::to": ".to(cpu) / .cpu()",
    "aten::_to_copy": ".to(cpu) / .cpu()",
    "aten::copy_": "a blocking copy",
    "aten::masked_select": "boolean-mask indexing",
    "aten::unique": "unique",
    "aten::repeat_interleave": "repeat_interleave with a tensor count",
}


def _in_steps(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["step_index"] >= 0]


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None or x != x else round(float(x), digits)


def step_with_graph_us(gpu_busy_us: float, kernels_per_step: float, rule: Rule) -> float:
    """The step replayed as one CUDA graph: the GPU's own work plus the per-kernel cost left inside a graph
    (graph_overhead_us_per_kernel, measured on the H200 decode step; the rule's TOML says how)."""
    return gpu_busy_us + kernels_per_step * rule.threshold("graph_overhead_us_per_kernel")


def launch_bound(a: Analysis, rule: Rule) -> Finding | None:
    step = a.step_time_us
    if not step:
        raise SkipRule("no step time")
    idle_launch = a.median("idle_launch_us") or 0.0
    idle_pct = 100.0 * idle_launch / step
    if idle_pct < rule.threshold("min_launch_idle_pct"):
        return None
    busy = a.median("gpu_busy_us") or 0.0
    kernels = a.median("kernels") or 0.0
    launches = a.median("launch_calls") or 0.0
    shorter = a.steps["kernels_shorter_than_launch"].sum() / max(a.steps["kernels"].sum(), 1) * 100.0
    # With the step in one graph, what is left is the GPU's own work plus a small per-kernel cost.
    saving = min(idle_launch, step - step_with_graph_us(busy, kernels, rule))
    predicted = step - saving
    syncs = a.median("host_syncs") or 0.0
    caveat = (
        f" The step has {syncs:.0f} host sync(s) per step (see GA401); a graph cannot capture them, "
        "so they must go first."
        if syncs >= 1
        else ""
    )
    message = (
        f"The GPU is idle {idle_pct:.0f}% of the step waiting for kernel launches: {kernels:.0f} kernels per step, "
        f"GPU busy {100 * busy / step:.0f}%, {shorter:.0f}% of kernels ran shorter than their own launch call. "
        f"Replaying the step as one CUDA graph would take about {predicted:,.0f} µs instead of {step:,.0f} µs.{caveat}"
    )
    evidence = {
        "step_time_us": _r(step),
        "gpu_busy_us": _r(busy),
        "gpu_busy_pct": _r(100 * busy / step),
        "idle_launch_us": _r(idle_launch),
        "idle_launch_pct": _r(idle_pct),
        "kernels_per_step": _r(kernels),
        "launch_calls_per_step": _r(launches),
        "launch_call_us_per_step": _r(a.median("launch_call_us")),
        "kernels_shorter_than_launch_pct": _r(shorter),
        "predicted_step_us_with_graph": _r(predicted),
    }
    return make_finding(rule, a, message, evidence, saving)


def launch_bound_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str]:
    """Against a step timed without the profiler (which stretches launch gaps, not kernels): timed step -
    the graph-replayed step of the evidence's GPU busy time and kernel count."""
    evidence = finding.setdefault("evidence", {})
    with_graph = step_with_graph_us(evidence.get("gpu_busy_us") or 0.0, evidence.get("kernels_per_step") or 0.0, rule)
    saving = timed_us - with_graph
    evidence["timed_step_us"] = _r(timed_us)
    evidence["predicted_step_us_with_graph"] = _r(min(with_graph, timed_us))
    return saving, (
        f"(Step figures from the profiled steps.) Timed without the profiler the step takes {timed_us:,.0f} µs, so "
        f"one graph would save about {max(0.0, saving):,.0f} µs of it."
    )


def underfilled_kernels(a: Analysis, rule: Rule) -> Finding | None:
    sm_count = a.peaks.sm_count
    if not sm_count:
        raise SkipRule("the trace does not say how many SMs the GPU has (no deviceProperties)")
    k = _in_steps(a.kernels)
    # Communication kernels are sized by the collective, not by the SM count: leave them out.
    k = k[(k["blocks"] > 0) & (k["family"] != "communication")]
    if not len(k) or not a.n_steps:
        return None
    max_blocks = rule.threshold("max_waves") * sm_count
    under = k[(k["blocks"] < max_blocks) & (k["bound"].isin(["latency", "launch"]) | (k["blocks"] < sm_count))]
    # A kernel at >= NEAR_ROOF_PCT of its roof is bound by it (memory/compute class), whatever its grid.
    under = under[~(under["pct_of_roof"] >= NEAR_ROOF_PCT)]
    share = 100.0 * under["dur_us"].sum() / k["dur_us"].sum()
    if share < rule.threshold("min_share_of_gpu_time_pct"):
        return None
    bw = a.peaks.hbm_bytes_per_s
    dur = under["dur_us"].to_numpy(float)
    if bw:
        floor = under["bytes"].to_numpy(float) / bw * 1e6
        # Where bytes are unknown, assume half of the idle SMs' share is recoverable.
        fallback = dur * (1 - under["blocks"].to_numpy(float) / sm_count) / 2
        per_kernel = np.where(np.isfinite(floor), np.clip(dur - floor, 0, None), fallback)
    else:
        per_kernel = dur * (1 - under["blocks"].to_numpy(float) / sm_count) / 2
    saving = per_kernel.sum()
    per_step = saving / a.n_steps
    # Per kernel family, so a fix that regenerates some families' kernels (torch.compile writes its own
    # elementwise, normalization and reduction kernels) can claim that part and no more.
    by_family = pd.Series(per_kernel, index=under["family"].to_numpy()).groupby(level=0).sum() / a.n_steps
    # Grouped by name codes (long kernel names hash slowly in pandas), then in name order as groupby("name").
    codes, names = factorize_names(under["name"])
    by_name = under["dur_us"].groupby(codes).sum()
    by_name.index = pd.Index(names[by_name.index.to_numpy()], dtype=object)
    top = by_name.sort_index().sort_values(ascending=False).head(3)
    message = (
        f"{share:.0f}% of GPU time is in kernels whose grid is smaller than one wave "
        f"(median {under['blocks'].median():.0f} blocks on {sm_count} SMs): most SMs idle while they run. "
        f"Largest: {', '.join(short_kernel_name(n) for n in top.index)}."
    )
    evidence = {
        "share_of_gpu_time_pct": _r(share),
        "kernels_per_step": _r(len(under) / a.n_steps),
        "us_per_step": _r(under["dur_us"].sum() / a.n_steps),
        "median_blocks": _r(under["blocks"].median(), 0),
        "sm_count": sm_count,
        "saving_by_family_us": {str(fam): _r(float(v)) for fam, v in by_family.sort_values(ascending=False).items()},
    }
    return make_finding(rule, a, message, evidence, per_step)


def _chains(k: pd.DataFrame, min_length: int, max_intensity: float) -> pd.DataFrame:
    """Kernels in runs of at least ``min_length`` consecutive memory-bound elementwise/normalization kernels
    on one stream within one step, with a ``run_id`` column (kernels sorted by start within a run)."""
    # Under the memory roof by intensity: an issue-bound TensorIterator loop (class compute, roof side memory)
    # is still a kernel a fused one replaces.
    side = k["roof_side"] if "roof_side" in k else k["bound"]
    # cuDNN's layout transposes are GA203's (channels_last removes them; a fused kernel does not).
    layout = match_names(k["name"], LAYOUT_CONVERSION_KERNEL)
    eligible = (
        k["family"].isin(_CHAIN_FAMILIES) & (side != "compute") & ~(k["intensity"] > max_intensity)
    ).to_numpy() & ~layout
    ordered = k.assign(eligible=eligible).sort_values(["step_index", "stream", "ts_us"], kind="stable")
    flags = ordered["eligible"].to_numpy()
    group = ordered["step_index"].to_numpy() * 1_000_003 + ordered["stream"].to_numpy()
    # A run starts at an eligible kernel whose predecessor is ineligible or in another step/stream.
    starts = flags & ~np.concatenate(([False], flags[:-1] & (group[1:] == group[:-1])))
    runs = ordered.assign(run_id=np.cumsum(starts))[flags]
    sizes = runs.groupby("run_id")["run_id"].transform("size").to_numpy()
    return runs[sizes >= min_length]


def elementwise_chain(a: Analysis, rule: Rule) -> Finding | None:
    k = _in_steps(a.kernels)
    if not len(k) or not a.n_steps or not a.step_time_us:
        return None
    chained = _chains(k, int(rule.threshold("min_chain_length")), rule.threshold("max_intensity_flop_per_byte"))
    if not len(chained):
        return None
    runs = chained.groupby("run_id")["dur_us"].agg(["size", "sum", "max"])
    chain_us = runs["sum"].sum() / a.n_steps
    if 100.0 * chain_us / a.step_time_us < rule.threshold("min_share_of_step_pct"):
        return None
    # A fused kernel reads the chain's inputs once and writes its outputs once: about the traffic, and so
    # the time, of the chain's largest member (H200, add+RMSNorm 16384x4096 bf16: eager chain 952 µs,
    # largest member ~130 µs, one fused Triton kernel 133 µs).
    saving = (runs["sum"] - runs["max"]).sum() / a.n_steps
    biggest = chained[chained["run_id"] == runs["sum"].idxmax()]
    ops = [o if isinstance(o, str) else short_kernel_name(n) for o, n in zip(biggest["op"], biggest["name"])]
    per_step = len(runs) / a.n_steps
    message = (
        f"{per_step:.1f} chain(s) per step of {runs['size'].mean():.1f} memory-bound elementwise/normalization "
        f"kernels in a row ({chain_us:,.0f} µs/step, {100 * chain_us / a.step_time_us:.0f}% of the step). Each "
        f"kernel reads and writes whole tensors; fused, a chain would move its data once. "
        f"Largest chain: {' → '.join(ops[:8])}{' → …' if len(ops) > 8 else ''}."
    )
    evidence = {
        "chains_per_step": _r(per_step),
        "kernels_in_chains_per_step": _r(len(chained) / a.n_steps),
        "chain_us_per_step": _r(chain_us),
        "longest_chain": int(runs["size"].max()),
        "largest_chain_us": _r(runs["sum"].max()),
    }
    return make_finding(rule, a, message, evidence, saving)


def fp32_matmul(a: Analysis, rule: Rule) -> Finding | None:
    k = _in_steps(a.kernels)
    if not len(k) or not a.n_steps:
        return None
    cc = a.trace.device.compute_capability if a.trace.device else None
    if cc is not None and cc < (7, 0):
        raise SkipRule("the GPU has no tensor cores (compute capability below 7.0)")
    tensor_core_name = match_names(k["name"], r"(?i)tf32|bf16|f16|fp16|h884|h1688|s16816|tensorop|i8")
    fp32_gemm = (k["family"] == "gemm") & k["dtype"].isin(["float", "c10::Float"]) & ~tensor_core_name
    sel = k[fp32_gemm]
    share = 100.0 * sel["dur_us"].sum() / k["dur_us"].sum() if len(sel) else 0.0
    if share < rule.threshold("min_share_of_gpu_time_pct"):
        return None
    fp32 = peak_flops(a.peaks, "fp32")
    tf32 = peak_flops(a.peaks, "tf32")
    # Compute-bound GEMMs speed up by the ratio of the roofs; assume half when the GPU's peaks are unknown.
    speedup_share = 1 - fp32 / tf32 if fp32 and tf32 else 0.5
    time_per_step = sel["dur_us"].sum() / a.n_steps
    saving = time_per_step * speedup_share
    achieved = sel["flops"].sum() / (sel["dur_us"].sum() * 1e-6) if sel["flops"].notna().any() else None
    message = (
        f"{share:.0f}% of GPU time ({time_per_step:,.0f} µs/step) is fp32 matrix multiplication on the CUDA cores"
        + (f" at {achieved / 1e12:.0f} TFLOP/s" if achieved else "")
        + (
            f"; the tensor cores' TF32 roof is {tf32 / 1e12:.0f} TFLOP/s against {fp32 / 1e12:.0f}"
            if fp32 and tf32
            else ""
        )
        + "."
    )
    evidence = {
        "share_of_gpu_time_pct": _r(share),
        "us_per_step": _r(time_per_step),
        "kernels_per_step": _r(len(sel) / a.n_steps),
        "achieved_tflops": _r(achieved / 1e12) if achieved else None,
        "top_kernel": short_kernel_name(sel.groupby("name")["dur_us"].sum().idxmax()),
        # The kernel time TF32 takes off; on a timed step, fp32_matmul_timed caps it by the host's time.
        "gpu_saving_us": _r(saving),
    }
    return make_finding(rule, a, message, evidence, saving)


def fp32_matmul_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, str | None]:
    """GA301's saving against the timed step. Where the profile timed the step with TF32 on and off in a loop
    (``tf32_step_delta_us``: gpuadvisor.profile.tf32_step_delta, on a step whose host takes half of it or more),
    that measurement is the saving (basis: measured alternative); elsewhere the GPU saving capped by the host's
    time per step (``host_capped_saving``). Why: on the H100, the suite's single-image ViT step (GPU busy 18%)
    ran 9,730 -> 10,072 µs with TF32 while GA301 claimed 2,550 µs from its GPU time alone: its host took about
    370 µs more per step with TF32 on (benchmarks/results/tf32_h100/), which no figure of the trace gives."""
    from gpuadvisor.rules.detectors_model import host_capped_saving
    from gpuadvisor.rules.engine import MEASURED_ALTERNATIVE

    timed = timed or {}
    delta = as_number(timed.get("tf32_step_delta_us"))
    if delta is None:
        return host_capped_saving(finding, timed_us, timed, "TF32")
    evidence = finding.setdefault("evidence", {})
    rounds = timed.get("tf32_step_delta_rounds")
    evidence["tf32_step_delta_us"] = _r(delta)
    evidence["expected_alone_us"] = _r(-delta)
    evidence["basis"] = (
        f"TF32 timed on and off in a loop of this step ({rounds or 'several'} rounds of two blocks; the median of "
        "the rounds' ratios of on to off, less 1, times the timed step), as the tf32 fix sets it"
    )
    finding["saving_basis"] = MEASURED_ALTERNATIVE
    gpu = as_number(evidence.get("gpu_saving_us"))
    gpu_part = f"Its kernels would take {gpu:,.0f} µs less, but timed" if gpu else "Timed"
    if delta <= 0:
        text = (
            f"{gpu_part} with TF32 on and off in a loop, this eager step took {-delta:,.0f} µs less per step "
            "with it on."
        )
    else:
        text = (
            f"{gpu_part} with TF32 on and off in a loop, this eager step took {delta:,.0f} µs more per step with "
            "it on: its host, which bounds the step, takes longer to enqueue TF32's GEMMs. It pays with compile "
            "or graphs, which take the host's time out of the step."
        )
    return max(-delta, 0.0), text


def host_syncs(a: Analysis, rule: Rule) -> Finding | None:
    syncs = a.median("host_syncs") or 0.0
    if syncs < rule.threshold("min_syncs_per_step") or not a.step_time_us:
        return None
    idle = a.median("idle_sync_us") or 0.0
    idle_pct = 100.0 * idle / a.step_time_us
    in_steps = a.host_syncs
    where = []
    for _, row in in_steps.head(3).iterrows():
        hint = _SYNC_OP_HINTS.get(row["op"] or "", row["op"] or row["name"])
        where.append(f"{hint} at {row['source']}" if row["source"] else f"{hint} ({row['name']})")
    message = (
        f"{syncs:.0f} host synchronization(s) per step; the GPU then sits idle {idle:,.0f} µs per step "
        f"({idle_pct:.1f}%) until the host queues more work. From: {'; '.join(where) if where else 'unknown'}."
    )
    evidence = {
        "host_syncs_per_step": _r(syncs),
        "idle_after_sync_us": _r(idle),
        "idle_after_sync_pct": _r(idle_pct),
        "sources": [
            {"call": r["name"], "op": r["op"], "source": r["source"], "count": int(r["count"])}
            for _, r in in_steps.head(5).iterrows()
        ],
    }
    severity = None if idle_pct >= rule.threshold("min_idle_pct") else "low"
    return make_finding(rule, a, message, evidence, idle, severity=severity)


def host_syncs_timed(
    finding: dict, rule: Rule, timed_us: float, profiled_us: float | None, timed: dict | None = None
) -> tuple[float, None]:
    """The idle time after syncs is host-side time, which the profiler's overhead stretches: scaled by
    timed / profiled step."""
    saving = finding.get("estimated_saving_us_per_step") or 0.0
    if profiled_us and profiled_us > timed_us:
        saving = saving * timed_us / profiled_us
    return saving, None


def pageable_copies(a: Analysis, rule: Rule) -> Finding | None:
    t = _in_steps(a.transfers)
    t = t[t["pageable"] & (t["op"] == "memcpy")]
    if not len(t) or not a.n_steps or not a.step_time_us:
        return None
    bytes_per_step = t["bytes"].clip(lower=0).sum() / a.n_steps
    us_per_step = t["dur_us"].sum() / a.n_steps
    if bytes_per_step < rule.threshold("min_bytes_per_step"):
        return None
    if 100.0 * us_per_step / a.step_time_us < rule.threshold("min_share_of_step_pct"):
        return None
    link = a.peaks.host_link_bytes_per_s
    # Pinned copies reach ~80% of the host link (PCIe Gen5 x16 on an H200 host); without a link figure,
    # assume pinned copies take half as long.
    pinned_us = bytes_per_step / (0.8 * link) * 1e6 if link else us_per_step / 2
    saving = max(0.0, us_per_step - pinned_us)
    achieved = t["bytes"].clip(lower=0).sum() / (t["dur_us"].sum() * 1e-6)
    # Name the user's source line of each copy through its launch call: the frame gives the function, its
    # source the .to( / .cpu() call. Every copy of the step is looked up (pinned ones too), so that the n-th
    # copy of a call of the function can be matched to the n-th copy call in its body.
    rt = a.trace.runtime
    in_steps = _in_steps(a.transfers)
    copies = in_steps[in_steps["op"] == "memcpy"][["correlation", "direction", "pageable"]]
    launches = rt[["ts_us", "tid", "correlation"]].merge(copies, on="correlation").sort_values("ts_us").head(200)
    kinds = [DIRECTION_KINDS.get(d) for d in launches["direction"]]
    located = call_sources(a.frames, launches["ts_us"], launches["tid"], kinds)
    sources = []
    for where, pageable in zip(located, launches["pageable"]):
        if where and pageable and where not in sources:
            sources.append(where)
    directions = ", ".join(sorted(set(t["direction"])))
    message = (
        f"{len(t) / a.n_steps:.0f} copy(ies) per step from/to pageable host memory ({directions}, "
        f"{bytes_per_step / 1e6:,.1f} MB/step, {us_per_step:,.0f} µs/step at {achieved / 1e9:.1f} GB/s); the host "
        f"blocks on each and the copy cannot overlap compute."
        + (f" From: {'; '.join(sources[:3])}." if sources else "")
    )
    evidence = {
        "copies_per_step": _r(len(t) / a.n_steps),
        "bytes_per_step": int(bytes_per_step),
        "us_per_step": _r(us_per_step),
        "achieved_gb_per_s": _r(achieved / 1e9, 2),
        "sources": sources[:5],
    }
    return make_finding(rule, a, message, evidence, saving)
