"""``gpuadvisor compare``: two reports in, one verdict per metric and one for the whole, as a CI gate.

Pure functions on report dicts (schema of :mod:`gpuadvisor.report.json`); the CLI only loads the files,
calls :func:`compare_reports` and prints one of the renderings below.

Comparable first
    Two reports are compared only when they were measured alike: the same GPU name, driver, CUDA and
    torch versions (a field given by one report and not the other counts as different), the same
    command (``profile`` times steps without the profiler, ``analyze`` under it), and SM clock medians
    within ``clock_tolerance_pct`` (5%) of the base's when both reports have clocks. Otherwise the verdict
    is "not comparable" (exit 2) and no metric is judged, unless ``allow_env_drift`` is set; the
    differences are listed either way.

Metrics, each with a direction (lower is better, except tokens/s)
    ``step_time``            summary.samples_us (µs)                       tested (samples)
    ``tokens_per_s``         summary.tokens_per_s, per-sample from samples  tested (samples), higher is better
    ``memory_allocated``     summary.memory_allocated_peak_bytes           threshold
    ``memory_reserved``      summary.memory_reserved_peak_bytes            threshold
    ``energy_per_step``      summary.energy_j_per_step (J)                 one value
    ``kernels_per_step``     summary.kernels_per_step                      exact
    ``host_syncs_per_step``  summary.host_syncs_per_step                   exact
    ``kernel:NAME``          kernels[].us_per_step, the ``top_kernels`` largest of either report   one value

A metric absent (or null) in both reports is left out; present in one only, it is "skipped".

Verdicts ("worse" is the direction that hurts: larger, or smaller for tokens/s). Let ``b`` and ``c`` be
the base and current values (medians of the samples for tested metrics), ``change = c / b - 1`` signed so
that worse is positive, and ``delta = c - b`` signed the same way. A change is *past the thresholds* when
``change > threshold_pct / 100`` AND ``delta > floor`` (a base of 0 counts as an infinite change).

- exact (counters): worse by any amount -> regression; better -> improvement; equal -> pass.
- threshold (peak memory: the caching allocator's peak repeats run to run): past the thresholds worse ->
  regression; past them better -> improvement; else pass.
- tested (timed samples): with fewer than ``min_samples`` samples on a side, past the thresholds worse ->
  inconclusive, else pass. Otherwise a one-sided Mann–Whitney U test of current against base in the worse
  direction gives ``p``: past the thresholds worse AND ``p < alpha`` -> regression; past the thresholds
  worse and ``p >= alpha`` -> inconclusive; past the thresholds better AND the one-sided test in the
  better direction gives ``p < alpha`` -> improvement; else pass (a significant change smaller than the
  thresholds passes: real, but too small to gate on).
- one value (energy per step, per-kernel time: the report keeps one figure per run, no samples): past
  the thresholds worse -> inconclusive (one number cannot separate a change from run-to-run noise);
  else pass.

Why one-sided: the gate asks one question, "is CURRENT worse?". A one-sided test answers it with a false
alarm rate of ``alpha``; a two-sided test at the same ``alpha`` spends half of that on the other direction
and so needs a larger shift before it flags a real slowdown. Improvements get their own one-sided test in
the other direction, so each verdict keeps its false-alarm rate at ``alpha``.

The whole: "not comparable" as above; else "regression" if any metric regressed, else "inconclusive" if
any is, else "pass". Exit codes (:func:`exit_code`): 0 pass or inconclusive, 1 regression (or
inconclusive with ``strict``), 2 not comparable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from gpuadvisor.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, BadInputError
from gpuadvisor.inputs import InputError, decode_toml, integer_digits, number_out_of_range, read_text
from gpuadvisor.report.formatting import MISSING, as_number, format_bytes, format_count, format_us, short_kernel_name
from gpuadvisor.report.sections import Column, Table, distinct_short_names, format_energy
from gpuadvisor.textsafe import escape_control

PASS = "pass"
IMPROVEMENT = "improvement"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
SKIPPED = "skipped"
NOT_COMPARABLE = "not comparable"

LOWER = "lower"
HIGHER = "higher"

EXACT = "exact"
THRESHOLD = "threshold"
TESTED = "mann-whitney"
ONE_VALUE = "one value"

MIB = 2**20
CONFIG_TABLE = "tool.gpuadvisor.compare"
KERNEL_PREFIX = "kernel:"


@dataclass
class Settings:
    """Thresholds of the gate. Each field is also a key of ``[tool.gpuadvisor.compare]`` in pyproject.toml."""

    alpha: float = 0.05  # significance level of each one-sided Mann–Whitney test
    # Below 5 samples a side the test can hardly decide: at 4 vs 4 the smallest one-sided p is 1/70 = 0.014,
    # reached only when the two sets do not overlap at all; at 3 vs 3 it is 1/20 = 0.05, never below alpha.
    min_samples: int = 5
    time_threshold_pct: float = 5.0  # step time
    time_floor_us: float = 20.0
    tokens_threshold_pct: float = 5.0  # tokens/s
    tokens_floor_per_s: float = 0.0
    memory_threshold_pct: float = 5.0  # peak allocated and reserved memory
    memory_floor_mib: float = 64.0
    energy_threshold_pct: float = 5.0  # energy per step
    energy_floor_j: float = 0.0
    kernel_threshold_pct: float = 5.0  # each top kernel's time per step
    kernel_floor_us: float = 20.0
    top_kernels: int = 5  # kernels compared: the largest of either report by time per step
    clock_tolerance_pct: float = 5.0  # SM clock medians further apart than this: not comparable
    sources: dict[str, str] = field(default_factory=dict)  # key -> where its value came from (if not default)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("sources")
        return data


SETTING_KEYS = tuple(f.name for f in fields(Settings) if f.name != "sources")
_INT_KEYS = {"min_samples", "top_kernels"}


def _check_setting(key: str, value: Any, where: str) -> float | int:
    if key not in SETTING_KEYS:
        known = ", ".join(SETTING_KEYS)
        raise BadInputError(f"{where}: unknown key '{key}' (known: {known})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or number_out_of_range(value):
        raise BadInputError(f"{where}: {key} must be a number, got {_shown(value)}")
    if key in _INT_KEYS:
        if not float(value).is_integer() or value < (1 if key == "min_samples" else 0):
            least = 1 if key == "min_samples" else 0
            raise BadInputError(f"{where}: {key} must be a whole number >= {least}, got {value!r}")
        return int(value)
    if key == "alpha" and not 0 < value < 1:
        raise BadInputError(f"{where}: alpha must be between 0 and 1, got {value!r}")
    if value < 0:
        raise BadInputError(f"{where}: {key} must be >= 0, got {value!r}")
    return float(value)


def _shown(value: Any) -> str:
    """A value from an input file for a message: its repr, shortened (an integer of 400 digits says how long)."""
    if isinstance(value, int) and not isinstance(value, bool) and number_out_of_range(value):
        return f"an integer of {integer_digits(value)} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def find_config(start: str | os.PathLike[str]) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a ``[tool.gpuadvisor.compare]`` table."""
    folder = Path(start).resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if not path.is_file():  # a FIFO or a folder of that name is no config: skipped, never opened
            continue
        text = _read_config(path)
        if "gpuadvisor" in text and _config_table(text, path) is not None:
            return path
    return None


def _read_config(path: Path) -> str:
    """A pyproject.toml's text: a regular file of at most 4 MiB, UTF-8 (gpuadvisor.inputs)."""
    try:
        return read_text(path, "config")
    except InputError as exc:
        raise BadInputError(f"cannot read {str(exc).removeprefix('config file ')}") from None


def _config_table(text: str, path: Path) -> dict[str, Any] | None:
    try:
        data = decode_toml(text, str(path))  # nesting at most 200 deep, integers within 64 bits
    except InputError as exc:
        raise BadInputError(str(exc).replace(f"{path}: invalid TOML", f"{path} is not valid TOML", 1)) from None
    table: Any = data
    for part in CONFIG_TABLE.split("."):
        table = table.get(part) if isinstance(table, dict) else None
    if table is not None and not isinstance(table, dict):
        raise BadInputError(f"{path}: [{CONFIG_TABLE}] must be a table")
    return table


def load_settings(
    config: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None
) -> tuple[Settings, Path | None]:
    """Settings from the defaults, then ``config`` (a pyproject.toml, or None), then ``overrides``
    (from flags: ``{"--threshold-pct": 3.0}`` sets every ``*_threshold_pct``; ``{"--alpha": 0.01}``).
    Returns the settings and the config file read. Bad keys or values raise BadInputError."""
    settings = Settings()
    path = Path(config) if config is not None else None
    if path is not None:
        table = _config_table(_read_config(path), path) or {}
        where = f"{path} [{CONFIG_TABLE}]"
        for key, value in table.items():
            setattr(settings, key, _check_setting(key, value, where))
            settings.sources[key] = str(path)
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        if flag == "--threshold-pct":
            keys = [k for k in SETTING_KEYS if k.endswith("_threshold_pct")]
        elif flag == "--alpha":
            keys = ["alpha"]
        elif flag == "--top":
            keys = ["top_kernels"]
        else:
            raise ValueError(f"unknown override {flag}")
        for key in keys:
            setattr(settings, key, _check_setting(key, value, flag))
            settings.sources[key] = flag
    return settings, path


# --- comparability ------------------------------------------------------------------------------

ENV_FIELDS = (("gpu_name", "GPU"), ("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"))


@dataclass
class Drift:
    """One way in which the two runs differ."""

    field: str
    label: str
    base: Any
    current: Any
    detail: str


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def environment_drift(base: dict[str, Any], current: dict[str, Any], clock_tolerance_pct: float) -> list[Drift]:
    """What makes two reports not comparable (module docstring): an empty list when nothing does."""
    drifts = []
    base_env, current_env = _dict(base.get("env")), _dict(current.get("env"))
    for key, label in ENV_FIELDS:
        b, c = base_env.get(key), current_env.get(key)
        if b != c:
            b, c = _safe(b), _safe(c)
            drifts.append(Drift(f"env.{key}", label, b, c, f"{label}: {_text(b)} vs {_text(c)}"))
    b, c = base.get("command"), current.get("command")
    if b != c:
        b, c = _safe(b), _safe(c)
        detail = f"command: {_text(b)} vs {_text(c)} (steps timed without the profiler vs under it)"
        drifts.append(Drift("command", "command", b, c, detail))
    b_clock = as_number(_dict(base_env.get("clocks")).get("sm_mhz_median"))
    c_clock = as_number(_dict(current_env.get("clocks")).get("sm_mhz_median"))
    if b_clock and c_clock is not None:
        change = 100.0 * (c_clock - b_clock) / b_clock
        if abs(change) > clock_tolerance_pct:
            detail = (
                f"SM clock median: {b_clock:,.0f} MHz vs {c_clock:,.0f} MHz ({change:+.1f}%, "
                f"tolerance {clock_tolerance_pct:g}%)"
            )
            drifts.append(Drift("env.clocks.sm_mhz_median", "SM clock", b_clock, c_clock, detail))
    return drifts


def _safe(value: Any) -> Any:
    """A value read from a report, its control characters escaped when it is text (gpuadvisor.textsafe)."""
    return escape_control(value) if isinstance(value, str) else value


def _text(value: Any) -> str:
    return "unknown" if value is None else escape_control(str(value))


# --- one metric ---------------------------------------------------------------------------------


@dataclass
class MetricResult:
    """The verdict on one metric. Values in ``unit``; ``change_pct`` and ``delta`` are current - base, as
    measured (not signed by direction); ``p_value`` is the one-sided test's in the direction of the change."""

    key: str
    name: str
    unit: str  # "us", "tokens/s", "bytes", "J", "count"
    direction: str  # LOWER or HIGHER is better
    method: str  # EXACT, THRESHOLD, TESTED or ONE_VALUE
    base: float | None
    current: float | None
    verdict: str
    reason: str
    change_pct: float | None = None
    delta: float | None = None
    p_value: float | None = None
    n_base: int | None = None
    n_current: int | None = None
    threshold_pct: float | None = None
    floor: float | None = None


# The Mann–Whitney test runs on at most this many samples a side: when a report holds more, evenly spaced ones in
# the order they were recorded (the first and the last included), the same every run; the medians, the ratio and
# the floor use every sample. 10 M samples a side took 28 s and 2.1 GB in the test; 100,000 take ~0.1 s, and
# already resolve shifts far smaller than the 5% threshold. (profile records at most 10,000 timed steps.)
MAX_TEST_SAMPLES = 100_000


def tested_samples(samples: Sequence[float]) -> Any:
    """At most :data:`MAX_TEST_SAMPLES` of ``samples``, evenly spaced (all of them when there are fewer)."""
    import numpy as np

    values = np.asarray(samples, dtype=np.float64)
    if len(values) <= MAX_TEST_SAMPLES:
        return values
    return values[np.linspace(0, len(values) - 1, MAX_TEST_SAMPLES).round().astype(np.int64)]


def mann_whitney_p(current: Sequence[float], base: Sequence[float], alternative: str) -> float:
    """One-sided Mann–Whitney U p-value: ``alternative`` "greater" tests whether ``current`` tends to be
    larger than ``base``, "less" smaller. Identical constant samples give 1.0. Each side is cut to
    :data:`MAX_TEST_SAMPLES` evenly spaced samples first."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    with np.errstate(all="ignore"):  # constant samples: scipy divides by a zero variance and says so
        p = float(mannwhitneyu(tested_samples(current), tested_samples(base), alternative=alternative).pvalue)
    return p if math.isfinite(p) else 1.0


def _signed(direction: str) -> int:
    return 1 if direction == LOWER else -1


def _past(base: float, current: float, direction: str, threshold_pct: float, floor: float) -> tuple[bool, bool]:
    """(worse past both thresholds, better past both thresholds)."""
    worse_delta = _signed(direction) * (current - base)
    if base == 0:
        change = math.inf if current != 0 else 0.0
        worse_change = math.copysign(change, worse_delta) if worse_delta else 0.0
    else:
        worse_change = worse_delta / abs(base)
    limit = threshold_pct / 100.0
    worse = worse_change > limit and worse_delta > floor
    better = -worse_change > limit and -worse_delta > floor
    return worse, better


def _change_pct(base: float, current: float) -> float | None:
    if base == 0:
        return None if current != 0 else 0.0
    return 100.0 * (current - base) / abs(base)


def _limits(threshold_pct: float, floor: float, unit: str) -> str:
    if not floor:
        return f"{threshold_pct:g}%"
    amount = f"{floor / MIB:g} MiB" if unit == "bytes" else _format(floor, unit)
    return f"{threshold_pct:g}% and {amount}"


def _format(value: Any, unit: str) -> str:
    if unit == "us":
        return format_us(value)
    if unit == "bytes":
        number = as_number(value)
        return MISSING if number is None else format_bytes(number)
    if unit == "J":
        return format_energy(value)
    if unit == "tokens/s":
        number = as_number(value)
        return MISSING if number is None else f"{format_count(number)} tokens/s"
    return format_count(value)


def _change_text(base: float, current: float, unit: str) -> str:
    pct = _change_pct(base, current)
    delta = current - base
    sign = "+" if delta > 0 else "-" if delta < 0 else "±"
    amount = _format(abs(delta), unit)
    return f"{pct:+.1f}% ({sign}{amount})" if pct is not None else f"new ({sign}{amount})"


def compare_samples(
    key: str,
    name: str,
    base: list[float],
    current: list[float],
    *,
    unit: str,
    direction: str,
    threshold_pct: float,
    floor: float,
    alpha: float,
    min_samples: int,
) -> MetricResult:
    """A timed metric with samples on both sides (module docstring, "tested")."""
    b, c = _median(base), _median(current)
    worse, better = _past(b, c, direction, threshold_pct, floor)
    result = MetricResult(key, name, unit, direction, TESTED, b, c, PASS, "", _change_pct(b, c), c - b)
    result.n_base, result.n_current, result.threshold_pct, result.floor = len(base), len(current), threshold_pct, floor
    limits = _limits(threshold_pct, floor, unit)
    change = _change_text(b, c, unit)
    if len(base) < min_samples or len(current) < min_samples:
        counts = f"{len(base)} and {len(current)} samples (the test needs {min_samples} a side)"
        if worse:
            result.verdict = INCONCLUSIVE
            result.reason = f"{change} past {limits}, but only {counts}"
        else:
            result.reason = f"{change} {'better past' if better else 'within'} {limits}; {counts}"
        return result
    worse_alternative = "greater" if direction == LOWER else "less"
    better_alternative = "less" if direction == LOWER else "greater"
    observed_worse = _signed(direction) * (c - b) > 0
    p_worse = mann_whitney_p(current, base, worse_alternative)
    p_better = mann_whitney_p(current, base, better_alternative) if (better or not observed_worse) else None
    result.p_value = p_worse if observed_worse or p_better is None else p_better
    if worse and p_worse < alpha:
        result.verdict = REGRESSION
        result.reason = f"{change} past {limits}, p = {p_worse:.2g} < {alpha:g}"
    elif worse:
        result.verdict = INCONCLUSIVE
        result.reason = f"{change} past {limits}, but p = {p_worse:.2g} >= {alpha:g}: may be noise"
    elif better and p_better is not None and p_better < alpha:
        result.verdict = IMPROVEMENT
        result.reason = f"{change} past {limits}, p = {p_better:.2g} < {alpha:g}"
    elif better:
        result.reason = f"{change} better past {limits}, but p = {p_better:.2g} >= {alpha:g}"
    else:
        significant = " (significant, but small)" if result.p_value is not None and result.p_value < alpha else ""
        result.reason = f"{change} within {limits}{significant}"
    return result


def compare_values(
    key: str,
    name: str,
    base: float,
    current: float,
    *,
    unit: str,
    direction: str,
    method: str,
    threshold_pct: float = 0.0,
    floor: float = 0.0,
) -> MetricResult:
    """A metric with one value per report: ``method`` EXACT, THRESHOLD or ONE_VALUE (module docstring)."""
    result = MetricResult(key, name, unit, direction, method, base, current, PASS, "", _change_pct(base, current))
    result.delta = current - base
    change = _change_text(base, current, unit)
    if method == EXACT:
        worse_delta = _signed(direction) * (current - base)
        if worse_delta > 0:
            result.verdict, result.reason = REGRESSION, f"{change}: counts compare exactly"
        elif worse_delta < 0:
            result.verdict, result.reason = IMPROVEMENT, f"{change}: counts compare exactly"
        else:
            result.reason = "the same count"
        return result
    result.threshold_pct, result.floor = threshold_pct, floor
    worse, better = _past(base, current, direction, threshold_pct, floor)
    limits = _limits(threshold_pct, floor, unit)
    if method == THRESHOLD:
        if worse:
            result.verdict, result.reason = REGRESSION, f"{change} past {limits}"
        elif better:
            result.verdict, result.reason = IMPROVEMENT, f"{change} past {limits}"
        else:
            result.reason = f"{change} within {limits}"
        return result
    if worse:
        result.verdict = INCONCLUSIVE
        result.reason = f"{change} past {limits}, but one value per report cannot tell a change from noise"
    else:
        result.reason = f"{change} {'better past' if better else 'within'} {limits}"
    return result


# --- two reports --------------------------------------------------------------------------------


def _number(report: dict[str, Any], label: str, section: str, key: str) -> float | None:
    """``report[section][key]`` as a float, None when absent or null; anything else is bad input."""
    value = _dict(report.get(section)).get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or number_out_of_range(value):
        raise BadInputError(f"{label}: {section}.{key} is {_shown(value)}, expected a number or null")
    return float(value)


def load_reports(*paths: str | os.PathLike[str]) -> tuple[dict[str, Any], ...]:
    """The reports at ``paths`` (:func:`gpuadvisor.report.json.load_report`: checked, bounded), each one's
    ``summary.samples_us`` turned into a float array as soon as it is read (:func:`_samples`, the same checks):
    10 M samples a side are 80 MB as an array against 320 MB as Python floats, so ``compare`` of two such
    reports stays under 1 GB."""
    from gpuadvisor.report.json import load_report

    reports = []
    for path in paths:
        report = load_report(path)
        summary = report.get("summary")
        if isinstance(summary, dict) and isinstance(summary.get("samples_us"), list):
            summary["samples_us"] = _samples(report, escape_control(str(path)))
        reports.append(report)
    return tuple(reports)


def _median(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.median(np.asarray(values, dtype=np.float64)))


def _samples(report: dict[str, Any], label: str) -> Any:
    """summary.samples_us as a float array, nulls left out; anything but positive numbers is bad input. In numpy:
    10 M samples are checked in ~0.5 s, where a loop in Python took seconds."""
    import numpy as np

    value = _dict(report.get("summary")).get("samples_us")
    if value is None:
        return np.zeros(0)
    if isinstance(value, np.ndarray):  # checked already (load_reports)
        return value
    if not isinstance(value, list):
        raise BadInputError(f"{label}: summary.samples_us is not a list")
    kinds = set(map(type, value))
    values = None
    if kinds <= {float, int, type(None)}:
        try:
            values = np.asarray(value, dtype=np.float64)  # None -> NaN (JSON has no NaN of its own)
        except OverflowError:  # an integer no float holds (400 digits)
            values = None
    if values is not None and type(None) in kinds:
        values = values[~np.isnan(values)]
    if values is None or not ((values > 0).all() and np.isfinite(values).all()):
        for i, x in enumerate(value):
            if x is None:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)) or number_out_of_range(x) or x <= 0:
                raise BadInputError(f"{label}: summary.samples_us[{i}] is {_shown(x)}, expected a positive number")
    return values


def _kernel_times(report: dict[str, Any], label: str) -> dict[str, float]:
    times: dict[str, float] = {}
    for i, row in enumerate(report.get("kernels") or []):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise BadInputError(f"{label}: kernels[{i}] has no name")
        value = row.get("us_per_step")
        if value is None:
            value = row.get("total_us")  # a report without steps keeps totals only
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or number_out_of_range(value):
            raise BadInputError(f"{label}: kernels[{i}].us_per_step is {_shown(value)}, expected a number")
        name = escape_control(row["name"])  # a name from a file: no control character reaches a terminal
        times[name] = times.get(name, 0.0) + float(value)
    return times


def _skipped(key: str, name: str, unit: str, direction: str, method: str, base: Any, current: Any) -> MetricResult:
    side = "base" if current is None else "current"
    return MetricResult(key, name, unit, direction, method, base, current, SKIPPED, f"only the {side} report has it")


def _timed_metric(
    key: str,
    name: str,
    unit: str,
    direction: str,
    samples: tuple[list[float], list[float]],
    values: tuple[float | None, float | None],
    limits: tuple[float, float],
    s: Settings,
) -> MetricResult | None:
    """Tested on the samples when both reports have them, else judged as one value; None when neither has it."""
    (b_samples, c_samples), (b, c) = samples, values
    threshold_pct, floor = limits
    if len(b_samples) and len(c_samples):
        return compare_samples(
            key,
            name,
            b_samples,
            c_samples,
            unit=unit,
            direction=direction,
            threshold_pct=threshold_pct,
            floor=floor,
            alpha=s.alpha,
            min_samples=s.min_samples,
        )
    if b is not None and c is not None:
        return compare_values(
            key, name, b, c, unit=unit, direction=direction, method=ONE_VALUE, threshold_pct=threshold_pct, floor=floor
        )
    if b is not None or c is not None:
        return _skipped(key, name, unit, direction, TESTED, b, c)
    return None


def _step_metrics(base: dict, current: dict, labels: tuple[str, str], s: Settings) -> list[MetricResult]:
    b_samples, c_samples = _samples(base, labels[0]), _samples(current, labels[1])
    b_median = _number(base, labels[0], "summary", "step_time_us")
    c_median = _number(current, labels[1], "summary", "step_time_us")
    step = _timed_metric(
        "step_time",
        "step time",
        "us",
        LOWER,
        (b_samples, c_samples),
        (b_median, c_median),
        (s.time_threshold_pct, s.time_floor_us),
        s,
    )
    b_tokens = _number(base, labels[0], "summary", "tokens_per_s")
    c_tokens = _number(current, labels[1], "summary", "tokens_per_s")
    rates = (_token_rates(b_tokens, b_samples), _token_rates(c_tokens, c_samples))
    tokens = _timed_metric(
        "tokens_per_s",
        "tokens/s",
        "tokens/s",
        HIGHER,
        rates,
        (b_tokens, c_tokens),
        (s.tokens_threshold_pct, s.tokens_floor_per_s),
        s,
    )
    return [m for m in (step, tokens) if m is not None]


def _token_rates(tokens_per_s: float | None, samples: Any) -> Any:
    """Tokens/s of each step sample: the report's tokens/s is tokens per step / the samples' median."""
    import numpy as np

    if not tokens_per_s or not len(samples):
        return np.zeros(0)
    tokens_per_step = tokens_per_s * _median(samples) / 1e6
    return tokens_per_step * 1e6 / np.asarray(samples, dtype=np.float64)


@dataclass(frozen=True)
class _SummaryMetric:
    """A metric read from one summary key; thresholds named by their Settings fields (floor x floor_scale)."""

    key: str
    name: str
    summary_key: str
    unit: str
    method: str
    threshold: str | None = None
    floor: str | None = None
    floor_scale: float = 1.0


_SUMMARY_METRICS = (
    _SummaryMetric("memory_allocated", "peak memory allocated", "memory_allocated_peak_bytes", "bytes", THRESHOLD,
                   "memory_threshold_pct", "memory_floor_mib", MIB),
    _SummaryMetric("memory_reserved", "peak memory reserved", "memory_reserved_peak_bytes", "bytes", THRESHOLD,
                   "memory_threshold_pct", "memory_floor_mib", MIB),
    _SummaryMetric("energy_per_step", "energy per step", "energy_j_per_step", "J", ONE_VALUE,
                   "energy_threshold_pct", "energy_floor_j"),
    _SummaryMetric("kernels_per_step", "kernels per step", "kernels_per_step", "count", EXACT),
    _SummaryMetric("host_syncs_per_step", "host syncs per step", "host_syncs_per_step", "count", EXACT),
)  # fmt: skip


def _scalar_metrics(base: dict, current: dict, labels: tuple[str, str], s: Settings) -> list[MetricResult]:
    results = []
    for metric in _SUMMARY_METRICS:
        b = _number(base, labels[0], "summary", metric.summary_key)
        c = _number(current, labels[1], "summary", metric.summary_key)
        if b is None and c is None:
            continue
        if b is None or c is None:
            results.append(_skipped(metric.key, metric.name, metric.unit, LOWER, metric.method, b, c))
            continue
        limits = {}
        if metric.threshold is not None and metric.floor is not None:
            limits = {
                "threshold_pct": getattr(s, metric.threshold),
                "floor": getattr(s, metric.floor) * metric.floor_scale,
            }
        results.append(
            compare_values(
                metric.key, metric.name, b, c, unit=metric.unit, direction=LOWER, method=metric.method, **limits
            )
        )
    return results


def _kernel_metrics(base: dict, current: dict, labels: tuple[str, str], s: Settings) -> list[MetricResult]:
    if s.top_kernels <= 0:
        return []
    b_times, c_times = _kernel_times(base, labels[0]), _kernel_times(current, labels[1])
    if not b_times and not c_times:
        return []
    chosen: list[str] = []
    for times in (c_times, b_times):
        for name in sorted(times, key=lambda n: -times[n])[: s.top_kernels]:
            if name not in chosen:
                chosen.append(name)
    chosen.sort(key=lambda n: -max(b_times.get(n, 0.0), c_times.get(n, 0.0)))
    results = []
    for name in chosen:
        b, c = b_times.get(name, 0.0), c_times.get(name, 0.0)
        result = compare_values(
            KERNEL_PREFIX + name,
            f"kernel {name}",
            b,
            c,
            unit="us",
            direction=LOWER,
            method=ONE_VALUE,
            threshold_pct=s.kernel_threshold_pct,
            floor=s.kernel_floor_us,
        )
        if name not in b_times:
            result.reason += " (not in the base report's kernel list)"
        elif name not in c_times:
            result.reason += " (not in the current report's kernel list)"
        results.append(result)
    return results


def overall_verdict(metrics: Iterable[MetricResult]) -> str:
    verdicts = {m.verdict for m in metrics}
    if REGRESSION in verdicts:
        return REGRESSION
    if INCONCLUSIVE in verdicts:
        return INCONCLUSIVE
    return PASS


def compare_reports(
    base: dict[str, Any],
    current: dict[str, Any],
    settings: Settings | None = None,
    *,
    allow_env_drift: bool = False,
    labels: tuple[str, str] = ("base", "current"),
) -> dict[str, Any]:
    """Compare two report dicts (module docstring). ``labels`` name them in messages (their paths).

    Returns {verdict, comparable, allow_env_drift, base {label, tool, command, env}, current {...},
    drift [{field, label, base, current, detail}], metrics [MetricResult as dicts], counts {verdict: n},
    settings {...}, config (path or None), notes [str]}. Malformed numbers raise BadInputError.
    """
    import numpy as np

    with np.errstate(all="ignore"):  # samples of 1e308 µs sum to inf: a median stays finite, a mean need not
        return _compare_reports(base, current, settings, allow_env_drift=allow_env_drift, labels=labels)


def _compare_reports(
    base: dict[str, Any],
    current: dict[str, Any],
    settings: Settings | None,
    *,
    allow_env_drift: bool,
    labels: tuple[str, str],
) -> dict[str, Any]:
    s = settings or Settings()
    labels = (escape_control(str(labels[0])), escape_control(str(labels[1])))  # paths from the command line
    drift = environment_drift(base, current, s.clock_tolerance_pct)
    comparable = not drift
    metrics: list[MetricResult] = []
    notes: list[str] = []
    if comparable or allow_env_drift:
        metrics = (
            _step_metrics(base, current, labels, s)
            + _scalar_metrics(base, current, labels, s)
            + _kernel_metrics(base, current, labels, s)
        )
        if drift:
            notes.append("the runs differ (" + "; ".join(d.detail for d in drift) + "), compared anyway")
        verdict = overall_verdict(metrics)
    else:
        verdict = NOT_COMPARABLE
        notes.append("no metric was compared: pass --allow-env-drift to compare anyway")
    counts: dict[str, int] = {}
    for m in metrics:
        counts[m.verdict] = counts.get(m.verdict, 0) + 1

    def side(report: dict[str, Any], label: str) -> dict[str, Any]:
        return {
            "label": label,
            "tool": _safe(_dict(report.get("tool")).get("version")),
            "command": _safe(report.get("command")),
            "env": {key: _safe(_dict(report.get("env")).get(key)) for key, _ in ENV_FIELDS},
            "sm_mhz_median": _dict(_dict(report.get("env")).get("clocks")).get("sm_mhz_median"),
        }

    return {
        "verdict": verdict,
        "comparable": comparable,
        "allow_env_drift": allow_env_drift,
        "base": side(base, labels[0]),
        "current": side(current, labels[1]),
        "drift": [asdict(d) for d in drift],
        "metrics": [asdict(m) for m in metrics],
        "counts": counts,
        "settings": s.as_dict(),
        "setting_sources": dict(s.sources),
        "notes": notes,
    }


def exit_code(result: dict[str, Any], strict: bool = False) -> int:
    """0 pass (or inconclusive without ``strict``), 1 regression (or inconclusive with it), 2 not comparable."""
    verdict = result["verdict"]
    if verdict == NOT_COMPARABLE:
        return EXIT_BAD_INPUT
    if verdict == REGRESSION or (strict and verdict == INCONCLUSIVE):
        return EXIT_FINDINGS
    return EXIT_OK


def summary_line(result: dict[str, Any], strict: bool = False) -> str:
    """One line for stderr or a log: the verdict and what decided it."""
    verdict = result["verdict"]
    if verdict == NOT_COMPARABLE:
        details = "; ".join(d["detail"] for d in result["drift"])
        return f"not comparable: {details} (--allow-env-drift compares anyway)"
    decisive = [m for m in result["metrics"] if m["verdict"] == verdict]
    if verdict in (REGRESSION, INCONCLUSIVE) and decisive:
        shown = "; ".join(f"{m['name']} {m['reason']}" for m in decisive[:3])
        more = f" (and {len(decisive) - 3} more)" if len(decisive) > 3 else ""
        suffix = " (--strict)" if verdict == INCONCLUSIVE and strict else ""
        return f"{verdict}{suffix}: {shown}{more}"
    return f"{verdict}: {len(result['metrics'])} metric(s) compared"


# --- renderings ---------------------------------------------------------------------------------

VERDICT_MARKS = {
    PASS: "✅",
    IMPROVEMENT: "✅",
    REGRESSION: "❌",
    INCONCLUSIVE: "⚠️",
    SKIPPED: "➖",
    NOT_COMPARABLE: "⛔",
}
VERDICT_STYLES = {
    PASS: "green",
    IMPROVEMENT: "bold green",
    REGRESSION: "bold red",
    INCONCLUSIVE: "yellow",
    SKIPPED: "dim",
    NOT_COMPARABLE: "bold red",
}


def metric_tables(result: dict[str, Any], name_chars: int = 48, why: bool = True) -> list[Table]:
    """The metrics as strings, in two tables: the run's metrics, then the top kernels (µs per step).
    Columns: metric (or kernel), base, current, change, p, verdict, and why (when ``why``)."""
    columns = [
        Column("Metric"),
        Column("Base", numeric=True),
        Column("Current", numeric=True),
        Column("Change", numeric=True),
        Column("p", numeric=True),
        Column("Verdict", wrap=False),
    ]
    if why:
        columns.append(Column("Why"))
    runs = Table("Metrics", list(columns))
    kernels = Table("Top kernels, µs per step", [Column("Kernel"), *columns[1:]])
    metrics = result["metrics"]
    kernel_names = [m["key"][len(KERNEL_PREFIX) :] for m in metrics if m["key"].startswith(KERNEL_PREFIX)]
    shorts = iter(distinct_short_names(kernel_names, name_chars))
    for m in metrics:
        is_kernel = m["key"].startswith(KERNEL_PREFIX)
        unit = m["unit"]
        pct = m["change_pct"]
        change = MISSING
        if m["base"] is not None and m["current"] is not None:
            change = f"{pct:+.1f}%" if pct is not None else "new"
        p = MISSING if m["p_value"] is None else f"{m['p_value']:.2g}"
        row = [next(shorts) if is_kernel else m["name"], _format(m["base"], unit), _format(m["current"], unit)]
        row += [change, p, m["verdict"]] + ([m["reason"]] if why else [])
        (kernels if is_kernel else runs).rows.append(row)
    return [table for table in (runs, kernels) if table.rows]


def drift_table(result: dict[str, Any]) -> Table:
    table = Table("Environment", [Column("Field"), Column("Base"), Column("Current")])
    for d in result["drift"]:
        table.rows.append([d["label"], _text(d["base"]), _text(d["current"])])
    return table


def _headline(result: dict[str, Any]) -> str:
    counts = result["counts"]
    if result["verdict"] == NOT_COMPARABLE:
        return "the two runs were measured differently; no metric was compared"
    order = (REGRESSION, INCONCLUSIVE, IMPROVEMENT, PASS, SKIPPED)
    return ", ".join(f"{counts[v]} {v}" for v in order if counts.get(v)) or "no metric in both reports"


def _settings_line(result: dict[str, Any]) -> str:
    s = result["settings"]
    return (
        f"step time {s['time_threshold_pct']:g}% and {s['time_floor_us']:g} µs; kernels {s['kernel_threshold_pct']:g}% "
        f"and {s['kernel_floor_us']:g} µs; tokens/s {s['tokens_threshold_pct']:g}%; memory "
        f"{s['memory_threshold_pct']:g}% and {s['memory_floor_mib']:g} MiB; energy {s['energy_threshold_pct']:g}%; "
        f"one-sided Mann–Whitney at alpha {s['alpha']:g}, at least {s['min_samples']} samples a side"
    )


def render_terminal(result: dict[str, Any], console: Any) -> None:
    """The comparison on a rich console: header, the verdict, the metric (or environment) table, notes."""
    from rich.text import Text

    from gpuadvisor.report.terminal import rich_table

    base, current = result["base"], result["current"]
    console.print(Text(f"gpuadvisor compare  {base['label']} → {current['label']}", style="bold"))
    env = current["env"]
    gpu = " · ".join(f"{label} {env[key]}" for key, label in ENV_FIELDS if env.get(key))
    if gpu:
        console.print(Text(gpu, style="dim"))
    verdict = result["verdict"]
    line = Text("Verdict ")
    line.append(verdict, style=VERDICT_STYLES.get(verdict, ""))
    line.append(f"  {_headline(result)}")
    console.print(line)
    console.print()
    if result["drift"]:
        console.print(rich_table(drift_table(result)))
        console.print()
    if result["metrics"]:
        width = console.width or 100
        name_chars = max(16, min(60, width - 58))
        for table in metric_tables(result, name_chars, why=False):
            console.print(rich_table(table, {"Verdict": VERDICT_STYLES}))
            console.print()
        explained = [m for m in result["metrics"] if m["verdict"] != PASS]
        for m in explained:
            label = m["name"]
            if m["key"].startswith(KERNEL_PREFIX):
                label = "kernel " + short_kernel_name(m["key"][len(KERNEL_PREFIX) :], name_chars)
            line = Text(f"{label}: ")
            line.append(m["verdict"], style=VERDICT_STYLES.get(m["verdict"], ""))
            line.append(f", {m['reason']}")
            console.print(line)
        if explained:
            console.print()
    console.print(Text("Thresholds: " + _settings_line(result), style="dim"))
    for note in result["notes"]:
        console.print(Text(f"note: {note}", style="dim"))


def _markdown_cell(value: Any) -> str:
    from gpuadvisor.report.markdown import escape_markdown

    return escape_markdown(value) or " "


def render_markdown(result: dict[str, Any]) -> str:
    """The comparison as GitHub-flavoured Markdown, for a PR comment or ``$GITHUB_STEP_SUMMARY``."""
    verdict = result["verdict"]
    base, current = result["base"], result["current"]
    lines = [
        f"### gpuadvisor compare: {VERDICT_MARKS.get(verdict, '')} {verdict}",
        "",
        f"{_markdown_cell(_headline(result))} · base `{_code(base['label'])}` · current `{_code(current['label'])}`",
        "",
    ]
    tables = []
    if result["drift"]:
        tables.append(drift_table(result))
    tables += metric_tables(result)
    for table in tables:
        lines.append(f"**{table.title}**")
        lines.append("")
        lines.append("| " + " | ".join(_markdown_cell(c.name) for c in table.columns) + " |")
        lines.append("|" + "|".join("---:" if c.numeric else "---" for c in table.columns) + "|")
        for row in table.rows:
            cells = [_markdown_cell(cell) for cell in row]
            if table.columns[-2].name == "Verdict":
                cells[-2] = f"{VERDICT_MARKS.get(row[-2], '')} {cells[-2]}"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("<details><summary>How this was decided</summary>")
    lines.append("")
    lines.append(f"- Thresholds: {_markdown_cell(_settings_line(result))}.")
    if result["setting_sources"]:
        sources = ", ".join(f"`{k}` from {_code(v)}" for k, v in sorted(result["setting_sources"].items()))
        lines.append(f"- Overridden: {_markdown_cell(sources)}")
    lines.append(
        "- A timed metric regresses only when its median is worse past both the ratio threshold and the "
        "absolute floor AND the one-sided Mann–Whitney U test says so; counters compare exactly."
    )
    for note in result["notes"]:
        lines.append(f"- {_markdown_cell(note)}")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _code(text: Any) -> str:
    return str(text).replace("`", "'")


def _xml_text(value: Any) -> str:
    """Text that XML 1.0 can hold: control characters other than tab and newline dropped."""
    return "".join(ch for ch in str(value) if ch in "\t\n\r" or ord(ch) >= 0x20)


def render_junit_xml(result: dict[str, Any], strict: bool = False) -> str:
    """JUnit XML: a testcase "environment", then one per metric; regressions (and, with ``strict``,
    inconclusive metrics) are failures, skipped metrics are skipped."""
    suite = ElementTree.Element("testsuite", name="gpuadvisor compare")
    failures = skipped = 0
    env_case = ElementTree.SubElement(suite, "testcase", classname="gpuadvisor.compare", name="environment")
    if result["drift"]:
        details = _xml_text("; ".join(d["detail"] for d in result["drift"]))
        if result["verdict"] == NOT_COMPARABLE:
            failure = ElementTree.SubElement(
                env_case, "failure", message=f"not comparable: {details}", type=NOT_COMPARABLE
            )
            failure.text = details
            failures += 1
        else:
            ElementTree.SubElement(env_case, "system-out").text = f"compared despite: {details}"
    for m in result["metrics"]:
        case = ElementTree.SubElement(suite, "testcase", classname="gpuadvisor.compare", name=_xml_text(m["name"]))
        text = _xml_text(
            f"{m['name']}: base {_format(m['base'], m['unit'])}, current {_format(m['current'], m['unit'])}; "
            f"{m['verdict']}: {m['reason']}"
        )
        if m["verdict"] == REGRESSION or (strict and m["verdict"] == INCONCLUSIVE):
            failure = ElementTree.SubElement(case, "failure", message=_xml_text(m["reason"]), type=m["verdict"])
            failure.text = text
            failures += 1
        elif m["verdict"] == SKIPPED:
            ElementTree.SubElement(case, "skipped", message=_xml_text(m["reason"]))
            skipped += 1
        else:
            ElementTree.SubElement(case, "system-out").text = text
    suite.set("tests", str(len(result["metrics"]) + 1))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    ElementTree.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suite, encoding="unicode") + "\n"
