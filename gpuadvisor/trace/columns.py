"""The fast way from trace bytes to tables: split the event array at byte level, decode each piece into
typed structs, and pull each table's columns straight into numpy arrays. Large traces decode half their
pieces in a forked worker process (:mod:`gpuadvisor.trace.worker`).

Splitting without parsing (kineto's checked path spends ~1 s of a 425 MB trace on a first msgspec pass that
only finds where each event starts): the reader finds ``"traceEvents": [`` and the ``]`` that closes it (the
last one after a ``}`` such that the file with the array emptied still decodes, with its top-level
``traceEvents`` exactly there), and cuts the array at ``}, {`` gaps about every :data:`CHUNK_BYTES`. A cut
inside a string or inside a nested object leaves the piece before it unbalanced, which msgspec rejects; so
when every piece decodes, the cuts were all between events. Anything else (a bare array, odd field types for
the lenient structs, malformed JSON) returns None, and :mod:`gpuadvisor.trace.kineto` reads the file its
slower, checked way, which also words the error.

Text columns travel as small integer codes into a list of distinct values (a trace repeats a few
hundred names a million times): cheap to send back from the worker, and the final columns hold one
string object per distinct name, which hashes once (pandas' groupby and factorize run faster on them).
"""

from __future__ import annotations

import gc
import mmap
import re
import sys
from collections import defaultdict
from itertools import chain, count
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuadvisor.textsafe import escape_names
from gpuadvisor.trace import kineto
from gpuadvisor.trace.worker import ForkedCall, WorkerFailed, can_fork

# Pieces of about this many bytes (~12k events of a torch.profiler trace); the structs of one piece live at a
# time. Small pieces keep the structs in cache while each table's columns are read from them: 4 MB took a
# median 6.5 s of CPU for the 425 MB trace, 16 MB 7.3 s, 1 MB 7.5 s (three runs each, on a shared machine).
CHUNK_BYTES = 4 * 1024 * 1024
# Traces of at least this many bytes of JSON decode half their pieces in a forked worker. Measured load_trace
# (best of 5, tiled llama_decode, a 2-core machine with other jobs on it): 24 MB 0.19 s alone / 0.15 s with
# the worker, 64 MB 0.47 / 0.43, 128 MB 1.02 / 0.65; with the second core busier, the worker lost 0.02 s at
# 8 and 24 MB and 0.07 s at 64 MB. Below this size it saves little, and costs as much when the core is busy.
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
# Share of the bytes the worker decodes. Both processes decode at about the same rate (~1.8 s of CPU each, the
# 425 MB trace in 4 MB pieces); the parent merges and builds the tables once the worker's half is back.
WORKER_SHARE = 0.5
# The header around the event array (deviceProperties, distributedInfo, ...) is copied to be decoded on
# its own; past this size the file is unusual and goes the checked way.
MAX_HEADER_BYTES = 16 * 1024 * 1024

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_GAP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")


class _EventsAt(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw(b"null")  # noqa: N815


_EVENTS_AT_DECODER = msgspec.json.Decoder(_EventsAt)
_EVENTS_DECODER = msgspec.json.Decoder(list[kineto.Event])


class _Unusual(Exception):
    """The fast path cannot vouch for this file: read it the checked way."""


# Which categories fill which table (kineto's lists; the first category sorts first at equal times).
TABLE_CATEGORIES = {
    "kernels": kineto._KERNEL_CATS,
    "memcpys": kineto._MEMCPY_CATS,
    "runtime": kineto._RUNTIME_CATS,
    "cpu_ops": ("cpu_op",),
    "annotations": kineto._ANNOTATION_CATS,
    "syncs": ("cuda_sync",),
    "python_frames": ("python_function",),
    "windows": kineto._WINDOW_CATS,
}
# Args fields read per table: (column, Args attribute).
_ARG_COLUMNS = {
    "kernels": (
        ("device", "device"),
        ("stream", "stream"),
        ("correlation", "correlation"),
        ("external_id", "external_id"),
        ("registers_per_thread", "registers_per_thread"),
        ("shared_memory_bytes", "shared_memory"),
    ),
    "memcpys": (
        ("device", "device"),
        ("stream", "stream"),
        ("correlation", "correlation"),
        ("external_id", "external_id"),
        ("bytes", "bytes"),
    ),
    "runtime": (("correlation", "correlation"), ("external_id", "external_id")),
    "cpu_ops": (("external_id", "external_id"),),
    "annotations": (("external_id", "external_id"),),
    "syncs": (("stream", "stream"), ("correlation", "correlation")),
    "python_frames": (),
    "windows": (),
}
_WITH_TID = ("runtime", "cpu_ops", "python_frames")
# Per table: the name of a bool column that is True for rows of its second category.
_SECOND_CATEGORY = {"memcpys": "_memset", "runtime": "_driver", "annotations": "on_gpu"}

_get_cat, _get_name, _get_ts, _get_dur = attrgetter("cat"), attrgetter("name"), attrgetter("ts"), attrgetter("dur")
_get_tid, _get_args = attrgetter("tid"), attrgetter("args")
_EMPTY_ARGS = kineto.Args()


class Pool:
    """Distinct values (names, thread ids, raw shapes) and the code of each, in first-seen order."""

    def __init__(self) -> None:
        # A new value gets the next code on first lookup: one pass over the values.
        self.index: defaultdict[Any, int] = defaultdict(count().__next__)

    def codes(self, values, n: int | None = None) -> np.ndarray:
        """Codes of a list of values, or of an iterable of ``n`` values."""
        count = len(values) if n is None else n
        return np.fromiter(map(self.index.__getitem__, values), dtype=np.int32, count=count)

    @property
    def values(self) -> list:
        return list(self.index)


class Pools:
    def __init__(self) -> None:
        self.names, self.tids, self.raws = Pool(), Pool(), Pool()

    def lists(self) -> dict[str, list]:
        return {"names": self.names.values, "tids": self.tids.values, "raws": self.raws.values}


_POOL_OF_COLUMN = {
    "name": "names",
    "tid": "tids",
    "input_dims_raw": "raws",
    "input_types_raw": "raws",
    "concrete_inputs_raw": "raws",
}


# --------------------------------------------------------------------------------------------
# bytes -> pieces


def split_events(data: bytearray | mmap.mmap, path) -> tuple[kineto.KinetoFile, list[tuple[int, int]]] | None:
    """The header and the pieces of the event array: (position of the piece's "[", position of its "]"),
    where inner ends are commas between events, overwritten while the piece decodes. None when the file
    does not look like a Kineto JSON object (the checked path takes it)."""
    head_end = min(len(data), MAX_HEADER_BYTES)
    key = data.find(b'"traceEvents"', 0, head_end)
    if key < 0 or data[:4096].lstrip()[:1] != b"{":
        return None
    match = _EVENTS_KEY.match(data, key)
    if match is None:
        return None
    open_at = match.end() - 1
    found = _events_end(data, open_at)
    if found is None:
        return None
    doc, close_at = found
    bounds = [open_at]
    target = open_at + CHUNK_BYTES
    while target < close_at:
        gap = _EVENT_GAP.search(data, target, close_at)
        if gap is None:
            break
        comma = data.find(b",", gap.start(), gap.end())
        bounds.append(comma)
        target = comma + CHUNK_BYTES
    bounds.append(close_at)
    return doc, list(zip(bounds[:-1], bounds[1:]))


def _events_end(data: bytearray | mmap.mmap, open_at: int) -> tuple[kineto.KinetoFile, int] | None:
    """The header and the position of the "]" that closes the event array opened at ``open_at``: the last
    "]" after a "}" (or right after the "[") such that the file with the array emptied decodes, with its
    top-level traceEvents exactly there. Keys after the array (traceName, log lines) are skipped."""
    head = bytes(data[:open_at])
    close_at = len(data)
    lowest = max(open_at + 1, len(data) - MAX_HEADER_BYTES)
    for _ in range(64):
        close_at = data.rfind(b"]", lowest, close_at)
        if close_at < 0:
            return None
        # Only whitespace may separate it from the last event's "}" (or from the "[" of an empty array).
        window = max(open_at, close_at - 4096)
        before = data.rfind(b"}", window, close_at)
        if before < 0 and window > open_at or data[max(before, open_at) + 1 : close_at].strip():
            continue
        header = head + b"[]" + bytes(data[close_at + 1 :])
        try:
            doc = kineto._HEADER_DECODER.decode(header)
            at = _EVENTS_AT_DECODER.decode(header).traceEvents
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        # The emptied array must be the top-level traceEvents (not a key of some nested object).
        if doc.traceEvents == [] and bytes(at) == b"[]" and kineto._address(at) - kineto._address(header) == open_at:
            return doc, close_at
    return None


def _decode_piece(data: bytearray | mmap.mmap, piece: tuple[int, int]) -> list:
    open_at, close_at = piece
    saved = data[open_at], data[close_at]
    data[open_at], data[close_at] = 0x5B, 0x5D  # "[", "]"
    try:
        return _EVENTS_DECODER.decode(memoryview(data)[open_at : close_at + 1])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # the checked path words the error
        raise _Unusual from None
    finally:
        data[open_at], data[close_at] = saved


# --------------------------------------------------------------------------------------------
# events -> columns


def _ints(values: list, field: str = "id") -> np.ndarray:
    """kineto._ints (None -> -1, through float64) without its float round trip where that changes nothing:
    all values ints of magnitude below 2**53. 0.7 ms against 1.3 ms on 40k External ids."""
    try:
        out = np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return kineto._ints(values, field)
    if len(out) and (out.max() >= 2**53 or out.min() <= -(2**53)):
        return kineto._ints(values, field)
    return out


def _dims3(values: list, field: str = "grid") -> np.ndarray:
    """kineto._dims3, without numpy's nested-sequence discovery where every value is a list of three ints
    (the typed decode's list[int]): 5.8 ms against 8.3 ms on 40k grids."""
    if set(map(type, values)) <= {list} and set(map(len, values)) <= {3}:
        try:
            return np.fromiter(chain.from_iterable(values), dtype=np.int64, count=3 * len(values)).reshape(-1, 3)
        except (TypeError, ValueError, OverflowError):
            pass
    return kineto._dims3(values, field)


_RAW_ARGS = ("input_dims", "input_types", "concrete_inputs")


def _raw_bytes(args: list, n: int) -> list[list[bytes]]:
    """The bytes of each ``Input Dims``, ``Input type`` and ``Concrete Inputs`` (:data:`_RAW_ARGS`): one join
    and one split instead of a bytes() per value (40% faster on 5.5k operators). A NUL byte separates them: raw
    JSON has none (control characters in strings are escaped), and the count of parts checks it."""
    parts = b"\0".join(chain.from_iterable(map(attrgetter(a), args) for a in _RAW_ARGS)).split(b"\0") if n else []
    if len(parts) != len(_RAW_ARGS) * n:
        parts = [bytes(raw) for a in _RAW_ARGS for raw in map(attrgetter(a), args)]
    return [parts[i * n : (i + 1) * n] for i in range(len(_RAW_ARGS))]


def _rows_of(cat_codes: np.ndarray, cat_index: dict[str, int], cats: tuple[str, ...]) -> np.ndarray:
    wanted = [cat_index[c] for c in cats if c in cat_index]
    if not wanted:
        return np.zeros(0, dtype=np.intp)
    mask = cat_codes == wanted[0]
    for code in wanted[1:]:
        mask |= cat_codes == code
    return np.flatnonzero(mask)


def piece_columns(events: list, pools: Pools) -> tuple[dict[str, dict[str, np.ndarray]], int]:
    """Each table's columns for a list of typed events (text columns as codes into ``pools``), and the
    count of events on accelerators we don't model."""
    cat_index: defaultdict[str, int] = defaultdict(count().__next__)
    cat_codes = np.fromiter(map(cat_index.__getitem__, map(_get_cat, events)), dtype=np.int32, count=len(events))
    counts = np.bincount(cat_codes, minlength=len(cat_index))
    other = int(sum(counts[i] for c, i in cat_index.items() if c.startswith(kineto._OTHER_DEVICE_PREFIXES)))
    out = {}
    for table, table_cats in TABLE_CATEGORIES.items():
        rows = _rows_of(cat_codes, cat_index, table_cats)
        items = list(map(events.__getitem__, rows.tolist()))
        n = len(items)
        cols: dict[str, np.ndarray] = {
            "name": pools.names.codes(map(_get_name, items), n),
            "ts_us": np.fromiter(map(_get_ts, items), dtype=np.float64, count=n),
            "dur_us": np.fromiter(map(_get_dur, items), dtype=np.float64, count=n),
        }
        if table in _SECOND_CATEGORY:
            second = cat_index.get(table_cats[1], -1)
            cols[_SECOND_CATEGORY[table]] = cat_codes[rows] == second
        if table in _WITH_TID:
            cols["tid"] = pools.tids.codes(map(_get_tid, items), n)
        if _ARG_COLUMNS[table] or table == "kernels" or table == "cpu_ops":
            args = list(map(_get_args, items))
            if not all(args):  # events without args read as an empty Args
                args = [a or _EMPTY_ARGS for a in args]
            for column, attr in _ARG_COLUMNS[table]:
                cols[column] = _ints(list(map(attrgetter(attr), args)), attr)
            if table == "kernels":
                cols["grid"] = _dims3(list(map(attrgetter("grid"), args)), "grid")
                cols["block"] = _dims3(list(map(attrgetter("block"), args)), "block")
            if table == "cpu_ops":
                flops = [np.nan if f is None else f for f in map(attrgetter("flops"), args)]
                cols["flops"] = kineto._floats(flops, "flops")
                # The shapes' bytes, detached from the trace bytes (the pool keeps one copy of each).
                dims, types, concrete = _raw_bytes(args, n)
                cols["input_dims_raw"] = pools.raws.codes(dims)
                cols["input_types_raw"] = pools.raws.codes(types)
                cols["concrete_inputs_raw"] = pools.raws.codes(concrete)
        out[table] = cols
    return out, other


def _decode_pieces(data, pieces: list[tuple[int, int]], pools: Pools) -> tuple[list, int, int]:
    """(per-piece columns, events, other-device events) of some pieces, one piece's structs at a time."""
    parts = []
    n_events = other = 0
    for piece in pieces:
        events = _decode_piece(data, piece)
        n_events += len(events)
        cols, piece_other = piece_columns(events, pools)
        del events
        parts.append(cols)
        other += piece_other
    return parts, n_events, other


def _join(parts: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    if len(parts) == 1:
        return parts[0]
    return {t: {c: np.concatenate([p[t][c] for p in parts]) for c in parts[0][t]} for t in parts[0]}


def _worker_job(data, pieces: list[tuple[int, int]]):
    def job():
        pools = Pools()
        parts, n_events, other = _decode_pieces(data, pieces, pools)
        return _join(parts), pools.lists(), n_events, other

    return job


# --------------------------------------------------------------------------------------------
# columns -> tables


def _object_array(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _memcpy_kinds(names: np.ndarray, memset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """direction, src_kind, dst_kind per row, from the distinct names (as kineto's str.extract did)."""
    direction, src, dst = {}, {}, {}
    for name in dict.fromkeys(names.tolist()):
        match = kineto._MEMCPY_RE.search(name) if isinstance(name, str) else None
        direction[name], src[name], dst[name] = match.groups() if match else ("?", "", "")
    out = []
    for table, memset_value in ((direction, "Memset"), (src, ""), (dst, "Device")):
        column = _object_array([table[n] for n in names.tolist()])
        column[memset] = memset_value
        out.append(column)
    return out[0], out[1], out[2]


def _table(table: str, cols: dict[str, np.ndarray], rank: int, values: dict[str, np.ndarray]) -> pd.DataFrame:
    ts = cols["ts_us"]
    if table in ("kernels", "memcpys", "runtime", "annotations"):
        # kineto's order: by start time, then category, then trace order.
        second = cols.get(_SECOND_CATEGORY.get(table, ""))
        order = np.lexsort((second, ts)) if second is not None else np.argsort(ts, kind="stable")
        if not (order[1:] > order[:-1]).all():
            cols = {c: v[order] for c, v in cols.items()}
            ts = cols["ts_us"]
    dur = cols["dur_us"]
    n = len(ts)

    def obj(column: str) -> pd.Series:
        return pd.Series(values[_POOL_OF_COLUMN[column]][cols[column]], dtype=object)

    timed = {"rank": rank, "name": obj("name"), "ts_us": ts, "dur_us": dur, "end_us": ts + dur}
    if table == "kernels":
        return kineto.kernel_frame(
            timed,
            {name: cols[name] for name in ("device", "stream", "correlation", "external_id")},
            cols["grid"],
            cols["block"],
            cols["registers_per_thread"],
            cols["shared_memory_bytes"],
        )
    if table == "memcpys":
        memset = cols["_memset"]
        names = timed["name"].to_numpy()
        direction, src, dst = _memcpy_kinds(names, memset)
        op = _object_array(["memcpy"] * n)
        op[memset] = "memset"
        return pd.DataFrame(
            {
                "rank": rank,
                "name": timed["name"],
                "op": pd.Series(op, dtype=object),
                "direction": pd.Series(direction, dtype=object),
                "src_kind": pd.Series(src, dtype=object),
                "dst_kind": pd.Series(dst, dtype=object),
                "ts_us": ts,
                "dur_us": dur,
                "end_us": timed["end_us"],
                "device": cols["device"],
                "stream": cols["stream"],
                "correlation": cols["correlation"],
                "external_id": cols["external_id"],
                "bytes": cols["bytes"],
            }
        )
    if table == "runtime":
        api = _object_array(["runtime"] * n)
        api[cols["_driver"]] = "driver"
        return pd.DataFrame(
            {
                **timed,
                "api": pd.Series(api, dtype=object),
                "tid": obj("tid"),
                "correlation": cols["correlation"],
                "external_id": cols["external_id"],
            }
        )
    if table == "cpu_ops":
        return pd.DataFrame(
            {
                **timed,
                "tid": obj("tid"),
                "external_id": cols["external_id"],
                "flops": cols["flops"],
                "input_dims_raw": obj("input_dims_raw"),
                "input_types_raw": obj("input_types_raw"),
                "concrete_inputs_raw": obj("concrete_inputs_raw"),
            }
        )
    if table == "annotations":
        return pd.DataFrame({**timed, "on_gpu": cols["on_gpu"], "external_id": cols["external_id"]})
    if table == "syncs":
        return pd.DataFrame({**timed, "stream": cols["stream"], "correlation": cols["correlation"]})
    if table == "windows":
        return pd.DataFrame(timed)
    return pd.DataFrame({**timed, "tid": obj("tid")})


def load_columns(data: bytearray | mmap.mmap, path, index: int):
    """(header, rank, tables, events, other-device events) of a trace's bytes, or None where the checked
    path must read it (see the module doc)."""
    split = split_events(data, path)
    if split is None:
        return None
    doc, pieces = split
    rank = index
    if doc.distributedInfo is not None and doc.distributedInfo.rank is not None:
        rank = kineto._as_int(doc.distributedInfo.rank, index, "distributedInfo rank")
    pools = Pools()
    mine, theirs = pieces, []
    if len(pieces) > 1 and len(data) >= PARALLEL_MIN_BYTES and can_fork() and not _gpu_runtime_started():
        begin, total = pieces[0][0], pieces[-1][1] - pieces[0][0]
        starts = [start - begin for start, _ in pieces]
        cut = min(max(1, int(np.searchsorted(starts, total * (1 - WORKER_SHARE)))), len(pieces) - 1)
        mine, theirs = pieces[:cut], pieces[cut:]
    # The cyclic GC would rescan the millions of short-lived objects of the decode (the kernels' grid and
    # block lists are tracked) again and again: off while decoding, analyze on the 425 MB trace took a median
    # 7.8 s of CPU against 8.7 s (three runs each, before the other tuning here).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if theirs:
            with ForkedCall(_worker_job(data, theirs)) as worker:
                parts, n_events, other = _decode_pieces(data, mine, pools)
                try:
                    cols, their_values, their_events, their_other = worker.result()
                except WorkerFailed as exc:
                    if str(exc).startswith(_Unusual.__name__):
                        raise _Unusual from None
                    # Killed or out of memory: decode its pieces here.
                    more, their_events, their_other = _decode_pieces(data, theirs, pools)
                    parts.extend(more)
                else:
                    parts.append(_translate(cols, their_values, pools))
                n_events += their_events
                other += their_other
        else:
            parts, n_events, other = _decode_pieces(data, mine, pools)
    except _Unusual:
        return None
    finally:
        if gc_was_enabled:
            gc.enable()
    cols = _join(parts)
    values = {
        "names": _object_array(escape_names(pools.names.values)),  # control characters escaped: gpuadvisor.textsafe
        "tids": _object_array(pools.tids.values),
        "raws": _object_array([msgspec.Raw(b) for b in pools.raws.values]),
    }
    tables = {table: _table(table, cols[table], rank, values) for table in TABLE_CATEGORIES}
    tables["steps"] = kineto._steps(tables, rank)
    del tables["windows"]
    return doc, rank, tables, n_events, other


def _translate(cols: dict[str, dict[str, np.ndarray]], their_values: dict[str, list], pools: Pools):
    """The worker's columns with its codes turned into codes of this process's pools."""
    remaps = {
        "names": pools.names.codes(their_values["names"]),
        "tids": pools.tids.codes(their_values["tids"]),
        "raws": pools.raws.codes(their_values["raws"]),
    }
    for table in cols.values():
        for column, pool in _POOL_OF_COLUMN.items():
            if column in table:
                table[column] = remaps[pool][table[column]]
    return cols


def _gpu_runtime_started() -> bool:
    """Whether this process runs CUDA or torch.distributed (profile, apply, a rank): their threads may hold
    locks at a fork, which the child would inherit held, so such a process decodes alone."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if torch.cuda.is_initialized():
            return True
        distributed = getattr(torch, "distributed", None)
        return bool(distributed is not None and distributed.is_available() and distributed.is_initialized())
    except Exception:  # an odd torch build: be safe
        return True
