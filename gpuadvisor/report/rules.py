"""The rule catalog for people: ``gpuadvisor rules`` (terminal, JSON, the README's Markdown table) and
``gpuadvisor explain`` (one rule's documentation under the four fixed headings)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuadvisor.rules.engine import Rule

COLUMNS = ("id", "name", "severity", "category", "fix", "title")
EXPLAIN_HINT = "gpuadvisor explain GA101 shows what a rule detects, why it matters and the fix."


def rule_rows(rules: list[Rule]) -> list[dict[str, Any]]:
    """``rules --format json``: one object per rule."""
    return [
        {
            "id": r.id,
            "name": r.name,
            "title": r.title,
            "category": r.category,
            "severity": r.severity,
            "fix_id": r.fix_id,
            "thresholds": r.thresholds,
        }
        for r in rules
    ]


def rules_markdown(rules: list[Rule]) -> str:
    """The README's rule table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    for r in rules:
        title = r.title.replace("|", "\\|")  # a cell must not end early
        lines.append(f"| {r.id} | {r.name} | {r.severity} | {r.category} | {r.fix_id or ''} | {title} |")
    return "\n".join(lines) + "\n"


# The six-column table is used when its title column gets at least this many characters; below, the stacked one.
MIN_TITLE_CHARS = 40


def render_rules_terminal(rules: list[Rule], console: Any) -> None:
    """The catalog as a table: all six columns on a wide console; on a narrower one (80 columns) the name and
    category go above the title in one column, so titles wrap between words in a column wide enough to read."""
    from rich.table import Table
    from rich.text import Text

    rows = [(r.id, r.name, r.severity, r.category, r.fix_id or "", r.title) for r in rules]
    fixed = sum(max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(5))
    wide = console.width >= fixed + MIN_TITLE_CHARS + 3 * len(COLUMNS) + 1  # box lines and padding
    table = Table(title="gpuadvisor rules", title_justify="left")
    if wide:
        for column in COLUMNS:
            table.add_column(column)
        for row in rows:
            table.add_row(*(Text(value) for value in row))
    else:
        for column in ("id", "severity", "fix", "rule"):
            table.add_column(column)
        for rule_id, name, severity, category, fix_id, title in rows:
            cell = Text()
            cell.append(name, style="bold")
            cell.append(f" ({category})\n", style="dim")
            cell.append(title)
            table.add_row(Text(rule_id), Text(severity), Text(fix_id), cell)
    from gpuadvisor.report.layout import fit_table

    console.print(fit_table(table, console))
    console.print(Text(EXPLAIN_HINT, style="dim"))


def explain_markdown(rule: Rule) -> str:
    """``gpuadvisor explain``: the rule's documentation, generated from its TOML (never written twice)."""
    thresholds = "\n".join(f"- `{k}` = {int(v) if v.is_integer() else v}" for k, v in rule.thresholds.items())
    thresholds = thresholds or "- none"
    refs = "\n".join(f"- {r}" for r in rule.references) or "- none"
    fix_line = f"\n\nFix id: `{rule.fix_id}`" if rule.fix_id else ""
    return (
        f"# {rule.id} {rule.name}: {rule.title}\n\n"
        f"*severity* {rule.severity} · *category* {rule.category} · *detector* `{rule.detector}`\n\n"
        f"## What it does\n\n{rule.doc['what']}\n\n## Why is this bad?\n\n{rule.doc['why']}\n\n"
        f"## Example\n\n```python\n{rule.doc['example']}\n```\n\n## Use instead\n\n{rule.doc['fix']}{fix_line}\n\n"
        f"## Thresholds\n\n{thresholds}\n\n## References\n\n{refs}\n"
    )
