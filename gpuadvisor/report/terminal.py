"""The report on a terminal, with rich: header, summary, top kernels, findings, then notes.

Laid out for 100 columns; narrower consoles get shorter kernel names and wrapped cells, never an
error. All text goes through :class:`rich.text.Text`, so brackets in kernel names or messages are
printed as they are, not read as markup.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from gpuadvisor.report import sections
from gpuadvisor.report.formatting import KERNEL_NAME_CHARS, short_kernel_name
from gpuadvisor.report.sections import Table

__all__ = ["render_terminal", "rich_table", "short_kernel_name"]

SEVERITY_STYLES = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}
CLASS_STYLES = {"compute": "magenta", "memory": "blue", "latency": "yellow", "launch": "red", "unknown": "dim"}
# Kernel names get at least this many characters before the optional columns stay: at 80 columns (a CI log,
# a pipe) the family column goes and names keep 33, enough for nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT's tile
# sizes or a functor's name; narrower consoles get shorter names, never an error.
MIN_NAME_CHARS = 28


def _without(table: Table, names: set[str]) -> Table:
    """``table`` without the columns called ``names``."""
    keep = [i for i, column in enumerate(table.columns) if column.name not in names]
    return Table(
        table.title,
        [table.columns[i] for i in keep],
        [[row[i] for i in keep] for row in table.rows],
        table.caption,
    )


def rich_table(table: Table, styles: dict[str, dict[str, str]] | None = None) -> RichTable:
    """A rich table from a section table. Numbers never wrap; text columns fold when space runs out."""
    styles = styles or {}
    out = RichTable(
        title=Text(table.title, style="bold"),
        title_justify="left",
        caption=Text(table.caption, style="dim") if table.caption else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
    )
    for column in table.columns:
        short = column.numeric or not column.wrap
        out.add_column(
            column.name,
            justify="right" if column.numeric else "left",
            no_wrap=short,
            overflow="fold",  # fit_table keeps numbers and labels whole, and wraps text between words
        )
    for row in table.rows:
        cells = []
        for column, value in zip(table.columns, row, strict=False):
            style = styles.get(column.name, {}).get(value, "")
            cells.append(Text(value, style=style))
        out.add_row(*cells)
    return out


def _natural_width(table: Table, index: int) -> int:
    return max([len(table.columns[index].name), *(len(row[index]) for row in table.rows)])


def _kernel_table(report: Any, top: int, width: int) -> Table:
    """The top-kernels table sized for ``width``: names as long as fit (up to 60 characters); on
    narrow consoles the family, calls and % GPU columns go before names get shorter than MIN_NAME_CHARS."""
    dropped = {"#"}  # the rows are in order already
    probe = _without(sections.kernel_table(report, top, KERNEL_NAME_CHARS), dropped)
    for optional in ({"Family"}, {"Calls/step", "Calls"}, {"% GPU"}):
        others = sum(_natural_width(probe, i) for i, c in enumerate(probe.columns) if c.name != "Kernel")
        name_chars = width - others - 2 * (len(probe.columns) - 1)  # a separator and a space per gap
        if name_chars >= MIN_NAME_CHARS:
            break
        dropped |= optional
        probe = _without(probe, optional)
    name_chars = max(MIN_NAME_CHARS, min(KERNEL_NAME_CHARS, name_chars))
    return _without(sections.kernel_table(report, top, name_chars), dropped)


def _header(report: Any) -> Text:
    tool = sections.section(report, "tool")
    title = f"{sections.text(tool.get('name'), 'gpuadvisor')} {sections.text(tool.get('version'), '')}".strip()
    command = sections.text(report.get("command"), "") if isinstance(report, dict) else ""
    header = Text()
    header.append(title, style="bold")
    if command:
        header.append(f" {command}", style="bold")
    header.append("  ")
    header.append(sections.source_line(report))
    header.append("\nGPU    ", style="dim")
    header.append(sections.gpu_line(report))
    header.append("\nPeaks  ", style="dim")
    header.append(sections.peaks_line(report))
    clocks = sections.clocks_line(report)
    if clocks:
        header.append("\nClocks ", style="dim")
        header.append(clocks)
    return header


def _summary(report: Any) -> RichTable:
    table = RichTable(
        title=Text("Summary", style="bold"),
        title_justify="left",
        box=None,
        show_header=False,
        show_edge=False,
        pad_edge=False,
        padding=(0, 2, 0, 0),
    )
    table.add_column("Metric", style="bold", overflow="fold")
    table.add_column("Value", justify="right", no_wrap=True)
    table.add_column("Detail", overflow="fold")
    for metric, value, detail in sections.summary_rows(report):
        table.add_row(Text(metric), Text(value), Text(detail, style="dim" if value else ""))
    return table


def _finding_details(report: Any) -> list[Padding]:
    blocks = []
    for finding in sections.sorted_findings(report):
        severity = sections.text(finding.get("severity"), "")
        block = Text()
        block.append(sections.text(finding.get("rule_id")), style=SEVERITY_STYLES.get(severity, "bold"))
        name = sections.text(finding.get("name"), "")
        if name:
            block.append(f" {name}", style="bold")
        title = sections.text(finding.get("title"), "")
        if title:
            block.append(f": {title}")
        block.append("\n")
        block.append(sections.text(finding.get("message"), "(no details)"))
        fix = sections.text(finding.get("fix"), "")
        fix_id = sections.text(finding.get("fix_id"), "")
        if fix or fix_id:
            block.append("\nFix: ", style="bold")
            block.append(fix or "—")
            if fix_id:
                block.append(f"  (fix id: {fix_id})", style="green")
        evidence = sections.evidence_text(finding)
        if evidence:
            block.append(f"\nEvidence: {evidence}", style="dim")
        blocks.append(Padding(block, (0, 0, 1, 2)))
    return blocks


def render_terminal(report: dict[str, Any], console: Console, top: int = 10) -> None:
    """Print ``report`` on ``console``: header, summary, the ``top`` kernels, findings, ranks (multi-rank
    folders), transfers, host syncs, notes, skipped rules."""
    console.print(_header(report))
    console.print()
    console.print(_summary(report))
    console.print()

    kernels = _kernel_table(report, top, console.width)
    if kernels.rows:
        console.print(rich_table(kernels, {"Class": CLASS_STYLES}))
        console.print()
    elif not sections.records(report, "kernels"):
        console.print(Text("Top kernels", style="bold"))
        console.print(Text("No GPU kernels in this trace.", style="dim"))
        console.print()

    findings = sections.finding_table(report)
    if findings.rows:
        console.print(rich_table(findings, {"Severity": SEVERITY_STYLES}))
        console.print()
        for block in _finding_details(report):
            console.print(block)
    else:
        console.print(Text("Findings", style="bold"))
        console.print(Text("No findings.", style="dim"))
        console.print()

    for table in (sections.rank_table(report), sections.transfer_table(report), sections.host_sync_table(report)):
        if table.rows:
            console.print(rich_table(table))
            console.print()

    notes = sections.notes(report)
    skipped = sections.skipped_rules(report)
    if notes:
        console.print(Text("Notes", style="dim bold"))
        for note in notes:
            console.print(Padding(Text(f"• {note}", style="dim"), (0, 0, 0, 2)))
    if skipped:
        console.print(Text("Skipped rules", style="dim bold"))
        for rule_id, reason in skipped:
            console.print(Padding(Text(f"{rule_id}: {reason}" if reason else rule_id, style="dim"), (0, 0, 0, 2)))
