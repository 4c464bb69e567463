"""The ``apply`` report (``command: "apply"``, :mod:`gpuadvisor.apply`) as tables of strings, on a terminal (rich)
and in Markdown: the fixes and what became of them, before against after, the kernel diff, the lines to keep.

Like :mod:`gpuadvisor.report.sections`, every function reads the report defensively: a missing key or a
``None`` gives a "—" cell or no rows, never an exception.
"""

from __future__ import annotations

from typing import Any

from gpuadvisor.report import sections
from gpuadvisor.report.formatting import (
    MISSING,
    as_number,
    format_bytes,
    format_count,
    format_pct,
    format_us,
)
from gpuadvisor.report.sections import Column, Table

STATUS_STYLES = {"applied": "green", "refused": "yellow", "rolled_back": "red", "failed": "bold red"}
KERNEL_CHARS = 60

# The keys a numerics result (gpuadvisor.fixes.numerics, NumericsResult.to_dict()) may use, tried in order.
_NUMERICS_METRIC = ("metric", "name", "kind")
_NUMERICS_VALUE = ("value", "error", "patched_error", "rel_l2", "sqnr_db")
_NUMERICS_BOUND = ("bound", "limit", "threshold", "max_allowed", "min_allowed")
_NUMERICS_PASSED = ("passed", "ok")


def _first(mapping: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


def _number(value: Any) -> str:
    number = as_number(value)
    if number is None:
        return sections.text(value)
    return f"{number:.3g}"


def numerics_text(numerics: Any) -> str:
    """``rel_l2 3.1e-03 ≤ 1e-02 (pass)`` from a fix's numerics result; ``—`` when there is none."""
    if not isinstance(numerics, dict) or not numerics:
        return MISSING
    metric = _first(numerics, _NUMERICS_METRIC)
    value = _first(numerics, _NUMERICS_VALUE)
    bound = _first(numerics, _NUMERICS_BOUND)
    passed = _first(numerics, _NUMERICS_PASSED)
    if value is None and bound is None:
        scalars = [f"{k}={_number(v)}" for k, v in numerics.items() if isinstance(v, (int, float, str, bool))]
        return ", ".join(scalars[:4]) or MISSING
    text = f"{sections.text(metric, '')} {_number(value)}".strip()
    if bound is not None:
        text += f" vs bound {_number(bound)}"
    if as_number(numerics.get("reference_error")) is not None:
        text += f" (original {_number(numerics['reference_error'])})"
    if isinstance(passed, bool):
        text += " (pass)" if passed else " (FAIL)"
    return text


def fix_table(report: Any) -> Table:
    """One row per requested fix: status, predicted and measured saving, numerics, and what changed or why not."""
    table = Table(
        "Fixes",
        [
            Column("Fix", wrap=False),
            Column("Status", wrap=False),
            Column("Predicted", numeric=True),
            Column("Measured", numeric=True),
            Column("Numerics"),
            Column("Changes / reason"),
        ],
    )
    for fix in sections.records(report, "fixes"):
        status = sections.text(fix.get("status"))
        if status == "applied":
            detail = "; ".join(sections.text(c) for c in fix.get("changes") or []) or "applied"
            skipped = fix.get("skipped") or []
            if skipped:
                detail += f" ({len(skipped)} place(s) left alone)"
        else:
            detail = sections.text(fix.get("reason"), "no reason given")
            if fix.get("suggestion"):
                detail += f" → {sections.text(fix.get('suggestion'))}"
        measured = format_us(fix.get("measured_saving_us"))
        if fix.get("measured_together_with"):
            measured += " (all)"
        table.rows.append(
            [
                sections.text(fix.get("fix_id")),
                status,
                format_us(fix.get("predicted_saving_us")),
                measured,
                numerics_text(fix.get("numerics")),
                detail,
            ]
        )
    return table


def search_table(report: Any) -> Table:
    """``--fix auto``'s search: one row per candidate stack, what it applied, its time and why it lost."""
    table = Table(
        "Search (--fix auto)",
        [
            Column("#", numeric=True),
            Column("Candidate", wrap=False),
            Column("Applied", wrap=False),
            Column("µs/step", numeric=True),
            Column("Result"),
        ],
    )
    search = sections.section(report, "search")
    for index, row in enumerate(sections.records(search, "candidates"), start=1):
        fixes = row.get("fixes") if isinstance(row.get("fixes"), list) else []
        applied = row.get("applied") if isinstance(row.get("applied"), list) else []
        result = sections.text(row.get("status"))
        if row.get("why"):
            result += f": {sections.text(row.get('why'))}"
        table.rows.append(
            [
                str(index),
                "+".join(sections.text(f) for f in fixes),
                "+".join(sections.text(f) for f in applied) or "-",
                format_us(row.get("step_us")),
                result,
            ]
        )
    if table.rows and as_number(search.get("original_us")) is not None:
        table.rows.append(["", "original", "-", format_us(search.get("original_us")), "the step as written"])
    return table


def _change(before: Any, after: Any) -> str:
    """The relative change from ``before`` to ``after`` (``-42.0%``), or ""."""
    b, a = as_number(before), as_number(after)
    if b is None or a is None or b == 0:
        return ""
    pct = 100.0 * (a - b) / abs(b)
    return f"{pct:+.1f}%"


def _spread_cell(side: dict[str, Any]) -> str:
    p10, p90 = side.get("step_time_p10_us"), side.get("step_time_p90_us")
    if as_number(p10) is None or as_number(p90) is None:
        return MISSING
    return f"{format_us(p10)}–{format_us(p90)}"


def speedup_text(report: Any) -> str:
    """``1.84x (95% CI 1.79–1.90)``."""
    speedup = sections.section(report, "speedup")
    median = as_number(speedup.get("median"))
    if median is None:
        return MISSING
    low, high = as_number(speedup.get("ci_low")), as_number(speedup.get("ci_high"))
    text = f"{median:.3g}x"
    if low is not None and high is not None:
        confidence = as_number(speedup.get("confidence")) or 0.95
        text += f" ({100 * confidence:.0f}% CI {low:.3g}–{high:.3g})"
    paired = speedup.get("paired")
    if isinstance(paired, dict) and as_number(paired.get("median")) is not None:
        text += f"; paired over {paired.get('rounds')} rounds {as_number(paired['median']):.3g}x"
        p_low, p_high = as_number(paired.get("ci_low")), as_number(paired.get("ci_high"))
        if p_low is not None and p_high is not None:
            text += f" ({p_low:.3g}–{p_high:.3g})"
    return text


def comparison_table(report: Any) -> Table:
    """Before against after: step time, speedup, kernels, launches, GPU busy, energy, peak memory, tokens/s."""
    before, after = sections.section(report, "before"), sections.section(report, "after")
    table = Table(
        "Before and after",
        [
            Column("Metric", wrap=False),
            Column("Before", numeric=True),
            Column("After", numeric=True),
            Column("Change", numeric=True),
        ],
    )
    rows = [
        (
            "Step time (median)",
            format_us(before.get("step_time_us")),
            format_us(after.get("step_time_us")),
            _change(before.get("step_time_us"), after.get("step_time_us")),
        ),
        ("Step time p10–p90", _spread_cell(before), _spread_cell(after), ""),
        ("Speedup", "", speedup_text(report), ""),
    ]
    saving = sections.section(report, "saving")
    if as_number(saving.get("measured_us")) is not None:
        rows.append(
            (
                "Saving per step",
                f"predicted {format_us(saving.get('predicted_us'))}",
                f"measured {format_us(saving.get('measured_us'))}",
                format_pct(saving.get("measured_pct")),
            )
        )
    for label, key, fmt in (
        ("Kernels per step", "kernels_per_step", format_count),
        ("Launch calls per step", "launch_calls_per_step", format_count),
        ("GPU busy per step", "gpu_busy_us", format_us),
        ("GPU busy", "gpu_busy_pct", format_pct),
        ("Energy per step", "energy_j_per_step", sections.format_energy),
        ("Peak memory allocated", "peak_memory_bytes", format_bytes),
        ("Tokens/s", "tokens_per_s", format_count),
    ):
        b, a = before.get(key), after.get(key)
        if key == "energy_j_per_step":
            # "not measured" (never 0) where NVML sampled but a side's blocks were too short for its counter.
            cells = sections.energy_cell(before), sections.energy_cell(after)
            if cells != (MISSING, MISSING):
                rows.append((label, *cells, _change(b, a)))
            continue
        if as_number(b) is None and as_number(a) is None:
            continue
        rows.append((label, fmt(b), fmt(a), _change(b, a) if key != "gpu_busy_pct" else ""))
    table.rows = [list(row) for row in rows]
    return table


def class_table(report: Any) -> Table:
    """GPU time per step by roofline class, before and after."""
    diff = sections.section(report, "kernel_diff")
    table = Table(
        "GPU time per step by class",
        [Column("Class", wrap=False), Column("Before", numeric=True), Column("After", numeric=True)],
    )
    classes = diff.get("classes_us_per_step")
    if isinstance(classes, dict):
        for cls, pair in classes.items():
            if isinstance(pair, dict):
                table.rows.append([sections.text(cls), format_us(pair.get("before")), format_us(pair.get("after"))])
    return table


def kernel_change_table(report: Any, key: str, title: str, name_chars: int = KERNEL_CHARS) -> Table:
    """The kernels that ``disappeared`` or ``appeared`` between before and after, by time per step."""
    table = Table(title, [Column("Kernel"), Column("µs/step", numeric=True), Column("Calls/step", numeric=True)])
    rows = sections.records(sections.section(report, "kernel_diff"), key)
    names = sections.distinct_short_names([row.get("name") for row in rows], name_chars)
    for row, name in zip(rows, names, strict=True):
        table.rows.append([name, format_us(row.get("us_per_step")), format_count(row.get("count_per_step"))])
    return table


def keep_lines(report: Any) -> list[str]:
    keep = report.get("keep") if isinstance(report, dict) else None
    return [str(line) for line in keep] if isinstance(keep, list) else []


def apply_notes(report: Any) -> list[str]:
    notes = list(sections.notes(report))
    diff = sections.section(report, "kernel_diff")
    notes += [sections.text(n) for n in diff.get("notes") or [] if n]
    return notes


def _title_line(report: Any) -> str:
    source = sections.section(report, "source")
    model = sections.text(source.get("model"), "")
    requested = sections.text(source.get("fixes_requested"), "")
    ids = ", ".join(str(f) for f in source.get("fix_ids") or [])
    line = f"{model} · --fix {requested}" if requested else model
    if ids and ids != requested:
        line += f" ({ids})"
    return line


# --- terminal -----------------------------------------------------------------------------------


def render_apply_terminal(report: dict[str, Any], console) -> None:
    """Print the apply report on a rich ``console``."""
    from rich.padding import Padding
    from rich.syntax import Syntax
    from rich.text import Text

    from gpuadvisor.report.terminal import CLASS_STYLES, rich_table

    tool = sections.section(report, "tool")
    header = Text()
    header.append(
        f"{sections.text(tool.get('name'), 'gpuadvisor')} {sections.text(tool.get('version'), '')} apply", style="bold"
    )
    header.append(f"  {_title_line(report)}")
    header.append("\nGPU    ", style="dim")
    header.append(sections.gpu_line(report))
    clocks = sections.clocks_line(report)
    if clocks:
        header.append("\nClocks ", style="dim")
        header.append(clocks)
    console.print(header)
    console.print()
    fixes = fix_table(report)
    if fixes.rows:
        console.print(rich_table(fixes, {"Status": STATUS_STYLES}))
    else:
        console.print(Text("Fixes", style="bold"))
        console.print(Text("No fix was requested.", style="dim"))
    console.print()
    search = search_table(report)
    if search.rows:
        console.print(rich_table(search))
        console.print()
    console.print(rich_table(comparison_table(report)))
    console.print()
    for table in (
        class_table(report),
        kernel_change_table(
            report, "disappeared", "Kernels that disappeared", max(16, min(KERNEL_CHARS, console.width - 30))
        ),
        kernel_change_table(
            report, "appeared", "Kernels that appeared", max(16, min(KERNEL_CHARS, console.width - 30))
        ),
    ):
        if table.rows:
            console.print(rich_table(table, {"Class": CLASS_STYLES}))
            console.print()
    keep = keep_lines(report)
    if keep:
        console.print(Text("Keep the fixes: add these lines to your code", style="bold"))
        console.print(
            Padding(Syntax("\n".join(keep), "python", theme="ansi_dark", background_color="default"), (0, 0, 0, 2))
        )
        console.print()
    notes = apply_notes(report)
    if notes:
        console.print(Text("Notes", style="dim bold"))
        for note in notes:
            console.print(Padding(Text(f"• {note}", style="dim"), (0, 0, 0, 2)))


# --- Markdown -----------------------------------------------------------------------------------


def render_apply_markdown(report: dict[str, Any]) -> str:
    """The apply report as GitHub-flavoured Markdown (every piece of report text escaped). Ends with a newline."""
    from gpuadvisor.report.markdown import escape_markdown, markdown_table

    tool = sections.section(report, "tool")
    lines = ["# gpuadvisor report: apply", "", "| | |", "|---|---|"]
    for label, value in (
        ("Model", _title_line(report)),
        ("GPU", sections.gpu_line(report)),
        ("Clocks", sections.clocks_line(report)),
        ("Tool", f"{sections.text(tool.get('name'), 'gpuadvisor')} {sections.text(tool.get('version'), '')}".strip()),
    ):
        if value:
            lines.append(f"| **{label}** | {escape_markdown(value)} |")
    lines.append("")
    lines += ["## Fixes", ""]
    lines += markdown_table(fix_table(report), "No fix was requested.")
    search = search_table(report)
    if search.rows:
        lines += ["## Search (--fix auto)", ""]
        lines += markdown_table(search, "")
    lines += ["## Before and after", ""]
    lines += markdown_table(comparison_table(report), "No measurements.")
    for table in (
        class_table(report),
        kernel_change_table(report, "disappeared", "Kernels that disappeared"),
        kernel_change_table(report, "appeared", "Kernels that appeared"),
    ):
        if table.rows:
            lines += [f"## {table.title}", ""]
            lines += markdown_table(table, "")
    keep = keep_lines(report)
    if keep:
        lines += ["## Keep the fixes", "", "Add these lines to your code:", "", "```python", *keep, "```", ""]
    notes = apply_notes(report)
    if notes:
        lines += ["## Notes", "", *(f"- {escape_markdown(note)}" for note in notes), ""]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"
