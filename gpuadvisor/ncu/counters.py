"""Nsight Compute CSV -> per-kernel shared-memory table -> GA502 findings.

Reads what ``ncu --csv`` prints with ``--metrics`` (the default "details" layout: one row per kernel launch and
metric, with ``Metric Name``/``Metric Unit``/``Metric Value`` columns) and the ``--page raw`` layout (one row
per launch, one column per metric, a units row under the header). Numbers may carry thousands separators.
Standard library only: no pandas.

Hostile or broken exports are one-line errors (exit 2): a field over :data:`MAX_FIELD_CHARS` characters, a NUL
byte, a ``Metric Name`` column without ``Metric Value``, a units row shorter than the header. Counters that are
not finite numbers (``inf``, ``1e400``) read as missing (JSON ``null``, never ``Infinity``), and kernel names keep
no control characters (escaped, :mod:`gpuadvisor.textsafe`).

Per kernel name, summed over its profiled launches (``kernel_table``):

``kernel``                             the name Nsight Compute reports
``launches``                           profiled launches
``duration_us``                        sum of gpu__time_duration.sum, µs
``time_share_pct``                     duration as % of all profiled kernels' duration
``ld_instructions``/``st_instructions``          smsp__inst_executed_op_shared_{ld,st}.sum (warp level)
``ld_wavefronts``/``st_wavefronts``              l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum
``ld_bank_conflicts``/``st_bank_conflicts``      l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum
``ld_wavefronts_per_instruction`` (and st)       wavefronts / instructions
``ld_ideal_wavefronts`` (and st)                 wavefronts - bank conflicts (what the same accesses take
                                                 without conflicts; instructions whose lanes are all
                                                 predicated off count as instructions but take none)
``ld_excess_ratio`` (and st)                     wavefronts / ideal wavefronts (1.0: no conflict)
``shared_pipe_pct``                    l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,
                                       mean over launches (None when not collected)
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError
from gpuadvisor.textsafe import escape_control

# Longest CSV field accepted: the csv module's own limit. A kernel name of a heavily templated C++ kernel is a few
# thousand characters; a field past this is not an export of Nsight Compute.
MAX_FIELD_CHARS = 131_072

METRICS = {
    "ld_instructions": "smsp__inst_executed_op_shared_ld.sum",
    "st_instructions": "smsp__inst_executed_op_shared_st.sum",
    "ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "ld_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "st_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "duration": "gpu__time_duration.sum",
    "shared_pipe_pct": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
}
REQUIRED = ("ld_instructions", "st_instructions", "ld_wavefronts", "st_wavefronts")
_TIME_TO_US = {
    "ns": 1e-3,
    "nsecond": 1e-3,
    "us": 1.0,
    "usecond": 1.0,
    "ms": 1e3,
    "msecond": 1e3,
    "s": 1e6,
    "second": 1e6,
}


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "").replace("\u202f", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None  # inf, 1e400: not a counter value (JSON null)


def _csv_rows(text: str, source: str = "CSV") -> list[list[str]]:
    # ncu mixes its own "==PROF==" lines and the program's output into the same stream: keep the CSV rows.
    lines = [line for line in text.splitlines() if line.startswith('"')]
    reader = csv.reader(io.StringIO("\n".join(lines)))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a field past csv.field_size_limit() (131,072 characters), a NUL byte
        raise BadInputError(f"{source}: not a CSV that Nsight Compute writes (line {reader.line_num}: {exc})") from None
    return rows


def parse_csv(text: str, source: str = "CSV") -> list[dict[str, Any]]:
    """One dict per profiled launch: id, kernel, block, grid, metrics {name: value in base units, time in µs}."""
    rows = _csv_rows(text, source)
    if not rows:
        raise BadInputError(f"{source}: no Nsight Compute CSV rows (expected the output of `ncu --csv`)")
    header = rows[0]
    column = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in column:
        raise BadInputError(f"{source}: no 'Kernel Name' column: not an Nsight Compute CSV export")
    if "Metric Name" in column and "Metric Value" not in column:
        raise BadInputError(f"{source}: a 'Metric Name' column without 'Metric Value': not an Nsight Compute export")
    launches: dict[str, dict[str, Any]] = {}

    def launch_for(row: list[str]) -> dict[str, Any]:
        key = row[column["ID"]] if "ID" in column else str(len(launches))
        if key not in launches:
            launches[key] = {
                "id": escape_control(key),
                "kernel": escape_control(row[column["Kernel Name"]]),
                "block": escape_control(row[column["Block Size"]]) if "Block Size" in column else "",
                "grid": escape_control(row[column["Grid Size"]]) if "Grid Size" in column else "",
                "metrics": {},
            }
        return launches[key]

    if "Metric Name" in column:
        for row in rows[1:]:
            if len(row) < len(header):
                continue
            unit = row[column["Metric Unit"]] if "Metric Unit" in column else ""
            launch_for(row)["metrics"][row[column["Metric Name"]]] = _convert(row[column["Metric Value"]], unit)
        return list(launches.values())
    second = rows[1] if len(rows) > 1 else []
    units = second if "ID" in column and len(second) > column["ID"] and not second[column["ID"]].strip() else None
    if units is not None and len(units) < len(header):
        raise BadInputError(
            f"{source}: the units row has {len(units)} fields, the header {len(header)}: not an Nsight Compute export"
        )
    for row in rows[2 if units else 1 :]:
        if len(row) < len(header):
            continue
        launch = launch_for(row)
        for name, index in column.items():
            if "__" in name:
                launch["metrics"][name] = _convert(row[index], units[index] if units else "")
    return list(launches.values())


def _convert(value: str, unit: str) -> float | None:
    number = _number(value)
    if number is None:
        return None
    factor = _TIME_TO_US.get(unit.strip().lower())
    number = number * factor if factor else number
    return number if math.isfinite(number) else None


def kernel_table(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel name, counters summed over launches; sorted by duration, largest first."""
    missing = [METRICS[k] for k in REQUIRED if not any(METRICS[k] in launch["metrics"] for launch in launches)]
    if missing:
        raise BadInputError(f"the Nsight Compute data lacks {', '.join(missing)} (collect them with --metrics)")
    by_name: dict[str, dict[str, Any]] = {}
    for launch in launches:
        row = by_name.setdefault(
            launch["kernel"],
            {"kernel": launch["kernel"], "launches": 0, "block": launch["block"], "grid": launch["grid"], "_pct": []},
        )
        row["launches"] += 1
        for key, metric in METRICS.items():
            value = launch["metrics"].get(metric)
            if key == "shared_pipe_pct":
                if value is not None:
                    row["_pct"].append(value)
                continue
            out_key = "duration_us" if key == "duration" else key
            row[out_key] = row.get(out_key, 0.0) + (value or 0.0)
    total_us = sum(r.get("duration_us", 0.0) for r in by_name.values())
    table = []
    for row in by_name.values():
        pct = row.pop("_pct")
        row["shared_pipe_pct"] = round(sum(pct) / len(pct), 2) if pct else None
        row["time_share_pct"] = round(100.0 * row.get("duration_us", 0.0) / total_us, 2) if total_us else None
        for op in ("ld", "st"):
            instructions = row.get(f"{op}_instructions", 0.0)
            wavefronts = row.get(f"{op}_wavefronts", 0.0)
            conflicts = row.get(f"{op}_bank_conflicts", 0.0)
            # Not instructions x (1, 2 or 4): an instruction whose lanes are all predicated off (the late steps
            # of a tree reduction) is counted but moves nothing. Measured on the H200 corpus
            # (benchmarks/results/bank_conflicts_ncu.json), wavefronts / (wavefronts - conflicts) gives each
            # kernel's degree over the ideal of its access width: reduce_interleaved 3.80 where wavefronts per
            # instruction read 0.74; float4_stride2 2.00 (8 per instruction, ideal 4).
            ideal = max(wavefronts - conflicts, 0.0) if instructions else 0.0
            row[f"{op}_wavefronts_per_instruction"] = round(wavefronts / instructions, 3) if instructions else None
            row[f"{op}_ideal_wavefronts"] = ideal
            row[f"{op}_excess_ratio"] = round(wavefronts / ideal, 3) if ideal else None
        row["duration_us"] = round(row.get("duration_us", 0.0), 3)
        for key, value in row.items():  # sums of huge counters can overflow: unknown (null), never Infinity
            if isinstance(value, float) and not math.isfinite(value):
                row[key] = None
        table.append(row)
    table.sort(key=lambda r: -(r["duration_us"] or 0.0))
    return table


def load_csv(path: Path) -> list[dict[str, Any]]:
    """The per-kernel table of an ncu CSV file: a regular file of at most 256 MiB (:mod:`gpuadvisor.inputs`)."""
    from gpuadvisor.inputs import read_bytes

    text = read_bytes(path, "csv").decode("utf-8", errors="replace")
    return kernel_table(parse_csv(text, str(path)))


def bank_conflicts_measured(measured: dict[str, Any], rule) -> list:
    """GA502: per kernel and op (loads, stores), flag wavefronts / ideal >= ``min_excess_ratio``.

    ``measured`` has ``kernels`` (the :func:`kernel_table` rows) and ``steps`` (profiled steps, or None).
    The saving estimate is the time the shared pipe spent on excess wavefronts: duration x shared-pipe
    utilization x excess / wavefronts (an upper bound on what removing the conflict gives back, reached
    only when the shared pipe limits the kernel); without the utilization counter, none is given.
    """
    from gpuadvisor.rules.engine import make_finding

    steps = measured.get("steps") or 1
    findings = []
    for row in measured["kernels"]:
        for op, label in (("ld", "loads"), ("st", "stores")):
            instructions = row.get(f"{op}_instructions") or 0
            ratio = row.get(f"{op}_excess_ratio")
            if instructions < rule.threshold("min_shared_instructions") or not ratio:
                continue
            if ratio < rule.threshold("min_excess_ratio"):
                continue
            wavefronts = row[f"{op}_wavefronts"]
            ideal = row[f"{op}_ideal_wavefronts"]
            if wavefronts is None or ideal is None:  # a counter too large to add up (null)
                continue
            excess = wavefronts - ideal
            pipe = row.get("shared_pipe_pct")
            duration = row["duration_us"] or 0.0
            saving = duration * (pipe / 100.0) * (excess / wavefronts) / steps if pipe else 0.0
            message = (
                f"{row['kernel']}: shared {label} take {wavefronts:,.0f} wavefronts where {ideal:,.0f} would do "
                f"({ratio:g}x; {row[f'{op}_wavefronts_per_instruction']:g} per instruction; {excess:,.0f} are "
                f"bank-conflict replays). The kernel ran {duration:,.1f} µs over "
                f"{row['launches']} launch(es), {row['time_share_pct']}% of the profiled GPU time."
            )
            evidence = {
                "kernel": row["kernel"],
                "op": label,
                "instructions": instructions,
                "wavefronts": wavefronts,
                "bank_conflicts": row.get(f"{op}_bank_conflicts"),
                "wavefronts_per_instruction": row[f"{op}_wavefronts_per_instruction"],
                "ideal_wavefronts_per_instruction": round(ideal / instructions, 3),
                "excess_ratio": ratio,
                "excess_wavefronts": excess,
                "duration_us": row["duration_us"],
                "launches": row["launches"],
                "time_share_pct": row["time_share_pct"],
                "shared_pipe_pct": pipe,
                "block": row.get("block"),
                "grid": row.get("grid"),
            }
            findings.append(make_finding(rule, None, message, evidence, saving))
    findings.sort(key=lambda f: (-f.evidence["excess_wavefronts"], f.evidence["kernel"]))
    return findings


def short_name(kernel: str, width: int = 60) -> str:
    name = re.sub(r"\s+", " ", kernel)
    return name if len(name) <= width else name[: width - 1] + "…"
