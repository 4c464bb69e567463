"""``report.json``: the versioned report schema, its encoder and its loader.

:func:`to_json` is the one JSON encoder of every command's output (reports, ``rules``, ``scan``, ``ncu``,
``calibrate``, ``compare``, ``diff``): strict JSON, ``null`` for NaN and infinities. The schema as code, from which
``docs/report.schema.json`` is generated, is :mod:`gpuadvisor.report.schema`; every report is assembled there.

A report is a plain dict. Version 1 (the one :data:`SCHEMA_VERSION` names) holds, times in µs:

``schema_version``   int, 1
``tool``             {name, version}
``command``          "analyze" | "profile" | "apply"
``source``           {path, ranks [int], events, size_bytes}
``env``              {gpu_name, sm_count, compute_capability "9.0", driver, cuda, torch, triton, clocks {}}
                     (each may be null)
``peaks``            {gpu, known, source, hbm_bytes_per_s, flops_per_s {dtype: FLOP/s}}
``summary``          {steps, step_time_us (median), samples_us [float], step_time_source, gpu_busy_us,
                     gpu_busy_pct, kernels_per_step, idle_launch_us, idle_sync_us, idle_other_us,
                     host_syncs_per_step, launch_calls_per_step, launch_call_us_per_step,
                     kernels_shorter_than_launch_pct, memcpy_us_per_step, kernel_us_per_step, top_finding,
                     combined_saving_us, combined_saving_pct (the findings with a fix together, overlaps counted
                     once), combined_upper_bound_us, combined_upper_bound_pct (the upper bounds together, "up
                     to"), combined_saving_basis (str); rules/engine.py, combined_estimate}
``steps``            [{step, start_us, step_time_us, gpu_busy_us, gpu_busy_pct, idle_launch_us,
                     idle_sync_us, idle_other_us, kernels, host_syncs}]
``timeline``         optional (null without steps): one profiled step, the one nearest the median, for the
                     report's timeline strip: {step, step_time_us, kernels, copies, idle_launch, idle_sync,
                     idle_other (each [[start_us, duration_us]] from the step's start: the union of the kernel,
                     of the memcpy/memset intervals, and the idle gaps classified as the step breakdown does),
                     copy_us_per_step [float] (every step's copy time, in steps order), omitted {lane: count of
                     the shortest intervals left out}} (analysis/timeline.py, step_timeline)
``kernels``          [{name, family, count, count_per_step, total_us, us_per_step, mean_us, pct_of_gpu_time,
                     flops, bytes, intensity (FLOP/byte), achieved_flops_per_s, achieved_bytes_per_s,
                     bound "compute"|"memory"|"latency"|"launch"|"unknown", pct_of_roof (null above 100:
                     roof_note says why), estimated (the % of roof or class rests on an estimate), blocks,
                     dtype, bytes_basis (how bytes were counted), roof_note}], by total_us, largest first
``transfers``        [{direction, src_kind, dst_kind, count, bytes, total_us, bytes_per_s, pageable, sync}]
``host_syncs``       [{name, count, total_us, per_step, source}]
``findings``         [{rule_id, name, title, severity "high"|"medium"|"low"|"info", category, message,
                     evidence {name: number|str}, estimated_saving_us_per_step, estimated_saving_pct,
                     fix_id, fix, saving_basis "graph replay model"|"roof"|"measured alternative"|"upper bound",
                     saving_from "launch_idle"|"sync_idle"|"copies"|"kernels"|"step"}], ranked by
                     rules/engine.py, rank_key (saving, upper bounds at half weight, largest first)
``skipped_rules``    [{rule_id, reason}]
``notes``            [str]
``kernel_classes``   optional: {bound: GPU µs per step in kernels of that class}
``ranks``            optional, multi-rank folders: {matched_steps, step_basis, rows [{rank, step_time_us,
                     gpu_busy_pct, compute_us_per_step, communication_us_per_step,
                     exposed_communication_us_per_step, ...}], straggler, straggler_excess_wait_us_per_step,
                     straggler_excess_wait_pct} (report/build.py, _ranks_section); `profile --nproc N` adds
                     world_size, backend, launcher, timing_agreement {tolerance_pct, max_abs_difference_pct,
                     within_tolerance} and per row timed_step_time_us, timed_step_p10_us, timed_step_p90_us,
                     timed_steps, step_time_source, trace_vs_timed_pct, folder (profile.py, _merge_ranks)
``memory``           optional, ``profile``: {allocator (CUDA only, else absent or null: allocated_peak_bytes,
                     reserved_peak_bytes, reserved_minus_allocated_peak_bytes, fragmentation_pct,
                     inactive_split_peak_bytes, num_alloc_retries, num_ooms, device_total_bytes,
                     peak_pct_of_device, headroom_bytes, ...), snapshot (``--memory``: segments, reserved_bytes,
                     free_bytes, largest_free_block_bytes, external_fragmentation_pct, peak_bytes,
                     bytes_by_category {category: bytes}, top_sites [{site, bytes, count}], ...), kv_cache (decode
                     workloads with a cache found: bytes_per_token, free_bytes, tokens_that_fit,
                     sequences_that_fit, fp8_sequences_that_fit, paged_sequences_that_fit, ...), notes [str]}
                     (capture/memory.py: allocator_summary, snapshot_summary, kv_cache_capacity)
``distributed``      optional, one rank's own report of a multi-rank profile: {rank, world_size, local_rank, backend}

Numbers a run could not measure are ``null``; NaN and infinities are written as ``null`` too.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import os
from pathlib import Path, PurePath
from typing import Any

import msgspec

from gpuadvisor.errors import BadInputError

SCHEMA_VERSION = 1

# The keys every report must have, and the JSON type of each. ``compare`` reads summary.samples_us,
# kernels and findings; ``env`` says whether two runs are comparable; ``tool`` which gpuadvisor wrote it.
# The other keys of the schema above are optional to readers: the renderers show what is there.
REQUIRED_KEYS: dict[str, type] = {
    "schema_version": int,
    "tool": dict,
    "env": dict,
    "summary": dict,
    "kernels": list,
    "findings": list,
}

_JSON_TYPE_NAMES = {dict: "an object", list: "an array", int: "an integer", str: "a string"}


def _clean(value: Any, where: str) -> Any:
    """``value`` as plain JSON types: numpy/pandas scalars unwrapped, NaN/inf -> None, keys -> str."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k, where): _clean(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_clean(item, f"{where}[{i}]") for i, item in enumerate(items)]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return _clean(value.value, where)
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _clean(dataclasses.asdict(value), where)
    if isinstance(value, msgspec.Struct):
        return _clean(msgspec.to_builtins(value), where)
    # numpy and pandas, without importing them: scalars have .item(), arrays and Series .tolist().
    type_name = type(value).__name__
    if type_name in {"NAType", "NaTType"}:
        return None
    if hasattr(value, "isoformat") and type_name == "Timestamp":
        return value.isoformat()
    if hasattr(value, "tolist") and callable(value.tolist):
        return _clean(value.tolist(), where)
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item(), where)
    raise TypeError(f"cannot write {type(value).__name__} at {where} to report.json")


def to_plain(value: Any) -> Any:
    """``value`` as plain JSON types (what report dicts hold): numpy/pandas unwrapped, NaN/inf -> None."""
    return _clean(value, "report")


def _key(key: Any, where: str) -> str:
    cleaned = _clean(key, where)
    if cleaned is None or isinstance(cleaned, (dict, list)):
        raise TypeError(f"cannot use {key!r} as a key at {where} in report.json")
    if isinstance(cleaned, bool):
        return "true" if cleaned else "false"
    return str(cleaned)


def to_json(report: dict[str, Any]) -> str:
    """The report as indented JSON (2 spaces, UTF-8 text, trailing newline); NaN and inf become null.

    numpy and pandas scalars and arrays, paths, enums, dataclasses and datetimes are converted;
    anything else raises TypeError naming where it is.
    """
    encoded = msgspec.json.encode(_clean(report, "report"))
    return msgspec.json.format(encoded, indent=2).decode("utf-8") + "\n"


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "null" if value is None else type(value).__name__


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``report.json`` written by :func:`to_json` and check its version and required keys.

    Raises BadInputError (one line) when the file is missing, unreadable, empty, truncated, not JSON,
    not an object, of another schema version, or lacks a required key.
    """
    path = Path(path)
    try:
        from gpuadvisor.inputs import read_bytes  # a regular file only, at most 256 MiB, nesting checked

        data = read_bytes(path, "report")
    except FileNotFoundError:
        raise BadInputError(f"report not found: {path}") from None
    except IsADirectoryError:
        raise BadInputError(f"{path} is a directory, not a report.json") from None
    except OSError as exc:
        raise BadInputError(f"cannot read report {path}: {exc.strerror or exc}") from None
    if not data.strip():
        raise BadInputError(f"report {path} is empty")
    if data[:2] == b"\x1f\x8b":
        raise BadInputError(f"{path} is gzip-compressed, not a report.json (for a trace, run gpuadvisor analyze)")
    try:
        report = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        reason = str(exc)
        hint = " (truncated?)" if "truncated" in reason.lower() else ""
        raise BadInputError(f"report {path} is not valid JSON{hint}: {reason}") from None
    if not isinstance(report, dict):
        raise BadInputError(f"{path} is not a gpuadvisor report: expected a JSON object, found {_describe(report)}")
    if "schema_version" not in report:
        if "traceEvents" in report:
            raise BadInputError(f"{path} is a profiler trace, not a report (run gpuadvisor analyze on it)")
        raise BadInputError(f"{path} is not a gpuadvisor report: it has no schema_version")
    version = report["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise BadInputError(f"report {path} has schema_version {version!r}; expected the integer {SCHEMA_VERSION}")
    if version != SCHEMA_VERSION:
        newer = " (written by a newer gpuadvisor)" if version > SCHEMA_VERSION else ""
        raise BadInputError(
            f"report {path} has schema_version {version}{newer}; this gpuadvisor reads version {SCHEMA_VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise BadInputError(f"report {path} lacks required key{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    for key, expected in REQUIRED_KEYS.items():
        if not isinstance(report[key], expected):
            raise BadInputError(
                f"report {path}: {key} is {_describe(report[key])}, expected {_JSON_TYPE_NAMES[expected]}"
            )
    return report
