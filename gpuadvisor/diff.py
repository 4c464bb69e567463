"""``gpuadvisor diff``: what changed between two Kineto traces, kernel by kernel and operator by operator.

Both traces go through the same reader and step attribution as ``analyze``. Per name, each side's total
time is divided by its number of steps:

- GPU rows (kernels, memcpys, memsets, keyed by kind and name): the activities of the ProfilerStep
  windows, each attributed to the step in which it was launched (its own start when the launch is
  unknown), as in :func:`gpuadvisor.analysis.linking.gpu_activities`;
- CPU operator rows (``cpu_op`` events, by name): the operators starting inside a ProfilerStep window,
  by inclusive (total) time, so a parent operator includes its children.

When both traces have ProfilerStep annotations the figures are per step ("per step"); when either lacks
them every event of each trace counts and the figures are per trace ("per trace").

Each side's step time is the one ``analyze`` reports (:func:`gpuadvisor.analysis.timeline.median_step_time_us`
of :func:`~gpuadvisor.analysis.timeline.step_breakdown`): the median step window, which runs to the end of
the GPU work launched in the step, not the ProfilerStep annotation's CPU span alone (on
sample_traces/gemm.json.gz the annotation lasts 459 µs, the step's GPU work 6,986 µs). Without ProfilerStep
annotations it is the whole trace, as ``analyze`` treats it.

Each row: name, kind, status ("added": only in current, "removed": only in base, "slower", "faster",
"unchanged"), base_us_per_step, current_us_per_step, change_us_per_step (current - base),
change_pct (None for added rows), base_count_per_step, current_count_per_step. Rows are sorted by
|change_us_per_step|, largest first, then by name.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import assign_steps, gpu_activities, step_windows
from gpuadvisor.analysis.timeline import median_step_time_us, step_breakdown
from gpuadvisor.errors import BadInputError
from gpuadvisor.report.formatting import MISSING, format_count, format_us
from gpuadvisor.report.sections import Column, Table, distinct_short_names
from gpuadvisor.textsafe import escape_control
from gpuadvisor.trace.kineto import load_trace
from gpuadvisor.trace.model import Trace

ADDED = "added"
REMOVED = "removed"
SLOWER = "slower"
FASTER = "faster"
UNCHANGED = "unchanged"
STATUSES = (ADDED, REMOVED, SLOWER, FASTER, UNCHANGED)

PER_STEP = "per step"
PER_TRACE = "per trace"


def pick_rank(trace: Trace, rank: int | None, path: str | os.PathLike[str]) -> tuple[Trace, list[str]]:
    """One rank of ``trace``: ``rank`` or the lowest; notes say which when there were several."""
    if rank is not None:
        if rank not in trace.ranks:
            raise BadInputError(f"{path}: no rank {rank} (ranks: {', '.join(map(str, trace.ranks))})")
        return trace.for_rank(rank), []
    if len(trace.ranks) == 1:
        return trace, []
    first = trace.ranks[0]
    return trace.for_rank(first), [f"{path} holds ranks {trace.ranks}: rank {first} compared (--rank picks another)"]


def _gpu_totals(acts: pd.DataFrame, per_step: bool) -> pd.DataFrame:
    """kind, name, count, total_us of the GPU activities (:func:`gpu_activities`) in the steps (or the whole
    trace)."""
    if per_step:
        acts = acts[acts["step_index"] >= 0]
    if not len(acts):
        return pd.DataFrame({"kind": [], "name": [], "count": [], "total_us": []})
    return acts.groupby(["kind", "name"], sort=False).agg(count=("dur_us", "size"), total_us=("dur_us", "sum"))


def _cpu_totals(trace: Trace, per_step: bool) -> pd.DataFrame:
    """kind ("cpu_op"), name, count, total_us of the CPU operators starting in the steps (or the whole trace)."""
    ops = trace.cpu_ops
    if per_step and len(ops):
        inside = assign_steps(ops["ts_us"].to_numpy(), step_windows(trace)) >= 0
        ops = ops[inside]
    if not len(ops):
        return pd.DataFrame({"kind": [], "name": [], "count": [], "total_us": []})
    ops = ops.assign(kind="cpu_op")
    return ops.groupby(["kind", "name"], sort=False).agg(count=("dur_us", "size"), total_us=("dur_us", "sum"))


def _rows(base: pd.DataFrame, current: pd.DataFrame, base_steps: int, current_steps: int) -> list[dict[str, Any]]:
    """Outer join of two totals tables, per step, with status and change; sorted by |change|."""
    if not len(base) and not len(current):
        return []
    joined = pd.concat(
        {
            "base": base.reset_index().set_index(["kind", "name"]),
            "current": current.reset_index().set_index(["kind", "name"]),
        },
        axis=1,
    ).fillna(0.0)
    b_us = joined[("base", "total_us")].to_numpy(float) / base_steps
    c_us = joined[("current", "total_us")].to_numpy(float) / current_steps
    b_count = joined[("base", "count")].to_numpy(float) / base_steps
    c_count = joined[("current", "count")].to_numpy(float) / current_steps
    change = c_us - b_us
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(b_us > 0, 100.0 * change / b_us, np.nan)
    rows = []
    for i, (kind, name) in enumerate(joined.index):
        if b_count[i] == 0:
            status = ADDED
        elif c_count[i] == 0:
            status = REMOVED
        elif change[i] > 0:
            status = SLOWER
        elif change[i] < 0:
            status = FASTER
        else:
            status = UNCHANGED
        rows.append(
            {
                "name": name,
                "kind": kind,
                "status": status,
                "base_us_per_step": float(b_us[i]),
                "current_us_per_step": float(c_us[i]),
                "change_us_per_step": float(change[i]),
                "change_pct": None if np.isnan(pct[i]) else float(pct[i]),
                "base_count_per_step": float(b_count[i]),
                "current_count_per_step": float(c_count[i]),
            }
        )
    rows.sort(key=lambda r: (-abs(r["change_us_per_step"]), r["name"]))
    return rows


def _section(rows: list[dict[str, Any]], top: int | None) -> dict[str, Any]:
    counts = {status: 0 for status in STATUSES}
    for row in rows:
        counts[row["status"]] += 1
    return {
        "rows": rows if top is None else rows[:top],
        "rows_total": len(rows),
        "counts": counts,
        "base_us_per_step": sum(r["base_us_per_step"] for r in rows),
        "current_us_per_step": sum(r["current_us_per_step"] for r in rows),
    }


def _side(trace: Trace, acts: pd.DataFrame, path: str, steps: int) -> dict[str, Any]:
    return {
        "path": path,
        "rank": trace.ranks[0] if len(trace.ranks) == 1 else None,
        "steps": steps,
        "profiler_steps": int(len(trace.steps)),
        "step_time_us_median": median_step_time_us(step_breakdown(trace, acts)),
        "gpu_name": trace.device.name if trace.device else None,
    }


def diff_traces(
    base: Trace, current: Trace, *, top: int | None = None, labels: tuple[str, str] = ("base", "current")
) -> dict[str, Any]:
    """Compare two one-rank traces (module docstring).

    Returns {basis ("per step" | "per trace"), base {path, rank, steps, profiler_steps, step_time_us_median
    (as ``analyze``'s step_time_us; the whole trace without ProfilerSteps), gpu_name}, current {...},
    gpu {rows, rows_total, counts {status: n}, base_us_per_step,
    current_us_per_step}, cpu_ops {...}, notes [str]}; ``top`` keeps that many rows per section.
    """
    per_step = bool(len(base.steps)) and bool(len(current.steps))
    notes = []
    if per_step:
        base_steps, current_steps = len(step_windows(base)), len(step_windows(current))
    else:
        base_steps = current_steps = 1
        lacking = [label for label, t in zip(labels, (base, current)) if not len(t.steps)]
        notes.append(f"no ProfilerStep annotations in {' and '.join(lacking)}: totals are per trace, not per step")
    base_acts, current_acts = gpu_activities(base), gpu_activities(current)
    gpu = _rows(_gpu_totals(base_acts, per_step), _gpu_totals(current_acts, per_step), base_steps, current_steps)
    cpu = _rows(_cpu_totals(base, per_step), _cpu_totals(current, per_step), base_steps, current_steps)
    return {
        "basis": PER_STEP if per_step else PER_TRACE,
        "base": _side(base, base_acts, labels[0], base_steps),
        "current": _side(current, current_acts, labels[1], current_steps),
        "gpu": _section(gpu, top),
        "cpu_ops": _section(cpu, top),
        "notes": notes,
    }


def diff_paths(
    base: str | os.PathLike[str], current: str | os.PathLike[str], *, rank: int | None = None, top: int | None = None
) -> dict[str, Any]:
    """:func:`diff_traces` on two trace files (or per-rank folders, of which ``rank`` is compared)."""
    traces, notes = [], []
    for path in (base, current):
        trace, rank_notes = pick_rank(load_trace(path), rank, path)
        traces.append(trace)
        notes += rank_notes
    labels = (escape_control(str(base)), escape_control(str(current)))  # paths are shown: no control characters
    with np.errstate(all="ignore"):  # a 1e308 timestamp overflows to inf, which the rows treat as unknown
        result = diff_traces(*traces, top=top, labels=labels)
    result["notes"] = [escape_control(n) for n in notes] + result["notes"]
    return result


# --- renderings ---------------------------------------------------------------------------------

STATUS_STYLES = {ADDED: "bold red", REMOVED: "green", SLOWER: "red", FASTER: "green", UNCHANGED: "dim"}
SECTION_TITLES = {"gpu": "GPU kernels and copies", "cpu_ops": "CPU operators (inclusive time)"}


def _signed_us(value: float) -> str:
    text = format_us(abs(value))
    return f"+{text}" if value > 0 else f"-{text}" if value < 0 else text


def section_table(result: dict[str, Any], key: str, name_chars: int = 48) -> Table:
    """One section's rows as strings: status, name, base, current, change, change %, calls (base → current)."""
    section = result[key]
    unit = "µs per step" if result["basis"] == PER_STEP else "µs per trace"
    table = Table(
        f"{SECTION_TITLES[key]}, {unit}",
        [
            Column("Status", wrap=False),
            Column("Name"),
            Column("Base", numeric=True),
            Column("Current", numeric=True),
            Column("Change", numeric=True),
            Column("%", numeric=True),
            Column("Calls" + ("/step" if result["basis"] == PER_STEP else ""), numeric=True),
        ],
    )
    rows = section["rows"]
    names = distinct_short_names([r["name"] for r in rows], name_chars) if key == "gpu" else None
    for i, row in enumerate(rows):
        name = names[i] if names is not None else str(row["name"])
        if row["kind"] not in ("kernel", "cpu_op") and not name.startswith(("Memcpy", "Memset")):
            name = f"{name} [{row['kind']}]"
        pct = row["change_pct"]
        calls = f"{_calls(row['base_count_per_step'])} → {_calls(row['current_count_per_step'])}"
        table.rows.append(
            [
                row["status"],
                name,
                format_us(row["base_us_per_step"]),
                format_us(row["current_us_per_step"]),
                _signed_us(row["change_us_per_step"]),
                MISSING if pct is None else f"{pct:+.0f}%",
                calls,
            ]
        )
    if section["rows_total"] > len(rows):
        table.caption = f"{len(rows)} of {section['rows_total']} rows, largest change first (--top)"
    return table


def _calls(value: float) -> str:
    return format_count(round(value, 2))


def _side_line(side: dict[str, Any]) -> str:
    count = side["profiler_steps"]
    steps = f"{count} ProfilerStep{'s' if count != 1 else ''}" if count else "no ProfilerSteps"
    median = side["step_time_us_median"]
    step = ""
    if median is not None:
        step = f", median step {format_us(median)}" if count else f", whole trace {format_us(median)}"
    return f"{side['path']}: {steps}{step}"


def _counts_line(result: dict[str, Any], key: str) -> str:
    section = result[key]
    counts = ", ".join(f"{n} {status}" for status, n in section["counts"].items() if n)
    total = (
        f"{format_us(section['base_us_per_step'])} → {format_us(section['current_us_per_step'])} "
        f"{'per step' if result['basis'] == PER_STEP else 'per trace'}"
    )
    return f"{SECTION_TITLES[key]}: {total}; {counts or 'none'}"


def render_terminal(result: dict[str, Any], console: Any) -> None:
    """The diff on a rich console: both sides, totals, then the two tables."""
    from rich.text import Text

    from gpuadvisor.report.terminal import rich_table

    console.print(Text(f"gpuadvisor diff  {result['base']['path']} → {result['current']['path']}", style="bold"))
    console.print(Text(f"Base     {_side_line(result['base'])}"))
    console.print(Text(f"Current  {_side_line(result['current'])}"))
    for key in ("gpu", "cpu_ops"):
        console.print(Text(_counts_line(result, key)))
    console.print()
    width = console.width or 100
    name_chars = max(16, min(60, width - 62))
    for key in ("gpu", "cpu_ops"):
        if result[key]["rows"]:
            console.print(rich_table(section_table(result, key, name_chars), {"Status": STATUS_STYLES}))
            console.print()
    for note in result["notes"]:
        console.print(Text(f"note: {note}", style="dim"))


def render_markdown(result: dict[str, Any]) -> str:
    """The diff as GitHub-flavoured Markdown; full names of the GPU rows in a collapsed list."""
    from gpuadvisor.report.markdown import escape_markdown

    def cell(value: Any) -> str:
        return escape_markdown(value) or " "

    lines = [
        f"### gpuadvisor diff ({result['basis']})",
        "",
        f"- Base: {cell(_side_line(result['base']))}",
        f"- Current: {cell(_side_line(result['current']))}",
    ]
    lines += [f"- {cell(_counts_line(result, key))}" for key in ("gpu", "cpu_ops")]
    lines += [f"- {cell(note)}" for note in result["notes"]]
    lines.append("")
    for key in ("gpu", "cpu_ops"):
        table = section_table(result, key)
        if not table.rows:
            continue
        lines += [f"**{cell(table.title)}**", ""]
        lines.append("| " + " | ".join(cell(c.name) for c in table.columns) + " |")
        lines.append("|" + "|".join("---:" if c.numeric else "---" for c in table.columns) + "|")
        lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in table.rows]
        if table.caption:
            lines += ["", cell(table.caption)]
        lines.append("")
    gpu_rows = result["gpu"]["rows"]
    if gpu_rows:
        lines += ["<details><summary>Full GPU names</summary>", ""]
        lines += [f"{i}. {cell(row['name'])}" for i, row in enumerate(gpu_rows, 1)]
        lines += ["", "</details>", ""]
    return "\n".join(lines)
