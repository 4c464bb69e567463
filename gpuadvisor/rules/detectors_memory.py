"""Detectors of the memory-capacity rules (GA6xx). They read what ``gpuadvisor profile`` measured of PyTorch's
caching allocator on a CUDA GPU, not the trace: the report's ``memory`` section (the summaries of
:mod:`gpuadvisor.capture.memory`, gathered by :mod:`gpuadvisor.capture.memory_run`) and the allocator settings in
its ``env`` (:func:`gpuadvisor.environment.allocator_config`). A detector reads them as ``a.memory`` and ``a.env``;
a trace's analysis (``analyze``) has neither, and the rules are skipped with the reason, as the GA7xx rules are on
a single rank.

The memory section is complete only once the run is over, after the trace's analysis has run the other rules, so
:func:`run_memory_rules` runs these over a finished report; whoever adds the section calls it (``profile``: right
after ``report["memory"] = section``). It replaces their skipped entries with what they find and re-ranks the
findings.

Their savings are memory, not time: 0 µs per step and no % of the step, as GA501's (whose figure only a measurement
gives), which report.html shows as "saving not estimated"; the bytes are in the evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuadvisor.capture import memory as memory_figures
from gpuadvisor.report.formatting import as_number, format_bytes, format_count
from gpuadvisor.rules.engine import DETECTORS, Finding, Rule, SkipRule, make_finding

NO_ALLOCATOR = (
    "not applicable: no allocator figures (`gpuadvisor profile` records them on a CUDA GPU; a trace has none)"
)
# The settings that say expandable segments are on, and the key of the other allocator backend.
_EXPANDABLE = "expandable_segments"
_ASYNC_BACKEND = "cudamallocasync"
# Where the allocator's configuration is recorded in a report's env (environment.allocator_config), most
# authoritative first: what torch ran with, then the environment variables as set.
_SETTING_SOURCES = (
    ("allocator_settings", "the allocator's settings"),
    ("pytorch_cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF"),
    ("pytorch_alloc_conf", "PYTORCH_ALLOC_CONF"),
)
_ELEMENT_WORDS = {1: "1 byte an element: FP8/int8", 2: "2 bytes an element: bf16/fp16", 4: "4 bytes an element: fp32"}


@dataclass
class MemoryFacts:
    """What the GA6xx detectors read, taken from a finished report: its ``memory`` section and its ``env``."""

    memory: dict[str, Any] | None
    env: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> MemoryFacts:
        memory = report.get("memory")
        env = report.get("env")
        return cls(
            memory=dict(memory) if isinstance(memory, Mapping) else None,
            env=dict(env) if isinstance(env, Mapping) else {},
        )


# --- what the report holds -------------------------------------------------------------------------------


def _count(mapping: Mapping[str, Any], key: str) -> int | None:
    value = as_number(mapping.get(key))
    return None if value is None else int(value)


def allocator_figures(a: Any) -> dict[str, Any]:
    """The allocator's figures of the run (``memory.allocator``); SkipRule without them or without its peaks."""
    memory = getattr(a, "memory", None)
    allocator = memory.get("allocator") if isinstance(memory, Mapping) else None
    if not isinstance(allocator, Mapping):
        raise SkipRule(NO_ALLOCATOR)
    if _count(allocator, "reserved_peak_bytes") is None or _count(allocator, "allocated_peak_bytes") is None:
        raise SkipRule("the allocator's statistics have no allocated or reserved peak")
    return dict(allocator)


def parse_allocator_settings(settings: str) -> dict[str, str]:
    """``"expandable_segments:True,max_split_size_mb:128"`` as {option: value}, options lower-case."""
    out = {}
    for part in str(settings).split(","):
        key, _, value = part.partition(":")
        if key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def expandable_segments(a: Any) -> tuple[bool | None, str]:
    """Whether the run's allocator used expandable segments, and how we know: True when the ``profile --memory``
    snapshot counted expandable segments or any setting recorded in env turns them on (the environment variable
    too: torch reads it when CUDA starts, and only a later ``_set_allocator_settings`` in the code could turn them
    off again); False when settings are recorded and none does; None when the report records none (a report
    written before env recorded them)."""
    memory = getattr(a, "memory", None) or {}
    snapshot = memory.get("snapshot") if isinstance(memory, Mapping) else None
    if isinstance(snapshot, Mapping) and (_count(snapshot, "expandable_segments") or 0) > 0:
        return True, f"the memory snapshot has {_count(snapshot, 'expandable_segments')} expandable segment(s)"
    env = getattr(a, "env", None) or {}
    recorded = [(label, str(env[key])) for key, label in _SETTING_SOURCES if env.get(key) is not None]
    for label, settings in recorded:
        if parse_allocator_settings(settings).get(_EXPANDABLE, "").lower() == "true":
            return True, f"{label}: {settings!r}"
    if recorded:
        label, settings = recorded[0]
        return False, f"{label}: {settings!r}" if settings else f"{label}: the defaults"
    return None, "the report records no allocator settings"


def _async_backend(a: Any) -> bool:
    env = getattr(a, "env", None) or {}
    for key, _ in _SETTING_SOURCES:
        if env.get(key):
            return parse_allocator_settings(env[key]).get("backend", "").lower() == _ASYNC_BACKEND
    return False


def _pct(part: float, whole: float | None) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


# --- detectors ---------------------------------------------------------------------------------------------


def allocator_fragmentation(a: Any, rule: Rule) -> Finding | None:
    """GA601: reserved far above allocated at the peaks, or allocation retries; not when expandable segments
    are already on."""
    alloc = allocator_figures(a)
    if _async_backend(a):
        raise SkipRule(
            "the cudaMallocAsync backend manages the memory: expandable segments are a setting of the native allocator"
        )
    allocated = _count(alloc, "allocated_peak_bytes") or 0
    reserved = _count(alloc, "reserved_peak_bytes") or 0
    slack = max(reserved - allocated, 0)
    share = 100.0 * slack / reserved if reserved else 0.0
    retries = _count(alloc, "num_alloc_retries") or 0
    on, how = expandable_segments(a)
    if on:
        return None
    large = share >= rule.threshold("min_fragmentation_pct") and slack >= rule.threshold("min_slack_bytes")
    retried = retries >= rule.threshold("min_alloc_retries")
    if not (large or retried):
        return None
    message = (
        f"The caching allocator reserved {format_bytes(reserved)} at its peak while the tensors needed at most "
        f"{format_bytes(allocated)} at once: {format_bytes(slack)} ({share:.0f}% of the reserve) held cached blocks "
        "beyond the most the tensors ever used, freed blocks that later requests of other sizes could not reuse."
    )
    if retries:
        message += (
            f" {format_count(retries)} allocation(s) failed, freed the allocator's whole cache and retried, a device "
            "synchronisation each."
        )
    settings = "are off" if on is False else "are not recorded as on"
    message += (
        f" Expandable segments {settings} ({how}). With them, freed blocks merge and larger requests reuse them: up "
        f"to {format_bytes(slack)} of device memory back (a memory saving; the step time is not estimated to change)."
    )
    evidence = {
        "allocated_peak_bytes": allocated,
        "reserved_peak_bytes": reserved,
        "reserved_minus_allocated_peak_bytes": slack,
        "fragmentation_pct": round(share, 2),
        "inactive_split_peak_bytes": _count(alloc, "inactive_split_peak_bytes"),
        "num_alloc_retries": retries,
        "num_device_alloc": _count(alloc, "num_device_alloc"),
        "expandable_segments": "off" if on is False else "unknown",
        "allocator_settings": how,
        "saving": f"memory, not time: up to {format_bytes(slack)} of reserved memory back to the device",
    }
    return make_finding(rule, None, message, evidence, 0.0, "high" if retried else None)


def memory_headroom(a: Any, rule: Rule) -> Finding | None:
    """GA603: the reserved peak above min_peak_pct_of_device of the device's memory."""
    alloc = allocator_figures(a)
    total = _count(alloc, "device_total_bytes")
    if not total:
        raise SkipRule("the device's total memory is unknown")
    reserved = _count(alloc, "reserved_peak_bytes") or 0
    allocated = _count(alloc, "allocated_peak_bytes") or 0
    peak_pct = 100.0 * reserved / total
    if peak_pct < rule.threshold("min_peak_pct_of_device"):
        return None
    headroom = max(total - reserved, 0)
    slack = max(reserved - allocated, 0)
    retries = _count(alloc, "num_alloc_retries") or 0
    ooms = _count(alloc, "num_ooms") or 0
    message = (
        f"The run's reserved peak is {format_bytes(reserved)}, {peak_pct:.1f}% of the device's "
        f"{format_bytes(total)}: {format_bytes(headroom)} left for a longer input, a larger batch and what the "
        f"reserve does not count (the CUDA context, other processes). The tensors' own peak was "
        f"{format_bytes(allocated)} ({100.0 * allocated / total:.1f}%); the other {format_bytes(slack)} of the reserve "
        "were cached blocks (GA601 says whether expandable segments would get them back)."
    )
    if retries or ooms:
        message += (
            f" The run is at the limit already: {format_count(retries)} allocation retr(ies) (the allocator freed its "
            f"cache and synchronised the device) and {format_count(ooms)} out-of-memory error(s)."
        )
    evidence = {
        "reserved_peak_bytes": reserved,
        "allocated_peak_bytes": allocated,
        "device_total_bytes": total,
        "headroom_bytes": headroom,
        "reserved_peak_pct_of_device": round(peak_pct, 2),
        "allocated_peak_pct_of_device": _pct(allocated, total),
        "device_free_bytes": _count(alloc, "device_free_bytes"),
        "reserved_minus_allocated_peak_bytes": slack,
        "num_alloc_retries": retries,
        "num_ooms": ooms,
        "saving": "memory, not time: the headroom a smaller peak would leave",
    }
    return make_finding(rule, None, message, evidence, 0.0, "high" if retries or ooms else None)


def kv_cache_capacity(a: Any, rule: Rule) -> Finding:
    """GA602: the KV cache's bytes per token and how many more tokens and sequences fit in the free memory, at
    this dtype, in FP8 and paged."""
    alloc = allocator_figures(a)
    memory = getattr(a, "memory", None) or {}
    kv = memory.get("kv_cache")
    if not isinstance(kv, Mapping) or not _count(kv, "bytes_per_token"):
        notes = [n for n in memory.get("notes") or [] if isinstance(n, str) and "cache" in n.lower()]
        raise SkipRule(
            notes[0]
            if notes
            else 'no KV cache found: not a decode workload (KIND = "decode", a cache object among the inputs, or '
            "KV-cache buffers in the model)"
        )
    total = _count(alloc, "device_total_bytes")
    if not total:
        raise SkipRule("the device's total memory is unknown")
    bytes_per_token = _count(kv, "bytes_per_token") or 0
    slots = max(_count(kv, "sequence_tokens") or 1, 1)
    batch = max(_count(kv, "batch") or 1, 1)
    itemsize = _count(kv, "itemsize") or 2
    cache_bytes = _count(kv, "cache_bytes") or bytes_per_token * slots * batch
    reserved = _count(alloc, "reserved_peak_bytes") or 0
    device_free = _count(alloc, "device_free_bytes")
    # What the cache could still take: the device less the run's reserved peak, or less, what the driver said was
    # free (the context, other processes), whichever is smaller; less the safety margin.
    available = max(total - reserved, 0) if device_free is None else min(max(total - reserved, 0), device_free)
    margin = int(total * rule.threshold("safety_margin_pct_of_device") / 100.0)
    free_for_cache = max(available - margin, 0)
    page_tokens = int(rule.threshold("page_tokens"))
    more = memory_figures.kv_cache_capacity(bytes_per_token, free_for_cache, slots, itemsize=itemsize)
    # The whole cache's room: the free memory plus the cache's own bytes (a new cache replaces the old one).
    pool = free_for_cache + cache_bytes
    mean_tokens = as_number(kv.get("mean_tokens"))
    whole = memory_figures.kv_cache_capacity(
        bytes_per_token, pool, slots, itemsize=itemsize, mean_tokens=mean_tokens, page_tokens=page_tokens
    )
    paged_tokens = pool // (page_tokens * bytes_per_token) * page_tokens
    fp8_bytes = whole["fp8_bytes_per_token"]
    fp8_paged_tokens = pool // (page_tokens * fp8_bytes) * page_tokens if fp8_bytes else None
    element = _ELEMENT_WORDS.get(itemsize, f"{itemsize} bytes an element")
    message = (
        f"Each token of a sequence takes {format_bytes(bytes_per_token)} of KV cache (keys and values of every layer "
        f"and KV head, {element}), {format_bytes(bytes_per_token * slots)} per sequence of {format_count(slots)} "
        f"slots; the cache holds {format_count(batch)} x {format_count(slots)} slots ({format_bytes(cache_bytes)}). "
        f"Of the device's {format_bytes(total)}, the run's reserved peak took {format_bytes(reserved)}"
        + (
            f" and the driver saw {format_bytes(device_free)} free"
            if device_free is not None and device_free < total - reserved
            else ""
        )
        + f"; less a {rule.threshold('safety_margin_pct_of_device'):g}% safety margin ({format_bytes(margin)}), "
        f"{format_bytes(free_for_cache)} are free for the cache: room for "
        f"{format_count(more['tokens_that_fit'])} more tokens, {format_count(more['sequences_that_fit'])} more "
        f"sequences of {format_count(slots)} slots ({format_count(whole['sequences_that_fit'])} in all)."
    )
    if fp8_bytes:
        message += (
            f" An FP8 cache ({format_bytes(fp8_bytes)} per token) would hold "
            f"{format_count(whole['fp8_sequences_that_fit'])} such sequences in all."
        )
    message += (
        f" A paged cache ({page_tokens}-token pages, only the slots a sequence uses) holds "
        f"{format_count(paged_tokens)} tokens in all"
        + (f" ({format_count(fp8_paged_tokens)} in FP8)" if fp8_paged_tokens else "")
        + ", shared by the sequences by their actual lengths"
    )
    if whole["paged_sequences_that_fit"] is not None:
        message += (
            f": {format_count(whole['paged_sequences_that_fit'])} sequences of {mean_tokens:g} tokens on average."
        )
    else:
        message += " (the run does not say how long sequences grow)."
    evidence = {
        "bytes_per_token": bytes_per_token,
        "bytes_per_sequence": bytes_per_token * slots,
        "slots_per_sequence": slots,
        "batch": batch,
        "cache_bytes": cache_bytes,
        "element_size": itemsize,
        "device_total_bytes": total,
        "reserved_peak_bytes": reserved,
        "device_free_bytes": device_free,
        "safety_margin_bytes": margin,
        "free_for_cache_bytes": free_for_cache,
        "more_tokens": more["tokens_that_fit"],
        "more_sequences": more["sequences_that_fit"],
        "sequences_in_all": whole["sequences_that_fit"],
        "fp8_bytes_per_token": fp8_bytes,
        "fp8_sequences_in_all": whole["fp8_sequences_that_fit"],
        "page_tokens": page_tokens,
        "paged_tokens_in_all": paged_tokens,
        "fp8_paged_tokens_in_all": fp8_paged_tokens,
        "paged_sequences_in_all": whole["paged_sequences_that_fit"],
        "saving": "capacity, not time",
    }
    return make_finding(rule, None, message, evidence, 0.0, "low" if not more["sequences_that_fit"] else None)


# --- over a finished report ----------------------------------------------------------------------------------


def memory_rules(rules: list[Rule]) -> list[Rule]:
    """The rules whose detectors are in this module (the GA6xx rules and any user rule bound to them)."""
    return [r for r in rules if r.detector in DETECTORS and DETECTORS[r.detector].module == __name__]


def run_memory_rules(report: dict[str, Any], rules: list[Rule] | None = None) -> dict[str, Any]:
    """Run the memory rules over a finished report that has a ``memory`` section (``profile`` on CUDA, once the
    section is in): their findings join the others, ranked (:func:`~gpuadvisor.rules.engine.rank_key`), their
    entries in ``skipped_rules`` are replaced by what they find or why they skip, and the summary's top finding
    and combined estimate are recomputed. A report without allocator figures is returned as it is (the rules'
    skipped entries from the analysis stand). Returns ``report``, changed in place."""
    from gpuadvisor.report.json import to_plain
    from gpuadvisor.rules.engine import combined_estimate, detector_function, load_rules, rank_key

    facts = MemoryFacts.from_report(report)
    if facts.memory is None or not isinstance(facts.memory.get("allocator"), Mapping):
        return report
    chosen = memory_rules(load_rules() if rules is None else rules)
    ids = {r.id for r in chosen}
    findings = [f for f in report.get("findings") or [] if f.get("rule_id") not in ids]
    skipped = [s for s in report.get("skipped_rules") or [] if s.get("rule_id") not in ids]
    for rule in chosen:
        try:
            result = detector_function(rule.detector)(facts, rule)
        except SkipRule as exc:
            skipped.append({"rule_id": rule.id, "reason": str(exc)})
            continue
        for finding in [] if result is None else result if isinstance(result, list) else [result]:
            findings.append(to_plain(asdict(finding)))
    findings.sort(key=rank_key)
    report["findings"] = findings
    report["skipped_rules"] = sorted(skipped, key=lambda s: str(s.get("rule_id")))
    summary = report.get("summary")
    if isinstance(summary, dict):
        summary["top_finding"] = findings[0]["rule_id"] if findings else None
        summary.update(combined_estimate(findings, summary))
    return report
