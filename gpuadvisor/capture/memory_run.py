"""The ``memory`` section of a ``profile`` report: what :mod:`gpuadvisor.capture.memory`'s pure functions say
about one run, gathered from the live workload.

- ``allocator``: the caching allocator's figures over the timed steps (:func:`allocator_figures`, CUDA only);
- ``snapshot`` (``profile --memory``): a memory snapshot over :data:`SNAPSHOT_STEPS` extra untimed steps, run
  after the timed ones so that recording every allocation's stack cannot slow them (:func:`snapshot_steps`);
- ``kv_cache``: for a decode workload (``KIND = "decode"``, a cache object in the inputs, or KV-cache buffers in
  the model), the cache's bytes per token and how many tokens and sequences fit (:func:`kv_cache_section`);
- ``notes``.

Torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from gpuadvisor.progress import ProgressDisplay
from gpuadvisor.steps import StepRunner, synchronize
from gpuadvisor.workload import Workload

# Untimed steps recorded by `profile --memory` (the allocation history keeps at most
# memory.HISTORY_MAX_ENTRIES events, so a step with many allocations keeps its last ones).
SNAPSHOT_STEPS = 3
SKIPPED_NO_CUDA = "--memory skipped: no CUDA GPU"


def allocator_figures(cuda: bool) -> dict[str, Any] | None:
    """:func:`~gpuadvisor.capture.memory.allocator_summary` of the allocator's statistics now (call it right after
    the timed steps, whose peaks were reset before them); None without CUDA."""
    if not cuda:
        return None
    from gpuadvisor.capture import memory

    raw = memory.read_allocator_stats()
    return memory.allocator_summary(raw["stats"], raw["total_bytes"], raw["free_bytes"])


def _cache_objects(workload: Workload) -> list[Any]:
    """The inputs that are KV caches by their type's name (a transformers Cache, a user's KVCache...)."""
    import torch

    return [
        x
        for x in workload.inputs
        if not isinstance(x, torch.Tensor) and not isinstance(x, type) and "cache" in type(x).__name__.lower()
    ]


def _cache_tensors(workload: Workload, cuda_only: bool = True) -> list[Any]:
    """The (CUDA) tensors of the cache objects in the inputs and of the model's KV-cache buffers, 3-d or more,
    each once."""
    import torch

    from gpuadvisor.capture import memory

    found = [t for obj in _cache_objects(workload) for t in memory.cache_tensors(obj)]
    if isinstance(workload.model, torch.nn.Module):
        found += memory.cache_tensors(workload.model)
    seen: set[int] = set()
    out = []
    for t in found:
        if isinstance(t, torch.Tensor) and (t.is_cuda or not cuda_only) and t.dim() >= 3 and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out


def snapshot_steps(
    workload: Workload, run_step: StepRunner, label: str, display: ProgressDisplay, steps: int = SNAPSHOT_STEPS
) -> dict[str, Any]:
    """``profile --memory`` (CUDA): record the allocation history over ``steps`` untimed steps, take the snapshot
    and summarise it (:func:`~gpuadvisor.capture.memory.snapshot_summary`: bytes by category, the largest
    allocation sites at the peak, segments and fragmentation). Recording stops however the steps end."""
    import torch

    from gpuadvisor.capture import memory

    display.phase("memory snapshot", steps)
    memory.start_history()
    try:
        for i in range(steps):
            run_step("memory snapshot", i, steps)
            display.advance()
        synchronize(True, label, "memory snapshot")
        snapshot = memory.take_snapshot()
    finally:
        torch.cuda.memory._record_memory_history(None)  # stopped already after a snapshot; harmless then
    optimizers = [x for x in workload.inputs if isinstance(x, torch.optim.Optimizer)]
    optimizer = optimizers[0] if optimizers else getattr(workload.model, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = None
    categories = memory.category_ranges(workload.model, optimizer, caches=_cache_objects(workload))
    summary = memory.snapshot_summary(snapshot, categories, device_index=torch.cuda.current_device())
    summary["steps"] = steps
    del snapshot
    return summary


def is_decode(workload: Workload) -> bool:
    """``KIND = "decode"`` in the file, a cache object among the inputs, or KV-cache buffers in the model."""
    import torch

    if (workload.kind or "").strip().lower() == "decode" or _cache_objects(workload):
        return True
    if isinstance(workload.model, torch.nn.Module):
        from gpuadvisor.capture import memory

        return any(t.dim() >= 3 for t in memory.cache_tensors(workload.model) if isinstance(t, torch.Tensor))
    return False


def kv_cache_section(
    workload: Workload, allocator: dict[str, Any] | None, *, cuda_only: bool = True
) -> tuple[dict[str, Any] | None, list[str]]:
    """For a decode workload on CUDA: the cache found (:func:`~gpuadvisor.capture.memory.kv_cache_from_tensors`)
    and its capacity (:func:`~gpuadvisor.capture.memory.kv_cache_capacity`) in the memory the cache could use: the
    device's memory less the run's peak reserved, plus the cache's own bytes. Returns (section or None, notes).
    ``cuda_only=False`` counts CPU tensors too (tests)."""
    if allocator is None or not is_decode(workload):
        return None, []
    from gpuadvisor.capture import memory

    tensors = _cache_tensors(workload, cuda_only)
    found = memory.kv_cache_from_tensors((tuple(t.shape), t.element_size()) for t in tensors)
    if found is None:
        return None, [
            "a decode workload, but no KV-cache tensor (3-d or more, on the GPU) was found in the inputs' cache "
            "objects or the model's cache buffers: no KV-cache capacity"
        ]
    headroom = allocator.get("headroom_bytes")
    if headroom is None:
        return None, ["the device's total memory is unknown: no KV-cache capacity"]
    free = int(headroom) + int(found["cache_bytes"])
    capacity = memory.kv_cache_capacity(
        found["bytes_per_token"], free, found["tokens"] or 1, itemsize=found["itemsize"] or 2
    )
    capacity["notes"] = [
        f"{len(tensors)} cache tensor(s), {found['cache_bytes']:,} bytes for batch {found['batch']} x "
        f"{found['tokens']} token slots; free memory for the cache is the device's memory less the run's peak "
        "reserved, plus the cache's own bytes",
        *capacity["notes"],
    ]
    if capacity.get("paged_sequences_that_fit") is None:
        capacity["notes"].append("paged allocation is not estimated: the run does not say how long sequences grow")
    section = {
        **capacity,
        "cache_bytes": found["cache_bytes"],
        "cache_tensors": len(tensors),
        "batch": found["batch"],
        "itemsize": found["itemsize"],
    }
    return section, []


def memory_section(
    workload: Workload,
    allocator: dict[str, Any] | None,
    snapshot: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """The report's ``memory`` section, or None without CUDA (nothing to say: no allocator)."""
    if allocator is None:
        return None
    section: dict[str, Any] = {"allocator": allocator}
    if snapshot is not None:
        section["snapshot"] = snapshot
    kv, notes = kv_cache_section(workload, allocator)
    if kv is not None:
        section["kv_cache"] = kv
    section["notes"] = notes
    return section
