"""What a report says, section by section, as rows of strings: the terminal and the Markdown renderers lay
these out, so both show the same numbers in the same words.

Every function reads the report dict (schema in :mod:`gpuadvisor.report.json`) defensively: a missing
key, a ``None`` section, an empty list or a non-finite number gives a "—" cell or no rows, never an
exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuadvisor.report.formatting import (
    MISSING,
    as_number,
    format_bytes,
    format_bytes_per_s,
    format_count,
    format_flops_per_s,
    format_intensity,
    format_pct,
    format_us,
    short_kernel_name,
)
from gpuadvisor.stats import percentile
from gpuadvisor.textsafe import escape_control

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}
# Percentiles are printed only from this many step samples up; below that p10/p90 say nothing.
MIN_SAMPLES_FOR_SPREAD = 3
# The header quotes one compute peak: the first of these the GPU has (training and inference dtypes first).
PREFERRED_PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")


@dataclass
class Column:
    name: str
    numeric: bool = False  # right-aligned, never wrapped
    wrap: bool = True  # False for short labels (ids, directions) that read badly when broken


@dataclass
class Table:
    """A table as strings; renderers style cells by column name (severity, class)."""

    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    caption: str = ""


def section(report: Any, key: str) -> dict[str, Any]:
    """``report[key]`` when it is a dict, else an empty dict."""
    value = report.get(key) if isinstance(report, dict) else None
    return value if isinstance(value, dict) else {}


def records(report: Any, key: str) -> list[dict[str, Any]]:
    """``report[key]`` as a list of dicts (non-dict entries dropped), else an empty list."""
    value = report.get(key) if isinstance(report, dict) else None
    if not isinstance(value, (list, tuple)):
        return []
    return [item for item in value if isinstance(item, dict)]


def text(value: Any, default: str = MISSING) -> str:
    """A value as one line of text, control characters shown as escapes (a report read from a file is someone
    else's text: :mod:`gpuadvisor.textsafe`); None, NaN and empty strings give ``default``."""
    if value is None:
        return default
    if isinstance(value, float) and not math.isfinite(value):
        return default
    result = escape_control(" ".join(str(value).split()))
    return result or default


# --- header -------------------------------------------------------------------------------------


def source_line(report: Any) -> str:
    """``trace.json.gz · rank 0 · 12,345 events · 4.20 MB`` (what was analysed)."""
    source = section(report, "source")
    parts = [text(source.get("path"), "unknown source")]
    ranks = source.get("ranks")
    if isinstance(ranks, (list, tuple)) and ranks:
        label = "rank" if len(ranks) == 1 else "ranks"
        shown = ", ".join(text(r) for r in list(ranks)[:8]) + (", …" if len(ranks) > 8 else "")
        parts.append(f"{label} {shown}")
    if as_number(source.get("events")) is not None:
        parts.append(f"{format_count(source.get('events'))} events")
    if as_number(source.get("size_bytes")) is not None:
        parts.append(format_bytes(source.get("size_bytes")))
    return " · ".join(parts)


def gpu_line(report: Any) -> str:
    """``NVIDIA H200 · 132 SMs · sm 9.0 · driver 550.54 · CUDA 12.4 · torch 2.5.1 · triton 3.1.0``."""
    env = section(report, "env")
    if env.get("device") == "cpu":
        cpu = text(env.get("cpu_name"), "")
        threads = f", {format_count(env.get('cpu_threads'))} threads" if as_number(env.get("cpu_threads")) else ""
        parts = [f"no GPU: ran on the CPU ({cpu}{threads})" if cpu else "no GPU: ran on the CPU"]
    else:
        parts = [text(env.get("gpu_name"), "unknown GPU")]
    if as_number(env.get("sm_count")) is not None:
        parts.append(f"{format_count(env.get('sm_count'))} SMs")
    if env.get("compute_capability"):
        parts.append(f"sm {text(env.get('compute_capability'))}")
    for key, label in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("triton", "triton")):
        if env.get(key):
            parts.append(f"{label} {text(env.get(key))}")
    return " · ".join(parts)


# env.clocks keys written by `profile` (NVML, during the timed steps), shown as "SM 1,980 MHz (1,755–1,980)".
_PROFILE_CLOCK_KEYS = {"sm_mhz_median", "mem_mhz_median", "sm_mhz_min", "sm_mhz_max"}


def clocks_line(report: Any) -> str:
    """The clocks the run saw (``SM 1,980 MHz (1,755–1,980) · memory 3,201 MHz`` for a profile run,
    ``sm_mhz 1,980 · mem_mhz 3,201`` for other keys), or "" when not recorded."""
    clocks = section(report, "env").get("clocks")
    if not isinstance(clocks, dict) or not clocks:
        return ""
    parts = []
    if set(clocks) & _PROFILE_CLOCK_KEYS:
        if as_number(clocks.get("sm_mhz_median")) is not None:
            sm = f"SM {format_count(clocks.get('sm_mhz_median'))} MHz median"
            low, high = as_number(clocks.get("sm_mhz_min")), as_number(clocks.get("sm_mhz_max"))
            if low is not None and high is not None and low != high:
                sm += f" ({format_count(low)}–{format_count(high)})"
            parts.append(sm)
        if as_number(clocks.get("mem_mhz_median")) is not None:
            parts.append(f"memory {format_count(clocks.get('mem_mhz_median'))} MHz")
    for key, value in clocks.items():
        if key in _PROFILE_CLOCK_KEYS:
            continue
        shown = format_count(value) if as_number(value) is not None else text(value)
        parts.append(f"{text(key)} {shown}")
    return " · ".join(parts)


def peaks_line(report: Any) -> str:
    """``table (HBM 4.80 TB/s, bf16 989 TFLOP/s)``, or why there is no roof."""
    peaks = section(report, "peaks")
    if section(report, "env").get("device") == "cpu":
        return "not used (no GPU kernels)"
    if not peaks:
        return "none (no % of roof)"
    flops = peaks.get("flops_per_s") if isinstance(peaks.get("flops_per_s"), dict) else {}
    figures = []
    if as_number(peaks.get("hbm_bytes_per_s")) is not None:
        figures.append(f"HBM {format_bytes_per_s(peaks.get('hbm_bytes_per_s'))}")
    dtype = next((d for d in PREFERRED_PEAK_DTYPES if d in flops), next(iter(flops), None))
    if dtype is not None and as_number(flops.get(dtype)) is not None:
        figures.append(f"{dtype} {format_flops_per_s(flops.get(dtype))}")
    if not peaks.get("known") and not figures:
        gpu = text(peaks.get("gpu"), "")
        named = gpu and gpu.lower() not in {"unknown", "none"}
        return f"none for {gpu} (no % of roof)" if named else "none for this GPU (no % of roof)"
    source = text(peaks.get("source"), "table")
    return f"{source} ({', '.join(figures)})" if figures else source


# --- summary ------------------------------------------------------------------------------------


def _share_of_step(value_us: Any, step_us: float | None) -> str:
    value = as_number(value_us)
    if value is None or not step_us:
        return ""
    return f"{format_pct(100 * value / step_us)} of step"


def summary_rows(report: Any) -> list[tuple[str, str, str]]:
    """(metric, value, detail) rows: step time with spread, GPU busy, idle split, launches, syncs."""
    summary = section(report, "summary")
    raw_samples = summary.get("samples_us")
    samples = [v for v in (as_number(s) for s in raw_samples) if v is not None] if isinstance(raw_samples, list) else []
    step_us = as_number(summary.get("step_time_us"))
    if step_us is None and samples:
        step_us = percentile(samples, 50)

    if step_us is None:
        step_detail = "no steps found"
    else:
        step_detail = "1 sample" if len(samples) == 1 else f"median of {len(samples)} samples" if samples else "median"
        if len(samples) >= MIN_SAMPLES_FOR_SPREAD:
            step_detail += f", p10 {format_us(percentile(samples, 10))}, p90 {format_us(percentile(samples, 90))}"
    if summary.get("step_time_source"):
        step_detail += f"; from {text(summary.get('step_time_source'))}"

    rows = [("Step time", format_us(step_us), step_detail)]
    rows += _profile_rows(summary, step_us)
    if as_number(summary.get("steps")) is not None:
        rows.append(("Steps in trace", format_count(summary.get("steps")), ""))
    if section(report, "env").get("device") == "cpu":
        rows += _cpu_rows(report, summary)
        return rows
    # Figures from the trace are shares of the profiled step when the step time is a timed one (profile).
    profiled_us = as_number(summary.get("trace_step_time_us"))
    busy_us = as_number(summary.get("gpu_busy_us"))
    busy_detail = f"{format_us(busy_us)} per step" if busy_us else ""
    if busy_us and profiled_us and step_us:
        busy_detail = f"of the profiled step; {busy_detail}, {format_pct(100 * busy_us / step_us)} of the timed step"
    rows.append(("GPU busy", format_pct(summary.get("gpu_busy_pct")), busy_detail))
    for key, label in (
        ("idle_launch_us", "GPU idle: launch"),
        ("idle_sync_us", "GPU idle: sync"),
        ("idle_other_us", "GPU idle: other"),
    ):
        share = _share_of_step(summary.get(key), profiled_us or step_us)
        rows.append(
            (label, format_us(summary.get(key)), share.replace("of step", "of profiled step") if profiled_us else share)
        )
    rows.append(("Kernels per step", format_count(summary.get("kernels_per_step")), ""))
    launch_detail = ""
    if as_number(summary.get("launch_call_us_per_step")) is not None:
        launch_detail = f"{format_us(summary.get('launch_call_us_per_step'))} of CPU per step"
    rows.append(("Launch calls per step", format_count(summary.get("launch_calls_per_step")), launch_detail))
    if as_number(summary.get("kernels_shorter_than_launch_pct")) is not None:
        rows.append(
            ("Kernels shorter than launch", format_pct(summary.get("kernels_shorter_than_launch_pct")), "of kernels")
        )
    rows.append(("Host syncs per step", format_count(summary.get("host_syncs_per_step")), ""))
    if as_number(summary.get("memcpy_us_per_step")) is not None:
        rows.append(("Copies per step", format_us(summary.get("memcpy_us_per_step")), "memcpy/memset time on the GPU"))
    if as_number(summary.get("combined_saving_us")) is not None:
        detail = f"{format_pct(summary.get('combined_saving_pct'))} of step: findings with a fix, overlaps counted once"
        rows.append(("Combined saving", format_us(summary.get("combined_saving_us")), detail))
    if as_number(summary.get("combined_upper_bound_us")):
        detail = f"{format_pct(summary.get('combined_upper_bound_pct'))} of step, the upper-bound findings together"
        rows.append(("Combined upper bound", f"up to {format_us(summary.get('combined_upper_bound_us'))}", detail))
    top_finding = _top_finding(report, summary.get("top_finding"))
    if top_finding:
        rows.append(("Top finding", "", top_finding))  # a sentence: the wide column
    by_class = summary_classes(report)
    if by_class:
        rows.append(("GPU time by class", "", by_class))
    return rows


def format_energy(joules: Any) -> str:
    """Energy: ``"1.23 J"``, ``"45.6 mJ"``."""
    value = as_number(joules)
    if value is None:
        return MISSING
    if abs(value) >= 1:
        return f"{value:,.2f} J"
    return f"{value * 1000:.1f} mJ" if abs(value) >= 0.01 else f"{value * 1000:.2f} mJ"


ENERGY_NOT_MEASURED = "not measured"


def energy_cell(section: dict[str, Any]) -> str:
    """A summary's (or apply side's) energy per step: the figure; "not measured" where NVML sampled but the
    energy was not measured (energy_source says why: a span under the counter's update interval, a counter
    that did not advance); ``MISSING`` where nothing was sampled."""
    if as_number(section.get("energy_j_per_step")) is not None:
        return format_energy(section.get("energy_j_per_step"))
    return ENERGY_NOT_MEASURED if text(section.get("energy_source"), "") else MISSING


def _profile_rows(summary: dict[str, Any], step_us: float | None) -> list[tuple[str, str, str]]:
    """Rows only a `profile` run has: the step under the profiler, tokens/s, energy and power, peak memory."""
    rows = []
    trace_step = as_number(summary.get("trace_step_time_us"))
    if trace_step is not None:
        slowdown = as_number(summary.get("profiler_slowdown"))
        detail = "median of the profiled steps"
        detail += f", {slowdown:.1f}x the timed step" if slowdown is not None else ""
        rows.append(("Step under profiler", format_us(trace_step), detail))
    if as_number(summary.get("tokens_per_s")) is not None:
        rows.append(("Tokens/s", format_count(summary.get("tokens_per_s")), "at the median step time"))
    energy = as_number(summary.get("energy_j_per_step"))
    source = text(summary.get("energy_source"), "")
    if energy is not None or source or as_number(summary.get("power_w_median")) is not None:
        details = []
        power = as_number(summary.get("power_w_average"))
        if energy is None and source:
            details.append(source.removeprefix(ENERGY_NOT_MEASURED + ": "))  # why it was not measured
        if power is not None:
            details.append(f"power {power:,.0f} W" + (f" ({source})" if source else " average"))
        elif as_number(summary.get("power_w_median")) is not None:
            details.append(f"power {as_number(summary.get('power_w_median')):,.0f} W median")
        if as_number(summary.get("temperature_c_max")) is not None:
            details.append(f"up to {format_count(summary.get('temperature_c_max'))} °C")
        reasons = summary.get("throttle_reasons")
        if isinstance(reasons, (list, tuple)) and reasons:
            details.append("clock reasons: " + ", ".join(text(r) for r in reasons))
        elif isinstance(reasons, (list, tuple)):
            details.append("no clock throttling seen")
        rows.append(("Energy per step", energy_cell(summary), "; ".join(details)))
    if as_number(summary.get("memory_allocated_peak_bytes")) is not None:
        reserved = summary.get("memory_reserved_peak_bytes")
        detail = "allocated"
        if as_number(reserved) is not None:
            detail += f"; {format_bytes(reserved)} reserved by the allocator"
        rows.append(("Peak memory", format_bytes(summary.get("memory_allocated_peak_bytes")), detail))
    return rows


def _cpu_rows(report: Any, summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows of a run on the CPU: CPU operator time per step and the operators that took most of it."""
    rows = []
    if as_number(summary.get("cpu_op_self_us_per_step")) is not None:
        rows.append(("CPU op time", format_us(summary.get("cpu_op_self_us_per_step")), "per profiled step"))
    ops = records(report, "cpu_ops")[:5]
    if ops:
        rows.append(
            ("Top CPU ops", "", " · ".join(f"{text(op.get('name'))} {format_us(op.get('per_step_us'))}" for op in ops))
        )
    return rows


def cpu_op_table(report: Any, limit: int = 15) -> Table:
    """The CPU operators of a run without GPU kernels (``cpu_ops``), by self time."""
    table = Table(
        "CPU operators",
        [
            Column("Operator"),
            Column("Calls/step", True),
            Column("Self/step", True),
            Column("Total/step", True),
        ],
    )
    ops = records(report, "cpu_ops")
    for op in ops[: max(0, limit)]:
        table.rows.append(
            [
                text(op.get("name")),
                format_count(op.get("count_per_step")),
                format_us(op.get("per_step_us")),
                format_us(op.get("total_per_step_us")),
            ]
        )
    if ops:
        shown = min(limit, len(ops))
        table.caption = f"{shown} of {len(ops)} operators, by self time (total includes the operators each one called)"
    return table


def _top_finding(report: Any, top: Any) -> str:
    """The summary's top finding; a bare rule id is completed with the finding's title and saving."""
    label = text(top, "")
    if not label:
        return ""
    for finding in records(report, "findings"):
        if text(finding.get("rule_id"), "") == label:
            title = text(finding.get("title") or finding.get("name"), "")
            saving = as_number(finding.get("estimated_saving_us_per_step"))
            label += f": {title}" if title else ""
            label += f" (saves ~{format_us(saving)} per step)" if saving else ""
            break
    return label


def summary_classes(report: Any) -> str:
    """GPU time per step by roofline class, largest first (``latency 281 µs · memory 102 µs``), or ""."""
    classes = report.get("kernel_classes") if isinstance(report, dict) else None
    if not isinstance(classes, dict):
        return ""
    pairs = [(text(name), as_number(us)) for name, us in classes.items()]
    pairs = sorted(((name, us) for name, us in pairs if us), key=lambda pair: -pair[1])
    return " · ".join(f"{name} {format_us(us)}" for name, us in pairs)


# --- kernels ------------------------------------------------------------------------------------


# Long enough for any kernel name: short_kernel_name at this width simplifies the name but never cuts it.
_UNCUT = 100_000


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def keep_part(text: str, start: int, end: int, max_chars: int) -> str:
    """``text`` in at most ``max_chars`` characters that show ``text[start:end]`` (the part that tells it apart
    from a similar name), then as much of what follows as fits, then of what precedes, with "…" where something
    is left out; the name's first word (``nvjet``, ``sm90``) stays in front when there is room."""
    n = len(text)
    if n <= max_chars:
        return text
    start = max(0, min(start, n - 1))
    cut = text.rfind("_", 0, start)
    if 0 <= cut and start - cut <= 6:  # begin at a word boundary when that costs a few characters
        start = cut + 1
    end = max(start + 1, min(end, n))
    first = text.find("_")
    head = text[:first] if 0 < first <= 8 else ""

    def render(a: int, b: int, lead: str) -> str:
        left = text[:a] if a <= len(lead) else (f"{lead}…" if lead else "…")
        return left + text[a:b] + ("" if b >= n else "…")

    lead = head
    a, b = start, min(end, n)
    while len(render(a, b, lead)) > max_chars and b > a + 1:
        b -= 1  # the differing part is longer than the room: keep its beginning
    if len(render(a, b, lead)) > max_chars:
        lead = ""
    while b < n and len(render(a, b + 1, lead)) <= max_chars:
        b += 1
    while a > 0 and len(render(a - 1, b, lead)) <= max_chars:
        a -= 1
    return render(a, b, lead)


def _wrapper_part(full: str, start: int, max_chars: int) -> str | None:
    """``unrolled…<direct_…cuda>``: a ``wrapper<functor>`` name that differs from another in its wrapper keeps
    the wrapper's beginning up to the difference, and the functor (what the kernel does) as far as it fits."""
    import re

    wrapped = re.fullmatch(r"(\w+)<(\w+)>", full)
    if wrapped is None or start >= len(wrapped.group(1)):
        return None
    wrapper, inner = wrapped.groups()
    keep = max(start + 1, 4)
    room = max_chars - keep - 3  # "…", "<" and ">"
    if keep >= len(wrapper) or room < 6:
        return None
    from gpuadvisor.report.formatting import shorten_middle

    return f"{wrapper[:keep]}…<{shorten_middle(inner, room)}>"


def distinct_short_names(names: list[Any], max_chars: int) -> list[str]:
    """Short names for a list of kernels, within ``max_chars``, such that two different kernels never read the
    same. Kernels whose names shorten alike but differ (``nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT`` and
    ``nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT`` cut in the middle) show the part where they differ
    (:func:`keep_part`); kernels whose simplified names are the same (template instances of one kernel) get
    " (2)", " (3)", … in list order."""
    shorts = [short_kernel_name(name, max_chars) for name in names]
    fulls = [short_kernel_name(name, _UNCUT) for name in names]
    for _ in range(3):  # a new short name may meet another one: look again, a few times at most
        groups: dict[str, set[str]] = {}
        for short, full in zip(shorts, fulls, strict=True):
            groups.setdefault(short, set()).add(full)
        if all(len(fulls_alike) == 1 for fulls_alike in groups.values()):
            break
        for i, (short, full) in enumerate(zip(shorts, fulls, strict=True)):
            others = groups[short] - {full}
            if not others:
                continue
            start = max(_common_prefix(full, other) for other in others)
            end = len(full) - max(_common_suffix(full, other) for other in others)
            shorts[i] = _wrapper_part(full, start, max_chars) or keep_part(full, start, max(end, start + 1), max_chars)
    seen: dict[str, list[Any]] = {}
    result = []
    for name, short in zip(names, shorts, strict=True):
        variants = seen.setdefault(short, [])
        if name not in variants:
            variants.append(name)
        number = variants.index(name) + 1
        if number == 1:
            result.append(short)
        else:
            suffix = f" ({number})"
            result.append(short_kernel_name(name, max(8, max_chars - len(suffix))) + suffix)
    return result


def roof_cell(kernel: dict[str, Any], shown: str, extended: bool) -> str:
    """The "% of roof" cell: the figure, or, where the estimate put the kernel above its roof (no measurement
    can), ``>100% (bytes estimate inconsistent)`` (with the whole reason when ``extended``)."""
    note = kernel.get("roof_note")
    if not isinstance(note, str) or not note:
        return shown
    if as_number(kernel.get("pct_of_roof")) is None:
        return f">100% ({note if extended else note.split(':')[0]})"
    return f"{shown} ({note})" if extended else shown


def kernel_table(report: Any, top: int, name_chars: int, extended: bool = False) -> Table:
    """The ``top`` kernels by total time. Per-step columns when the report has steps, totals otherwise.

    ``extended`` adds intensity and achieved rates (the Markdown report has the width for them).
    Values marked estimated (FLOPs/bytes from shapes) carry a ``~`` prefix.
    """
    kernels = records(report, "kernels")
    kernels.sort(key=lambda k: -(as_number(k.get("total_us")) or 0.0))
    per_step = any(as_number(k.get("us_per_step")) is not None for k in kernels)
    columns = [Column("#", True), Column("Kernel"), Column("Family")]
    columns += (
        [Column("Calls/step", True), Column("µs/step", True)]
        if per_step
        else [
            Column("Calls", True),
            Column("Total", True),
        ]
    )
    columns += [Column("% GPU", True), Column("Class", wrap=False), Column("% of roof", True)]
    if extended:
        columns += [Column("FLOP/byte", True), Column("Achieved", True)]

    shown = kernels[: max(0, top)]
    table = Table("Top kernels", columns)
    names = distinct_short_names([k.get("name") for k in shown], name_chars)
    for index, (kernel, name) in enumerate(zip(shown, names, strict=True), start=1):
        mark = "~" if kernel.get("estimated") else ""
        roof = format_pct(kernel.get("pct_of_roof"))
        row = [str(index), name, text(kernel.get("family"))]
        if per_step:
            row += [format_count(kernel.get("count_per_step")), format_us(kernel.get("us_per_step"))]
        else:
            row += [format_count(kernel.get("count")), format_us(kernel.get("total_us"))]
        row += [
            format_pct(kernel.get("pct_of_gpu_time")),
            text(kernel.get("bound"), "unknown"),
            roof_cell(kernel, mark + roof if roof != MISSING else roof, extended),
        ]
        if extended:
            intensity = format_intensity(kernel.get("intensity"))
            rates = [
                format_flops_per_s(kernel.get("achieved_flops_per_s"))
                if as_number(kernel.get("achieved_flops_per_s"))
                else "",
                format_bytes_per_s(kernel.get("achieved_bytes_per_s"))
                if as_number(kernel.get("achieved_bytes_per_s"))
                else "",
            ]
            achieved = ", ".join(r for r in rates if r)
            row += [
                mark + intensity if intensity != MISSING else intensity,
                mark + achieved if achieved else MISSING,
            ]
        table.rows.append(row)

    if kernels:
        share = sum(as_number(k.get("pct_of_gpu_time")) or 0.0 for k in shown)
        caption = f"{len(shown)} of {len(kernels)} kernels listed, {format_pct(share)} of GPU time"
        if any(k.get("estimated") and as_number(k.get("pct_of_roof")) is not None for k in shown):
            caption += "; ~ = from estimated FLOPs/bytes"
        if any(isinstance(k.get("roof_note"), str) and as_number(k.get("pct_of_roof")) is None for k in shown):
            caption += "; >100% = the estimate exceeds the roof, so it is no measurement and classes nothing"
        if not any(as_number(k.get("pct_of_roof")) is not None for k in kernels):
            if section(report, "peaks").get("known"):
                caption += "; no % of roof: the trace has no FLOP or byte counts for these kernels"
            else:
                caption += "; no % of roof without peak figures for this GPU"
        table.caption = caption
    return table


# --- findings -----------------------------------------------------------------------------------


def sorted_findings(report: Any) -> list[dict[str, Any]]:
    """Findings in the engine's order (:func:`gpuadvisor.rules.engine.rank_key`: by estimated saving, upper
    bounds at half weight, largest first; ties by severity)."""
    from gpuadvisor.rules.engine import rank_key

    return sorted(records(report, "findings"), key=rank_key)


def saving_text(finding: dict[str, Any], value: str) -> str:
    """A finding's saving as the tables print it: "up to …" for an upper bound (no fix behind it)."""
    return f"up to {value}" if finding.get("saving_basis") == "upper bound" and value not in ("", "—", "n/a") else value


def finding_table(report: Any) -> Table:
    table = Table(
        "Findings",
        [
            Column("ID", wrap=False),
            Column("Severity", wrap=False),
            Column("Title"),
            Column("Saving/step", True),
            Column("% of step", True),
            Column("Fix", wrap=False),
        ],
    )
    for finding in sorted_findings(report):
        table.rows.append(
            [
                text(finding.get("rule_id")),
                text(finding.get("severity")),
                text(finding.get("title") or finding.get("name")),
                saving_text(finding, format_us(finding.get("estimated_saving_us_per_step"))),
                saving_text(finding, format_pct(finding.get("estimated_saving_pct"))),
                text(finding.get("fix_id")),
            ]
        )
    return table


def evidence_value(key: str, value: Any) -> str:
    """One evidence value, formatted by the unit its key names (``us``, ``pct``, ``bytes``, ``_per_s``)."""
    if isinstance(value, (list, tuple, dict)):
        scalars = isinstance(value, (list, tuple)) and all(not isinstance(v, (list, tuple, dict)) for v in value)
        if scalars and len(value) <= 8:
            return "[" + ", ".join(text(v) for v in value) + "]"
        return f"({len(value)} entries in report.json)"
    number = as_number(value)
    if number is None:
        return text(value)
    words = key.lower().split("_")
    if "us" in words:
        return format_us(number)
    if "pct" in words:
        return format_pct(number)
    if key.endswith("bytes_per_s"):
        return format_bytes_per_s(number)
    if key.endswith("flops_per_s"):
        return format_flops_per_s(number)
    if "bytes" in words:
        return format_bytes(number)
    if float(number).is_integer() or abs(number) >= 100:
        return format_count(number)
    return f"{number:.3g}"


def evidence_text(finding: dict[str, Any]) -> str:
    """``key=value, …`` from a finding's evidence, each value formatted by the unit its key names."""
    evidence = finding.get("evidence")
    if not isinstance(evidence, dict):
        return ""
    return ", ".join(f"{text(key)}={evidence_value(str(key), value)}" for key, value in evidence.items())


# --- transfers, host syncs, steps ---------------------------------------------------------------


def transfer_table(report: Any) -> Table:
    table = Table(
        "Transfers",
        [
            Column("Direction", wrap=False),
            Column("From → to"),
            Column("Count", True),
            Column("Bytes", True),
            Column("Time", True),
            Column("Rate", True),
            Column("Notes"),
        ],
    )
    for transfer in records(report, "transfers"):
        notes = []
        if transfer.get("pageable"):
            notes.append("pageable")
        if transfer.get("sync"):
            notes.append("synchronous")
        table.rows.append(
            [
                text(transfer.get("direction")),
                f"{text(transfer.get('src_kind'), '?')} → {text(transfer.get('dst_kind'), '?')}",
                format_count(transfer.get("count")),
                format_bytes(transfer.get("bytes")),
                format_us(transfer.get("total_us")),
                format_bytes_per_s(transfer.get("bytes_per_s")),
                ", ".join(notes),
            ]
        )
    return table


def host_sync_table(report: Any, limit: int = 10) -> Table:
    """The ``limit`` host synchronizations that cost the most time, with the operator that caused each."""
    syncs = records(report, "host_syncs")
    syncs.sort(key=lambda sync: -(as_number(sync.get("total_us")) or 0.0))
    has_op = any(sync.get("op") for sync in syncs)
    has_source = any(sync.get("source") for sync in syncs)
    columns = [Column("Call")]
    columns += [Column("Op")] if has_op else []
    columns += [Column("Count", True), Column("Per step", True), Column("Time", True)]
    columns += [Column("Source")] if has_source else []
    table = Table("Host syncs", columns)
    for sync in syncs[: max(0, limit)]:
        row = [text(sync.get("name"))]
        row += [text(sync.get("op"))] if has_op else []
        row += [format_count(sync.get("count")), format_count(sync.get("per_step")), format_us(sync.get("total_us"))]
        row += [text(sync.get("source"))] if has_source else []
        table.rows.append(row)
    if len(syncs) > limit:
        table.caption = f"{min(limit, len(syncs))} of {len(syncs)} sync sites, by time"
    return table


def step_table(report: Any) -> Table:
    table = Table(
        "Steps",
        [
            Column("Step", True),
            Column("Time", True),
            Column("GPU busy", True),
            Column("Idle: launch", True),
            Column("Idle: sync", True),
            Column("Idle: other", True),
            Column("Kernels", True),
            Column("Host syncs", True),
        ],
    )
    for step in records(report, "steps"):
        table.rows.append(
            [
                text(step.get("step")),
                format_us(step.get("step_time_us")),
                format_pct(step.get("gpu_busy_pct")),
                format_us(step.get("idle_launch_us")),
                format_us(step.get("idle_sync_us")),
                format_us(step.get("idle_other_us")),
                format_count(step.get("kernels")),
                format_count(step.get("host_syncs")),
            ]
        )
    return table


def rank_table(report: Any, limit: int = 16) -> Table:
    """The ``ranks`` section (a multi-rank folder): per rank its median step, GPU busy, compute,
    communication and exposed communication per step; the caption names the straggler. Beyond ``limit``
    ranks, the first ones by rank number are listed, plus the straggler."""
    ranks = section(report, "ranks")
    rows = records(ranks, "rows")
    # `gpuadvisor profile --nproc N` adds each rank's timed step (CUDA events, no profiler) to the rows.
    timed = any(row.get("timed_step_time_us") is not None for row in rows)
    columns = [Column("Rank", wrap=False)]
    if timed:
        columns += [Column("Timed step", True), Column("Trace step", True), Column("Trace vs timed", True)]
    else:
        columns += [Column("Step", True)]
    columns += [
        Column("GPU busy", True),
        Column("Compute", True),
        Column("Comm", True),
        Column("Exposed", True),
        Column("Exposed %", True),
    ]
    table = Table("Ranks", columns)
    straggler = ranks.get("straggler")
    shown = rows[: max(0, limit)]
    shown += [r for r in rows[max(0, limit) :] if straggler is not None and r.get("rank") == straggler]
    for row in shown:
        step = as_number(row.get("step_time_us"))
        exposed = as_number(row.get("exposed_communication_us_per_step"))
        label = text(row.get("rank"))
        if straggler is not None and row.get("rank") == straggler:
            label += " (straggler)"
        cells = [label]
        if timed:
            difference = as_number(row.get("trace_vs_timed_pct"))
            cells += [
                format_us(row.get("timed_step_time_us")),
                format_us(step),
                MISSING if difference is None else f"{difference:+.1f}%",
            ]
        else:
            cells.append(format_us(step))
        cells += [
            format_pct(row.get("gpu_busy_pct")),
            format_us(row.get("compute_us_per_step")),
            format_us(row.get("communication_us_per_step")),
            format_us(exposed),
            format_pct(100.0 * exposed / step if exposed is not None and step else None),
        ]
        table.rows.append(cells)
    if rows:
        parts = []
        if len(shown) < len(rows):
            parts.append(f"{len(shown)} of {len(rows)} ranks")
        matched = ranks.get("matched_steps")
        if isinstance(matched, (list, tuple)) and matched:
            listed = ", ".join(text(s) for s in list(matched)[:6]) + (", …" if len(matched) > 6 else "")
            parts.append(f"medians over steps {listed}")
        elif timed and ranks.get("step_basis"):
            parts.append(f"trace step: {text(ranks.get('step_basis'))}")
        else:
            parts.append("each rank's whole trace (no common ProfilerStep numbers)")
        if timed:
            agreement = ranks.get("timing_agreement") if isinstance(ranks.get("timing_agreement"), dict) else {}
            worst = as_number(agreement.get("max_abs_difference_pct"))
            tolerance = as_number(agreement.get("tolerance_pct"))
            timed_text = "timed step: median of CUDA events (CPU: wall clock) without the profiler, each rank's own"
            if worst is not None and tolerance is not None:
                verdict = "within" if worst <= tolerance else "NOT within"
                timed_text += f"; trace and timed steps differ by up to {worst:.1f}% ({verdict} {tolerance:.0f}%)"
            parts.append(timed_text)
        parts.append(
            "compute, comm and exposed per step; comm = NCCL/RCCL kernels, exposed = comm while no other kernel or "
            "copy runs (exposed % of the step)"
        )
        if straggler is not None:
            wait = format_us(ranks.get("straggler_excess_wait_us_per_step"))
            share = format_pct(ranks.get("straggler_excess_wait_pct"))
            parts.append(
                f"straggler: rank {text(straggler)}, the others wait ~{wait} per step for it ({share} of its step)"
            )
        else:
            parts.append("no straggler")
        table.caption = "; ".join(parts)
    return table


def notes(report: Any) -> list[str]:
    value = report.get("notes") if isinstance(report, dict) else None
    if not isinstance(value, (list, tuple)):
        return []
    return [text(note) for note in value if text(note, "")]


def skipped_rules(report: Any) -> list[tuple[str, str]]:
    return [(text(s.get("rule_id")), text(s.get("reason"), "")) for s in records(report, "skipped_rules")]
