"""Fast reader for Kineto Chrome traces (torch.profiler's ``export_chrome_trace``).

msgspec decodes the JSON straight into typed structs, ignoring the fields we do not model (that is
where its speed comes from: a 425 MB trace decodes in about 1.4 s, where ``json``/``orjson`` build
every dict and take about 15 s). One pass over the events then fills plain Python lists, one per
column, which become the DataFrames of :class:`~gpuadvisor.trace.model.Trace`.

Most files take the faster route of :mod:`gpuadvisor.trace.columns` (byte-level split, columns straight
into numpy, half of a large trace in a forked worker); it gives the same tables, and hands the files it
cannot vouch for (odd field types, bare arrays, malformed JSON) to the checked path below.

Every failure a user can cause (missing file, empty file, a FIFO or device, corrupt or truncated gzip, a
decompression bomb, malformed JSON, JSON that is not a trace, JSON nested past the decoder's recursion limit, a
number too large for the tables: a 400-digit ``ts`` or ``dur``, an id past 64 bits) raises
:class:`BadInputError` with a one-line message. Names (kernels, operators, annotations, the GPU's) are stored with
their control characters escaped (:mod:`gpuadvisor.textsafe`): no renderer can send them to a terminal.
"""

from __future__ import annotations

import mmap
import os
import re
import zlib
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import Any, Generic, TypeVar, Union

import msgspec
import numpy as np
import pandas as pd

from gpuadvisor.errors import BadInputError
from gpuadvisor.inputs import MAX_INT, MAX_NESTING, integer_digits, open_input
from gpuadvisor.textsafe import escape_control
from gpuadvisor.trace.model import DeviceInfo, Trace

# A Kineto trace compresses 5x to 30x with gzip (the traces in sample_traces/ and the public ones
# in shared/traces/public are 6x to 24x). A stream past this ratio and past the size below is far more
# likely a decompression bomb than a trace.
MAX_GZIP_RATIO = 200
RATIO_CHECK_AFTER_BYTES = 64 * 1024 * 1024
# Hard cap on the decompressed size; each byte of trace costs ~2.5 bytes of memory to analyse.
MAX_TRACE_BYTES = int(os.environ.get("GPUADVISOR_MAX_TRACE_BYTES", 8 * 1024**3))
_CHUNK = 4 * 1024 * 1024

Number = Union[int, float]
Scalar = Union[int, float, str, None]


class NumberOutOfRange(BadInputError):
    """A number in a trace that no table column can hold (an integer past 64 bits, one too large for a float);
    the trace reader adds the file's name."""


def _out_of_range(value: Any, field: str) -> NumberOutOfRange:
    if isinstance(value, int) and not isinstance(value, bool):
        digits = integer_digits(value)
        return NumberOutOfRange(f"a number in the trace ({field}) is an integer of {digits} digits, out of range")
    return NumberOutOfRange(f"a number in the trace ({field}) is out of range")


class Args(msgspec.Struct, gc=False):
    """The ``args`` of an event: only the keys the analyses read (typed as torch.profiler writes them)."""

    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    correlation: Union[int, None] = None
    device: Union[int, None] = None
    stream: Union[int, None] = None
    grid: Union[list[int], str, None] = None
    block: Union[list[int], str, None] = None
    registers_per_thread: Union[int, None] = msgspec.field(default=None, name="registers per thread")
    shared_memory: Union[int, None] = msgspec.field(default=None, name="shared memory")
    bytes: Union[int, None] = None
    flops: Union[int, float, None] = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Concrete Inputs")


class Event(msgspec.Struct, gc=False):
    """The fields the tables read (fewer fields decode faster). No ``ph``: every event of the categories the
    tables use is a complete ("X") event in Kineto's output; the lenient path below still checks it."""

    cat: str = ""
    name: str = ""
    tid: Union[int, str] = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Union[Args, None] = None


class LenientArgs(msgspec.Struct, gc=False):
    """The same keys with any scalar type: for traces from other writers (decoded only when the fast,
    typed decode fails; the table builder converts what it can and marks the rest unknown)."""

    external_id: Scalar = msgspec.field(default=None, name="External id")
    correlation: Scalar = None
    device: Scalar = None
    stream: Scalar = None
    grid: Any = None
    block: Any = None
    registers_per_thread: Scalar = msgspec.field(default=None, name="registers per thread")
    shared_memory: Scalar = msgspec.field(default=None, name="shared memory")
    bytes: Scalar = None
    flops: Scalar = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Concrete Inputs")


class LenientEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Union[LenientArgs, None] = None


class DeviceProperties(msgspec.Struct):
    id: Scalar = None
    name: Union[str, None] = None
    numSms: Scalar = None  # noqa: N815 (Kineto's key)
    computeMajor: Scalar = None  # noqa: N815
    computeMinor: Scalar = None  # noqa: N815
    totalGlobalMem: Scalar = None  # noqa: N815
    maxThreadsPerMultiprocessor: Scalar = None  # noqa: N815
    regsPerMultiprocessor: Scalar = None  # noqa: N815
    sharedMemPerMultiprocessor: Scalar = None  # noqa: N815


class DistributedInfo(msgspec.Struct):
    rank: Scalar = None
    world_size: Scalar = None
    backend: Union[str, None] = None


E = TypeVar("E")


class KinetoFile(msgspec.Struct, Generic[E]):
    traceEvents: Union[list[E], msgspec.UnsetType] = msgspec.UNSET  # noqa: N815
    deviceProperties: list[DeviceProperties] = []  # noqa: N815
    distributedInfo: Union[DistributedInfo, None] = None  # noqa: N815
    schemaVersion: Scalar = None  # noqa: N815
    displayTimeUnit: Union[str, None] = None  # noqa: N815
    cuda_runtime_version: Scalar = None
    cuda_driver_version: Scalar = None


# Events are decoded in chunks: a first pass splits traceEvents into raw byte views (cheap: no objects per
# field), then each chunk is decoded into typed structs, turned into columns and dropped. Peak memory is
# the trace bytes plus one chunk of structs plus the columns, instead of the trace bytes plus every
# event as a struct (2.3 GB for a 427 MB trace).
CHUNK_EVENTS = 250_000
_HEADER_DECODER = msgspec.json.Decoder(KinetoFile[msgspec.Raw])
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_CHUNK_DECODERS = (msgspec.json.Decoder(list[Event]), msgspec.json.Decoder(list[LenientEvent]))
_JSON_LIST_DECODER = msgspec.json.Decoder(Union[list[Any], None])

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_MEMCPY_RE = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


# --------------------------------------------------------------------------------------------
# bytes in


def read_trace_bytes(path: Path) -> bytearray | mmap.mmap:
    """The decompressed bytes of a trace file, with guards against bad and hostile files: a writable
    buffer (a private mapping of the file, or a bytearray), so that the decoder can frame each chunk of
    events in place (see _framed_chunk) instead of copying it."""
    try:
        with open_input(path, "trace") as f:  # a regular file only: a FIFO or /dev/zero is refused, not read
            head = f.read(2)
            if not head:
                raise BadInputError(f"{path}: empty file")
            f.seek(0)
            if head == b"\x1f\x8b":
                return _gunzip_guarded(f, path)
            size = os.fstat(f.fileno()).st_size
            if size > MAX_TRACE_BYTES:
                raise BadInputError(f"{path}: {size / 1e9:.1f} GB is over the {MAX_TRACE_BYTES / 1e9:.1f} GB limit")
            try:
                # A private (copy-on-write) mapping: no copy out of the page cache, and the in-place
                # framing of chunks never reaches the file.
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):  # not mappable (a pipe, some network file systems)
                data = bytearray(size)
                read = f.readinto(data)
                del data[read:]
    except IsADirectoryError:
        raise BadInputError(f"{path}: is a directory with no trace files") from None
    except PermissionError:
        raise BadInputError(f"{path}: permission denied") from None
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    if len(data) > MAX_TRACE_BYTES:
        raise BadInputError(f"{path}: {len(data) / 1e9:.1f} GB is over the {MAX_TRACE_BYTES / 1e9:.1f} GB limit")
    return data


def _gunzip_guarded(f, path: Path) -> bytearray:
    """Decompress a gzip stream (one member or several concatenated), at most one chunk of output at a
    time, checking the start of the data and the bomb limits after every chunk."""
    out = bytearray()
    decomp = zlib.decompressobj(wbits=31)
    compressed = 0
    pending = b""
    checked_start = False
    while True:
        if not pending:
            pending = f.read(_CHUNK)
            if not pending:
                break
            compressed += len(pending)
        if decomp.eof:
            if not pending.strip(b"\x00"):
                pending = b""  # zero padding after the last member, as tape and block devices leave
                continue
            decomp = zlib.decompressobj(wbits=31)  # another member follows: concatenated gzip is valid
        try:
            out += decomp.decompress(pending, _CHUNK)
        except zlib.error as exc:
            raise BadInputError(f"{path}: corrupt gzip data ({exc})") from None
        pending = decomp.unused_data if decomp.eof else decomp.unconsumed_tail
        if not checked_start:
            stripped = bytes(out[:4096]).lstrip()
            if stripped:
                checked_start = True
                if stripped[:1] not in (b"{", b"["):
                    raise BadInputError(f"{path}: not a JSON trace (decompressed data does not start with '{{' or '[')")
        _check_bomb(path, len(out), compressed)
    if not decomp.eof:
        raise BadInputError(f"{path}: truncated gzip file (stream ends before its end marker)")
    return out


def _check_bomb(path: Path, out_bytes: int, compressed: int) -> None:
    if out_bytes > MAX_TRACE_BYTES:
        raise BadInputError(
            f"{path}: decompresses past the {MAX_TRACE_BYTES / 1e9:.1f} GB limit "
            "(set GPUADVISOR_MAX_TRACE_BYTES to raise it)"
        )
    if out_bytes > RATIO_CHECK_AFTER_BYTES and out_bytes > MAX_GZIP_RATIO * max(compressed, 1):
        raise BadInputError(
            f"{path}: refused, decompresses more than {MAX_GZIP_RATIO}x "
            f"({compressed} bytes to over {out_bytes} bytes): a gzip bomb, not a trace"
        )


# --------------------------------------------------------------------------------------------
# decode


def _decode_header(data: bytes, path: Path) -> KinetoFile:
    """The trace's metadata, with ``traceEvents`` as a list of raw (undecoded) events."""
    start = data[:4096].lstrip()[:1]
    if start not in (b"{", b"["):
        head = bytes(data[:4096]).strip()[:16]
        if head in (b"null", b"true", b"false") or head[:1] in b'"-0123456789':
            raise BadInputError(f"{path}: not a Kineto trace (a JSON {head.decode(errors='replace')!r}, not an object)")
        raise BadInputError(f"{path}: not JSON (starts with {bytes(data[:16])!r})")
    try:
        if start == b"[":  # the Chrome trace format also allows a bare array of events
            return KinetoFile(traceEvents=_RAW_LIST_DECODER.decode(data))
        doc = _HEADER_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise BadInputError(f"{path}: not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower():
            raise BadInputError(f"{path}: truncated JSON ({msg})") from None
        raise BadInputError(f"{path}: malformed JSON ({msg})") from None
    except RecursionError:
        raise too_deep(path) from None
    if doc.traceEvents is msgspec.UNSET:
        raise BadInputError(f"{path}: not a Kineto trace (JSON object without 'traceEvents')")
    return doc


def too_deep(path: Path) -> BadInputError:
    """The error for JSON nested past msgspec's recursion guard (Python's recursion limit, ~1,000 levels)."""
    return BadInputError(f"{path}: JSON nested too deep to read (a trace's events are at most a few levels deep)")


def _address(buffer) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


@contextmanager
def _framed_chunk(data: bytearray, raws: list[msgspec.Raw]):
    """The events ``raws`` as one JSON array, without copying them. The raw events are views into ``data``,
    in order, so the chunk is the span from the first event's start to the last one's end (the commas
    between them included). The bytes just outside that span (a comma, whitespace or a bracket) are
    overwritten with "[" and "]" while the chunk is decoded, then restored. Copying each ~70 MB span
    instead cost 1.5 s on a 425 MB trace (page faults on fresh memory), joining the raw events 2.0 s."""
    base = _address(data)
    start = _address(raws[0]) - base - 1
    end = _address(raws[-1]) - base + len(raws[-1])
    inside = 0 <= start and end < len(data) and data[start + 1 : start + 1 + len(raws[0])] == bytes(raws[0])
    if not inside or not isinstance(data, (bytearray, mmap.mmap)):
        yield b"[" + b",".join(raws) + b"]"
        return
    saved = data[start], data[end]
    data[start], data[end] = 0x5B, 0x5D  # "[", "]"
    try:
        # Not released here: the decoded events' raw fields (shapes) are views into it until copied.
        yield memoryview(data)[start : end + 1]
    finally:
        data[start], data[end] = saved


def _decode_chunk(data: bytearray, raws: list[msgspec.Raw], path: Path) -> list:
    """Typed events for a slice of raw events; the lenient structs when a field has an unexpected type."""
    with _framed_chunk(data, raws) as chunk:
        try:
            return _CHUNK_DECODERS[0].decode(chunk)
        except msgspec.ValidationError:
            pass
        except RecursionError:
            raise too_deep(path) from None
        try:
            return _CHUNK_DECODERS[1].decode(chunk)
        except msgspec.ValidationError as exc:
            raise BadInputError(f"{path}: not a Kineto trace (an event is not an object: {exc})") from None
        except RecursionError:
            raise too_deep(path) from None


def _as_int(value: Any, default: int = -1, field: str = "id") -> int:
    """An int64 value; None and what is not a number -> ``default``; NaN and infinities too. An integer past 64
    bits raises NumberOutOfRange (it cannot be stored, and silently dropping it would change the analysis)."""
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if not -MAX_INT <= number <= MAX_INT:
        raise _out_of_range(value, field)
    return number


def _as_float(value: Any, field: str = "value") -> float:
    try:
        return float(value)
    except OverflowError:  # an integer of 400 digits: no float holds it
        raise _out_of_range(value, field) from None
    except (TypeError, ValueError):
        return float("nan")


def _decode_raw_list(raw, types: bool = False) -> list | None:
    """A raw ``Input Dims`` (or, ``types``, ``Input type``) decoded; None where absent or malformed. Nesting past
    :data:`~gpuadvisor.inputs.MAX_NESTING` (shapes are 2 or 3 deep) is bad input."""
    if raw is None or bytes(raw) == b"null":
        return None
    if bytes(raw).count(b"[") > MAX_NESTING:
        from gpuadvisor.inputs import json_nesting

        if json_nesting(bytes(raw)) > MAX_NESTING:
            raise BadInputError(f"a trace's 'Input Dims' or 'Input type' is nested deeper than {MAX_NESTING} levels")
    try:
        value = _JSON_LIST_DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    except RecursionError:
        raise BadInputError("a trace's 'Input Dims' or 'Input type' is nested too deep to read") from None
    if types and value:
        value = [escape_control(v) if isinstance(v, str) else v for v in value]
    return value


_KERNEL_CATS = ("kernel",)
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_MEMCPY_CATS = ("gpu_memcpy", "gpu_memset")
_ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation")
# The profiler's own span of its recording ("PyTorch Profiler (0)"): where the recorded window ends.
_WINDOW_CATS = ("Trace",)
_OTHER_DEVICE_PREFIXES = ("mtia", "xpu", "hpu")


_USED_CATS = (
    _KERNEL_CATS
    + _RUNTIME_CATS
    + _MEMCPY_CATS
    + _ANNOTATION_CATS
    + _WINDOW_CATS
    + ("cpu_op", "cuda_sync", "python_function")
)


def _bucket_events(events: list) -> dict[str, list]:
    """Complete ("X") events grouped by category, in trace order. Typed events skip the phase check:
    Kineto writes every event of the categories the tables read as a complete event."""
    buckets: dict[str, list] = {}
    if events and isinstance(events[0], Event):
        for ev in events:
            bucket = buckets.get(ev.cat)
            if bucket is None:
                bucket = buckets[ev.cat] = []
            bucket.append(ev)
        return buckets
    for ev in events:
        if ev.ph == "X":
            buckets.setdefault(ev.cat if isinstance(ev.cat, str) else "", []).append(ev)
    return buckets


def _attr(items: list, name: str) -> list:
    return list(map(attrgetter(name), items))


def _floats(values: list, field: str = "value") -> np.ndarray:
    """A float column; values that are not numbers become NaN; an integer too large for a float raises
    NumberOutOfRange naming ``field``."""
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.asarray([_as_float(v, field) if v is not None else np.nan for v in values], dtype=np.float64)


def _ints(values: list, field: str = "id") -> np.ndarray:
    """An int64 column; None and non-numbers become -1; an integer past 64 bits raises NumberOutOfRange."""
    try:
        arr = np.asarray(values, dtype=np.float64)  # None -> NaN
        arr[~np.isfinite(arr)] = -1
        return arr.astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.asarray([_as_int(v, field=field) for v in values], dtype=np.int64)


def _dims3(values: list, field: str = "grid") -> np.ndarray:
    try:
        out = np.asarray(values, dtype=np.int64)
        if out.shape == (len(values), 3):
            return out
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.full((len(values), 3), -1, dtype=np.int64)
    for i, v in enumerate(values):
        if isinstance(v, list):
            for j, x in enumerate(v[:3]):
                out[i, j] = _as_int(x, field=field)
    return out


def _names(items: list, intern: dict[str, str] | None = None) -> pd.Series:
    """The events' names, control characters escaped (:mod:`gpuadvisor.textsafe`): once per distinct name
    (``intern`` maps each raw name to its one stored string)."""
    names = _attr(items, "name")
    if items and not isinstance(items[0], Event):
        names = [n if isinstance(n, str) else "" if n is None else str(n) for n in names]
    if intern is None:
        intern = {}
    get = intern.get
    names = [get(n) or intern.setdefault(n, escape_control(n)) for n in names]
    return pd.Series(names, dtype=object)


def _timed(items: list, rank: int, intern: dict[str, str] | None = None) -> dict[str, Any]:
    ts = _floats(_attr(items, "ts"), "ts")
    dur = _floats(_attr(items, "dur"), "dur")
    return {"rank": rank, "name": _names(items, intern), "ts_us": ts, "dur_us": dur, "end_us": ts + dur}


def _args(items: list, empty: Any) -> list:
    return [ev.args or empty for ev in items]


def _gather(buckets: dict[str, list], cats: tuple[str, ...]) -> list:
    if len(cats) == 1:
        return buckets.get(cats[0], [])
    out: list = []
    for cat in cats:
        out.extend(buckets.get(cat, []))
    return out


def kernel_frame(
    timed: dict[str, Any],
    ids: dict[str, np.ndarray],
    grid: np.ndarray,
    block: np.ndarray,
    registers: np.ndarray,
    shared_memory: np.ndarray,
) -> pd.DataFrame:
    """The kernels table from its columns (both readers build it here): ``timed`` (rank, name, ts/dur/end),
    ``ids`` (device, stream, correlation, external_id), ``grid``/``block`` as (n, 3) arrays with -1 where
    unknown."""
    return pd.DataFrame(
        {
            **timed,
            "device": np.maximum(ids["device"], 0),
            "stream": ids["stream"],
            "correlation": ids["correlation"],
            "external_id": ids["external_id"],
            "grid_x": grid[:, 0],
            "grid_y": grid[:, 1],
            "grid_z": grid[:, 2],
            "block_x": block[:, 0],
            "block_y": block[:, 1],
            "block_z": block[:, 2],
            "blocks": np.where((grid >= 0).all(axis=1), grid.prod(axis=1), -1),
            "threads_per_block": np.where((block >= 0).all(axis=1), block.prod(axis=1), -1),
            "registers_per_thread": registers,
            "shared_memory_bytes": shared_memory,
        }
    )


def _tables(events: list, rank: int) -> tuple[dict[str, pd.DataFrame], int]:
    """The per-category tables of a list of events, and the count of events on accelerators we don't model."""
    buckets = _bucket_events(events)
    empty = Args() if not events or isinstance(events[0], Event) else LenientArgs()
    intern: dict[str, str] = {}

    items = _gather(buckets, _KERNEL_CATS)
    args = _args(items, empty)
    kernels = kernel_frame(
        _timed(items, rank, intern),
        {name: _ints(_attr(args, name), name) for name in ("device", "stream", "correlation", "external_id")},
        _dims3(_attr(args, "grid"), "grid"),
        _dims3(_attr(args, "block"), "block"),
        _ints(_attr(args, "registers_per_thread"), "registers per thread"),
        _ints(_attr(args, "shared_memory"), "shared memory"),
    )

    items = _gather(buckets, _MEMCPY_CATS)
    args = _args(items, empty)
    memcpys = pd.DataFrame(
        {
            **_timed(items, rank, intern),
            "device": _ints(_attr(args, "device")),
            "stream": _ints(_attr(args, "stream")),
            "correlation": _ints(_attr(args, "correlation")),
            "external_id": _ints(_attr(args, "external_id")),
            "bytes": _ints(_attr(args, "bytes"), "bytes"),
        }
    )
    memcpys.insert(2, "op", pd.Series(["memset" if ev.cat == "gpu_memset" else "memcpy" for ev in items], dtype=object))
    kinds = memcpys["name"].str.extract(_MEMCPY_RE)
    is_copy = memcpys["op"] == "memcpy"
    memcpys.insert(3, "direction", kinds[0].fillna("?").where(is_copy, "Memset").astype(object))
    memcpys.insert(4, "src_kind", kinds[1].fillna("").where(is_copy, "").astype(object))
    memcpys.insert(5, "dst_kind", kinds[2].fillna("").where(is_copy, "Device").astype(object))

    items = _gather(buckets, _RUNTIME_CATS)
    args = _args(items, empty)
    runtime = pd.DataFrame(
        {
            **_timed(items, rank, intern),
            "api": pd.Series(["driver" if ev.cat == "cuda_driver" else "runtime" for ev in items], dtype=object),
            "tid": pd.Series(_attr(items, "tid"), dtype=object),
            "correlation": _ints(_attr(args, "correlation")),
            "external_id": _ints(_attr(args, "external_id")),
        }
    )

    items = buckets.get("cpu_op", [])
    args = _args(items, empty)
    cpu_ops = pd.DataFrame(
        {
            **_timed(items, rank),
            "tid": pd.Series(_attr(items, "tid"), dtype=object),
            "external_id": _ints(_attr(args, "external_id")),
            "flops": _floats([np.nan if f is None else f for f in _attr(args, "flops")], "flops"),
            # Shapes stay raw JSON until an analysis asks (see input_shapes). The copies detach them from
            # the trace bytes, so that each chunk's views do not keep the whole buffer alive.
            "input_dims_raw": pd.Series([r.copy() for r in _attr(args, "input_dims")], dtype=object),
            "input_types_raw": pd.Series([r.copy() for r in _attr(args, "input_types")], dtype=object),
            "concrete_inputs_raw": pd.Series([r.copy() for r in _attr(args, "concrete_inputs")], dtype=object),
        }
    )

    items = _gather(buckets, _ANNOTATION_CATS)
    annotations = pd.DataFrame(
        {
            **_timed(items, rank),
            "on_gpu": np.asarray([ev.cat == "gpu_user_annotation" for ev in items], dtype=bool),
            "external_id": _ints(_attr(_args(items, empty), "external_id")),
        }
    )

    items = buckets.get("cuda_sync", [])
    args = _args(items, empty)
    syncs = pd.DataFrame(
        {
            **_timed(items, rank),
            "stream": _ints(_attr(args, "stream")),
            "correlation": _ints(_attr(args, "correlation")),
        }
    )

    items = buckets.get("python_function", [])
    frames = pd.DataFrame(
        {
            **_timed(items, rank),
            "tid": pd.Series(_attr(items, "tid"), dtype=object),
        }
    )

    windows = pd.DataFrame(_timed(_gather(buckets, _WINDOW_CATS), rank))

    other = sum(len(v) for k, v in buckets.items() if k.startswith(_OTHER_DEVICE_PREFIXES))
    tables = {
        "kernels": kernels,
        "memcpys": memcpys,
        "runtime": runtime,
        "cpu_ops": cpu_ops,
        "annotations": annotations,
        "syncs": syncs,
        "python_frames": frames,
        "windows": windows,
    }
    return tables, other


def _steps(tables: dict[str, pd.DataFrame], rank: int) -> pd.DataFrame:
    """ProfilerStep#N host annotations as steps (one row per N, in time order), each cut at the end of the
    recorded window (:func:`recorded_end`): ``cut_us`` says by how much (0: the step ended inside it). Seen on a
    public trace of a compiled step: its one ProfilerStep lasts 13.3 s while everything the profiler recorded,
    its own span included, ends 1.7 ms after the step starts; what came after the recording is not the step's
    idle time."""
    annotations = tables["annotations"]
    host = annotations[~annotations["on_gpu"]]
    step_rows = []
    for name, t0, d in zip(host["name"], host["ts_us"], host["dur_us"]):
        match = _STEP_RE.match(name)
        if match:
            step_rows.append((rank, int(match.group(1)), t0, d, t0 + d))
    steps = pd.DataFrame(step_rows, columns=["rank", "step", "ts_us", "dur_us", "end_us"])
    steps = steps.sort_values("ts_us", kind="stable").drop_duplicates("step").reset_index(drop=True)
    steps["cut_us"] = 0.0
    end = recorded_end(tables)
    if end is None or not len(steps):
        return steps
    steps = steps[~(steps["ts_us"].to_numpy(float) >= end)].reset_index(drop=True)
    over = steps["end_us"].to_numpy(float) > end
    if over.any():
        steps.loc[over, "cut_us"] = steps.loc[over, "end_us"] - end
        steps.loc[over, "end_us"] = end
        steps.loc[over, "dur_us"] = end - steps.loc[over, "ts_us"]
    return steps


def recorded_end(tables: dict[str, pd.DataFrame]) -> float | None:
    """The end of what a trace file recorded: the latest end of the profiler's own span and of every event
    other than the ProfilerStep annotations; None without the profiler's span (a trace that lacks it is not
    cut: the window's end is then unknown)."""
    windows = tables.get("windows")
    span = windows["end_us"].to_numpy(float) if windows is not None and len(windows) else np.empty(0)
    span = span[np.isfinite(span)]
    if not len(span):
        return None
    ends = [float(span.max())]
    for key, df in tables.items():
        if key in ("windows", "steps") or not len(df):
            continue
        values = df["end_us"].to_numpy(float)
        if key == "annotations":
            values = values[~df["name"].astype(str).str.startswith("ProfilerStep#").to_numpy()]
        values = values[np.isfinite(values)]
        if len(values):
            ends.append(float(values.max()))
    return max(ends)


def _load_file(file: Path, index: int) -> tuple[KinetoFile, int, dict[str, pd.DataFrame], int, int, int]:
    """(header, rank, tables, events, bytes, other-device events) of one trace file."""
    try:
        return _load_file_unchecked(file, index)
    except NumberOutOfRange as exc:
        raise BadInputError(f"{file}: {exc}") from None


def _load_file_unchecked(file: Path, index: int) -> tuple[KinetoFile, int, dict[str, pd.DataFrame], int, int, int]:
    data = read_trace_bytes(file)
    size = len(data)
    from gpuadvisor.trace.columns import load_columns

    fast = load_columns(data, file, index)  # None: an unusual file, read below with every check
    if fast is not None:
        doc, rank, tables, n_events, other = fast
        return doc, rank, tables, n_events, size, other
    doc = _decode_header(data, file)
    rank = index
    if doc.distributedInfo is not None and doc.distributedInfo.rank is not None:
        rank = _as_int(doc.distributedInfo.rank, index, "distributedInfo rank")
    raws = doc.traceEvents
    doc.traceEvents = []
    chunks = []
    other = 0
    for start in range(0, len(raws), CHUNK_EVENTS):
        events = _decode_chunk(data, raws[start : start + CHUNK_EVENTS], file)
        part, part_other = _tables(events, rank)
        del events
        chunks.append(part)
        other += part_other
    n_events = len(raws)
    del raws, data
    if not chunks:
        chunks.append(_tables([], rank)[0])
    tables = _concat(chunks)
    for key in ("kernels", "memcpys", "runtime", "annotations"):
        tables[key] = tables[key].sort_values("ts_us", kind="stable").reset_index(drop=True)
    tables["steps"] = _steps(tables, rank)
    del tables["windows"]
    return doc, rank, tables, n_events, size, other


def _concat(parts: list[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    if len(parts) == 1:
        return parts[0]
    return {key: pd.concat([p[key] for p in parts], ignore_index=True) for key in parts[0]}


def input_shapes(cpu_ops: pd.DataFrame) -> tuple[list, list]:
    """Decoded ``Input Dims`` and ``Input type`` for the given cpu_ops rows (None where absent)."""
    return input_shapes_raw(cpu_ops["input_dims_raw"], cpu_ops["input_types_raw"])


def concrete_inputs_raw(raws) -> list:
    """Decoded ``Concrete Inputs`` (the values of scalar and list arguments as strings, e.g. a convolution's
    ``"[2, 2]"`` stride); None where absent or malformed."""
    return [_decode_raw_list(r, types=True) for r in raws]


def input_shapes_raw(dims_raw, types_raw) -> tuple[list, list]:
    """Decoded ``Input Dims`` and ``Input type`` JSON (bytes or msgspec.Raw; None where absent)."""
    return [_decode_raw_list(r) for r in dims_raw], [_decode_raw_list(r, types=True) for r in types_raw]


def _device_infos(doc: KinetoFile) -> list[DeviceInfo]:
    devices = []
    for i, p in enumerate(doc.deviceProperties or []):
        cc = None
        if p.computeMajor is not None and p.computeMinor is not None:
            cc = (_as_int(p.computeMajor, 0, "computeMajor"), _as_int(p.computeMinor, 0, "computeMinor"))
        devices.append(
            DeviceInfo(
                index=_as_int(p.id, i, "deviceProperties id"),
                name=escape_control(str(p.name or "unknown GPU")),
                sm_count=_as_int(p.numSms, 0, "numSms") or None,
                compute_capability=cc,
                total_memory_bytes=_as_int(p.totalGlobalMem, 0, "totalGlobalMem") or None,
                max_threads_per_sm=_as_int(p.maxThreadsPerMultiprocessor, 0, "maxThreadsPerMultiprocessor") or None,
                registers_per_sm=_as_int(p.regsPerMultiprocessor, 0, "regsPerMultiprocessor") or None,
                shared_memory_per_sm_bytes=_as_int(p.sharedMemPerMultiprocessor, 0, "sharedMemPerMultiprocessor")
                or None,
            )
        )
    return devices


# --------------------------------------------------------------------------------------------
# public entry


def find_trace_files(path: Path) -> list[Path]:
    """The trace files a path names: the file itself, or every trace file in a folder (sorted)."""
    if not path.exists():
        raise BadInputError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
        if not files:
            raise BadInputError(f"{path}: directory has no trace files (*.json or *.json.gz)")
        return files
    if not path.is_file():  # a FIFO or a device: the reader needs to seek and map
        raise BadInputError(f"{path}: not a regular file; save the trace to a file first")
    return [path]


def load_trace(path: str | os.PathLike) -> Trace:
    """Parse one Kineto trace file, or a folder of per-rank trace files, into a :class:`Trace`. numpy's floating-point
    warnings are silenced: a 1e308 timestamp plus its duration is inf, which the analyses treat as unknown."""
    with np.errstate(all="ignore"):
        return _load_trace(path)


def _load_trace(path: str | os.PathLike) -> Trace:
    root = Path(path)
    files = find_trace_files(root)
    parts = []
    devices: list[DeviceInfo] = []
    metadata: dict[str, Any] = {}
    events = 0
    size = 0
    other = 0
    used_ranks: set[int] = set()
    per_rank: dict[int, tuple[int, int]] = {}
    for index, file in enumerate(files):
        doc, rank, tables, n_events, n_bytes, n_other = _load_file(file, index)
        if rank in used_ranks:
            rank = max(used_ranks) + 1
            for df in tables.values():
                df["rank"] = rank
        used_ranks.add(rank)
        events += n_events
        size += n_bytes
        per_rank[rank] = (n_events, n_bytes)
        other += n_other
        if not devices:
            devices = _device_infos(doc)
        if not metadata:
            metadata = {
                "schema_version": doc.schemaVersion,
                "cuda_runtime_version": doc.cuda_runtime_version,
                "cuda_driver_version": doc.cuda_driver_version,
                "world_size": doc.distributedInfo.world_size if doc.distributedInfo else None,
            }
            metadata = {k: escape_control(v) if isinstance(v, str) else v for k, v in metadata.items()}
        parts.append(tables)
    tables = _concat(parts)
    if len(parts) > 1:
        for key in ("kernels", "memcpys", "runtime"):
            tables[key] = tables[key].sort_values(["rank", "ts_us"], kind="stable").reset_index(drop=True)
    return Trace(
        source=escape_control(str(root)),  # a path the report shows: no control characters
        devices=devices,
        ranks=sorted(used_ranks),
        metadata=metadata,
        event_count=events,
        size_bytes=size,
        other_device_events=other,
        rank_sizes=per_rank,
        **tables,
    )
