"""``profile`` of several ranks (``--nproc N``, or run by torchrun): every rank runs the single-GPU phases of
:mod:`gpuadvisor.profile` in lockstep, then the ranks are merged into one report.

Output folder of N ranks: report.json, report.md and report.html (merged: rank 0's report plus the `ranks`
table of every rank and the distributed rules' findings) and rank0/ … rank{N-1}/, each one rank's own
single-rank output (trace.json.gz, report.json, report.md, report.html, nvml.csv). docs/distributed.md
describes both ways to run. Torch is imported inside the functions.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError
from gpuadvisor.outputs import check_out_dir, discard_staging, make_staging, publish, staged_output
from gpuadvisor.profile import MIN_TIMING_S, OUTPUT_FILES, REPORT_FILES, measure, profile_and_report
from gpuadvisor.progress import ProgressDisplay
from gpuadvisor.report.profiled import TRACE_FILE
from gpuadvisor.stats import finite_round
from gpuadvisor.steps import build_workload, step_runner

RANK_DIR_PATTERN = re.compile(r"rank\d+")
# How close the trace's per-rank step times must come to the CUDA-event medians for the report to call them
# in agreement. It is the acceptance line, not a measured bound: benchmarks/ddp_profile_check.py
# measures the difference for examples/ddp_train.py on two H200s.
STEP_AGREEMENT_PCT = 5.0
DISTRIBUTED_CATEGORY = "distributed"
_MERGE_DIR = ".merge"


@dataclass(frozen=True)
class RankOptions:
    """What every rank needs to run the profile (the parent hands them to the ranks as arguments)."""

    model_path: Path
    entry: str | None
    warmup: int
    timed_steps: int
    profiled_steps: int
    out_dir: Path
    peaks_file: Path | None
    rules_dir: Path | None
    nvml: bool
    min_time_s: float = MIN_TIMING_S

    def child_args(self) -> list[str]:
        """The arguments of ``python -m gpuadvisor.distributed_child`` (paths absolute: ranks may run elsewhere)."""
        args = [
            str(self.model_path.absolute()),
            f"--warmup={self.warmup}",
            f"--steps={self.timed_steps}",
            f"--profile-steps={self.profiled_steps}",
            f"--min-time={self.min_time_s}",
            f"--out={self.out_dir.absolute()}",
        ]
        if self.entry is not None:
            args.append(f"--entry={self.entry}")
        if self.peaks_file is not None:
            args.append(f"--peaks={self.peaks_file.absolute()}")
        if self.rules_dir is not None:
            args.append(f"--rules={self.rules_dir.absolute()}")
        if not self.nvml:
            args.append("--no-nvml")
        return args


def check_ranks_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` that is a file, or a folder holding anything but an earlier multi-rank profile's
    outputs (report.json, report.md, report.html and rank<N>/ folders of the single-rank output files)."""

    def ours(path: Path) -> bool:
        if path.is_symlink():
            return False
        if path.is_file():
            return path.name in REPORT_FILES
        if path.is_dir() and RANK_DIR_PATTERN.fullmatch(path.name):
            return all(p.is_file() and not p.is_symlink() and p.name in OUTPUT_FILES for p in path.iterdir())
        return False

    check_out_dir(out_dir, command="multi-rank profile", ours=ours)


def launch_ranks(options: RankOptions, nproc: int, rules, *, progress: bool, show_rank_output: bool) -> dict[str, Any]:
    """``profile --nproc N``: run N ranks under torchrun (:mod:`gpuadvisor.capture.distributed`), wait for all
    of them, merge. A rank that fails: the error names it (exit 3, or 2 for bad input); Ctrl-C: every rank is
    stopped; either way nothing is left behind."""
    from gpuadvisor.capture import distributed as launcher
    from gpuadvisor.report.write import write_reports

    if not options.model_path.exists():
        raise BadInputError(f"{options.model_path}: no such file")
    check_ranks_out_dir(options.out_dir)
    import torch

    cuda = torch.cuda.is_available()
    launcher.check_nproc(nproc, cuda, torch.cuda.device_count() if cuda else 0)

    with staged_output(options.out_dir, check_ranks_out_dir) as staged:
        staging = staged.path
        control = staging / launcher.CONTROL_DIR
        control.mkdir()
        log_path = None if show_rank_output else control / "torchrun.log"
        child_args = [*options.child_args(), f"--staging={staging}"]
        with ProgressDisplay(progress) as display:
            display.phase(f"{nproc} rank(s): starting")

            def poll() -> None:
                phase = launcher.current_phase(control)
                if phase:
                    display.describe(f"{nproc} rank(s): {phase}")

            code = launcher.run_ranks(nproc, child_args, control, log_path=log_path, on_poll=poll)
            if code != 0:
                raise launcher.first_failure(control, code, log_path)
            display.phase("merging ranks")
            report = _merge_ranks(staging, nproc, options, rules, how=f"gpuadvisor profile --nproc {nproc}")
        shutil.rmtree(control)
        write_reports(report, staging)
        staged.publish()
    return report


def profile_rank(
    options: RankOptions,
    info,
    rules,
    staging_for: Callable[[Any], Path],
    *,
    control_dir: Path | None = None,
    progress: bool = False,
) -> tuple[dict[str, Any], Any]:
    """One rank's profile: the single-GPU phases in lockstep with the other ranks, written to
    ``<staging>/rank{r}/``. ``staging_for(group)`` gives the staging folder (called on every rank after the
    process group exists). Returns (this rank's report, the coordination group)."""
    from gpuadvisor.capture import distributed as ranks

    ranks.turn_off_nvlink_multicast()  # before NCCL starts, i.e. before the user's build()
    cuda = ranks.select_device(info)  # before build(): device="cuda" is this rank's GPU

    def tell(phase: str) -> None:
        ranks.write_control(control_dir, info.rank, "phase", phase)

    with ProgressDisplay(progress, on_phase=tell) as display:
        workload, label = build_workload(options.model_path, options.entry, display)
        backend = ranks.ensure_process_group(cuda)
        group = ranks.coordination_group()
        staging = Path(staging_for(group))
        ranks.barrier(group)  # every rank has built its model
        run_step = step_runner(workload.step_fn)
        measured = measure(
            run_step,
            label,
            cuda,
            options.warmup,
            options.timed_steps,
            options.nvml,
            display,
            before_timing=lambda: ranks.barrier(group),  # the ranks start timing together
            agree_steps=lambda count: ranks.max_over_ranks(count, group),
            min_time_s=options.min_time_s,
        )
        ranks.barrier(group)  # and profiling
        folder = staging / f"rank{info.rank}"
        folder.mkdir()
        facts = {
            "rank": info.rank,
            "world_size": info.world_size,
            "local_rank": info.local_rank,
            "backend": backend,
        }

        def annotate(report: dict[str, Any]) -> None:
            report["distributed"] = facts

        report = profile_and_report(
            workload,
            run_step,
            folder,
            measured,
            options.model_path,
            options.out_dir / folder.name,
            options.profiled_steps,
            rules,
            options.peaks_file,
            cuda,
            display,
            annotate=annotate,
        )
    return report, group


def profile_under_torchrun(options: RankOptions, info, rules, *, progress: bool) -> dict[str, Any] | None:
    """This process is one rank of ``torchrun -m gpuadvisor profile``: rank 0 makes the staging folder and
    tells the others, every rank profiles itself into it, rank 0 merges after a barrier and publishes.
    Returns the merged report on rank 0, None on the others. Errors name the rank. Best effort on failure:
    torchrun stops the other ranks; the failing rank and rank 0 both remove the staging folder."""
    import signal
    import threading

    from gpuadvisor.capture import distributed as ranks
    from gpuadvisor.errors import GpuAdvisorError

    if info.rank == 0:
        check_ranks_out_dir(options.out_dir)
    state: dict[str, Any] = {"staging": None, "created": []}

    def staging_for(group) -> Path:
        path = None
        if info.rank == 0:
            state["staging"], state["created"] = make_staging(options.out_dir)
            path = str(state["staging"])
        path = ranks.broadcast_text(path, group)
        state["staging"] = Path(path)
        return state["staging"]

    def interrupted(signum, frame) -> None:
        # torchrun stops the ranks with SIGTERM: clean up as after Ctrl-C. interrupt.Interrupted (a
        # KeyboardInterrupt) so one landing inside a finalizer is re-delivered, not printed and lost.
        from gpuadvisor import interrupt

        raise interrupt.Interrupted(signum)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, interrupted)
    published = False
    try:
        try:
            _, group = profile_rank(options, info, rules, staging_for, progress=progress and info.rank == 0)
            ranks.barrier(group)  # every rank has written its folder
            _destroy_process_group()
            if info.rank != 0:
                return None
            report = _merge_ranks(
                state["staging"],
                info.world_size,
                options,
                rules,
                how=f"torchrun --nproc-per-node {info.local_world_size} -m gpuadvisor profile",
            )
            from gpuadvisor.report.write import write_reports

            write_reports(report, state["staging"])
            publish(state["staging"], options.out_dir, check_ranks_out_dir)
            published = True
            return report
        except GpuAdvisorError as error:
            raise type(error)(f"rank {info.rank}: {error}") from error.__cause__
    finally:
        if not published and state["staging"] is not None and (info.rank == 0 or sys.exc_info()[0] is not None):
            discard_staging(state["staging"], state["created"])
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _merge_ranks(staging: Path, world_size: int, options: RankOptions, rules, *, how: str) -> dict[str, Any]:
    """The top-level report of N ranks: rank 0's own report, its source widened to all ranks, plus the `ranks`
    table (the trace analysis of every rank beside each rank's CUDA-event timing) and the distributed rules'
    findings over all ranks (GPU traces only: they need NCCL kernels)."""
    import copy

    from gpuadvisor.capture.distributed import read_rank_reports

    rank_reports = read_rank_reports(staging, world_size)
    report = copy.deepcopy(rank_reports[0])
    facts = report.pop("distributed", None) or {}
    backend = facts.get("backend")
    on_gpu = bool(report.get("kernels")) or report.get("env", {}).get("device") != "cpu"
    multi = _multi_rank_analysis(staging, world_size, options, rules, report["env"]) if on_gpu else None

    rows_by_rank = {row["rank"]: row for row in (multi or {}).get("ranks", {}).get("rows", [])}
    rows = [_rank_row(rank, rank_reports[rank], rows_by_rank.get(rank)) for rank in range(world_size)]
    differences = [abs(row["trace_vs_timed_pct"]) for row in rows if row["trace_vs_timed_pct"] is not None]
    worst = max(differences) if differences else None
    section = {
        "world_size": world_size,
        "backend": backend,
        "launcher": how,
        "matched_steps": [],
        "step_basis": "each rank's profiled steps (ProfilerStep windows), median",
        "rows": rows,
        "straggler": None,
        "straggler_excess_wait_us_per_step": None,
        "straggler_excess_wait_pct": None,
        "timing_agreement": {
            "tolerance_pct": STEP_AGREEMENT_PCT,
            "max_abs_difference_pct": finite_round(worst),
            "within_tolerance": None if worst is None else worst <= STEP_AGREEMENT_PCT,
        },
    }
    if multi is not None and "ranks" in multi:
        for key in (
            "matched_steps",
            "step_basis",
            "straggler",
            "straggler_excess_wait_us_per_step",
            "straggler_excess_wait_pct",
        ):
            section[key] = multi["ranks"].get(key)
    report["ranks"] = section

    distributed_ids = {rule.id for rule in rules if rule.category == DISTRIBUTED_CATEGORY}
    findings = [f for f in report.get("findings", []) if f.get("rule_id") not in distributed_ids]
    skipped = [s for s in report.get("skipped_rules", []) if s.get("rule_id") not in distributed_ids]
    if multi is not None and world_size > 1:
        findings += [_against_timed_step(f, report) for f in multi["findings"] if f.get("rule_id") in distributed_ids]
        skipped += [s for s in multi.get("skipped_rules", []) if s.get("rule_id") in distributed_ids]
    else:
        why = (
            "one rank: nothing to compare"
            if world_size == 1
            else f"CPU ranks ({backend or 'gloo'}): the traces hold no GPU communication (NCCL) kernels, which the "
            "exposed-communication and straggler analyses measure"
        )
        skipped += [{"rule_id": rule_id, "reason": why} for rule_id in sorted(distributed_ids)]
    from gpuadvisor.rules.engine import combined_estimate, rank_key

    findings.sort(key=rank_key)
    report["findings"] = findings
    report["summary"].update(combined_estimate(findings, report["summary"]))
    report["skipped_rules"] = skipped
    if findings:
        report["summary"]["top_finding"] = findings[0]["rule_id"]
    report["summary"]["world_size"] = world_size

    source = report.setdefault("source", {})
    source["path"] = str(options.out_dir)
    source["ranks"] = list(range(world_size))
    source["events"] = sum(int((r.get("source") or {}).get("events") or 0) for r in rank_reports.values())
    source["size_bytes"] = sum(int((r.get("source") or {}).get("size_bytes") or 0) for r in rank_reports.values())
    source["rank_folders"] = [f"rank{rank}" for rank in range(world_size)]

    own_notes = [n for n in report.get("notes", []) if not str(n).startswith("wrote ")]
    report["notes"] = [
        f"{world_size} rank(s), process group backend {backend or 'unknown'}, run by `{how}`: the summary, kernels, "
        "steps and per-rank findings are rank 0's (rank0/report.json; each rank's own report is in rank<N>/); the "
        "ranks table compares every rank"
        + (", and the distributed rules (GA7xx) cover all ranks" if world_size > 1 else ""),
        _agreement_note(rows, worst),
        *own_notes,
        f"wrote {options.out_dir}: report.json, report.md, report.html, "
        + ", ".join(f"rank{rank}/" for rank in range(world_size))
        + " (each: trace.json.gz, report.json, report.md, report.html, nvml.csv when NVML sampled)",
    ]
    from gpuadvisor.report.json import to_plain
    from gpuadvisor.report.schema import check_report

    report = to_plain(report)
    check_report(report)  # rank 0's report with the ranks' sections: still the schema's shape
    return report


def _multi_rank_analysis(staging: Path, world_size: int, options: RankOptions, rules, env) -> dict[str, Any]:
    """The folder analysis of `gpuadvisor analyze` over every rank's trace (rank 0's view plus the ranks table
    and the distributed rules), from a temporary folder of links to the rank traces."""
    from gpuadvisor.pipeline import analyze_trace_object
    from gpuadvisor.trace.kineto import load_trace

    merge_dir = staging / _MERGE_DIR
    merge_dir.mkdir()
    try:
        for rank in range(world_size):
            source = staging / f"rank{rank}" / TRACE_FILE
            target = merge_dir / f"rank{rank:05d}.json.gz"  # sorted as the ranks are when a trace names none
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        trace = load_trace(merge_dir)
        first = trace.ranks[0]
        one = trace.for_rank(first) if len(trace.ranks) > 1 else trace
        return analyze_trace_object(
            one, peaks_file=options.peaks_file, rules=rules, command="profile", env=env, all_ranks=trace
        )
    finally:
        shutil.rmtree(merge_dir, ignore_errors=True)


def _rank_row(rank: int, rank_report: dict[str, Any], trace_row: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the merged `ranks` table: the trace figures (the multi-rank analysis's row on GPUs; the rank's
    own profiled steps otherwise) beside the rank's timed steps."""
    summary = rank_report.get("summary") or {}
    if trace_row is not None:
        row = dict(trace_row)
    else:
        row = {
            "rank": rank,
            "steps": summary.get("steps"),
            "step_time_us": summary.get("trace_step_time_us"),
            "gpu_busy_pct": summary.get("gpu_busy_pct"),
            "compute_us_per_step": None,
            "communication_us_per_step": None,
            "exposed_communication_us_per_step": None,
            "overlapped_communication_us_per_step": None,
            "collectives_per_step": None,
            "communication_us_total": None,
            "exposed_communication_us_total": None,
        }
    timed = summary.get("step_time_us")
    trace_step = row.get("step_time_us")
    row.update(
        timed_step_time_us=timed,
        timed_step_p10_us=summary.get("step_time_p10_us"),
        timed_step_p90_us=summary.get("step_time_p90_us"),
        timed_steps=summary.get("timed_steps"),
        step_time_source=summary.get("step_time_source"),
        trace_vs_timed_pct=finite_round(100.0 * (trace_step - timed) / timed) if trace_step and timed else None,
        folder=f"rank{rank}",
    )
    return row


def _against_timed_step(finding: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A distributed finding's saving clipped to, and expressed as a share of, rank 0's timed step (as
    :func:`_rescale_savings` does for the other findings)."""
    timed = (report.get("summary") or {}).get("step_time_us")
    if not timed:
        return finding
    saving = min(max(0.0, float(finding.get("estimated_saving_us_per_step") or 0.0)), float(timed))
    finding["estimated_saving_us_per_step"] = round(saving, 1)
    finding["estimated_saving_pct"] = round(100.0 * saving / timed, 1)
    return finding


def _agreement_note(rows: list[dict[str, Any]], worst: float | None) -> str:
    if worst is None:
        return "per-rank step times from the trace could not be compared with the timed ones (a figure is missing)"
    pairs = ", ".join(
        f"rank {row['rank']} {_us_text(row.get('step_time_us'))} vs {_us_text(row.get('timed_step_time_us'))}"
        for row in rows[:8]
    )
    verdict = (
        f"agree within {STEP_AGREEMENT_PCT:.0f}%"
        if worst <= STEP_AGREEMENT_PCT
        else f"do NOT agree within {STEP_AGREEMENT_PCT:.0f}% (the profiler slows the host; a step bound by the "
        "host's launches or, on the CPU, by the operators themselves, stretches under it)"
    )
    return (
        f"per-rank step times, profiled trace vs timed without the profiler (median): {pairs}; largest difference "
        f"{worst:.1f}%: they {verdict}"
    )


def _us_text(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):,.0f} µs"
