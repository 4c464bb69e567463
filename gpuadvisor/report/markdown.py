"""The report as GitHub-flavoured Markdown: the terminal report's content, for PRs, issues and CI summaries.

Every piece of text from the report is escaped, so a kernel name such as ``reduce_kernel<MeanOps>``
or ``a|b`` shows as written and cannot break a table.
"""

from __future__ import annotations

import re
from typing import Any

from gpuadvisor.report import sections
from gpuadvisor.report.formatting import KERNEL_NAME_CHARS, format_pct, format_us
from gpuadvisor.report.sections import Table

# Characters Markdown would read as syntax: backslash, emphasis, code, links, table pipes, HTML.
_SPECIAL = re.compile(r"([\\`*\[\]|])")
# A run of "_" between two alphanumerics is literal in GFM (no intraword emphasis); any other run is escaped.
_UNDERSCORES = re.compile(r"_+")


def _escape_underscores(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    intraword = start > 0 and text[start - 1].isalnum() and end < len(text) and text[end].isalnum()
    return match.group(0) if intraword else match.group(0).replace("_", "\\_")


def escape_markdown(value: Any) -> str:
    """``value`` as literal text in Markdown, safe inside a table cell (``|`` -> ``\\|``, ``<`` -> ``&lt;``)."""
    text = sections.text(value, "")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _SPECIAL.sub(r"\\\1", text)
    return _UNDERSCORES.sub(_escape_underscores, text)


def markdown_table(table: Table, empty: str) -> list[str]:
    if not table.rows:
        return [f"_{empty}_", ""]
    lines = []
    if table.caption:
        lines += [escape_markdown(table.caption), ""]
    lines.append("| " + " | ".join(escape_markdown(c.name) for c in table.columns) + " |")
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in table.columns) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(escape_markdown(cell) or " " for cell in row) + " |")
    lines.append("")
    return lines


def _header(report: Any) -> list[str]:
    tool = sections.section(report, "tool")
    command = sections.text(report.get("command"), "") if isinstance(report, dict) else ""
    title = "gpuadvisor report" + (f": {command}" if command else "")
    rows = [
        ("Source", sections.source_line(report)),
        ("GPU", sections.gpu_line(report)),
        ("Clocks", sections.clocks_line(report)),
        ("Peaks", sections.peaks_line(report)),
        ("Tool", f"{sections.text(tool.get('name'), 'gpuadvisor')} {sections.text(tool.get('version'), '')}".strip()),
    ]
    lines = [f"# {escape_markdown(title)}", "", "| | |", "|---|---|"]
    lines += [f"| **{label}** | {escape_markdown(value)} |" for label, value in rows if value]
    return lines + [""]


def _summary(report: Any) -> list[str]:
    lines = ["## Summary", "", "| Metric | Value | Detail |", "|---|---:|---|"]
    for metric, value, detail in sections.summary_rows(report):
        lines.append(f"| {escape_markdown(metric)} | {escape_markdown(value)} | {escape_markdown(detail) or ' '} |")
    return lines + [""]


def _finding_details(report: Any) -> list[str]:
    lines: list[str] = []
    for finding in sections.sorted_findings(report):
        heading = sections.text(finding.get("rule_id"))
        if finding.get("name"):
            heading += f" {sections.text(finding.get('name'))}"
        if finding.get("title"):
            heading += f": {sections.text(finding.get('title'))}"
        facts = [f"**Severity:** {escape_markdown(sections.text(finding.get('severity')))}"]
        if finding.get("category"):
            facts.append(f"**Category:** {escape_markdown(finding.get('category'))}")
        saving = sections.saving_text(finding, format_us(finding.get("estimated_saving_us_per_step")))
        share = format_pct(finding.get("estimated_saving_pct"))
        facts.append(f"**Estimated saving:** {escape_markdown(saving)} per step ({escape_markdown(share)} of the step)")
        if finding.get("saving_basis"):
            facts.append(f"**Basis:** {escape_markdown(finding['saving_basis'])}")
        lines += [f"### {escape_markdown(heading)}", "", " · ".join(facts), ""]
        lines += [escape_markdown(sections.text(finding.get("message"), "(no details)")), ""]
        fix = sections.text(finding.get("fix"), "")
        fix_id = sections.text(finding.get("fix_id"), "")
        if fix or fix_id:
            line = f"**Fix:** {escape_markdown(fix or '—')}"
            if re.fullmatch(r"[\w.-]+", fix_id):
                line += f" (fix id `{fix_id}`)"
            elif fix_id:
                line += f" (fix id {escape_markdown(fix_id)})"
            lines += [line, ""]
        evidence = sections.evidence_text(finding)
        if evidence:
            lines += [f"**Evidence:** {escape_markdown(evidence)}", ""]
    return lines


def _bullets(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    return [f"## {title}", "", *(f"- {item}" for item in items), ""]


def render_markdown(report: dict[str, Any], top: int = 20) -> str:
    """``report`` as GitHub-flavoured Markdown: header, summary, the ``top`` kernels, findings with details,
    ranks (multi-rank folders), transfers, host syncs, per-step figures, notes and skipped rules. Ends with a
    newline."""
    lines = _header(report)
    lines += _summary(report)

    kernels = sections.kernel_table(report, top, KERNEL_NAME_CHARS, extended=True)
    if kernels.rows or not sections.records(report, "kernels"):
        lines += ["## Top kernels", ""]
        lines += markdown_table(kernels, "No GPU kernels in this trace.")

    lines += ["## Findings", ""]
    findings = sections.finding_table(report)
    lines += markdown_table(findings, "No findings.")
    if findings.rows:
        lines += _finding_details(report)

    tables = (
        sections.rank_table(report),
        sections.cpu_op_table(report),
        sections.transfer_table(report),
        sections.host_sync_table(report),
        sections.step_table(report),
    )
    for table in tables:
        if table.rows:
            lines += [f"## {table.title}", ""]
            lines += markdown_table(table, "")

    lines += _bullets("Notes", [escape_markdown(note) for note in sections.notes(report)])
    skipped = [
        f"{escape_markdown(rule_id)}: {escape_markdown(reason)}" if reason else escape_markdown(rule_id)
        for rule_id, reason in sections.skipped_rules(report)
    ]
    lines += _bullets("Skipped rules", skipped)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"
