"""Tables that read at any width (80 columns in a CI log or a pipe included): no word and no number is cut.

:func:`fit_table` takes any rich table a command prints (the terminal views' own, and those of ``scan``, ``ncu``,
``compare``, ``diff``) and, for the console it is printed on:

1. gives every column a minimum width: a right-aligned (numeric) or no-wrap column keeps its widest cell whole;
   a text column its longest word, so cells wrap between words and never inside one;
2. if the columns' minimums do not fit, draws the table compactly (no box, one space between columns);
3. if they still do not fit, prints each row as a block of ``column  value`` lines (a record view), which fits
   any width a word fits in.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

# Words longer than this may fold (a pasted path, a URL): one of them must not push a table into record view.
MAX_WORD = 40


def _measure(console: Console, cell: RenderableType) -> Measurement:
    return Measurement.get(console, console.options, cell)


def _keeps_whole(column: Any) -> bool:
    return bool(column.no_wrap) or column.justify == "right"


def _ranges(table: Table, console: Console) -> list[tuple[int, int]]:
    """Per column (least width that breaks no word, width with nothing wrapped), content only."""
    ranges = []
    for column in table.columns:
        least, most = 0, 0
        whole = _keeps_whole(column)
        for cell in column.cells:
            measured = _measure(console, cell)
            least = max(least, measured.maximum if whole else min(measured.minimum, MAX_WORD))
            most = max(most, measured.maximum)
        if column.header:
            measured = _measure(console, column.header)
            least = max(least, min(measured.minimum, MAX_WORD))
            most = max(most, measured.maximum)
        least = max(least, column.min_width or 0)
        ranges.append((least, max(least, most)))
    return ranges


def _overhead(table: Table) -> int:
    """The padding and box lines around the cells (rich's own accounting of a table's extra width)."""
    _, right, _, left = table.padding
    count = len(table.columns)
    width = 0
    for index in range(count):
        width += (0 if index == 0 and not table.pad_edge else left) + (
            0 if index == count - 1 and not table.pad_edge else right
        )
    if table.box:
        width += count - 1 + (2 if table.show_edge else 0)
    return width


def _lay_out(table: Table, console: Console) -> bool:
    """Give every column a width such that the table fits the console and no word is broken (the widest text
    columns give way first, none below its longest word); False when even that is too wide.
    The widths are set here because rich's own narrowing can take a column below its longest word."""
    ranges = _ranges(table, console)
    available = console.width - _overhead(table)
    least = sum(low for low, _ in ranges)
    if least > available:
        return False
    widths = [high for _, high in ranges]
    if sum(widths) > available:
        # The widest columns give way first, down to a common cap, none below its longest word.
        def capped(cap: int) -> list[int]:
            return [max(low, min(high, cap)) for low, high in ranges]

        low_cap, high_cap = 0, max(widths)
        while low_cap < high_cap:
            middle = (low_cap + high_cap + 1) // 2
            if sum(capped(middle)) <= available:
                low_cap = middle
            else:
                high_cap = middle - 1
        widths = capped(low_cap)
        for index, (_, high) in enumerate(ranges):  # what the cap left unused, one column at a time
            if sum(widths) < available and widths[index] < high:
                widths[index] += 1
    for column, width, (low, _) in zip(table.columns, widths, ranges):
        column.width = width
        column.min_width = low
        if not _keeps_whole(column):
            column.overflow = "fold"  # only a word longer than MAX_WORD folds
    return True


def _compact(table: Table) -> None:
    table.box = box.SIMPLE_HEAD if table.show_header else None
    table.show_edge = False
    table.pad_edge = False
    table.padding = (0, 1, 0, 0)


def record_view(table: Table) -> RenderableType:
    """Each row of ``table`` as lines of ``column  value``, a blank line between rows, under its title."""
    headers = [
        column.header if isinstance(column.header, Text) else Text(str(column.header)) for column in table.columns
    ]
    cells = [list(column.cells) for column in table.columns]
    rows = len(cells[0]) if cells else 0
    parts: list[RenderableType] = []
    if table.title:
        parts.append(table.title if isinstance(table.title, Text) else Text(str(table.title), style="bold"))
    for index in range(rows):
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(overflow="fold")
        for header, column in zip(headers, cells):
            grid.add_row(header, column[index])
        parts.append(Padding(grid, (0, 0, 1, 0) if index < rows - 1 else (0, 0, 0, 0)))
    if table.caption:
        parts.append(table.caption if isinstance(table.caption, Text) else Text(str(table.caption), style="dim"))
    return Group(*parts)


def fit_table(table: Table, console: Console) -> RenderableType:
    """``table`` laid out for ``console``'s width (the module docstring says how); returns what to print."""
    if _lay_out(table, console):
        return table
    _compact(table)
    if _lay_out(table, console):
        return table
    return record_view(table)
