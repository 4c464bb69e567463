"""Turn an :class:`~gpuadvisor.analysis.bundle.Analysis` and its findings into the report dict (schema v1).

The dict is what every writer renders (terminal, JSON, Markdown) and what ``compare`` reads back.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuadvisor.analysis.bundle import Analysis
from gpuadvisor.analysis.timeline import long_host_calls, step_timeline, sync_calls
from gpuadvisor.report.json import to_plain
from gpuadvisor.report.schema import assemble_report
from gpuadvisor.rules.engine import Finding, combined_estimate

clean = to_plain


def _round(x: Any, digits: int = 2) -> Any:
    x = clean(x)
    return round(x, digits) if isinstance(x, float) else x


def build_report(
    analysis: Analysis,
    findings: list[Finding],
    skipped: list[dict[str, str]],
    *,
    command: str = "analyze",
    env: dict[str, Any] | None = None,
    top_kernels: int = 50,
) -> dict[str, Any]:
    a = analysis
    trace = a.trace
    device = trace.device
    steps = a.steps
    step_time = a.step_time_us
    n = a.n_steps

    def per_step(column: str) -> float | None:
        return _round(a.median(column))

    kernels_rows = a.kernels
    shorter_pct = None
    if len(kernels_rows):
        known = kernels_rows["launch_dur_us"].notna()
        if known.any():
            shorter_pct = 100.0 * float((kernels_rows["dur_us"] < kernels_rows["launch_dur_us"])[known].mean())
    memcpy_per_step = None
    if n and len(a.transfers):
        t = a.transfers
        memcpy_per_step = float(t.loc[t["step_index"] >= 0, "dur_us"].sum()) / n

    summary = {
        "steps": n,
        "step_time_us": _round(step_time),
        "samples_us": [_round(x) for x in steps["step_time_us"]] if n else [],
        "step_time_source": (
            "whole trace (no ProfilerStep annotations)"
            if a.synthetic_step
            else "trace ProfilerStep annotations (under the profiler)"
        )
        if n
        else None,
        "gpu_busy_us": per_step("gpu_busy_us"),
        "gpu_busy_pct": per_step("gpu_busy_pct"),
        "kernels_per_step": per_step("kernels"),
        "idle_launch_us": per_step("idle_launch_us"),
        "idle_sync_us": per_step("idle_sync_us"),
        "idle_other_us": per_step("idle_other_us"),
        "host_syncs_per_step": per_step("host_syncs"),
        "launch_calls_per_step": per_step("launch_calls"),
        "launch_call_us_per_step": per_step("launch_call_us"),
        "median_queue_depth": per_step("median_queue_depth"),
        "kernels_shorter_than_launch_pct": _round(shorter_pct),
        "memcpy_us_per_step": _round(memcpy_per_step),
        "kernel_us_per_step": _round(sum(_class_totals(a).values())) if n and len(kernels_rows) else None,
        "top_finding": findings[0].rule_id if findings else None,
    }
    finding_rows = [clean(asdict(f)) for f in findings]
    summary.update(combined_estimate(finding_rows, summary))
    peaks = a.peaks
    report = {
        "source": {
            "path": trace.source,
            "ranks": list(trace.ranks),
            "events": trace.event_count,
            "size_bytes": trace.size_bytes,
        },
        "env": {
            "gpu_name": device.name if device else None,
            "sm_count": device.sm_count if device else None,
            "compute_capability": f"{device.compute_capability[0]}.{device.compute_capability[1]}"
            if device and device.compute_capability
            else None,
            "driver": _cuda_version(trace.metadata.get("cuda_driver_version")),
            "cuda": _cuda_version(trace.metadata.get("cuda_runtime_version")),
            "torch": None,
            "triton": None,
            "clocks": None,
            **(env or {}),
        },
        "peaks": {
            "gpu": peaks.gpu,
            "known": peaks.known,
            "source": peaks.source,
            "hbm_bytes_per_s": peaks.hbm_bytes_per_s,
            "flops_per_s": dict(peaks.flops_per_s),
        },
        "summary": summary,
        "steps": [
            {
                "step": int(r.step),
                "start_us": _round(r.start_us, 3),
                "step_time_us": _round(r.step_time_us),
                "gpu_busy_us": _round(r.gpu_busy_us),
                "gpu_busy_pct": _round(r.gpu_busy_pct),
                "idle_launch_us": _round(r.idle_launch_us),
                "idle_sync_us": _round(r.idle_sync_us),
                "idle_other_us": _round(r.idle_other_us),
                "kernels": int(r.kernels),
                "host_syncs": int(r.host_syncs),
            }
            for r in steps.itertuples()
        ],
        "timeline": _timeline(a),
        "kernels": [
            {
                "name": r.name,
                "family": r.family,
                "count": int(r.count),
                "count_per_step": _round(r.count_per_step),
                "total_us": _round(r.total_us),
                "us_per_step": _round(r.us_per_step),
                "mean_us": _round(r.mean_us, 3),
                "pct_of_gpu_time": _round(r.pct_of_gpu_time),
                "flops": _round(r.flops, 0),
                "bytes": _round(r.bytes, 0),
                "intensity": _round(r.intensity, 3),
                "achieved_flops_per_s": _round(r.achieved_flops_per_s, 0),
                "achieved_bytes_per_s": _round(r.achieved_bytes_per_s, 0),
                "bound": r.bound,
                "pct_of_roof": _round(r.pct_of_roof, 1),
                "estimated": bool(r.estimated),
                "blocks": None if clean(r.blocks) is None or r.blocks < 0 else int(r.blocks),
                "dtype": clean(r.dtype),
                "bytes_basis": clean(r.bytes_basis),
                "roof_note": clean(r.roof_note),
            }
            for r in a.kernel_names.head(top_kernels).itertuples()
        ]
        if len(a.kernel_names)
        else [],
        "kernel_classes": _class_totals(a),
        "transfers": [
            {
                "direction": r.direction,
                "src_kind": r.src_kind,
                "dst_kind": r.dst_kind,
                "count": int(r.count),
                "count_per_step": _round(r.count_per_step),
                "bytes": int(r.bytes),
                "bytes_per_step": _round(r.bytes_per_step, 0),
                "total_us": _round(r.total_us),
                "us_per_step": _round(r.us_per_step),
                "bytes_per_s": _round(r.bytes_per_s, 0),
                "pageable": bool(r.pageable),
                "sync": bool(r.sync),
            }
            for r in a.transfer_groups.itertuples()
        ],
        "host_syncs": [
            {
                "name": r.name,
                "op": clean(r.op),
                "source": clean(r.source),
                "count": int(r.count),
                "total_us": _round(r.total_us),
                "per_step": _round(r.count / n) if n else None,
            }
            for r in a.host_syncs.itertuples()
        ],
        "findings": finding_rows,
        "skipped_rules": skipped,
        "notes": list(a.notes),
    }
    ranks = _ranks_section(a)
    if ranks is not None:
        report["ranks"] = ranks
    return assemble_report(command, clean(report))


def _ranks_section(a: Analysis) -> dict[str, Any] | None:
    """All ranks side by side, when the analysis carries a multi-rank ``distributed`` table (a folder of
    per-rank traces analyzed without --rank): :mod:`gpuadvisor.analysis.distributed` defines the figures.

    {matched_steps [int] (ProfilerStep numbers every rank has; empty: whole-trace figures), step_basis (str),
    rows [{rank, steps, step_time_us, gpu_busy_pct, compute_us_per_step, communication_us_per_step,
    exposed_communication_us_per_step, overlapped_communication_us_per_step, collectives_per_step,
    communication_us_total, exposed_communication_us_total}], straggler (rank or None),
    straggler_excess_wait_us_per_step, straggler_excess_wait_pct (of the straggler's step)}
    """
    d = getattr(a, "distributed", None)
    if d is None:
        return None
    straggler = d.straggler or {}
    return {
        "matched_steps": [int(s) for s in d.matched_steps],
        "step_basis": "median over the ProfilerStep numbers every rank has"
        if d.matched_steps
        else "each rank's whole trace (the ranks share no ProfilerStep number)",
        "rows": [
            {
                "rank": int(r.rank),
                "steps": int(r.steps),
                "step_time_us": _round(r.step_time_us),
                "gpu_busy_pct": _round(r.gpu_busy_pct),
                "compute_us_per_step": _round(r.compute_us_per_step),
                "communication_us_per_step": _round(r.communication_us_per_step),
                "exposed_communication_us_per_step": _round(r.exposed_communication_us_per_step),
                "overlapped_communication_us_per_step": _round(r.overlapped_communication_us_per_step),
                "collectives_per_step": _round(r.collectives_per_step),
                "communication_us_total": _round(r.communication_us_total),
                "exposed_communication_us_total": _round(r.exposed_communication_us_total),
            }
            for r in d.rank_table.itertuples()
        ],
        "straggler": straggler.get("rank"),
        "straggler_excess_wait_us_per_step": _round(straggler.get("excess_wait_us_per_step")),
        "straggler_excess_wait_pct": _round(straggler.get("excess_wait_pct")),
    }


def _timeline(a: Analysis) -> dict[str, Any] | None:
    """One step's GPU intervals for the report's timeline strip (:func:`~gpuadvisor.analysis.timeline.step_timeline`:
    the profiled step nearest the median); None without steps."""
    syncs = a.syncs if a.syncs is not None else sync_calls(a.trace)
    return step_timeline(a.steps, a.activities, syncs, long_host_calls(a.trace))


def _cuda_version(value: Any) -> str | None:
    """Kineto writes CUDA versions as integers, 1000 * major + 10 * minor (12040 = 12.4)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None if value is None else str(value)
    value = int(value)
    return f"{value // 1000}.{(value % 1000) // 10}"


def _class_totals(a: Analysis) -> dict[str, float]:
    """GPU kernel time per step by roofline class (µs)."""
    k = a.kernels
    if not len(k) or not a.n_steps:
        return {}
    inside = k[k["step_index"] >= 0]
    totals = inside.groupby("bound")["dur_us"].sum() / a.n_steps
    return {str(c): round(float(v), 2) for c, v in totals.items()}
