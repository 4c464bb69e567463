"""GPU memory of a run: caching-allocator statistics, a memory-snapshot summary, and KV-cache capacity.

Most of this module is pure functions over what torch hands back (``torch.cuda.memory_stats()``,
``torch.cuda.mem_get_info()``, ``torch.cuda.memory._snapshot()``) and over plain numbers, so that the tests
run on a CPU with recorded inputs. The functions that talk to torch (:func:`read_allocator_stats`,
:func:`reset_peaks`, :func:`start_history`, :func:`take_snapshot`, :func:`category_ranges`,
:func:`cache_tensors`) import it inside.

The report's ``memory`` section (report/html.py and the other renderers read it) is::

    {"allocator": allocator_summary(...),    # every profile run
     "snapshot": snapshot_summary(...),      # with --memory
     "kv_cache": kv_cache_capacity(...),     # decode workloads with a KV cache
     "notes": [str]}

Sizes are bytes, shares are % (0-100).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuadvisor.report.formatting import as_number

# Entries kept by the allocator's history ring buffer under `profile --memory`. torch documents "several KB"
# per entry (its Python and C++ frames): 20,000 entries stay within ~100 MB of host memory however long the
# step runs, and cover a few steps of a 436-kernel decode step (a few hundred allocations a step). Older
# entries are overwritten, so a long run is summarised from its last entries, never loaded whole.
HISTORY_MAX_ENTRIES = 20_000
# Allocation sites listed (largest first) and the frames searched per block for the user's line.
TOP_SITES = 10
# KV-cache pages of vLLM's PagedAttention default block size: 16 tokens.
PAGE_TOKENS = 16

CATEGORY_ACTIVATIONS = "activations and temporaries"
CATEGORY_BEFORE = "allocated before recording (not matched)"

# Frames from these files are library code: the allocation site is the first frame outside them.
_LIBRARY_FRAME = re.compile(
    r"(site-packages|dist-packages|/lib/python\d|<frozen|<built-in|^\?\?$|\.(cpp|cc|cu|h|hpp)$)|"
    r"(^|/)(torch|triton|transformers|gpuadvisor)/"
)


def _int(value: Any) -> int | None:
    number = as_number(value)
    return None if number is None else int(number)


# --- allocator statistics ---------------------------------------------------------------------------


def read_allocator_stats(device: Any = None) -> dict[str, Any]:
    """The raw figures :func:`allocator_summary` reads: ``{"stats": torch.cuda.memory_stats(device),
    "free_bytes", "total_bytes"}`` (``torch.cuda.mem_get_info``). Needs CUDA."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return {"stats": dict(torch.cuda.memory_stats(device)), "free_bytes": int(free), "total_bytes": int(total)}


def reset_peaks(device: Any = None) -> None:
    """Start the peaks afresh (``torch.cuda.reset_peak_memory_stats``): call it before the timed run, so the
    peaks are the run's and not those of loading the model or warming up."""
    import torch

    torch.cuda.reset_peak_memory_stats(device)


def allocator_summary(
    stats: Mapping[str, Any], device_total_bytes: Any = None, device_free_bytes: Any = None
) -> dict[str, Any]:
    """The caching allocator's figures for one run, from ``torch.cuda.memory_stats()`` (keys such as
    ``allocated_bytes.all.peak``; missing keys give None). Returns:

    allocated_peak_bytes, reserved_peak_bytes, active_peak_bytes, requested_peak_bytes (what the tensors asked
    for, before rounding), inactive_split_peak_bytes (cached blocks split off a larger one and unused: the
    allocator's own fragmentation figure), reserved_minus_allocated_peak_bytes (reserved peak − allocated peak:
    what the process held beyond the most its tensors ever needed; at the allocated peak the unused reserve was
    at most this, and exactly this when reserved had stopped growing by then), fragmentation_pct (that, as % of
    the reserved peak), num_alloc_retries (allocations that failed, flushed the cache and retried: each is a
    cudaFree + cudaMalloc round trip and a device sync), num_ooms, num_device_alloc, num_device_free (cudaMalloc
    and cudaFree calls), device_total_bytes, device_free_bytes (at the read), peak_pct_of_device (reserved
    peak, % of the device), headroom_bytes (device − reserved peak: what a larger batch, a longer sequence or a
    KV cache could still use), notes.
    """
    allocated = _int(stats.get("allocated_bytes.all.peak"))
    reserved = _int(stats.get("reserved_bytes.all.peak"))
    total = _int(device_total_bytes)
    out: dict[str, Any] = {
        "allocated_peak_bytes": allocated,
        "reserved_peak_bytes": reserved,
        "active_peak_bytes": _int(stats.get("active_bytes.all.peak")),
        "requested_peak_bytes": _int(stats.get("requested_bytes.all.peak")),
        "inactive_split_peak_bytes": _int(stats.get("inactive_split_bytes.all.peak")),
        "reserved_minus_allocated_peak_bytes": None,
        "fragmentation_pct": None,
        "num_alloc_retries": _int(stats.get("num_alloc_retries")),
        "num_ooms": _int(stats.get("num_ooms")),
        "num_device_alloc": _int(stats.get("num_device_alloc")),
        "num_device_free": _int(stats.get("num_device_free")),
        "device_total_bytes": total,
        "device_free_bytes": _int(device_free_bytes),
        "peak_pct_of_device": None,
        "headroom_bytes": None,
        "notes": [],
    }
    if allocated is not None and reserved is not None:
        slack = max(reserved - allocated, 0)
        out["reserved_minus_allocated_peak_bytes"] = slack
        out["fragmentation_pct"] = round(100.0 * slack / reserved, 2) if reserved > 0 else 0.0
    if reserved is not None and total:
        out["peak_pct_of_device"] = round(100.0 * reserved / total, 2)
        out["headroom_bytes"] = max(total - reserved, 0)
    if out["num_alloc_retries"]:
        out["notes"].append(
            f"{out['num_alloc_retries']} allocation(s) failed, flushed the allocator's cache and retried: each "
            "frees cached segments and synchronizes the device"
        )
    if out["num_ooms"]:
        out["notes"].append(f"{out['num_ooms']} out-of-memory error(s) were raised during the run")
    return out


# --- memory snapshot ----------------------------------------------------------------------------------------


def start_history(max_entries: int = HISTORY_MAX_ENTRIES, device: Any = None) -> None:
    """Record every allocation with its Python stack (``torch.cuda.memory._record_memory_history``), keeping
    at most ``max_entries`` events (a ring buffer: a long run keeps its last ones)."""
    import torch

    torch.cuda.memory._record_memory_history(
        "all", context="all", stacks="python", max_entries=max_entries, device=device
    )


def take_snapshot(device: Any = None, stop: bool = True) -> dict[str, Any]:
    """The allocator's state and history (``torch.cuda.memory._snapshot``); stops recording unless ``stop``
    is False."""
    import torch

    snapshot = torch.cuda.memory._snapshot(device)
    if stop:
        torch.cuda.memory._record_memory_history(None, device=device)
    return snapshot


def _site(frames: Any) -> str | None:
    """The first frame outside library code, as "file:line (function)"; None without frames."""
    if not isinstance(frames, list) or not frames:
        return None
    for frame in frames:
        if not isinstance(frame, Mapping):
            continue
        filename = str(frame.get("filename") or "")
        if filename and not _LIBRARY_FRAME.search(filename):
            return f"{filename}:{frame.get('line')} ({frame.get('name')})"
    return None


class _Ranges:
    """Tensor storage (pointer, bytes) by category, for finding which category a block holds."""

    def __init__(self, categories: Mapping[str, Iterable[tuple[int, int]]] | None) -> None:
        pairs = []
        for name, ranges in (categories or {}).items():
            for ptr, nbytes in ranges:
                if ptr:
                    pairs.append((int(ptr), int(nbytes or 0), name))
        pairs.sort()
        self.starts = [p[0] for p in pairs]
        self.pairs = pairs

    def category(self, addr: int, size: int) -> str | None:
        """The category of the first tensor whose storage starts inside [addr, addr + size)."""
        i = bisect.bisect_left(self.starts, addr)
        if i < len(self.starts) and self.starts[i] < addr + size:
            return self.pairs[i][2]
        return None


def snapshot_summary(
    snapshot: Mapping[str, Any],
    categories: Mapping[str, Iterable[tuple[int, int]]] | None = None,
    *,
    device_index: int = 0,
    top_sites: int = TOP_SITES,
    max_events: int = HISTORY_MAX_ENTRIES,
) -> dict[str, Any]:
    """What a memory snapshot says, small enough for a report.

    ``snapshot``: ``torch.cuda.memory._snapshot()`` ({segments, device_traces}). ``categories``: {name:
    [(data_ptr, nbytes)]} of the tensors whose category is known (:func:`category_ranges`: parameters,
    gradients, optimizer state, caches); a block holding one of them counts as that category, any other block
    allocated during the recorded history as activations and temporaries. Only the last ``max_events`` events
    of the history are read.

    Returns: segments (count), segments_by_type {small, large}, expandable_segments, reserved_bytes,
    allocated_bytes, free_bytes (inactive blocks inside segments), largest_free_block_bytes,
    external_fragmentation_pct (1 − largest free block / free bytes: how much of the free memory a single
    large allocation could not use), trace_events (in the history), trace_events_used, peak_bytes (the most
    allocated at once over the history, counting blocks allocated before it), bytes_by_category {name: bytes}
    and top_sites [{site "file:line (function)", bytes, count}] of the blocks live at that peak, ooms (OOM
    events in the history), notes.
    """
    ranges = _Ranges(categories)
    segments = [s for s in snapshot.get("segments") or [] if isinstance(s, Mapping)]
    if any("device" in s for s in segments):
        segments = [s for s in segments if s.get("device", device_index) == device_index]
    blocks_alive: dict[int, tuple[int, Any]] = {}
    free_sizes: list[int] = []
    by_type: dict[str, int] = {}
    reserved = allocated = 0
    expandable = 0
    for seg in segments:
        reserved += int(seg.get("total_size") or 0)
        by_type[str(seg.get("segment_type") or "unknown")] = (
            by_type.get(str(seg.get("segment_type") or "unknown"), 0) + 1
        )
        expandable += bool(seg.get("is_expandable"))
        for block in seg.get("blocks") or []:
            size = int(block.get("size") or 0)
            state = block.get("state")
            if state == "inactive":
                free_sizes.append(size)
            else:
                allocated += size if state == "active_allocated" else 0
                blocks_alive[int(block.get("address") or 0)] = (size, block.get("frames"))
    free = sum(free_sizes)
    largest_free = max(free_sizes, default=0)
    traces = snapshot.get("device_traces") or []
    events = traces[device_index] if device_index < len(traces) and isinstance(traces[device_index], list) else []
    notes = []
    used = events[-max_events:] if max_events and len(events) > max_events else events
    if len(used) < len(events):
        notes.append(f"the history had {len(events):,} events: the last {len(used):,} were read")

    # Pass 1: the running total of allocations over the history, and the blocks that were there before it.
    live: dict[int, tuple[int, Any]] = {}
    before: dict[int, tuple[int, Any]] = {}  # freed during the history, allocated before it
    running = 0
    peak_running, peak_index = 0, -1
    ooms = 0
    for i, event in enumerate(used):
        action = event.get("action")
        addr = int(event.get("addr") or 0)
        size = int(event.get("size") or 0)
        if action == "alloc":
            live[addr] = (size, event.get("frames"))
            running += size
        elif action in ("free_completed", "free"):
            if addr in live:
                running -= live.pop(addr)[0]
            else:
                before[addr] = (size, event.get("frames"))
                running -= size
        elif action == "oom":
            ooms += 1
        else:
            continue
        if running > peak_running:
            peak_running, peak_index = running, i
    # Blocks alive at the snapshot that the history never allocated were there all along.
    all_along = {a: v for a, v in blocks_alive.items() if a not in live}
    baseline = sum(v[0] for v in before.values()) + sum(v[0] for v in all_along.values())

    # Pass 2: the blocks live at the peak.
    at_peak: dict[int, tuple[int, Any, bool]] = {a: (v[0], v[1], False) for a, v in all_along.items()}
    at_peak.update({a: (v[0], v[1], False) for a, v in before.items()})
    for event in used[: peak_index + 1]:
        action = event.get("action")
        addr = int(event.get("addr") or 0)
        if action == "alloc":
            at_peak[addr] = (int(event.get("size") or 0), event.get("frames"), True)
        elif action in ("free_completed", "free"):
            at_peak.pop(addr, None)
    if not used:
        notes.append("no allocation history in the snapshot: figures are those at the snapshot")
        at_peak = {a: (v[0], v[1], False) for a, v in blocks_alive.items()}
    by_category: dict[str, int] = {}
    sites: dict[str, list[int]] = {}
    for addr, (size, frames, in_history) in at_peak.items():
        category = ranges.category(addr, size) or (CATEGORY_ACTIVATIONS if in_history else CATEGORY_BEFORE)
        by_category[category] = by_category.get(category, 0) + size
        site = _site(frames) or "unknown (no user frame recorded)"
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
    top = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top_sites]
    return {
        "segments": len(segments),
        "segments_by_type": by_type,
        "expandable_segments": expandable,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "free_bytes": free,
        "largest_free_block_bytes": largest_free,
        "external_fragmentation_pct": round(100.0 * (1 - largest_free / free), 2) if free else 0.0,
        "trace_events": len(events),
        "trace_events_used": len(used),
        "peak_bytes": baseline + peak_running if used else allocated,
        "bytes_by_category": by_category,
        "top_sites": [{"site": s, "bytes": v[0], "count": v[1]} for s, v in top],
        "ooms": ooms,
        "notes": notes,
    }


def category_ranges(
    model: Any = None, optimizer: Any = None, caches: Iterable[Any] = (), cuda_only: bool = True
) -> dict[str, list[tuple[int, int]]]:
    """(data_ptr, storage nbytes) of the tensors of each known category, for :func:`snapshot_summary`:
    parameters (and buffers that are not a cache), gradients, optimizer state, caches (``caches``' tensors,
    found by :func:`cache_tensors`, and the model's cache-named buffers). CUDA tensors only unless
    ``cuda_only`` is False."""
    import torch

    def ranges(tensors: Iterable[Any]) -> list[tuple[int, int]]:
        out, seen = [], set()
        for t in tensors:
            if isinstance(t, torch.Tensor) and (t.is_cuda or not cuda_only) and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                out.append((t.data_ptr(), t.untyped_storage().nbytes()))
        return out

    out: dict[str, list[tuple[int, int]]] = {}
    cache_list = [t for c in caches for t in cache_tensors(c)]
    if model is not None and hasattr(model, "parameters"):
        params = list(model.parameters())
        buffers = list(model.named_buffers()) if hasattr(model, "named_buffers") else []
        cache_list += [b for name, b in buffers if _CACHE_NAME.search(name)]
        out["parameters"] = ranges(params + [b for name, b in buffers if not _CACHE_NAME.search(name)])
        out["gradients"] = ranges(p.grad for p in params if p.grad is not None)
    if optimizer is not None and hasattr(optimizer, "state"):
        state = [v for s in optimizer.state.values() for v in (s.values() if isinstance(s, dict) else ())]
        out["optimizer state"] = ranges(state)
    if cache_list:
        out["caches"] = ranges(cache_list)
    return out


_CACHE_NAME = re.compile(
    r"(^|[._])(k|v|key|value)s?_cache$|(^|[._])(key|value)_cache[._]|kv_cache|(^|[._])cache($|[._])"
)


def cache_tensors(obj: Any, max_depth: int = 4) -> list[Any]:
    """The tensors inside a KV-cache object (a transformers Cache, a list of (k, v) pairs, a module with
    k_cache/v_cache buffers...): every tensor reached through attributes, lists, tuples and dicts up to
    ``max_depth`` levels, each once."""
    import torch

    found: list[Any] = []
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if id(value) in seen or depth > max_depth:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, torch.nn.Module):
            for name, buffer in value.named_buffers():
                if _CACHE_NAME.search(name):
                    walk(buffer, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, depth + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                walk(item, depth + 1)

    walk(obj, 0)
    return found


# --- KV-cache capacity --------------------------------------------------------------------------------------


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Cache bytes one token takes in one sequence: a key and a value vector per layer and KV head."""
    return 2 * int(num_layers) * int(num_kv_heads) * int(head_dim) * int(itemsize)


def kv_dims_from_config(config: Any) -> tuple[int, int, int] | None:
    """(layers, KV heads, head_dim) from a model config (a transformers config or a dict with the same names:
    num_hidden_layers / n_layer / n_layers, num_key_value_heads (GQA) else num_attention_heads / n_head /
    n_heads, head_dim else hidden_size / n_embd / d_model over the heads); None when one is missing."""

    def get(*names: str) -> int | None:
        for name in names:
            value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
            if _int(value):
                return _int(value)
        return None

    layers = get("num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = get("num_attention_heads", "n_head", "n_heads")
    kv_heads = get("num_key_value_heads", "n_kv_heads", "num_kv_heads") or heads
    head_dim = get("head_dim")
    if head_dim is None:
        hidden = get("hidden_size", "n_embd", "d_model", "dim")
        head_dim = hidden // heads if hidden and heads else None
    if not (layers and kv_heads and head_dim):
        return None
    return layers, kv_heads, head_dim


def kv_cache_from_tensors(tensors: Iterable[tuple[Sequence[int], int]], token_axis: int = -2) -> dict[str, Any] | None:
    """Bytes per token from the cache tensors found: ``tensors`` as (shape, itemsize) pairs, laid out
    (batch, heads, tokens, head_dim) as transformers and examples/llama_decode.py keep them (``token_axis``
    says where the tokens are). Returns {bytes_per_token (per sequence), cache_bytes, tokens (slots per
    sequence), batch, itemsize (the largest)}; None without a 3-d or larger tensor."""
    per_token = 0.0
    cache_bytes = 0
    tokens = batch = None
    itemsize = 0
    for shape, size in tensors:
        shape = [int(d) for d in shape]
        if len(shape) < 3 or not all(shape):
            continue
        numel = math.prod(shape)
        cache_bytes += numel * int(size)
        per_token += numel * int(size) / (shape[0] * shape[token_axis])
        tokens = shape[token_axis] if tokens is None else max(tokens, shape[token_axis])
        batch = shape[0] if batch is None else max(batch, shape[0])
        itemsize = max(itemsize, int(size))
    if not cache_bytes:
        return None
    return {
        "bytes_per_token": int(round(per_token)),
        "cache_bytes": cache_bytes,
        "tokens": tokens,
        "batch": batch,
        "itemsize": itemsize,
    }


def kv_cache_capacity(
    bytes_per_token: int,
    free_bytes: int,
    sequence_tokens: int,
    *,
    itemsize: int = 2,
    mean_tokens: float | None = None,
    page_tokens: int = PAGE_TOKENS,
) -> dict[str, Any]:
    """How many tokens and sequences of ``sequence_tokens`` (the longest a sequence may grow) fit in
    ``free_bytes`` of cache at ``bytes_per_token``, and what an FP8 cache or paged allocation would give.

    A contiguous cache reserves ``sequence_tokens`` slots per sequence whatever it uses. Paged allocation
    (PagedAttention: fixed pages of ``page_tokens`` tokens handed out as a sequence grows) holds each sequence's
    actual length rounded up to a page: at ``mean_tokens`` tokens per sequence it fits
    free / (ceil(mean / page) x page x bytes_per_token) sequences; without ``mean_tokens`` it is not estimated.
    An FP8 cache stores 1 byte per element instead of ``itemsize`` (bf16/fp16: half the bytes, twice the
    tokens).

    Returns: bytes_per_token, bytes_per_sequence, free_bytes, sequence_tokens, tokens_that_fit,
    sequences_that_fit, fp8_bytes_per_token, fp8_tokens_that_fit, fp8_sequences_that_fit (None when the cache
    is already 1 byte an element), mean_tokens, page_tokens, paged_sequences_that_fit,
    paged_fp8_sequences_that_fit, notes.
    """
    bpt = int(bytes_per_token)
    free = max(int(free_bytes), 0)
    seq = max(int(sequence_tokens), 1)
    out: dict[str, Any] = {
        "bytes_per_token": bpt,
        "bytes_per_sequence": bpt * seq,
        "free_bytes": free,
        "sequence_tokens": seq,
        "tokens_that_fit": free // bpt if bpt else None,
        "sequences_that_fit": free // (bpt * seq) if bpt else None,
        "fp8_bytes_per_token": None,
        "fp8_tokens_that_fit": None,
        "fp8_sequences_that_fit": None,
        "mean_tokens": mean_tokens,
        "page_tokens": page_tokens,
        "paged_sequences_that_fit": None,
        "paged_fp8_sequences_that_fit": None,
        "notes": [],
    }
    fp8_bpt = bpt // itemsize if itemsize > 1 and bpt else None
    if fp8_bpt:
        out["fp8_bytes_per_token"] = fp8_bpt
        out["fp8_tokens_that_fit"] = free // fp8_bpt
        out["fp8_sequences_that_fit"] = free // (fp8_bpt * seq)
    else:
        out["notes"].append("the cache already stores 1 byte an element: FP8 would not shrink it")
    if mean_tokens and bpt:
        pages = math.ceil(float(mean_tokens) / page_tokens) * page_tokens
        out["paged_sequences_that_fit"] = free // (pages * bpt)
        if fp8_bpt:
            out["paged_fp8_sequences_that_fit"] = free // (pages * fp8_bpt)
    return out
