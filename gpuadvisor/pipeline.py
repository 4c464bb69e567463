"""The analyze pipeline: trace file -> tables -> analyses -> findings -> report dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError


def analyze_trace_object(
    trace,
    *,
    peaks_file=None,
    rules=None,
    command: str = "analyze",
    env: dict[str, Any] | None = None,
    all_ranks=None,
) -> dict[str, Any]:
    """Analyze an already-loaded single-rank :class:`Trace` into a report dict (built-in rules by default).

    ``all_ranks``: the multi-rank :class:`Trace` that ``trace`` is one rank of. The distributed analysis of it
    is attached to the analysis as ``distributed`` for the GA7xx rules and the report's ``ranks`` section.
    """
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.device.calibrate import load_calibration
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.report.build import build_report
    from gpuadvisor.rules.engine import load_rules, run_rules

    if rules is None:
        rules = load_rules()
    device = trace.device
    calibration = load_calibration(device.name) if device is not None else None  # `gpuadvisor calibrate`'s cache
    peaks = lookup_peaks(device, peaks_file, calibration=calibration)
    import numpy as np

    # A trace's zero-length kernels or 1e308 timestamps give NaN and inf shares, which the analyses and the
    # report treat as unknown: numpy's warnings about them are not the user's business on a successful run.
    with np.errstate(all="ignore"):
        analysis = analyze_trace(trace, peaks)
        if all_ranks is not None and len(all_ranks.ranks) > 1:
            from gpuadvisor.analysis.distributed import distributed_analysis

            analysis.distributed = distributed_analysis(all_ranks, {trace.ranks[0]: analysis.steps})
            analysis.notes.extend(analysis.distributed.notes)
        findings, skipped = run_rules(analysis, rules)
        return build_report(analysis, findings, skipped, command=command, env=env)


def analyze_path(path: str | Path, *, peaks_file=None, rules_dir=None, rank: int | None = None) -> dict[str, Any]:
    """Load a trace (file or folder of rank files) and analyze one rank of it.

    A folder of several ranks without ``rank`` gives rank 0's report (the lowest rank) plus a ``ranks``
    section comparing all ranks and the distributed rules' findings; with ``rank`` only that rank.
    """
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.rules.engine import load_rules
    from gpuadvisor.trace.kineto import load_trace

    rules = load_rules(rules_dir)  # a bad --rules folder or --peaks file fails before the trace is read
    if peaks_file is not None:
        lookup_peaks(None, peaks_file)
    trace = load_trace(path)
    notes = []
    all_ranks = None
    if len(trace.ranks) > 1:
        chosen = trace.ranks[0] if rank is None else rank
        if chosen not in trace.ranks:
            raise BadInputError(f"{path}: no rank {chosen} (ranks: {', '.join(map(str, trace.ranks))})")
        if rank is None:
            all_ranks = trace
            notes.append(
                f"{len(trace.ranks)} ranks in {path}; kernels, steps and per-rank findings cover rank {chosen} "
                "(use --rank N for another), the ranks table and the distributed rules (GA7xx) all ranks"
            )
        else:
            notes.append(f"{len(trace.ranks)} ranks in {path}; this report covers rank {chosen} (use --rank N)")
        trace = trace.for_rank(chosen)
    elif rank is not None and rank not in trace.ranks:
        raise BadInputError(f"{path}: no rank {rank} (the trace is rank {trace.ranks[0]})")
    if not trace.has_gpu_activity:
        if trace.other_device_events:
            raise BadInputError(
                f"{path}: no CUDA/HIP GPU kernels in this trace ({trace.other_device_events} events of another "
                "accelerator type, which gpuadvisor does not analyze)"
            )
        if len(trace.runtime):
            raise BadInputError(
                f"{path}: no GPU kernels in this trace ({len(trace.runtime)} CUDA runtime calls but no kernel or "
                "memcpy records: CUPTI activity tracing was off, e.g. a counters-only or range profile)"
            )
        raise BadInputError(
            f"{path}: no GPU kernels in this trace (CPU-only profile; record with ProfilerActivity.CUDA)"
        )
    report = analyze_trace_object(trace, peaks_file=peaks_file, rules=rules, all_ranks=all_ranks)
    report["notes"] = notes + report["notes"]
    return report
