"""Opening the files a user names, the one way every command does it: regular files only, bounded, guarded.

Every command that reads a user's file (a trace, a report, a CUDA source, a ``--peaks`` or ``--rules`` TOML/JSON,
a ``pyproject.toml``, an Nsight Compute CSV) opens it here:

- **Regular files only.** The path is checked with ``os.stat`` before it is opened (a FIFO, a character device
  such as ``/dev/zero``, a socket or a folder is refused by its type), opened with ``O_NONBLOCK`` (so that a FIFO
  swapped in between the two never blocks the open) and checked again with ``fstat`` on the open descriptor.
- **A byte bound per kind** (:data:`BYTE_LIMITS`): at most bound + 1 bytes are read, and more is refused; the
  size ``stat`` reports is never trusted (it is 0 for ``/dev/zero``, and a file can grow while it is read).
  Traces have their own, larger bound and bounded gzip decompression (:mod:`gpuadvisor.trace.kineto`).
- **Decoders with depth and magnitude guards** (:func:`decode_json`, :func:`decode_toml`, :func:`check_tree`):
  nesting deeper than :data:`MAX_NESTING` levels (200; a report is 4 deep, a rule file 2) and integers outside
  the 64-bit range (:data:`MAX_INT`, e.g. 400 digits) are bad input, not a RecursionError or OverflowError; so
  are integers past Python's 4,300-digit conversion limit, which json and tomllib raise as ValueError. A trace's
  events are decoded by msgspec, whose own recursion guard (Python's recursion limit, about 1,000 levels) is
  mapped to the same error by the trace reader.
- **One error type**, :class:`InputError` (a :class:`~gpuadvisor.errors.BadInputError`: exit 2, one line naming
  the file and what is wrong with it). A missing file, permission denied, a symlink loop, a name too long: the
  same one line, never a traceback or click's three-line usage error.

:func:`open_append` is the writing counterpart for a file someone else names (``$GITHUB_STEP_SUMMARY``): a FIFO
or a device there is refused at once instead of blocking the command.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import sys
from itertools import accumulate
from pathlib import Path
from typing import IO, Any

from gpuadvisor.errors import BadInputError

MIB = 1024 * 1024
# Bytes read from one file of each kind before it is refused. A report is ~50 KB, or ~20 bytes per step sample
# (10 M samples: 95 MB); the 8 MiB of CUDA is the scan's own limit (gpuadvisor/scan/source.py); an ncu --csv
# export of 200 launches x 30 metrics is ~2 MB.
BYTE_LIMITS = {
    "report": 256 * MIB,
    "cuda": 8 * MIB,
    "peaks": 1 * MIB,
    "rule": 1 * MIB,
    "config": 4 * MIB,
    "csv": 256 * MIB,
}
# How each kind is named in a message ("report x.json: ...").
KIND_NAMES = {
    "report": "report",
    "cuda": "source file",
    "peaks": "peaks file",
    "rule": "rule file",
    "config": "config file",
    "csv": "Nsight Compute CSV",
    "trace": "trace",
}
# Deepest nesting of arrays and objects (tables) accepted in a report or a config file.
MAX_NESTING = 200
# Largest magnitude of an integer in a report or a config file: the 64-bit range the analyses compute in.
MAX_INT = 2**63 - 1
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_OPEN_FLAGS = os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_OPEN_FLAGS |= getattr(os, "O_BINARY", 0)


class InputError(BadInputError):
    """A user's file that cannot be used: missing, unreadable, not a regular file, too large, malformed, or nested
    or numbered past the guards. Exit code 2, one line."""


# --------------------------------------------------------------------------------------------
# opening


def os_reason(exc: OSError) -> str:
    """A short reason for an OSError, without the path (the message names it once)."""
    reasons = {
        errno.ENOENT: "no such file",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EISDIR: "is a directory, not a file",
        errno.ELOOP: "too many levels of symbolic links (a symlink loop)",
        errno.ENAMETOOLONG: "file name too long",
        errno.ENOTDIR: "a part of the path is not a folder",
        errno.ENOSPC: "no space left on the device",
        errno.EROFS: "read-only file system",
        errno.EDQUOT: "disk quota exceeded",
        errno.ENXIO: "no such device or address",
    }
    return reasons.get(exc.errno, exc.strerror or str(exc))


def os_error_message(exc: OSError) -> str:
    """One line for an OSError that reached the command line: the file (or the output) and the reason. Writing
    stdout to ``/dev/full`` or a full disk, an ``--out`` name over 255 bytes: the system refused, exit 2."""
    filename = getattr(exc, "filename", None)
    if filename is None:
        return f"cannot write the output: {os_reason(exc)}"
    return f"{os.fsdecode(filename)}: {os_reason(exc)}"


def file_type(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _label(kind: str, path: Path | str) -> str:
    return f"{KIND_NAMES.get(kind, kind)} {path}"


def check_regular(path: str | os.PathLike[str], kind: str) -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed), refusing anything but a regular file with :class:`InputError`."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"{_label(kind, path)}: {os_reason(exc)}") from None
    except ValueError as exc:  # a NUL byte in the name
        raise InputError(f"{_label(kind, path)}: {exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{_label(kind, path)}: {file_type(info.st_mode)}, not a regular file")
    return info


def open_input(path: str | os.PathLike[str], kind: str) -> IO[bytes]:
    """``path`` opened for reading in binary, after :func:`check_regular`; ``O_NONBLOCK`` and an ``fstat`` of the
    open file make sure a FIFO or device swapped in meanwhile is refused, not waited on."""
    check_regular(path, kind)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise InputError(f"{_label(kind, path)}: {os_reason(exc)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{_label(kind, path)}: {file_type(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], kind: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file, at most ``limit`` (default: :data:`BYTE_LIMITS` of ``kind``); a longer file is
    refused after reading ``limit`` + 1 bytes. A report (kind ``"report"``) is also checked for nesting deeper than
    :data:`MAX_NESTING` (:func:`check_json_nesting`) so that its decoder never recurses past it."""
    limit = BYTE_LIMITS[kind] if limit is None else limit
    with open_input(path, kind) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise InputError(f"{_label(kind, path)}: cannot read: {os_reason(exc)}") from None
    if len(data) > limit:
        raise InputError(f"{_label(kind, path)}: larger than the {_size(limit)} limit for a {KIND_NAMES[kind]}")
    if kind == "report":
        check_json_nesting(data, _label(kind, path))
    return data


def read_text(path: str | os.PathLike[str], kind: str, limit: int | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a byte-order mark dropped); text that is not UTF-8 is refused."""
    data = read_bytes(path, kind, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{_label(kind, path)}: not UTF-8 text (byte {exc.start})") from None


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB and limit % MIB == 0 else f"{limit:,} bytes"


def open_append(path: str | os.PathLike[str], what: str = "$GITHUB_STEP_SUMMARY") -> IO[str]:
    """``path`` opened to append UTF-8 text, created if missing: a regular file only. A FIFO, a device or a folder
    raises OSError (EINVAL, saying what it is) at once, before anything could block on it, so a caller that warns
    on OSError skips it with its warning."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"{file_type(mode)}, not a regular file: skipped")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{file_type(mode)}, not a regular file: skipped")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


# --------------------------------------------------------------------------------------------
# decoding


_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_DEPTH_STEP = [0] * 256
for _open_byte in b"[{":
    _DEPTH_STEP[_open_byte] = 1
for _close_byte in b"]}":
    _DEPTH_STEP[_close_byte] = -1


def json_nesting(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped); for malformed text, the deepest
    an opening bracket reaches. Runs at C speed: the escapes that could end a string dropped, then all but
    quotes and brackets, then the strings; a 95 MB report of 10 M samples takes ~0.2 s."""
    if b"\\" in data:  # only the escapes that can end a string early matter: \\ and \"
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", data.translate(None, _NOT_STRUCTURE)).replace(b'"', b"")
    if len(brackets) <= 4 * MIB:
        return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    import numpy as np  # a long run of brackets: in chunks, so the running sum stays small

    table = np.zeros(256, dtype=np.int8)
    table[list(b"[{")] = 1
    table[list(b"]}")] = -1
    deepest = level = 0
    view = np.frombuffer(brackets, dtype=np.uint8)
    for start in range(0, len(view), 4 * MIB):
        running = np.cumsum(table[view[start : start + 4 * MIB]], dtype=np.int64) + level
        deepest = max(deepest, int(running.max()))
        level = int(running[-1])
    return deepest


def check_json_nesting(data: bytes, where: str, limit: int = MAX_NESTING) -> None:
    """:class:`InputError` when JSON text nests deeper than ``limit`` levels."""
    depth = json_nesting(data)
    if depth > limit:
        raise InputError(f"{where}: nested {depth} levels deep, deeper than the {limit} levels accepted")


def check_tree(value: Any, where: str, limit: int = MAX_NESTING, max_int: int = MAX_INT) -> None:
    """:class:`InputError` when a decoded document nests deeper than ``limit`` or holds an integer beyond
    ``max_int`` in magnitude. Iterative (no recursion); a list of numbers is checked in a few passes of C."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, at = stack.pop()
        if isinstance(node, dict):
            children = list(node.items())
        elif isinstance(node, list):
            kinds = set(map(type, node))
            if int in kinds:
                ints = node if kinds == {int} else [x for x in node if type(x) is int]
                if max(ints) > max_int or min(ints) < -max_int:
                    index = next(i for i, x in enumerate(node) if type(x) is int and not -max_int <= x <= max_int)
                    _check_int(node[index], where, f"{at}[{index}]", max_int)
            if dict not in kinds and list not in kinds:
                if depth > limit:
                    raise _too_deep(where, limit, at)
                continue
            children = [(i, x) for i, x in enumerate(node) if isinstance(x, (dict, list))]
        else:
            _check_int(node, where, at, max_int)
            continue
        if depth > limit:
            raise _too_deep(where, limit, at)
        for key, child in children:
            place = f"{at}[{key}]" if isinstance(key, int) else _join(at, key)
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, place))
            else:
                _check_int(child, where, place, max_int)


def _too_deep(where: str, limit: int, at: str) -> InputError:
    return InputError(f"{where}: nested deeper than the {limit} levels accepted (at {_shown(at) or 'top'})")


def _shown(at: str) -> str:
    """A place in a document, shortened to its last 60 characters."""
    return at if len(at) <= 60 else "..." + at[-57:]


def _join(at: str, key: Any) -> str:
    key = str(key)
    shown = key if len(key) <= 40 else key[:37] + "..."
    return f"{at}.{shown}" if at else shown


def _check_int(value: Any, where: str, at: str, max_int: int) -> None:
    if type(value) is int and not -max_int <= value <= max_int:
        digits = integer_digits(value)
        raise InputError(f"{where}: {_shown(at) or 'a value'} is an integer of {digits} digits, out of range (64-bit)")


def integer_digits(value: int) -> int:
    """Decimal digits of an integer, without converting it to text (which fails past 4,300 digits)."""
    magnitude = abs(value)
    digits = max(1, int(magnitude.bit_length() * math.log10(2)))
    return digits + 1 if magnitude >= 10**digits else digits


def _too_many_digits(exc: ValueError) -> bool:
    return "integer string conversion" in str(exc) or "digits" in str(exc)


def decode_json(data: bytes | str, where: str, *, check: bool = True, allow_nan: bool = False) -> Any:
    """JSON text decoded with the guards (module docstring): :class:`InputError` for malformed JSON, nesting past
    :data:`MAX_NESTING`, and (``check``) integers out of range. ``allow_nan`` accepts the non-standard ``NaN`` and
    ``Infinity`` (as the json module does), for a caller that then says which key holds one."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    check_json_nesting(raw, where)
    if allow_nan:
        import json

        try:
            value = json.loads(raw)
        except RecursionError:
            raise InputError(f"{where}: nested too deep to read") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON: {exc}") from None
        except ValueError as exc:  # past sys.get_int_max_str_digits(), or text that is not UTF-8
            if _too_many_digits(exc):
                raise InputError(f"{where}: holds an integer too long to read (over 4,300 digits)") from None
            raise InputError(f"{where}: not valid JSON: {exc}") from None
        if check:
            check_tree(value, where)
        return value
    import msgspec

    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "out of range" in text.lower():
            raise InputError(f"{where}: not valid JSON: a number out of range ({text})") from None
        hint = " (truncated?)" if "truncated" in text.lower() else ""
        raise InputError(f"{where}: not valid JSON{hint}: {text}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deep to read") from None
    if check:
        check_tree(value, where)
    return value


def _toml_module() -> Any:
    """tomllib (Python 3.11+), else tomli when installed, else None."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:  # pragma: no cover - Python 3.10
        import tomli

        return tomli
    except ImportError:  # pragma: no cover
        return None


def decode_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text decoded with the guards (module docstring): :class:`InputError` for invalid TOML, nesting past
    :data:`MAX_NESTING`, integers out of range or past Python's digit limit."""
    tomllib = _toml_module()
    if tomllib is None:
        raise InputError(f"{where}: reading TOML needs Python 3.11+ or the 'tomli' package; install it or use JSON")
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: invalid TOML ({exc})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deep to read (deeper than the {MAX_NESTING} levels accepted)") from None
    except ValueError as exc:  # int() past sys.get_int_max_str_digits(), raised from inside tomllib
        if _too_many_digits(exc):
            raise InputError(f"{where}: holds an integer too long to read (over 4,300 digits)") from None
        raise InputError(f"{where}: invalid TOML ({exc})") from None
    check_tree(value, where)
    return value


def load_json(path: str | os.PathLike[str], kind: str) -> Any:
    """A JSON file of ``kind`` read (:func:`read_bytes`) and decoded (:func:`decode_json`)."""
    return decode_json(read_bytes(path, kind), _label(kind, path))


def load_toml(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """A TOML file of ``kind`` read (:func:`read_text`) and decoded (:func:`decode_toml`)."""
    return decode_toml(read_text(path, kind), _label(kind, path))


def number_out_of_range(value: Any) -> bool:
    """Whether a number from a document cannot be used as a float: an integer too large for one (400 digits), or
    a float that is not finite. Booleans and non-numbers are not numbers here: False."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -MAX_INT <= value <= MAX_INT
    if isinstance(value, float):
        return not math.isfinite(value)
    return False


__all__ = [
    "BYTE_LIMITS",
    "MAX_INT",
    "MAX_NESTING",
    "InputError",
    "check_json_nesting",
    "check_regular",
    "check_tree",
    "decode_json",
    "decode_toml",
    "integer_digits",
    "json_nesting",
    "load_json",
    "load_toml",
    "number_out_of_range",
    "open_append",
    "open_input",
    "os_error_message",
    "os_reason",
    "read_bytes",
    "read_text",
]
