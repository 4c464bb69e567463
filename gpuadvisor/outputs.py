"""Output folders and files, the one way every command writes them: checked, staged, published, cleaned up.

- :func:`file_mode`: the mode of every file gpuadvisor writes (reports, traces, ``nvml.csv``, ``scan.json``,
  ``ncu.csv``, …): ``0o644`` less the umask, i.e. ``-rw-r--r--`` under the usual umask 022.
- :func:`write_atomic` and :func:`write_files`: one file, or a set of files that appear together or not at all
  (``analyze --out``, ``scan --out``, ``ncu --out``). A temporary file beside each target is flushed to disk and
  renamed over it (``os.replace`` is atomic); an error or Ctrl-C removes this call's files and the folders it made.
- :func:`check_out_dir`, :func:`staged_output`, :func:`publish`: a whole output folder (``profile``, ``apply``).
  Its files are written into a temporary folder beside ``out_dir`` (:func:`make_staging`), which is renamed into
  place at the end, replacing an older output folder of the same name only then; a failure or Ctrl-C leaves no
  output folder and no temporary one. An existing ``out_dir`` is replaced only when it holds nothing but an
  earlier run's outputs; anything else is refused, never deleted.

OSError while writing becomes :class:`~gpuadvisor.errors.BadInputError` (one line, exit 2).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpuadvisor.errors import BadInputError

FILE_MODE = 0o644  # every output file, before the umask
FOLDER_MODE = 0o755  # every output folder, before the umask

_written: list[Path] = []  # what this process has written and published, in order (for the interrupt message)


def written() -> list[Path]:
    """The files and output folders this process has written (put in place), in order."""
    return list(_written)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def file_mode() -> int:
    """The mode of every file gpuadvisor writes: :data:`FILE_MODE` less the umask (mkstemp alone gives 0o600)."""
    return FILE_MODE & ~_umask()


def folder_mode() -> int:
    """The mode of an output folder: :data:`FOLDER_MODE` less the umask (mkdtemp alone gives 0o700)."""
    return FOLDER_MODE & ~_umask()


# --- files --------------------------------------------------------------------------------------


def remove_file(path: Path | str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_temp(path: Path, data: str | bytes) -> Path:
    """Write ``data`` (str as UTF-8) to a new temporary file in ``path``'s folder, flushed to disk, with
    :func:`file_mode`; return its path. Nothing is left behind on an error."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, file_mode())
    except BaseException:
        remove_file(temp_name)
        raise
    return Path(temp_name)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` atomically: readers see the old file or the new one, whole.

    On any exception, KeyboardInterrupt included, the temporary file is removed and the exception re-raised;
    ``path`` is left as it was.
    """
    path = Path(path)
    temp = write_temp(path, data)
    try:
        os.replace(temp, path)
    except BaseException:
        remove_file(temp)
        raise
    if not _is_staging(path.parent):
        _written.append(path)


def make_dirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the folders this call created, outermost first."""
    missing = []
    current = Path(folder)
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
            remove_dirs(created)
            raise
        created.append(directory)
    return created


def remove_dirs(created: list[Path]) -> None:
    """Remove the folders a call created (outermost first in ``created``), innermost first, while empty."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            return


def write_files(folder: Path, files: Mapping[str, str | bytes], *, option: str = "--out") -> list[Path]:
    """Write every file of ``files`` (name -> content) into ``folder``, creating it if needed: all of them, or
    after an error or Ctrl-C none of this call's files, and no folder this call created. Returns the paths.
    ``option`` names the flag in the one-line error (a file where the folder should be, a write that fails)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadInputError(f"{option} {folder} is a file, not a folder")
    created: list[Path] = []
    temps: list[tuple[Path, Path]] = []
    replaced: list[Path] = []
    try:
        created = make_dirs(folder)
        for name, data in files.items():
            target = folder / name
            temps.append((write_temp(target, data), target))
        for temp, target in temps:
            os.replace(temp, target)
            replaced.append(target)
    except BaseException as exc:
        for temp, _ in temps:
            remove_file(temp)
        for target in replaced:
            remove_file(target)
        remove_dirs(created)
        if isinstance(exc, OSError):
            raise BadInputError(f"cannot write to {option} {folder}: {exc.strerror or exc}") from exc
        raise
    if not _is_staging(folder):
        _written.extend(replaced)
    return replaced


def _is_staging(folder: Path) -> bool:
    """Whether ``folder`` is (inside) a staging folder of :func:`make_staging`: its files are not written yet."""
    return any(part.startswith(".") and part.endswith(".tmp") for part in Path(folder).absolute().parts)


# --- output folders -----------------------------------------------------------------------------


def check_out_dir(
    out_dir: Path,
    allowed: frozenset[str] = frozenset(),
    command: str = "profile",
    ours: Callable[[Path], bool] | None = None,
) -> None:
    """Refuse an ``out_dir`` that is a file, or a folder holding anything but an earlier run's outputs (the
    file names in ``allowed``, or what ``ours`` accepts; ``command`` names that run in the message)."""
    if ours is None:

        def ours(path: Path) -> bool:
            return path.name in allowed and path.is_file()

    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise BadInputError(f"--out {out_dir} exists and is not a folder")
    if out_dir.is_dir():
        try:
            foreign = sorted(p.name for p in out_dir.iterdir() if not ours(p))
        except OSError as error:
            raise BadInputError(f"--out {out_dir}: cannot read it: {error.strerror or error}") from error
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise BadInputError(
                f"--out {out_dir} exists and holds other files ({shown}); it would be replaced, so give a new "
                f"or an earlier {command}'s folder"
            )


def make_staging(out_dir: Path) -> tuple[Path, list[Path]]:
    """A new temporary folder beside ``out_dir`` (creating missing parents); returns it and the parents made."""
    parent = out_dir.absolute().parent
    created: list[Path] = []
    try:
        created = make_dirs(parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.absolute().name}.", suffix=".tmp", dir=parent))
    except OSError as error:
        remove_dirs(created)
        raise BadInputError(f"cannot write to {out_dir}: {error.strerror or error}") from error
    except BaseException:
        remove_dirs(created)
        raise
    return staging, created


def discard_staging(staging: Path | None, created: list[Path]) -> None:
    """Remove a staging folder and the parents :func:`make_staging` made for it (what an error leaves)."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    remove_dirs(created)


def publish(staging: Path, out_dir: Path, check: Callable[[Path], None]) -> None:
    """Rename ``staging`` to ``out_dir``; an existing ``out_dir`` (an earlier run's outputs, as ``check`` makes
    sure once more) goes only now. A Ctrl-C whose KeyboardInterrupt something swallowed publishes nothing."""
    from gpuadvisor.interrupt import raise_if_interrupted

    raise_if_interrupted()
    os.chmod(staging, folder_mode())  # mkdtemp makes private folders; an output folder is meant to be shared
    check(out_dir)
    target = out_dir.absolute()
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _written.append(out_dir)


class StagedOutput:
    """The staging folder of one output folder (:func:`staged_output`): write into ``path``, then
    :meth:`publish`."""

    def __init__(self, out_dir: Path, check: Callable[[Path], None]):
        self.out_dir = out_dir
        self.check = check
        self.path, self.created = make_staging(out_dir)
        self.published = False

    def publish(self) -> None:
        publish(self.path, self.out_dir, self.check)
        self.published = True

    def discard(self) -> None:
        if not self.published:
            discard_staging(self.path, self.created)


@contextmanager
def staged_output(out_dir: Path, check: Callable[[Path], None]) -> Iterator[StagedOutput]:
    """A staging folder beside ``out_dir``: ``with staged_output(out, check) as staged: write into staged.path;
    staged.publish()``. Leaving the block without publishing (an error, Ctrl-C, a refusal) removes the staging
    folder and the parents made for it. ``check(out_dir)`` runs again just before publishing."""
    staged = StagedOutput(out_dir, check)
    try:
        yield staged
    finally:
        staged.discard()
