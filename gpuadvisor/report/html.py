"""``report.html``: every kind of report as one self-contained page, for a browser, offline.

One entry point, :func:`render_html`. It takes the report dict any command writes (``analyze``,
``profile``, ``apply``, ``scan``; and the result of ``gate.compare_reports`` for ``compare``) and returns
one HTML document: no file, script, style, font or image comes from anywhere else, so it opens from a CI
artifact, a mail attachment or a laptop on a plane.

The charts are SVG written here, not a plotting library: a log-log roofline with one mark per kernel row,
the step timeline and the sample distributions need ~30 lines of SVG each, and the page stays small
(~60-200 kB for the reports in benchmarks/results/, where plotly's inlined script alone would take
4.6 MB of the 5 MB budget), renders without JavaScript, and adds no dependency. The only script is the
static one at the bottom (sortable tables, hover boxes); no report text is ever placed inside it.

Every string from the report (kernel names come from traces, paths and messages from users' code) goes
through :func:`html.escape`, in text and in attributes alike, so a kernel named
``</script><script>alert(1)</script>`` shows as those characters and runs nothing.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gpuadvisor.report.formatting import (
    MISSING,
    as_number,
    format_bytes,
    format_bytes_per_s,
    format_count,
    format_flops,
    format_flops_per_s,
    format_intensity,
    format_pct,
    format_us,
    short_kernel_name,
)
from gpuadvisor.report.sections import evidence_value

# The bound on one report.html. The largest report in benchmarks/results/ renders to about 0.2 MB.
MAX_HTML_BYTES = 5_000_000
# Kernel rows drawn and listed. Reports keep their top 50 by time (report/build.py, top_kernels); a hand-made
# report with more still renders within MAX_HTML_BYTES (about 1.5 kB a row, table and mark together).
MAX_KERNEL_ROWS = 1000
# Dots drawn per side of a sample distribution; more are thinned to evenly spaced quantiles (the box and the
# median always use every sample).
MAX_DOTS = 2000
# Hover text keeps this much of a kernel name (the table has the whole name in its title).
TIP_NAME_CHARS = 240

# Okabe–Ito colours: told apart with the common colour-vision deficiencies.
CLASS_COLOURS = {
    "compute": "#0072B2",
    "memory": "#009E73",
    "latency": "#CC79A7",
    "launch": "#D55E00",
    "unknown": "#999999",
}
LANE_COLOURS = {
    "kernels": "#0072B2",
    "copies": "#E69F00",
    "busy": "#56B4E9",
    "idle_launch": "#D55E00",
    "idle_sync": "#CC79A7",
    "idle_other": "#BBBBBB",
    "idle": "#DDDDDD",
}
LANE_NAMES = {
    "kernels": "GPU busy: kernels",
    "copies": "GPU busy: copies",
    "busy": "GPU busy",
    "idle_launch": "idle: waiting for launches",
    "idle_sync": "idle: after host syncs",
    "idle_other": "idle: other",
    "idle": "idle (not classified)",
}
VERDICT_COLOURS = {
    "pass": "#1b7f3b",
    "improvement": "#1b7f3b",
    "regression": "#b00020",
    "inconclusive": "#a05a00",
    "skipped": "#777777",
    "not comparable": "#b00020",
}
SEVERITY_COLOURS = {"high": "#b00020", "medium": "#a05a00", "low": "#33691e", "info": "#555555"}


# --- the entry point ---------------------------------------------------------------------------------


def report_kind(report: Mapping[str, Any]) -> str:
    """ "compare" (a ``gate.compare_reports`` result), "apply", "scan", or "trace" (analyze, profile)."""
    if "verdict" in report and "metrics" in report and "summary" not in report:
        return "compare"
    command = report.get("command")
    if command == "apply" or ("before" in report and "after" in report and "fixes" in report):
        return "apply"
    if command == "scan":
        return "scan"
    return "trace"


def render_html(
    report: Mapping[str, Any],
    *,
    base_report: Mapping[str, Any] | None = None,
    current_report: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> str:
    """The report as one self-contained HTML page (a str; write it as UTF-8).

    ``report``: a report.json dict of any command, or for ``compare`` the dict ``gate.compare_reports``
    returns; :func:`report_kind` tells them apart. ``base_report`` and ``current_report``: for a compare
    result only, the two reports it compared, whose step samples the page draws (without them the page has
    the verdicts and numbers but no distributions). ``title``: the page title (default: from the report).

    The page has no external reference (no ``src``/``href`` to a URL), is at most :data:`MAX_HTML_BYTES`,
    and holds: for analyze/profile the headline numbers, findings (evidence, saving, fix), the roofline
    (one mark per kernel row, class ``kpoint``, ``data-kernel`` = the row's index), the timeline, the
    sortable kernels table, transfers, host syncs, ranks, memory, environment and peaks; for apply the
    before/after step times with the speedup's CI, each fix with its numerics, the search, the per-kernel
    diff, then the after run as for profile; for compare each metric's verdict with both sides' samples.
    """
    kind = report_kind(report)
    page = _render(kind, report, base_report, current_report, title)
    # A hand-made report can be larger than any command writes: halve what grows with it (kernel rows, the
    # strip's intervals) until the page fits, and say so on the page.
    while len(page.encode()) > MAX_HTML_BYTES and kind in ("trace", "apply"):
        smaller = _halved(report)
        if smaller is None:
            break
        report = smaller
        page = _render(kind, report, base_report, current_report, title)
    return page


def _render(kind: str, report, base_report, current_report, title: str | None) -> str:
    if kind == "compare":
        heading, body = _compare_page(report, base_report, current_report)
    elif kind == "apply":
        heading, body = _apply_page(report)
    elif kind == "scan":
        heading, body = _scan_page(report)
    else:
        heading, body = _trace_page(report)
    return _document(title or heading, kind, body)


def _halved(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """``report`` with half its kernel rows (the largest) and half of each strip lane (the longest), or None
    when nothing is left to halve."""
    kernels = _list(report.get("kernels"))[:MAX_KERNEL_ROWS]
    timeline = _dict(report.get("timeline"))
    lanes = {k: v for k, v in timeline.items() if k in LANE_NAMES and isinstance(v, list) and len(v) > 50}
    if len(kernels) <= 10 and not lanes:
        return None
    out = dict(report)
    if len(kernels) > 10:
        out["kernels"] = kernels[: len(kernels) // 2]
    if lanes:
        strip = dict(timeline)
        for lane, intervals in lanes.items():
            longest = sorted(_intervals(intervals), key=lambda iv: -iv[1])[: len(intervals) // 2]
            strip[lane] = sorted(longest)
        out["timeline"] = strip
    note = f"report.html shows the first {len(out.get('kernels') or [])} kernel rows of {len(report['kernels'])}"
    note += " and the longest intervals of the timeline, to stay under 5 MB" if lanes else ", to stay under 5 MB"
    out["notes"] = [n for n in _list(report.get("notes")) if not str(n).startswith("report.html shows")] + [note]
    return out


# --- text ----------------------------------------------------------------------------------------------


def esc(value: Any, default: str = MISSING) -> str:
    """``value`` as HTML-escaped text (quotes too, so the result is safe in an attribute); None -> default."""
    if value is None:
        return html.escape(default, quote=True)
    if isinstance(value, float) and not math.isfinite(value):
        return html.escape(default, quote=True)
    return html.escape(str(value), quote=True)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _rows(value: Any) -> list[dict[str, Any]]:
    return [r for r in _list(value) if isinstance(r, dict)]


def _g(value: Any) -> str:
    number = as_number(value)
    return MISSING if number is None else f"{number:.3g}"


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


# --- HTML pieces ---------------------------------------------------------------------------------------


def _section(anchor: str, heading: str, inner: str, note: str = "") -> str:
    lead = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{anchor}"><h2>{esc(heading)}</h2>{lead}{inner}</section>'


def _cards(items: Sequence[tuple[str, str, str]]) -> str:
    """Headline numbers: (label, value, detail), all already plain text (escaped here)."""
    cells = "".join(
        f'<div class="card"><div class="label">{esc(label)}</div><div class="value">{esc(value)}</div>'
        f'<div class="detail">{esc(detail, "")}</div></div>'
        for label, value, detail in items
        if value and value != MISSING
    )
    return f'<div class="cards">{cells}</div>' if cells else ""


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v not in (None, ""))
    return f'<table class="kv">{body}</table>' if body else ""


class Cell:
    """A table cell: shown text, the value a sort uses (numbers sort as numbers), a title, a CSS class."""

    __slots__ = ("text", "sort", "title", "css")

    def __init__(self, text: Any, sort: Any = None, title: Any = None, css: str = "") -> None:
        self.text, self.sort, self.title, self.css = text, sort, title, css


def _num_cell(value: Any, formatter=format_count) -> Cell:
    number = as_number(value)
    return Cell(formatter(number) if number is not None else MISSING, number, None, "num")


def _table(
    headers: Sequence[tuple[str, bool]], rows: Sequence[Sequence[Any]], *, sortable: bool = True, css: str = ""
) -> str:
    """A table; ``headers`` are (name, numeric). A cell is a :class:`Cell` or any value (shown as text)."""
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(
        f"<th{' data-type=num' if numeric else ''}{' class=num' if numeric else ''}>{esc(name)}</th>"
        for name, numeric in headers
    )
    lines = []
    for row in rows:
        cells = []
        for cell in row:
            if not isinstance(cell, Cell):
                cell = Cell(cell)
            attrs = ""
            if cell.sort is not None:
                attrs += f' data-sort="{esc(cell.sort)}"'
            if cell.title:
                attrs += f' title="{esc(cell.title)}"'
            if cell.css:
                attrs += f' class="{cell.css}"'
            cells.append(f"<td{attrs}>{cell.text if isinstance(cell.text, _Html) else esc(cell.text)}</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    classes = " ".join(c for c in ("sortable" if sortable else "", css) if c)
    return (
        f'<div class="scroll"><table class="{classes}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(lines)}</tbody></table></div>"
    )


class _Html(str):
    """Markup built here from escaped parts: a :class:`Cell` shows it as is."""


def _badge(text: str, colour: str) -> _Html:
    return _Html(f'<span class="badge" style="background:{colour}">{esc(text)}</span>')


def _paragraphs(lines: Sequence[Any], css: str = "notes") -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines if line)
    return f'<ul class="{css}">{items}</ul>' if items else ""


# --- SVG -----------------------------------------------------------------------------------------------


def _log10(x: float) -> float:
    return math.log10(x)


def _decade_label(value: float, unit: str) -> str:
    """10^k as a short label: 1, 10, 100, 1k, ... for FLOP/s ("1 T"); 0.01, 0.1, 1, 10 for intensity."""
    if unit == "flops":
        for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
            if value >= scale:
                return f"{value / scale:g} {prefix}".strip()
        return f"{value:g}"
    return f"{value:g}"


def _tip(lines: Sequence[str]) -> str:
    """A hover text, one fact a line."""
    text = "\n".join(line for line in lines if line)
    return text


def _svg_title(tip: str) -> str:
    """A mark's hover text, written once: the browser shows a <title> without script; the page's script moves
    it into the ``data-tip`` attribute its own hover box reads."""
    return f"<title>{esc(tip)}</title>"


def _kernel_tip(row: dict[str, Any], placed: bool, reason: str = "") -> str:
    name = str(row.get("name") or MISSING)
    estimated = row.get("estimated")
    roof = as_number(row.get("pct_of_roof"))
    roof_text = format_pct(roof) + " of roof" if roof is not None else "% of roof: " + MISSING
    if roof is None and row.get("roof_note"):
        roof_text += f" ({row['roof_note']})"
    lines = [
        _clip(name, TIP_NAME_CHARS),
        f"class: {row.get('bound') or 'unknown'}"
        + (f" · family {row['family']}" if row.get("family") else "")
        + (f" · {row['dtype']}" if row.get("dtype") else ""),
        f"calls: {format_count(row.get('count'))} ({format_count(row.get('count_per_step'))} per step)",
        f"time: {format_us(row.get('us_per_step'))} per step"
        + (
            f" ({format_pct(row.get('pct_of_gpu_time'))} of GPU time)" if row.get("pct_of_gpu_time") is not None else ""
        ),
    ]
    if placed:
        lines.append(
            f"intensity {format_intensity(row.get('intensity'))} FLOP/B · "
            f"{format_flops_per_s(row.get('achieved_flops_per_s'))}"
        )
    lines.append(roof_text)
    if estimated is None:
        lines.append("estimate: unknown")
    else:
        lines.append("FLOPs/bytes are an estimate" if estimated else "FLOPs measured by the profiler, bytes estimated")
    if reason:
        lines.append(f"not on the roofline: {reason}")
    return _tip(lines)


def _dtype_key(dtype: Any) -> str | None:
    try:
        from gpuadvisor.device.peaks import dtype_key
    except ImportError:  # pragma: no cover - the module is part of the package
        return None
    return dtype_key(dtype) if isinstance(dtype, str) else None


def _unplaced_reason(row: dict[str, Any]) -> str | None:
    """Why a kernel row has no place on the log-log roofline, None when it has one."""
    intensity = as_number(row.get("intensity"))
    achieved = as_number(row.get("achieved_flops_per_s"))
    if intensity is None or achieved is None:
        if row.get("bound") == "unknown" or row.get("family") == "communication":
            return "communication kernel: no FLOP or byte count"
        return "no FLOP or byte count for this kernel (no linked operator, or its shapes were not recorded)"
    if intensity <= 0 or achieved <= 0:
        return "0 FLOPs counted (data movement only): a log axis has no 0"
    return None


def roofline_svg(kernels: Sequence[dict[str, Any]], peaks: Mapping[str, Any]) -> str:
    """The roofline: one ``circle.kpoint`` per kernel row (``data-kernel`` = row index). Rows with an
    intensity and an achieved rate sit on the log-log chart; the others in the strip under it, saying why."""
    width, height = 900, 470
    left, right, top, bottom = 78, 150, 18, 52
    pw, ph = width - left - right, height - top - bottom
    hbm = as_number(peaks.get("hbm_bytes_per_s"))
    flops_peaks = {k: as_number(v) for k, v in _dict(peaks.get("flops_per_s")).items() if as_number(v)}
    placed: list[tuple[int, dict[str, Any], float, float]] = []
    unplaced: list[tuple[int, dict[str, Any], str]] = []
    for i, row in enumerate(kernels):
        reason = _unplaced_reason(row)
        if reason:
            unplaced.append((i, row, reason))
        else:
            placed.append((i, row, float(row["intensity"]), float(row["achieved_flops_per_s"])))
    used = []
    for row in kernels:
        key = _dtype_key(row.get("dtype"))
        if key and key in flops_peaks and key not in used:
            used.append(key)
    # The roof each row's % of roof was taken against (achieved / pct): fp32 matmuls on tensor cores sit under
    # the tf32 roof though their dtype says float (timm ResNet-50: wgrad at 129 TFLOP/s, 26.6% of 495).
    for row in kernels:
        achieved, pct = as_number(row.get("achieved_flops_per_s")), as_number(row.get("pct_of_roof"))
        intensity = as_number(row.get("intensity"))
        if not (achieved and pct and intensity and hbm) or abs(achieved * 100 / pct / (hbm * intensity) - 1) < 0.03:
            continue
        attainable = achieved * 100 / pct
        for key, peak in flops_peaks.items():
            if abs(attainable / peak - 1) < 0.03 and key not in used:
                used.append(key)
    if not used:
        used = [k for k in ("bf16", "fp32") if k in flops_peaks] or list(flops_peaks)[:2]
    roofs = sorted(((k, flops_peaks[k]) for k in used), key=lambda kv: -kv[1])
    have_roofs = bool(hbm and roofs)

    xs = [p[2] for p in placed]
    ys = [p[3] for p in placed]
    if have_roofs:
        xs += [peak / hbm for _, peak in roofs]
        ys += [peak for _, peak in roofs]
    if not xs:
        xs, ys = [0.1, 100.0], [1e9, 1e15]
    x0 = 10 ** math.floor(_log10(min(xs)) - 0.25)
    x1 = 10 ** math.ceil(_log10(max(xs)) + 0.25)
    y1 = 10 ** math.ceil(_log10(max(ys)) + 0.1)
    y0 = 10 ** math.floor(_log10(min(ys)))
    if x1 / x0 < 1e3:
        x0, x1 = x0 / 10, x1 * 10
    if y1 / y0 < 1e3:
        y0 = y1 / 1e3
    lx0, lx1, ly0, ly1 = _log10(x0), _log10(x1), _log10(y0), _log10(y1)

    def px(x: float) -> float:
        return left + (_log10(x) - lx0) / (lx1 - lx0) * pw

    def py(y: float) -> float:
        return top + ph - (_log10(y) - ly0) / (ly1 - ly0) * ph

    out = [
        f'<svg id="roofline-chart" class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="roofline: achieved FLOP/s against arithmetic intensity, one mark per kernel">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    for k in range(math.ceil(lx0), math.floor(lx1) + 1):
        x = px(10**k)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" class="grid"/>')
        out.append(
            f'<text x="{x:.1f}" y="{top + ph + 16}" class="tick" text-anchor="middle">'
            f"{esc(_decade_label(10**k, 'intensity'))}</text>"
        )
    for k in range(math.ceil(ly0), math.floor(ly1) + 1):
        y = py(10**k)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" class="grid"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{esc(_decade_label(10**k, 'flops'))}</text>"
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 10}" class="axis" text-anchor="middle">'
        "arithmetic intensity (FLOP/byte)</text>"
    )
    out.append(
        f'<text x="16" y="{top + ph / 2}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + ph / 2})">achieved FLOP/s</text>'
    )
    out.append(f'<clipPath id="roof-clip"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/></clipPath>')
    if have_roofs:
        top_peak = roofs[0][1]
        ridge = top_peak / hbm
        mx0 = max(x0, y0 / hbm)
        out.append(
            f'<g clip-path="url(#roof-clip)"><line x1="{px(mx0):.1f}" y1="{py(hbm * mx0):.1f}" x2="{px(ridge):.1f}" '
            f'y2="{py(top_peak):.1f}" class="roof"/>'
        )
        for _, peak in roofs:
            r = peak / hbm
            out.append(
                f'<line x1="{px(r):.1f}" y1="{py(peak):.1f}" x2="{left + pw}" y2="{py(peak):.1f}" class="roof"/>'
            )
        out.append("</g>")
        for key, peak in roofs:
            out.append(
                f'<text x="{left + pw + 6}" y="{py(peak) + 4:.1f}" class="roof-label">{esc(key)} '
                f"{esc(format_flops_per_s(peak))}</text>"
            )
        # The memory roof's label, along its slope at the left of the chart.
        lx = max(mx0, x0) * 3
        if lx < ridge:
            angle = -math.degrees(math.atan2(py(hbm * x0) - py(hbm * x0 * 10), px(x0 * 10) - px(x0)))
            # dy, inside the rotation, lifts the label off the line perpendicular to it.
            out.append(
                f'<text x="{px(lx):.1f}" y="{py(hbm * lx):.1f}" dy="-5" class="roof-label" '
                f'transform="rotate({angle:.1f} {px(lx):.1f} {py(hbm * lx):.1f})">HBM '
                f"{esc(format_bytes_per_s(hbm))}</text>"
            )
    else:
        out.append(
            f'<text x="{left + 10}" y="{top + 18}" class="tick">no peak figures for this GPU: no roofs '
            "drawn (use --peaks FILE or gpuadvisor calibrate)</text>"
        )
    max_us = max([as_number(r.get("us_per_step")) or 0.0 for r in kernels] + [1e-9])

    def radius(row: dict[str, Any]) -> float:
        us = as_number(row.get("us_per_step")) or 0.0
        return 3.0 + 16.0 * math.sqrt(max(us, 0.0) / max_us)

    def colour(row: dict[str, Any]) -> str:
        return CLASS_COLOURS.get(str(row.get("bound")), CLASS_COLOURS["unknown"])

    def mark(i: int, row: dict[str, Any], cx: float, cy: float, tip: str, placed_mark: bool) -> str:
        dash = ' stroke-dasharray="2 2"' if row.get("estimated") else ""
        return (
            f'<circle class="kpoint{" placed" if placed_mark else ""}" data-kernel="{i}" '
            f'data-bound="{esc(row.get("bound") or "unknown")}" cx="{cx:.1f}" cy="{cy:.1f}" r="{radius(row):.1f}" '
            f'fill="{colour(row)}"{dash}>{_svg_title(tip)}</circle>'
        )

    # Largest first, so small marks stay on top and can be hovered.
    for i, row, x, y in sorted(placed, key=lambda p: -(as_number(p[1].get("us_per_step")) or 0.0)):
        out.append(mark(i, row, px(x), py(y), _kernel_tip(row, True), True))
    out.append("</svg>")
    svg = "".join(out)
    lane = ""
    if unplaced:
        lw, lh = width, 64
        step = (lw - left - right) / max(len(unplaced), 1)
        parts = [
            f'<svg id="roofline-unplaced" class="chart" viewBox="0 0 {lw} {lh}" width="{lw}" height="{lh}" role="img" '
            f'aria-label="kernels without a place on the roofline">',
            f'<text x="{left - 6}" y="20" class="tick" text-anchor="end">not on the</text>',
            f'<text x="{left - 6}" y="34" class="tick" text-anchor="end">roofline</text>',
        ]
        ordered = sorted(unplaced, key=lambda u: -(as_number(u[1].get("us_per_step")) or 0.0))
        for n, (i, row, reason) in enumerate(ordered):
            parts.append(mark(i, row, left + step * (n + 0.5), lh / 2, _kernel_tip(row, False, reason), False))
        parts.append("</svg>")
        lane = "".join(parts)
    legend = "".join(
        f'<span class="key"><i style="background:{c}"></i>{esc(name)}-bound</span>'
        for name, c in CLASS_COLOURS.items()
        if any(str(r.get("bound") or "unknown") == name for r in kernels)
    )
    legend += '<span class="key"><i class="dashed"></i>dashed outline: FLOPs or bytes estimated</span>'
    legend += '<span class="key">area: GPU time per step</span>'
    return f'<div class="figure">{svg}{lane}<div class="legend">{legend}</div></div>'


def _bar_row_svg(rows: Sequence[tuple[str, float | None, list[tuple[str, float]]]], scale_us: float) -> str:
    """Stacked horizontal bars: (label, step µs, [(lane, µs), ...]), on one scale."""
    width, left, right, row_h = 900, 180, 90, 26
    height = 12 + row_h * len(rows)
    pw = width - left - right
    out = [
        f'<svg class="chart steps" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="where each step\'s time goes">'
    ]
    for n, (label, step_us, parts) in enumerate(rows):
        y = 8 + n * row_h
        out.append(f'<text x="{left - 8}" y="{y + 14}" class="tick" text-anchor="end">{esc(label)}</text>')
        x = float(left)
        for lane, us in parts:
            if us <= 0:
                continue
            w = us / scale_us * pw
            share = f" ({format_pct(100 * us / step_us)} of the step)" if step_us else ""
            tip = f"{label}: {LANE_NAMES.get(lane, lane)} {format_us(us)}{share}"
            out.append(
                f'<rect class="seg" data-lane="{lane}" x="{x:.2f}" y="{y}" width="{max(w, 0.5):.2f}" '
                f'height="{row_h - 8}" '
                f'fill="{LANE_COLOURS.get(lane, "#888")}">{_svg_title(tip)}</rect>'
            )
            x += w
        if step_us:
            out.append(f'<text x="{x + 6:.1f}" y="{y + 14}" class="tick">{esc(format_us(step_us))}</text>')
    out.append("</svg>")
    return "".join(out)


def _step_parts(
    step_us: float | None, busy: Any, idle_launch: Any, idle_sync: Any, idle_other: Any, copies: Any = None
) -> list[tuple[str, float]]:
    busy_us = as_number(busy)
    parts: list[tuple[str, float]] = []
    copy_us = as_number(copies)
    if busy_us is not None:
        if copy_us is not None and 0 <= copy_us <= busy_us + 0.01:
            parts += [("kernels", max(busy_us - copy_us, 0.0)), ("copies", copy_us)]
        else:
            parts.append(("busy", busy_us))
    idles = [("idle_launch", as_number(idle_launch)), ("idle_sync", as_number(idle_sync))]
    idles.append(("idle_other", as_number(idle_other)))
    parts += [(lane, v) for lane, v in idles if v is not None]
    if step_us is not None:
        rest = step_us - sum(v for _, v in parts)
        if rest > max(0.005 * step_us, 0.5):
            parts.append(("idle", rest))
    return parts


def _strip_svg(timeline: Mapping[str, Any]) -> str:
    """One step as lanes of intervals from its start (analysis.timeline.step_timeline's dict)."""
    step_us = as_number(timeline.get("step_time_us")) or 0.0
    lanes = [lane for lane in ("kernels", "copies", "idle_launch", "idle_sync", "idle_other") if timeline.get(lane)]
    if not step_us or not lanes:
        return ""
    width, left, right, lane_h = 900, 180, 90, 22
    height = 40 + lane_h * len(lanes)
    pw = width - left - right
    out = [
        f'<svg id="timeline-strip" class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="timeline of one step">'
    ]
    for n, lane in enumerate(lanes):
        y = 6 + n * lane_h
        total = sum(as_number(d) or 0.0 for _, d in _intervals(timeline.get(lane)))
        out.append(f'<text x="{left - 8}" y="{y + 13}" class="tick" text-anchor="end">{esc(LANE_NAMES[lane])}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{pw}" height="{lane_h - 6}" class="lane"/>')
        colour = LANE_COLOURS[lane]
        for start, dur in _intervals(timeline.get(lane)):
            x = left + start / step_us * pw
            w = max(dur / step_us * pw, 0.6)
            tip = f"{LANE_NAMES[lane]}: {format_us(dur)} at +{format_us(start)}"
            out.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane_h - 6}" fill="{colour}">'
                f"{_svg_title(tip)}</rect>"
            )
        out.append(f'<text x="{left + pw + 6}" y="{y + 13}" class="tick lane-total">{esc(format_us(total))}</text>')
    axis_y = 6 + lane_h * len(lanes) + 14
    for k in range(6):
        x = left + pw * k / 5
        out.append(
            f'<text x="{x:.1f}" y="{axis_y}" class="tick" text-anchor="middle">{esc(format_us(step_us * k / 5))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _intervals(value: Any) -> list[tuple[float, float]]:
    out = []
    for item in _list(value):
        if isinstance(item, (list, tuple)) and len(item) >= 2:
            start, dur = as_number(item[0]), as_number(item[1])
            if start is not None and dur is not None and dur > 0:
                out.append((start, dur))
    return out


def timeline_html(report: Mapping[str, Any], label: str = "step") -> str:
    """The timeline section's figures: one step's intervals when the report has ``timeline``, and a bar per
    step (``steps``), or per side for apply, else one for the median step (``summary``)."""
    timeline = _dict(report.get("timeline"))
    parts = []
    strip = _strip_svg(timeline) if timeline else ""
    if strip:
        omitted = _dict(timeline.get("omitted"))
        note = f"Step {esc(timeline.get('step'))}, the profiled step nearest the median, from its start."
        if omitted:
            note += " The shortest intervals are left out: " + esc(
                ", ".join(f"{LANE_NAMES.get(k, k)} {v}" for k, v in omitted.items())
            )
        parts.append(f'<h3>One step, from its start</h3><p class="note">{note}</p>{strip}')
    rows: list[tuple[str, float | None, list[tuple[str, float]]]] = []
    copies = _list(timeline.get("copy_us_per_step"))
    steps = _rows(report.get("steps"))
    summary = _dict(report.get("summary"))
    for n, s in enumerate(steps):
        step_us = as_number(s.get("step_time_us"))
        copy = copies[n] if len(copies) == len(steps) else s.get("memcpy_us")
        rows.append(
            (
                f"{label} {s.get('step', n)}",
                step_us,
                _step_parts(
                    step_us,
                    s.get("gpu_busy_us"),
                    s.get("idle_launch_us"),
                    s.get("idle_sync_us"),
                    s.get("idle_other_us"),
                    copy,
                ),
            )
        )
    if not rows and summary:
        step_us = as_number(summary.get("trace_step_time_us")) or as_number(summary.get("step_time_us"))
        if step_us and as_number(summary.get("gpu_busy_us")) is not None:
            rows.append(
                (
                    "median step",
                    step_us,
                    _step_parts(
                        step_us,
                        summary.get("gpu_busy_us"),
                        summary.get("idle_launch_us"),
                        summary.get("idle_sync_us"),
                        summary.get("idle_other_us"),
                        summary.get("memcpy_us_per_step"),
                    ),
                )
            )
    if rows:
        scale = max((r[1] or sum(v for _, v in r[2])) for r in rows) or 1.0
        heading = "Every profiled step" if steps else "The median profiled step"
        parts.append(f"<h3>{heading}</h3>" + _bar_row_svg(rows, scale))
    if not parts:
        return '<p class="empty">the report has no step figures</p>'
    present = {lane for r in rows for lane, v in r[2] if v > 0} | {
        lane for lane in ("kernels", "copies", "idle_launch", "idle_sync", "idle_other") if timeline.get(lane)
    }
    legend = "".join(
        f'<span class="key"><i style="background:{LANE_COLOURS[lane]}"></i>{esc(LANE_NAMES[lane])}</span>'
        for lane in LANE_NAMES
        if lane in present
    )
    return f'<div class="figure">{"".join(parts)}<div class="legend">{legend}</div></div>'


def _distribution_svg(sides: Sequence[tuple[str, list[float]]], unit: str, svg_id: str = "") -> str:
    """Each side's samples as dots with a p10–p90 box and a median tick, on one axis (log when the sides
    differ by more than 4x)."""
    values = [v for _, samples in sides for v in samples if v is not None and math.isfinite(v)]
    if not values:
        return ""
    width, left, right, row_h = 900, 150, 30, 44
    height = 34 + row_h * len(sides)
    pw = width - left - right
    lo, hi = min(values), max(values)
    log = lo > 0 and hi / lo > 4
    if log:
        a, b = _log10(lo) - 0.05, _log10(hi) + 0.05
    else:
        pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
        a, b = lo - pad, hi + pad

    def px(v: float) -> float:
        t = (_log10(v) if log else v) - a
        return left + t / (b - a) * pw

    ident = f' id="{esc(svg_id)}"' if svg_id else ""
    out = [
        f'<svg{ident} class="chart dist" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="sample distributions">'
    ]
    for n, (label, samples) in enumerate(sides):
        y = 8 + n * row_h
        mid = y + (row_h - 10) / 2
        clean = sorted(v for v in samples if v is not None and math.isfinite(v) and (v > 0 or not log))
        out.append(f'<text x="{left - 8}" y="{mid + 4:.1f}" class="tick" text-anchor="end">{esc(label)}</text>')
        if not clean:
            out.append(f'<text x="{left}" y="{mid + 4:.1f}" class="tick">no samples</text>')
            continue
        p10, p50, p90 = _quantile(clean, 0.1), statistics.median(clean), _quantile(clean, 0.9)
        tip = (
            f"{label}: {len(clean)} samples, median {_fmt_unit(p50, unit)}, p10 {_fmt_unit(p10, unit)}, "
            f"p90 {_fmt_unit(p90, unit)}, min {_fmt_unit(clean[0], unit)}, max {_fmt_unit(clean[-1], unit)}"
        )
        out.append(
            f'<rect class="box" x="{px(p10):.1f}" y="{y}" width="{max(px(p90) - px(p10), 1):.1f}" height="{row_h - 10}"'
            f">{_svg_title(tip)}</rect>"
        )
        out.append(f'<line class="median" x1="{px(p50):.1f}" y1="{y - 2}" x2="{px(p50):.1f}" y2="{y + row_h - 8}"/>')
        anchor = "end" if px(p50) > left + pw * 0.75 else "start"
        shift = -6 if anchor == "end" else 6
        out.append(
            f'<text x="{max(px(p90), px(p50)) + 6 if anchor == "start" else min(px(p10), px(p50)) + shift:.1f}" '
            f'y="{y + 9}" class="tick" text-anchor="{anchor}">{"median " if len(clean) > 1 else ""}'
            f"{esc(_fmt_unit(p50, unit))}</text>"
        )
        shown = (
            clean
            if len(clean) <= MAX_DOTS
            else [clean[int(k * (len(clean) - 1) / (MAX_DOTS - 1))] for k in range(MAX_DOTS)]
        )
        for k, v in enumerate(shown):
            jitter = ((k * 7919) % 17) / 16 - 0.5
            out.append(f'<circle class="dot" cx="{px(v):.1f}" cy="{mid + jitter * (row_h - 18):.1f}" r="2"/>')
    ticks = _ticks(a, b, log)
    axis_y = 8 + row_h * len(sides) + 12
    for t in ticks:
        x = px(t)
        out.append(f'<text x="{x:.1f}" y="{axis_y}" class="tick" text-anchor="middle">{esc(_fmt_unit(t, unit))}</text>')
    out.append("</svg>")
    return "".join(out)


def _ticks(a: float, b: float, log: bool) -> list[float]:
    if log:
        ticks = [m * 10**k for k in range(math.floor(a), math.ceil(b) + 1) for m in (1, 2, 5)]
        ticks = [t for t in ticks if a <= _log10(t) <= b]
        if len(ticks) > 8:
            ticks = [t for t in ticks if f"{t:g}"[0] in "15"]
        return ticks or [10**a, 10**b]
    span = b - a
    step = 10 ** math.floor(_log10(span / 5)) if span > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if span / (step * mult) <= 6:
            step *= mult
            break
    first = math.ceil(a / step) * step
    return [first + k * step for k in range(int((b - first) / step) + 1)]


def _quantile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _fmt_unit(value: Any, unit: str) -> str:
    if unit == "us":
        return format_us(value)
    if unit == "bytes":
        return format_bytes(value)
    if unit == "J":
        number = as_number(value)
        return MISSING if number is None else f"{number:.3g} J"
    if unit == "tokens/s":
        number = as_number(value)
        return MISSING if number is None else f"{number:,.1f}/s"
    return format_count(value)


def _paired_bars_svg(rows: Sequence[tuple[str, float | None, float | None]], unit: str) -> str:
    """Before (grey) and after (blue) bars per row, one linear scale."""
    values = [v for _, b, a in rows for v in (b, a) if v is not None]
    if not values:
        return ""
    width, left, right, row_h = 900, 150, 110, 30
    height = 10 + row_h * len(rows)
    pw = width - left - right
    top_value = max(values) or 1.0
    out = [f'<svg class="chart bars" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    for n, (label, before, after) in enumerate(rows):
        y = 6 + n * row_h
        out.append(f'<text x="{left - 8}" y="{y + 14}" class="tick" text-anchor="end">{esc(label)}</text>')
        for k, (side, value, fill) in enumerate((("before", before, "#9e9e9e"), ("after", after, "#0072B2"))):
            if value is None:
                continue
            w = max(value / top_value * pw, 0.5)
            tip = f"{label} {side}: {_fmt_unit(value, unit)}"
            out.append(
                f'<rect x="{left}" y="{y + k * 11}" width="{w:.1f}" height="10" fill="{fill}">{_svg_title(tip)}</rect>'
            )
            out.append(
                f'<text x="{left + w + 4:.1f}" y="{y + k * 11 + 9}" class="tick">{esc(_fmt_unit(value, unit))}</text>'
            )
    out.append("</svg>")
    legend = (
        '<div class="legend"><span class="key"><i style="background:#9e9e9e"></i>before</span>'
        '<span class="key"><i style="background:#0072B2"></i>after</span></div>'
    )
    return "".join(out) + legend


# --- sections shared by the report kinds --------------------------------------------------------------


def _header(title: str, lines: Sequence[tuple[str, Any]]) -> str:
    facts = "".join(f"<span><b>{esc(k)}</b> {esc(v)}</span>" for k, v in lines if v not in (None, ""))
    return f'<header><h1>{esc(title)}</h1><div class="facts">{facts}</div></header>'


def _gpu_text(report: Mapping[str, Any]) -> str | None:
    env = _dict(report.get("env"))
    if not env.get("gpu_name"):
        return None
    extra = []
    if env.get("sm_count"):
        extra.append(f"{env['sm_count']} SMs")
    if env.get("compute_capability"):
        extra.append(f"sm_{str(env['compute_capability']).replace('.', '')}")
    return f"{env['gpu_name']}" + (f" ({', '.join(extra)})" if extra else "")


def findings_html(findings: Sequence[dict[str, Any]], empty: str = "no findings") -> str:
    """Each finding: severity, rule, title, message, evidence table, saving, fix (``div.finding``)."""
    if not findings:
        return f'<p class="empty">{esc(empty)}</p>'
    out = []
    for f in findings:
        severity = str(f.get("severity") or "info")
        saving_us = as_number(f.get("estimated_saving_us_per_step"))
        saving_pct = as_number(f.get("estimated_saving_pct"))
        basis = f.get("saving_basis")
        saving = ""
        if saving_us == 0 and saving_pct is None:
            saving = "saving not estimated"
        elif saving_us is not None:
            upper = basis == "upper bound"
            saving = (
                f"{'up to ' if upper else ''}{format_us(saving_us)} per step"
                + (f" ({format_pct(saving_pct)} of the step)" if saving_pct is not None else "")
                + (f" · basis: {basis}" if basis else "")
            )
        evidence = _dict(f.get("evidence"))
        ev_rows = "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(evidence_value(str(k), v))}</td></tr>" for k, v in evidence.items()
        )
        fix_id = f.get("fix_id")
        fix = f.get("fix")
        out.append(
            f'<div class="finding" data-rule="{esc(f.get("rule_id"))}" data-severity="{esc(severity)}">'
            f'<div class="finding-head">{_badge(severity, SEVERITY_COLOURS.get(severity, "#555"))}'
            f'<span class="rule">{esc(f.get("rule_id"))}</span> <span class="title">{esc(f.get("title"))}</span>'
            + (f'<span class="saving">{esc(saving)}</span>' if saving else "")
            + "</div>"
            f'<p class="message">{esc(f.get("message"), "")}</p>'
            + (f'<details><summary>evidence</summary><table class="kv">{ev_rows}</table></details>' if ev_rows else "")
            + (
                f'<p class="fix"><b>Fix:</b> {esc(fix, "")}</p>'
                + (
                    f'<p class="fix">Applied for you by <code>gpuadvisor apply model.py --fix {esc(fix_id)}</code></p>'
                    if fix_id
                    else ""
                )
                if fix or fix_id
                else ""
            )
            + "</div>"
        )
    return "".join(out)


def kernels_table_html(kernels: Sequence[dict[str, Any]]) -> str:
    """The sortable kernels table (``table#kernels-table``), one row per kernel row of the report."""
    rows = []
    for i, k in enumerate(kernels):
        bound = str(k.get("bound") or "unknown")
        estimated = k.get("estimated")
        rows.append(
            [
                Cell(i, i, None, "num"),
                Cell(short := short_kernel_name(k.get("name")), short, k.get("name"), "name"),
                Cell(_badge(bound, CLASS_COLOURS.get(bound, "#999")), bound),
                _num_cell(k.get("count")),
                _num_cell(k.get("count_per_step")),
                _num_cell(k.get("us_per_step"), format_us),
                _num_cell(k.get("pct_of_gpu_time"), format_pct),
                _num_cell(k.get("mean_us"), format_us),
                _num_cell(k.get("flops"), format_flops),
                _num_cell(k.get("bytes"), format_bytes),
                _num_cell(k.get("intensity"), format_intensity),
                _num_cell(k.get("achieved_flops_per_s"), format_flops_per_s),
                _num_cell(k.get("achieved_bytes_per_s"), format_bytes_per_s),
                Cell(format_pct(k.get("pct_of_roof")), as_number(k.get("pct_of_roof")), k.get("roof_note"), "num"),
                Cell("estimate" if estimated else ("measured" if estimated is False else MISSING)),
                Cell(k.get("dtype") or MISSING),
                _num_cell(k.get("blocks")),
            ]
        )
    headers = [
        ("#", True),
        ("kernel", False),
        ("class", False),
        ("calls", True),
        ("calls/step", True),
        ("time/step", True),
        ("% GPU time", True),
        ("mean", True),
        ("FLOPs", True),
        ("bytes", True),
        ("FLOP/B", True),
        ("FLOP/s", True),
        ("bytes/s", True),
        ("% of roof", True),
        ("FLOPs/bytes", False),
        ("dtype", False),
        ("blocks", True),
    ]
    return _table(headers, rows).replace('<table class="sortable">', '<table id="kernels-table" class="sortable">', 1)


def _transfers_html(report: Mapping[str, Any]) -> str:
    rows = [
        [
            t.get("direction"),
            f"{t.get('src_kind') or '?'} → {t.get('dst_kind') or '?'}",
            _num_cell(t.get("count_per_step")),
            _num_cell(t.get("bytes_per_step"), format_bytes),
            _num_cell(t.get("us_per_step"), format_us),
            _num_cell(t.get("bytes_per_s"), format_bytes_per_s),
            "yes" if t.get("pageable") else "no",
            "yes" if t.get("sync") else "no",
        ]
        for t in _rows(report.get("transfers"))
    ]
    headers = [
        ("direction", False),
        ("memory", False),
        ("per step", True),
        ("bytes/step", True),
        ("time/step", True),
        ("bandwidth", True),
        ("pageable", False),
        ("synchronous", False),
    ]
    return _table(headers, rows)


def _host_syncs_html(report: Mapping[str, Any]) -> str:
    rows = [
        [
            s.get("name"),
            s.get("op") or MISSING,
            s.get("source") or MISSING,
            _num_cell(s.get("count")),
            _num_cell(s.get("per_step")),
            _num_cell(s.get("total_us"), format_us),
        ]
        for s in _rows(report.get("host_syncs"))
    ]
    headers = [
        ("call", False),
        ("operator", False),
        ("source", False),
        ("count", True),
        ("per step", True),
        ("host time", True),
    ]
    return _table(headers, rows)


def _ranks_html(report: Mapping[str, Any]) -> str:
    ranks = _dict(report.get("ranks"))
    rows = _rows(ranks.get("rows"))
    if not rows:
        return ""
    table = _table(
        [
            ("rank", True),
            ("step time", True),
            ("GPU busy", True),
            ("compute/step", True),
            ("communication/step", True),
            ("exposed communication/step", True),
        ],
        [
            [
                _num_cell(r.get("rank")),
                _num_cell(r.get("step_time_us"), format_us),
                _num_cell(r.get("gpu_busy_pct"), format_pct),
                _num_cell(r.get("compute_us_per_step"), format_us),
                _num_cell(r.get("communication_us_per_step"), format_us),
                _num_cell(r.get("exposed_communication_us_per_step"), format_us),
            ]
            for r in rows
        ],
    )
    straggler = ranks.get("straggler")
    note = f"straggler: rank {esc(straggler)}" if straggler is not None else ""
    return _section("ranks", "Ranks", table, note)


def memory_html(report: Mapping[str, Any]) -> str:
    """Peak memory from the summary, and the ``memory`` section (capture/memory.py's summaries) when present."""
    summary = _dict(report.get("summary"))
    memory = _dict(report.get("memory"))
    allocator = _dict(memory.get("allocator"))
    rows: list[tuple[str, Any]] = []
    allocated = summary.get("memory_allocated_peak_bytes", allocator.get("allocated_peak_bytes"))
    reserved = summary.get("memory_reserved_peak_bytes", allocator.get("reserved_peak_bytes"))
    if allocated is not None:
        rows.append(("peak allocated", format_bytes(allocated)))
    if reserved is not None:
        rows.append(("peak reserved", format_bytes(reserved)))
    labels = {
        "reserved_minus_allocated_peak_bytes": ("reserved − allocated at the peak", format_bytes),
        "fragmentation_pct": ("reserved but not allocated", format_pct),
        "inactive_split_peak_bytes": ("inactive split blocks (peak)", format_bytes),
        "device_total_bytes": ("device memory", format_bytes),
        "peak_pct_of_device": ("peak reserved, % of the device", format_pct),
        "headroom_bytes": ("headroom (device − peak reserved)", format_bytes),
        "num_alloc_retries": ("allocation retries (cache flushes)", format_count),
        "num_ooms": ("out-of-memory errors", format_count),
    }
    for key, (label, formatter) in labels.items():
        if allocator.get(key) is not None:
            rows.append((label, formatter(allocator[key])))
    parts = [_kv_table(rows)] if rows else []
    snapshot = _dict(memory.get("snapshot"))
    if snapshot:
        cats = _dict(snapshot.get("bytes_by_category"))
        if cats:
            parts.append("<h3>Bytes by category at the peak</h3>")
            parts.append(
                _table(
                    [("category", False), ("bytes", True)],
                    [[k, _num_cell(v, format_bytes)] for k, v in sorted(cats.items(), key=lambda kv: -(kv[1] or 0))],
                )
            )
        sites = _rows(snapshot.get("top_sites"))
        if sites:
            parts.append("<h3>Largest allocation sites</h3>")
            parts.append(
                _table(
                    [("source line", False), ("bytes", True), ("allocations", True)],
                    [
                        [s.get("site"), _num_cell(s.get("bytes"), format_bytes), _num_cell(s.get("count"))]
                        for s in sites
                    ],
                )
            )
        seg_rows = [
            ("peak allocated over the recorded history", format_bytes(snapshot.get("peak_bytes"))),
            ("segments", format_count(snapshot.get("segments"))),
            ("reserved in segments", format_bytes(snapshot.get("reserved_bytes"))),
            ("free inside segments", format_bytes(snapshot.get("free_bytes"))),
            ("largest free block", format_bytes(snapshot.get("largest_free_block_bytes"))),
            ("external fragmentation", format_pct(snapshot.get("external_fragmentation_pct"))),
        ]
        parts.append(_kv_table([r for r in seg_rows if r[1] != MISSING]))
    kv = _dict(memory.get("kv_cache"))
    if kv:
        parts.append("<h3>KV cache capacity</h3>")
        parts.append(
            _kv_table(
                [
                    ("cache bytes per token", format_bytes(kv.get("bytes_per_token"))),
                    ("free memory for cache", format_bytes(kv.get("free_bytes"))),
                    ("tokens that fit", format_count(kv.get("tokens_that_fit"))),
                    (
                        f"sequences of {format_count(kv.get('sequence_tokens'))} tokens",
                        format_count(kv.get("sequences_that_fit")),
                    ),
                    ("with an FP8 cache", format_count(kv.get("fp8_sequences_that_fit"))),
                    ("with paged allocation", format_count(kv.get("paged_sequences_that_fit"))),
                ]
            )
        )
        parts.append(_paragraphs(_list(kv.get("notes"))))
    for note in _list(memory.get("notes")):
        parts.append(f'<p class="note">{esc(note)}</p>')
    if not parts:
        return ""
    return _section("memory", "Memory", "".join(parts))


def environment_html(report: Mapping[str, Any]) -> str:
    env = _dict(report.get("env"))
    clocks = _dict(env.get("clocks"))
    rows: list[tuple[str, Any]] = [
        ("GPU", _gpu_text(report)),
        ("driver", env.get("driver")),
        ("CUDA", env.get("cuda")),
        ("torch", env.get("torch")),
        ("triton", env.get("triton")),
        ("python", env.get("python")),
    ]
    if clocks:
        rows.append(("SM clock (median)", f"{_g(clocks.get('sm_mhz_median'))} MHz"))
        if clocks.get("mem_mhz_median") is not None:
            rows.append(("memory clock (median)", f"{_g(clocks.get('mem_mhz_median'))} MHz"))
    for key, value in env.items():
        if key not in {
            "gpu_name",
            "sm_count",
            "compute_capability",
            "driver",
            "cuda",
            "torch",
            "triton",
            "python",
            "clocks",
        } and isinstance(value, (str, int, float)):
            rows.append((key, value))
    peaks = _dict(report.get("peaks"))
    peak_rows: list[tuple[str, Any]] = []
    if peaks:
        peak_rows.append(("peak table entry", peaks.get("gpu")))
        peak_rows.append(
            ("source", peaks.get("source") or ("unknown GPU: no peaks" if not peaks.get("known") else None))
        )
        if peaks.get("hbm_bytes_per_s") is not None:
            peak_rows.append(("HBM bandwidth", format_bytes_per_s(peaks.get("hbm_bytes_per_s"))))
        for key, value in _dict(peaks.get("flops_per_s")).items():
            peak_rows.append((f"{key} dense", format_flops_per_s(value)))
    inner = '<div class="two">' + f"<div><h3>Environment</h3>{_kv_table(rows)}</div>"
    inner += f"<div><h3>Peaks in use</h3>{_kv_table(peak_rows) or '<p class=empty>none</p>'}</div></div>"
    return _section("environment", "Environment and peaks", inner)


def _notes_html(report: Mapping[str, Any]) -> str:
    parts = []
    notes = [n for n in _list(report.get("notes")) if n]
    if notes:
        parts.append(_paragraphs(notes))
    skipped = _rows(report.get("skipped_rules"))
    if skipped:
        parts.append("<h3>Rules skipped</h3>")
        parts.append(_table([("rule", False), ("why", False)], [[s.get("rule_id"), s.get("reason")] for s in skipped]))
    return _section("notes", "Notes", "".join(parts)) if parts else ""


def _nav(links: Sequence[tuple[str, str]]) -> str:
    return "<nav>" + "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in links) + "</nav>"


# --- analyze / profile ----------------------------------------------------------------------------------


def _trace_cards(report: Mapping[str, Any]) -> str:
    s = _dict(report.get("summary"))
    p10, p90 = s.get("step_time_p10_us"), s.get("step_time_p90_us")
    spread = f"p10 {format_us(p10)} · p90 {format_us(p90)}" if p10 is not None and p90 is not None else ""
    source = s.get("step_time_source") or ""
    saving = s.get("combined_saving_us")
    return _cards(
        [
            ("step time (median)", format_us(s.get("step_time_us")), spread or _clip(str(source), 60)),
            ("GPU busy", format_pct(s.get("gpu_busy_pct")), f"{format_us(s.get('gpu_busy_us'))} per step"),
            (
                "kernels per step",
                format_count(s.get("kernels_per_step")),
                f"{format_count(s.get('launch_calls_per_step'))} launch calls",
            ),
            ("tokens/s", format_count(s.get("tokens_per_s")), ""),
            (
                "findings could save",
                format_us(saving) if saving else MISSING,
                f"{format_pct(s.get('combined_saving_pct'))} of the step" if saving else "",
            ),
            (
                "peak memory",
                format_bytes(s.get("memory_allocated_peak_bytes")),
                f"reserved {format_bytes(s.get('memory_reserved_peak_bytes'))}",
            ),
            ("energy per step", f"{_g(s.get('energy_j_per_step'))} J" if s.get("energy_j_per_step") else MISSING, ""),
        ]
    )


def _roofline_section(report: Mapping[str, Any], heading: str = "Roofline") -> str:
    kernels = _rows(report.get("kernels"))[:MAX_KERNEL_ROWS]
    peaks = _dict(report.get("peaks"))
    if not kernels:
        return _section("roofline", heading, '<p class="empty">the report has no kernel rows</p>')
    source = peaks.get("source") or "no peak figures"
    note = (
        f"Roofs of {esc(peaks.get('gpu') or 'this GPU')} ({esc(source)}); the compute roofs drawn are those of the "
        f"dtypes the kernels use. {len(kernels)} kernel row(s), one mark each: colour by class, area by GPU time "
        "per step; hover for the figures."
    )
    return _section("roofline", heading, roofline_svg(kernels, peaks), note)


def _kernels_section(report: Mapping[str, Any]) -> str:
    kernels = _rows(report.get("kernels"))
    note = "Click a column to sort."
    if len(kernels) > MAX_KERNEL_ROWS:
        note += f" The first {MAX_KERNEL_ROWS} of {len(kernels)} rows."
    return _section("kernels", "Kernels", kernels_table_html(kernels[:MAX_KERNEL_ROWS]), note)


def _trace_page(report: Mapping[str, Any]) -> tuple[str, str]:
    command = report.get("command") or "analyze"
    source = _dict(report.get("source"))
    title = f"gpuadvisor {command}: {source.get('model') or source.get('path') or 'report'}"
    header = _header(
        f"gpuadvisor {command}",
        [
            ("model", source.get("model")),
            ("trace", source.get("path")),
            ("GPU", _gpu_text(report)),
            ("steps", _dict(report.get("summary")).get("steps")),
            ("gpuadvisor", _dict(report.get("tool")).get("version")),
        ],
    )
    nav = _nav(
        [
            ("findings", "Findings"),
            ("roofline", "Roofline"),
            ("timeline", "Timeline"),
            ("kernels", "Kernels"),
            ("transfers", "Transfers and syncs"),
            ("memory", "Memory"),
            ("environment", "Environment"),
        ]
    )
    findings = _rows(report.get("findings"))
    body = [
        header,
        nav,
        _trace_cards(report),
        _section("findings", f"Findings ({len(findings)})", findings_html(findings)),
        _roofline_section(report),
        _section("timeline", "Timeline", timeline_html(report)),
        _kernels_section(report),
        _section(
            "transfers",
            "Transfers and host syncs",
            "<h3>Copies</h3>" + _transfers_html(report) + "<h3>Host synchronizations</h3>" + _host_syncs_html(report),
        ),
        _ranks_html(report),
        memory_html(report),
        environment_html(report),
        _notes_html(report),
    ]
    return title, "".join(body)


# --- apply ------------------------------------------------------------------------------------------


def _numerics_html(numerics: Any) -> _Html:
    if not isinstance(numerics, dict) or not numerics:
        return _Html(esc(MISSING))
    passed = numerics.get("passed")
    badge = _badge("pass", "#1b7f3b") if passed is True else _badge("FAIL", "#b00020") if passed is False else ""
    value = f"{esc(numerics.get('metric'), '')} {esc(_g(numerics.get('value')))}"
    if numerics.get("bound") is not None:
        value += f" (bound {esc(_g(numerics.get('bound')))})"
    if numerics.get("reference_error") is not None:
        value += f", the original's own {esc(_g(numerics.get('reference_error')))}"
    if numerics.get("nan_inf_parity") is False:
        value += ", NaN/Inf differ"
    detail = numerics.get("detail")
    more = f"<details><summary>detail</summary>{esc(detail)}</details>" if detail else ""
    return _Html(f"{badge} {value}{more}")


def _fixes_html(report: Mapping[str, Any]) -> str:
    rows = []
    for fix in _rows(report.get("fixes")):
        status = str(fix.get("status") or "?")
        colour = "#1b7f3b" if status == "applied" else "#b00020" if "roll" in status or "fail" in status else "#777"
        changes = _list(fix.get("changes"))
        why = fix.get("reason") or ""
        if fix.get("suggestion"):
            why = f"{why} — {fix['suggestion']}" if why else fix["suggestion"]
        detail = _Html(
            (esc(why) + "<br>" if why else "")
            + ("<ul class='changes'>" + "".join(f"<li>{esc(c)}</li>" for c in changes) + "</ul>" if changes else "")
        )
        rows.append(
            [
                Cell(fix.get("fix_id"), fix.get("fix_id"), fix.get("title")),
                Cell(_badge(status, colour), status),
                _num_cell(fix.get("predicted_saving_us"), format_us),
                _num_cell(fix.get("measured_saving_us"), format_us),
                Cell(_numerics_html(fix.get("numerics"))),
                Cell(detail),
            ]
        )
    headers = [
        ("fix", False),
        ("status", False),
        ("predicted saving", True),
        ("measured saving", True),
        ("numerics", False),
        ("what changed, or why not", False),
    ]
    return _table(headers, rows, css="fixes")


def _search_html(report: Mapping[str, Any]) -> str:
    search = _dict(report.get("search"))
    candidates = _rows(search.get("candidates"))
    if not candidates:
        return ""
    winner = search.get("winner")
    rows = []
    for n, c in enumerate(candidates):
        status = str(c.get("status") or "?")
        rows.append(
            [
                Cell(" + ".join(str(f) for f in _list(c.get("fixes"))) or MISSING),
                Cell(_badge("winner" if n == winner else status, "#1b7f3b" if n == winner else "#777"), status),
                _num_cell(c.get("step_us"), format_us),
                c.get("why") or "",
            ]
        )
    note = esc(search.get("method") or "")
    if search.get("original_us") is not None:
        note += f" The original: {esc(format_us(search['original_us']))} per step."
    table = _table([("candidate", False), ("status", False), ("step time", True), ("why it lost", False)], rows)
    return _section("search", "Search", table, note)


def _diff_html(report: Mapping[str, Any]) -> str:
    diff = _dict(report.get("kernel_diff"))
    if not diff:
        return _section(
            "diff", "Per-kernel diff", '<p class="empty">no kernel diff (the after run was not profiled)</p>'
        )
    parts = []
    counts = [
        (label, as_number(_dict(diff.get(key)).get("before")), as_number(_dict(diff.get(key)).get("after")))
        for key, label in (("kernels_per_step", "kernels per step"), ("launch_calls_per_step", "launch calls per step"))
        if isinstance(diff.get(key), dict)
    ]
    if counts:
        parts.append(_paired_bars_svg(counts, "count"))
    time_rows = []
    if isinstance(diff.get("gpu_busy_us"), dict):
        time_rows.append(
            ("GPU busy", as_number(diff["gpu_busy_us"].get("before")), as_number(diff["gpu_busy_us"].get("after")))
        )
    for cls, pair in _dict(diff.get("classes_us_per_step")).items():
        if isinstance(pair, dict):
            time_rows.append((f"{cls}-bound", as_number(pair.get("before")), as_number(pair.get("after"))))
    if time_rows:
        parts.append("<h3>GPU time per step by class</h3>" + _paired_bars_svg(time_rows, "us"))
    for key, heading in (
        ("disappeared", "Kernels gone after the fixes"),
        ("appeared", "Kernels new after the fixes"),
        ("changed", "Kernels changed"),
    ):
        rows = _rows(diff.get(key))
        if not rows:
            continue
        table_rows = []
        for r in rows:
            table_rows.append(
                [
                    Cell(short_kernel_name(r.get("name")), str(r.get("name") or ""), r.get("name"), "name"),
                    _num_cell(r.get("us_per_step", r.get("after_us_per_step")), format_us),
                    _num_cell(r.get("count_per_step")),
                ]
            )
        parts.append(f"<h3>{esc(heading)} ({len(rows)})</h3>")
        parts.append(_table([("kernel", False), ("time/step", True), ("calls/step", True)], table_rows))
    parts.append(_paragraphs(_list(diff.get("notes"))))
    return _section("diff", "Per-kernel diff", "".join(parts))


def _apply_page(report: Mapping[str, Any]) -> tuple[str, str]:
    source = _dict(report.get("source"))
    before, after = _dict(report.get("before")), _dict(report.get("after"))
    speedup = _dict(report.get("speedup"))
    saving = _dict(report.get("saving"))
    title = f"gpuadvisor apply: {source.get('model') or 'report'}"
    header = _header(
        "gpuadvisor apply",
        [
            ("model", source.get("model")),
            ("fixes asked", source.get("fixes_requested")),
            ("GPU", _gpu_text(report)),
            ("gpuadvisor", _dict(report.get("tool")).get("version")),
        ],
    )
    ci = ""
    if speedup.get("ci_low") is not None and speedup.get("ci_high") is not None:
        conf = as_number(speedup.get("confidence"))
        ci = f"{_g(speedup['ci_low'])}x – {_g(speedup['ci_high'])}x ({format_pct(100 * conf) if conf else '?'} CI)"
    paired = speedup.get("paired")
    if isinstance(paired, dict) and paired.get("median") is not None:
        ci += f" · paired over {paired.get('rounds')} rounds {_g(paired['median'])}x"
        if paired.get("ci_low") is not None and paired.get("ci_high") is not None:
            ci += f" ({_g(paired['ci_low'])}x – {_g(paired['ci_high'])}x)"
    cards = _cards(
        [
            ("speedup (median)", f"{_g(speedup.get('median'))}x" if speedup.get("median") is not None else MISSING, ci),
            (
                "before",
                format_us(before.get("step_time_us")),
                f"p10 {format_us(before.get('step_time_p10_us'))} · p90 {format_us(before.get('step_time_p90_us'))}",
            ),
            (
                "after",
                format_us(after.get("step_time_us")),
                f"p10 {format_us(after.get('step_time_p10_us'))} · p90 {format_us(after.get('step_time_p90_us'))}",
            ),
            (
                "measured saving",
                format_us(saving.get("measured_us")),
                f"predicted {format_us(saving.get('predicted_us'))}" if saving.get("predicted_us") is not None else "",
            ),
            (
                "tokens/s",
                format_count(after.get("tokens_per_s")),
                f"before {format_count(before.get('tokens_per_s'))}" if before.get("tokens_per_s") else "",
            ),
            (
                "peak memory after",
                format_bytes(after.get("peak_memory_bytes")),
                f"before {format_bytes(before.get('peak_memory_bytes'))}",
            ),
        ]
    )
    samples = [
        ("before", [v for v in (as_number(x) for x in _list(before.get("samples_us"))) if v is not None]),
        ("after", [v for v in (as_number(x) for x in _list(after.get("samples_us"))) if v is not None]),
    ]
    dist = _distribution_svg(samples, "us", "apply-steps")
    step_note = esc(speedup.get("method") or before.get("step_time_source") or "")
    if speedup.get("median") is not None:
        step_note = f"Speedup {esc(_g(speedup['median']))}x" + (f", {esc(ci)}" if ci else "") + f". {step_note}"
    step_table = _table(
        [("side", False), ("median", True), ("p10", True), ("p90", True), ("samples", True), ("source", False)],
        [
            [
                name,
                _num_cell(side.get("step_time_us"), format_us),
                _num_cell(side.get("step_time_p10_us"), format_us),
                _num_cell(side.get("step_time_p90_us"), format_us),
                _num_cell(len(_list(side.get("samples_us")))),
                side.get("step_time_source") or MISSING,
            ]
            for name, side in (("before", before), ("after", after))
        ],
        sortable=False,
    )
    steps = _section("steps", "Step time before and after", (dist or "") + step_table, step_note)
    nav = _nav(
        [
            ("steps", "Step times"),
            ("fixes", "Fixes"),
            ("diff", "Kernel diff"),
            ("findings", "Findings"),
            ("roofline", "Roofline"),
            ("timeline", "Timeline"),
            ("kernels", "Kernels"),
            ("environment", "Environment"),
        ]
    )
    findings = _rows(report.get("findings"))
    before_findings = _rows(before.get("findings"))
    findings_inner = "<h3>After the fixes</h3>" + findings_html(findings, "no findings after the fixes")
    if before_findings:
        findings_inner += "<h3>Before the fixes</h3>" + findings_html(before_findings)
    body = [
        header,
        nav,
        cards,
        steps,
        _section("fixes", "Fixes", _fixes_html(report)),
        _search_html(report),
        _diff_html(report),
        _section("findings", f"Findings ({len(findings)} after, {len(before_findings)} before)", findings_inner),
        _roofline_section(report, "Roofline after the fixes"),
        _section("timeline", "Timeline after the fixes", timeline_html(report)),
        _kernels_section(report),
        memory_html(report),
        environment_html(report),
        _section("keep", "Keep the fixes", _paragraphs(_list(report.get("keep")), "code"))
        if report.get("keep")
        else "",
        _notes_html(report),
    ]
    return title, "".join(body)


# --- compare ----------------------------------------------------------------------------------------


def _side_samples(report: Mapping[str, Any] | None, key: str) -> list[float]:
    """The per-step samples behind a tested metric, as ``gate`` reads them (tokens/s: from the step samples)."""
    if not report:
        return []
    summary = _dict(report.get("summary"))
    samples = [v for v in (as_number(x) for x in _list(summary.get("samples_us"))) if v is not None and v > 0]
    if key == "step_time":
        return samples
    if key == "tokens_per_s":
        rate = as_number(summary.get("tokens_per_s"))
        if not rate or not samples:
            return []
        tokens_per_step = rate * statistics.median(samples) / 1e6
        return [tokens_per_step * 1e6 / s for s in samples]
    return []


def _compare_page(
    result: Mapping[str, Any], base_report: Mapping[str, Any] | None, current_report: Mapping[str, Any] | None
) -> tuple[str, str]:
    verdict = str(result.get("verdict") or "?")
    base, current = _dict(result.get("base")), _dict(result.get("current"))
    header = _header(
        "gpuadvisor compare",
        [
            ("base", base.get("label")),
            ("current", current.get("label")),
            ("GPU", _dict(base.get("env")).get("gpu_name")),
        ],
    )
    counts = _dict(result.get("counts"))
    verdict_html = (
        f'<div class="verdict" data-verdict="{esc(verdict)}">{_badge(verdict, VERDICT_COLOURS.get(verdict, "#555"))} '
        + esc(", ".join(f"{n} {v}" for v, n in counts.items()))
        + "</div>"
    )
    metrics = _rows(result.get("metrics"))
    rows = []
    for m in metrics:
        v = str(m.get("verdict") or "?")
        unit = str(m.get("unit") or "")
        rows.append(
            [
                Cell(m.get("name"), m.get("key")),
                Cell(_badge(v, VERDICT_COLOURS.get(v, "#555")), v),
                Cell(_fmt_unit(m.get("base"), unit), as_number(m.get("base")), None, "num"),
                Cell(_fmt_unit(m.get("current"), unit), as_number(m.get("current")), None, "num"),
                _num_cell(m.get("change_pct"), lambda x: f"{x:+.1f}%"),
                _num_cell(m.get("p_value"), lambda x: f"{x:.3g}"),
                m.get("method"),
                m.get("reason"),
            ]
        )
    headers = [
        ("metric", False),
        ("verdict", False),
        ("base", True),
        ("current", True),
        ("change", True),
        ("p", True),
        ("method", False),
        ("why", False),
    ]
    table = _table(headers, rows)
    figures = []
    have_reports = base_report is not None and current_report is not None
    for n, m in enumerate(metrics):
        key = str(m.get("key") or "")
        unit = str(m.get("unit") or "")
        v = str(m.get("verdict") or "?")
        b_samples, c_samples = _side_samples(base_report, key), _side_samples(current_report, key)
        if b_samples or c_samples:
            sides = [("base", b_samples), ("current", c_samples)]
        else:
            sides = [
                (label, [x])
                for label, x in (("base", as_number(m.get("base"))), ("current", as_number(m.get("current"))))
                if x is not None
            ]
        svg = _distribution_svg(sides, unit, f"metric-{n}") if sides else ""
        figures.append(
            f'<div class="metric" data-metric="{esc(key)}">'
            f"<h3>{esc(m.get('name'))} {_badge(v, VERDICT_COLOURS.get(v, '#555'))}</h3>"
            f'<p class="note">{esc(m.get("reason"), "")}'
            + (f" · {len(b_samples)} vs {len(c_samples)} samples" if b_samples or c_samples else " · one value a side")
            + f"</p>{svg}</div>"
        )
    dist_note = (
        ""
        if have_reports
        else ("Sample distributions need the two reports: render_html(result, base_report=..., current_report=...).")
    )
    drift = _rows(result.get("drift"))
    drift_html = (
        _section(
            "drift",
            "Differences between the runs",
            _table(
                [("field", False), ("base", False), ("current", False), ("detail", False)],
                [[d.get("field"), d.get("base"), d.get("current"), d.get("detail")] for d in drift],
            ),
        )
        if drift
        else ""
    )
    settings = _dict(result.get("settings"))
    settings_html = (
        _section(
            "settings", "Settings", _kv_table([(k, v) for k, v in settings.items()]), esc(result.get("config") or "")
        )
        if settings
        else ""
    )
    notes = _list(result.get("notes"))
    body = [
        header,
        verdict_html,
        _section("metrics", f"Metrics ({len(metrics)})", table),
        _section("distributions", "Samples of each metric", "".join(figures) or '<p class="empty">none</p>', dist_note),
        drift_html,
        settings_html,
        _section("notes", "Notes", _paragraphs(notes)) if notes else "",
    ]
    return f"gpuadvisor compare: {verdict}", "".join(body)


# --- scan ------------------------------------------------------------------------------------------


def _scan_page(report: Mapping[str, Any]) -> tuple[str, str]:
    files = _rows(report.get("files"))
    header = _header(
        "gpuadvisor scan",
        [("files", len(files)), ("gpuadvisor", _dict(report.get("tool")).get("version"))],
    )
    findings = _rows(report.get("findings"))

    def side(value: Any) -> str:
        d = _dict(value)
        if not d:
            return MISSING
        degree = as_number(d.get("degree"))
        return f"{d.get('verdict') or '?'}" + (f" ({degree:g}-way)" if degree is not None else "")

    kernel_rows = [
        [
            k.get("file"),
            Cell(k.get("kernel"), k.get("kernel")),
            _num_cell(k.get("line")),
            "x".join(str(d) for d in _list(k.get("block_dim"))) or MISSING,
            side(k.get("load")),
            side(k.get("store")),
        ]
        for k in _rows(report.get("kernels"))
    ]
    kernels = _table(
        [("file", False), ("kernel", False), ("line", True), ("block", False), ("loads", False), ("stores", False)],
        kernel_rows,
    )
    file_rows = [[f.get("path"), f.get("status"), _num_cell(f.get("kernels")), f.get("reason") or ""] for f in files]
    body = [
        header,
        _section("findings", f"Findings ({len(findings)})", findings_html(findings)),
        _section("kernels", "Kernels", kernels),
        _section(
            "files", "Files", _table([("file", False), ("status", False), ("kernels", True), ("why", False)], file_rows)
        ),
        _section("notes", "Notes", _paragraphs(_list(report.get("warnings")) + _list(report.get("notes"))))
        if report.get("warnings") or report.get("notes")
        else "",
    ]
    return "gpuadvisor scan", "".join(body)


# --- the page --------------------------------------------------------------------------------------

_CSS = """
:root{--fg:#1d1d1f;--muted:#5f6368;--line:#e3e3e3;--bg:#fff;--panel:#f7f7f8}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:1240px;margin:0 auto;padding:18px 24px 60px}
header h1{font-size:22px;margin:0 0 6px}
.facts{display:flex;flex-wrap:wrap;gap:6px 18px;color:var(--muted);font-size:13px;word-break:break-all}
.facts b{color:var(--fg);font-weight:600}
nav{position:sticky;top:0;background:var(--bg);border-bottom:1px solid var(--line);padding:8px 0;margin:12px 0;
z-index:2}
nav a{margin-right:16px;color:#0b57d0;text-decoration:none}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.note{color:var(--muted);margin:4px 0 10px}
.empty{color:var(--muted);font-style:italic}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:var(--panel);border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:160px}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.03em}
.card .value{font-size:22px;font-weight:600}
.card .detail{color:var(--muted);font-size:12px}
.finding{border:1px solid var(--line);border-left:4px solid #999;border-radius:6px;padding:10px 14px;margin:10px 0;
background:var(--panel)}
.finding[data-severity=high]{border-left-color:#b00020}.finding[data-severity=medium]{border-left-color:#a05a00}
.finding[data-severity=low]{border-left-color:#33691e}
.finding-head{display:flex;flex-wrap:wrap;align-items:center;gap:8px}
.finding .rule{font-weight:700}.finding .title{font-weight:600}
.finding .saving{margin-left:auto;color:#1b5e20;font-weight:600}
.finding .message{margin:6px 0}
.fix{margin:6px 0 0}
code{background:#eef;padding:1px 4px;border-radius:3px;font-size:12.5px}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600;
white-space:nowrap}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none;background:var(--panel);position:sticky;top:0}
table.sortable th[aria-sort=ascending]::after{content:" ▲"}
table.sortable th[aria-sort=descending]::after{content:" ▼"}
table.kv th{color:var(--muted);font-weight:500;white-space:nowrap}
table.kv td{word-break:break-word}
ul.changes{margin:4px 0;padding-left:18px}
ul.code li{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;list-style:none}
.two{display:flex;flex-wrap:wrap;gap:24px}.two>div{flex:1 1 380px}
.figure{margin:8px 0}
svg.chart{max-width:100%;height:auto;display:block;font-size:11px}
svg .plot{fill:#fcfcfd;stroke:#ccc}
svg .grid{stroke:#ececec}
svg .tick{fill:#555}
svg .axis{fill:#333;font-size:12px}
svg .roof{stroke:#333;stroke-width:1.6;fill:none}
svg .roof-label{fill:#333;font-size:11px}
svg .kpoint{fill-opacity:.72;stroke:#222;stroke-width:.8}
svg .kpoint:hover,svg .seg:hover{stroke:#000;stroke-width:2}
svg .lane{fill:#f3f3f3}
svg .box{fill:#0072B2;fill-opacity:.18;stroke:#0072B2}
svg .median{stroke:#0072B2;stroke-width:2.5}
svg .dot{fill:#333;fill-opacity:.45}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;color:var(--muted);font-size:12px;margin:4px 0 0 78px}
.legend .key i{display:inline-block;width:11px;height:11px;border-radius:6px;margin-right:5px;vertical-align:-1px}
.legend .key i.dashed{border:1.5px dashed #333;background:transparent}
.verdict{font-size:18px;margin:14px 0}.verdict .badge{font-size:16px;padding:2px 12px}
.metric{border-top:1px solid var(--line);padding-top:4px}
details summary{cursor:pointer;color:#0b57d0}
#tip{position:fixed;pointer-events:none;background:rgba(28,28,30,.94);color:#fff;padding:6px 9px;border-radius:5px;
font-size:12px;white-space:pre-line;max-width:520px;display:none;z-index:9;word-break:break-all}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""

# Static: no report text is ever placed in it (every string of the report is in escaped HTML).
_SCRIPT = """
(function(){
  var tip=document.getElementById('tip');
  document.querySelectorAll('svg title').forEach(function(t){
    var el=t.parentNode; if(el.tagName.toLowerCase()==='svg'){return;}
    el.setAttribute('data-tip',t.textContent); t.remove();
  });
  document.addEventListener('mouseover',function(e){
    var el=e.target.closest?e.target.closest('[data-tip]'):null;
    if(!el){tip.style.display='none';return;}
    tip.textContent=el.getAttribute('data-tip'); tip.style.display='block';
  });
  document.addEventListener('mousemove',function(e){
    if(tip.style.display!=='block'){return;}
    var x=e.clientX+14, y=e.clientY+14, w=tip.offsetWidth, h=tip.offsetHeight;
    if(x+w>window.innerWidth-4){x=e.clientX-w-14;} if(y+h>window.innerHeight-4){y=e.clientY-h-14;}
    tip.style.left=Math.max(4,x)+'px'; tip.style.top=Math.max(4,y)+'px';
  });
  function key(td,num){
    var v=td.hasAttribute('data-sort')?td.getAttribute('data-sort'):td.textContent;
    if(num){var f=parseFloat(v); return isNaN(f)?-Infinity:f;} return v.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function(table){
    var ths=table.tHead?table.tHead.rows[0].cells:[];
    Array.prototype.forEach.call(ths,function(th,col){
      th.addEventListener('click',function(){
        var num=th.getAttribute('data-type')==='num';
        var asc=th.getAttribute('aria-sort')!=='ascending';
        Array.prototype.forEach.call(ths,function(o){o.removeAttribute('aria-sort');});
        th.setAttribute('aria-sort',asc?'ascending':'descending');
        var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=key(a.cells[col],num), y=key(b.cells[col],num);
          return (x<y?-1:x>y?1:0)*(asc?1:-1);
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""


def _document(title: str, kind: str, body: str) -> str:
    from gpuadvisor import __version__

    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No request for /favicon.ico: the page asks for nothing outside itself.
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f'<body data-report-kind="{esc(kind)}"><main>{body}'
        f"<footer>gpuadvisor {esc(__version__)} · one self-contained file: it fetches nothing.</footer>"
        f'</main><div id="tip"></div><script>{_SCRIPT}</script></body></html>\n'
    )
