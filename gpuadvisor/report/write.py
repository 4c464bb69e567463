"""Writing reports to disk so that an error or Ctrl-C never leaves a half-written file or a partial set.

Each file is written to a temporary file beside it, flushed to disk, then renamed over the target
(``os.replace`` is atomic on POSIX and Windows). :func:`write_reports` writes every temporary file
first and renames them only when all are complete, so a failure while writing (disk full, Ctrl-C)
leaves the previous reports untouched; a failure while renaming removes the reports of this call.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError
from gpuadvisor.report.json import to_json
from gpuadvisor.report.markdown import render_markdown

# --format value -> (file name, renderer). "terminal" prints and writes no file.
FILE_FORMATS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "json": ("report.json", to_json),
    "markdown": ("report.md", render_markdown),
    "md": ("report.md", render_markdown),
}
NON_FILE_FORMATS = {"terminal"}


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (0o666 less the umask); mkstemp uses 0o600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _remove(path: Path | str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_temp(path: Path, data: str | bytes, mode: int) -> Path:
    """Write ``data`` to a new temporary file in ``path``'s folder, flushed to disk; return its path."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
    except BaseException:
        _remove(temp_name)
        raise
    return Path(temp_name)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` atomically: readers see the old file or the new one, whole.

    On any exception, KeyboardInterrupt included, the temporary file is removed and the exception
    re-raised; ``path`` is left as it was.
    """
    path = Path(path)
    temp = _write_temp(path, data, _file_mode())
    try:
        os.replace(temp, path)
    except BaseException:
        _remove(temp)
        raise


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


def _make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and missing parents; return the folders this call created, outermost first."""
    missing = []
    current = folder
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    created: list[Path] = []
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to remove
        except BaseException:
            _remove_dirs(created)
            raise
        created.append(directory)
    return created


def _remove_dirs(created: list[Path]) -> None:
    """Remove the folders this call created, innermost first, as long as they are empty."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            return


def write_reports(report: dict[str, Any], out_dir: Path, formats: list[str]) -> list[Path]:
    """Write ``report.json`` and/or ``report.md`` (per ``formats``: "json", "markdown"/"md"; "terminal"
    writes nothing) into ``out_dir``, creating it if needed. Returns the paths written.

    Either every requested file is written or, after an error or Ctrl-C, none of this call's files
    remain, and ``out_dir`` is removed again if this call created it and it is empty. OSError becomes
    BadInputError (one line, exit code 2); KeyboardInterrupt is re-raised as it is.
    """
    out_dir = Path(out_dir)
    renderers = _file_names(formats)
    if not renderers:
        return []
    contents = {name: render(report) for name, render in renderers.items()}  # render before touching disk
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInputError(f"--out {out_dir} is a file, not a folder")

    created: list[Path] = []
    temps: list[tuple[Path, Path]] = []
    replaced: list[Path] = []
    try:
        created = _make_dirs(out_dir)
        mode = _file_mode()
        for name, text in contents.items():
            target = out_dir / name
            temps.append((_write_temp(target, text, mode), target))
        for temp, target in temps:
            os.replace(temp, target)
            replaced.append(target)
    except BaseException as exc:
        for temp, _ in temps:
            _remove(temp)
        for target in replaced:
            _remove(target)
        _remove_dirs(created)
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            raise BadInputError(f"cannot write reports to {out_dir}: {reason}") from exc
        raise
    return replaced
