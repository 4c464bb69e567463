"""Writing reports to disk so that an error or Ctrl-C never leaves a half-written file or a partial set.

:func:`write_reports` renders the requested formats first, then writes them all through
:func:`gpuadvisor.outputs.write_files` (temporary files beside the targets, flushed, renamed only when all are
complete; a failure removes this call's files and the folders it made). :func:`write_atomic` is
:func:`gpuadvisor.outputs.write_atomic`; both give every file the one output mode (``0o644`` less the umask).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError
from gpuadvisor.outputs import write_atomic, write_files
from gpuadvisor.report.json import to_json
from gpuadvisor.report.markdown import render_markdown

__all__ = ["FILE_FORMATS", "REPORT_FORMATS", "render_html", "write_atomic", "write_reports"]


def render_html(report: dict[str, Any]) -> str:
    """``report.html`` (:func:`gpuadvisor.report.html.render_html`, imported only when a page is written)."""
    from gpuadvisor.report.html import render_html as render

    return render(report)


# --format value -> (file name, renderer). "terminal" prints and writes no file.
FILE_FORMATS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "json": ("report.json", to_json),
    "markdown": ("report.md", render_markdown),
    "md": ("report.md", render_markdown),
    "html": ("report.html", render_html),
}
# What every output folder of a report gets: report.json, report.md and report.html.
REPORT_FORMATS = ("json", "markdown", "html")
NON_FILE_FORMATS = {"terminal"}


def _file_names(formats: Iterable[str]) -> dict[str, Callable[[dict[str, Any]], str]]:
    """File name -> renderer for the requested formats, in order, without duplicates."""
    wanted: dict[str, Callable[[dict[str, Any]], str]] = {}
    for fmt in formats:
        key = str(fmt).strip().lower()
        if key in NON_FILE_FORMATS:
            continue
        if key not in FILE_FORMATS:
            known = ", ".join(sorted({*FILE_FORMATS, *NON_FILE_FORMATS}))
            raise BadInputError(f"unknown report format {fmt!r}; expected one of {known}")
        name, renderer = FILE_FORMATS[key]
        wanted.setdefault(name, renderer)
    return wanted


def write_reports(report: dict[str, Any], out_dir: Path, formats: Iterable[str] = REPORT_FORMATS) -> list[Path]:
    """Write ``report.json``, ``report.md`` and/or ``report.html`` (per ``formats``: "json", "markdown"/"md",
    "html"; "terminal" writes nothing; by default all three) into ``out_dir``, creating it if needed. Returns
    the paths written.

    Either every requested file is written or, after an error or Ctrl-C, none of this call's files
    remain, and ``out_dir`` is removed again if this call created it and it is empty. OSError becomes
    BadInputError (one line, exit code 2); KeyboardInterrupt is re-raised as it is.
    """
    renderers = _file_names(formats)
    if not renderers:
        return []
    contents = {name: render(report) for name, render in renderers.items()}  # render before touching disk
    return write_files(Path(out_dir), contents)
