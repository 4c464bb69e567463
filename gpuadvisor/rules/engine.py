"""Rules: TOML files (data only) + detectors (Python, registered by name).

Built-in rules live in the repository's ``rules/<ID>-<name>.toml`` (``gpuadvisor/rules/catalog/`` in an
installed package: :data:`CATALOG_DIR`); ``--rules DIR`` adds rules or overrides built-in ones by id. A rule
names the tables it ``needs``; when the trace lacks one, the rule is skipped and the report says why. Each rule's
TOML also names its saving's basis and the share of the step it comes out of; its detector (registered by name in
:data:`DETECTORS`) computes the figure and, where the profiler distorts it, re-derives it against a timed step.

Every finding's saving carries its basis (``saving_basis``, one of :data:`SAVING_BASES`):

- ``graph replay model``: launch gaps a CUDA graph removes (step - GPU busy - a per-kernel cost left in a graph);
- ``roof``: the time now minus the time at a memory, compute or link roof (peaks table or calibrated);
- ``measured alternative``: a figure measured for the alternative on this GPU (the trace's own aligned GEMMs,
  an end-to-end H200 measurement of fused attention, kernels the alternative does not launch at all);
- ``upper bound``: no fix stands behind the figure; it is what could be gained at best, and the report says
  "up to".

Ranking (:func:`rank_key`, the one order every report uses): findings sort by their *ranking saving*, the
estimated saving in µs per step, multiplied by :data:`UPPER_BOUND_RANK_FACTOR` (0.5) for upper bounds; ties by
severity, then rule id. So an upper bound ranks below any saving with a fix behind it that is at least half its
size, and above only those smaller than half of it. The factor is a ranking convention, not a measurement.

``saving_from`` names the share of the step a saving comes out of (:data:`SAVING_SOURCES`), so that
:func:`combined_estimate` does not count the same idle time or kernel time twice.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError

# The built-in rules: the repository's top-level rules/ folder, which the build copies into an installed
# package as gpuadvisor/rules/catalog/ (setup.py); a source checkout, installed editable or run from the tree,
# reads rules/ itself.
PACKAGED_CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
CHECKOUT_CATALOG_DIR = Path(__file__).resolve().parents[2] / "rules"
CATALOG_DIR = PACKAGED_CATALOG_DIR if any(PACKAGED_CATALOG_DIR.glob("*.toml")) else CHECKOUT_CATALOG_DIR
SEVERITIES = ("high", "medium", "low", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
CATEGORIES = ("launch", "memory", "precision", "transfers", "shared-memory", "capacity", "distributed")
NEEDS = ("kernels", "runtime", "cpu_ops", "memcpys", "steps", "shapes", "stacks", "cuda_sources", "ncu_counters")
_ID_RE = re.compile(r"^GA[1-7]\d\d$")
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = ("id", "name", "title", "category", "severity", "detector")
_DOC_FIELDS = ("what", "why", "example", "fix")
_KNOWN_KEYS = set(_REQUIRED) | {"fix_id", "needs", "references", "thresholds", "doc", "saving_basis", "saving_from"}
GRAPH_REPLAY = "graph replay model"
ROOF = "roof"
MEASURED_ALTERNATIVE = "measured alternative"
UPPER_BOUND = "upper bound"
SAVING_BASES = (GRAPH_REPLAY, ROOF, MEASURED_ALTERNATIVE, UPPER_BOUND)
UPPER_BOUND_RANK_FACTOR = 0.5
# The share of the step a saving comes out of (summary field that measures it; None: the whole step).
SAVING_SOURCES = {
    "launch_idle": "idle_launch_us",  # GPU idle waiting for launches (host time: GA101, GA204)
    "sync_idle": "idle_sync_us",  # GPU idle after host syncs (GA401)
    "copies": "memcpy_us_per_step",  # memcpy/memset time (GA402)
    "kernels": "kernel_us_per_step",  # GPU kernel time (GA102, GA2xx, GA3xx, GA5xx)
    "step": None,  # anything else (GA7xx: communication spans kernels and idle time)
}


@dataclass
class Rule:
    id: str
    name: str
    title: str
    category: str
    severity: str
    detector: str
    thresholds: dict[str, float]
    doc: dict[str, str]
    fix_id: str | None = None
    needs: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    path: str = ""
    saving_basis: str = UPPER_BOUND
    saving_from: str = "step"

    def threshold(self, key: str) -> float:
        if key not in self.thresholds:
            raise BadInputError(f"{self.path}: rule {self.id} has no threshold '{key}' (its detector needs it)")
        return float(self.thresholds[key])


@dataclass
class Finding:
    rule_id: str
    name: str
    title: str
    severity: str
    category: str
    message: str
    evidence: dict[str, Any]
    estimated_saving_us_per_step: float
    estimated_saving_pct: float | None
    fix_id: str | None
    fix: str
    saving_basis: str = UPPER_BOUND
    saving_from: str = "step"


class SkipRule(Exception):
    """Raised by a detector when the trace lacks what it needs; the message says what."""


Detector = Callable[[Any, Rule], "Finding | list[Finding] | None"]
# How a detector's saving re-derives against a step timed without the profiler (``profile``, ``apply``):
# fn(finding dict, rule, timed_us, profiled_us, timed figures) -> (saving_us, text to append to the message or
# None); the timed figures are the report summary's (e.g. optimizer_step_host_us, measured without the profiler).
Retimer = Callable[[dict, Rule, float, "float | None", dict], "tuple[float, str | None]"]


@dataclass(frozen=True)
class DetectorEntry:
    """Where a detector's code is: ``function`` (and ``retime``, when it has one) in ``module``."""

    module: str
    function: str
    # The saving against the timed step (see Retimer). Without one, the saving stays as the trace gave it:
    # kernel and copy time, which the profiler does not change.
    retime: str | None = None


_CORE = "gpuadvisor.rules.detectors"
_MODEL = "gpuadvisor.rules.detectors_model"
_DISTRIBUTED = "gpuadvisor.rules.detectors_distributed"
_MEMORY = "gpuadvisor.rules.detectors_memory"
# The one registry of detectors, by the name a rule's ``detector`` gives (the code table of the rules, as a
# linter keeps one). Modules are imported on first use: listing and validating rules (`gpuadvisor rules`,
# `explain`) imports no analysis and no pandas, and the GA5xx detectors, which read scan results and Nsight
# Compute tables rather than a trace, load only where `gpuadvisor scan` and `gpuadvisor ncu` run them.
DETECTORS: dict[str, DetectorEntry] = {
    "launch_bound": DetectorEntry(_CORE, "launch_bound", retime="launch_bound_timed"),
    "underfilled_kernels": DetectorEntry(_CORE, "underfilled_kernels"),
    "elementwise_chain": DetectorEntry(_CORE, "elementwise_chain"),
    "fp32_matmul": DetectorEntry(_CORE, "fp32_matmul", retime="fp32_matmul_timed"),
    "host_syncs": DetectorEntry(_CORE, "host_syncs", retime="host_syncs_timed"),
    "pageable_copies": DetectorEntry(_CORE, "pageable_copies"),
    "unfused_attention": DetectorEntry(_MODEL, "unfused_attention"),
    "layout_conversions": DetectorEntry(_MODEL, "layout_conversions", retime="layout_conversions_timed"),
    "fp32_compute": DetectorEntry(_MODEL, "fp32_compute", retime="fp32_compute_timed"),
    "optimizer_loop": DetectorEntry(_MODEL, "optimizer_loop", retime="optimizer_loop_timed"),
    "optimizer_foreach": DetectorEntry(_MODEL, "optimizer_foreach", retime="optimizer_foreach_timed"),
    "misaligned_gemm": DetectorEntry(_MODEL, "misaligned_gemm"),
    "exposed_communication": DetectorEntry(_DISTRIBUTED, "exposed_communication"),
    "straggler_rank": DetectorEntry(_DISTRIBUTED, "straggler_rank"),
    "allocator_fragmentation": DetectorEntry(_MEMORY, "allocator_fragmentation"),
    "kv_cache_capacity": DetectorEntry(_MEMORY, "kv_cache_capacity"),
    "memory_headroom": DetectorEntry(_MEMORY, "memory_headroom"),
    "bank_conflicts_static": DetectorEntry("gpuadvisor.scan.report", "bank_conflicts_static"),
    "bank_conflicts_measured": DetectorEntry("gpuadvisor.ncu.counters", "bank_conflicts_measured"),
}


def detector_function(name: str) -> Detector:
    """The detector registered as ``name`` (its module imported now)."""
    import importlib

    entry = DETECTORS[name]
    return getattr(importlib.import_module(entry.module), entry.function)


def retime_function(name: str) -> Retimer | None:
    """How the detector ``name`` re-derives its saving against a timed step, or None (the saving stays)."""
    import importlib

    entry = DETECTORS.get(name)
    if entry is None or entry.retime is None:
        return None
    return getattr(importlib.import_module(entry.module), entry.retime)


def _fail(path: Path, message: str) -> BadInputError:
    return BadInputError(f"{path}: {message}")


# Detectors that read something other than a trace, and the ``needs`` entry that keeps a rule bound to one from
# running on a trace (`analyze`, `profile` skip it and say why; `scan` and `ncu` run it).
DETECTOR_INPUTS = {"bank_conflicts_static": "cuda_sources", "bank_conflicts_measured": "ncu_counters"}
_INPUT_WORDS = {
    "cuda_sources": "CUDA sources (gpuadvisor scan)",
    "ncu_counters": "Nsight Compute counters (gpuadvisor ncu)",
}


def parse_rule(path: Path) -> Rule:
    """Read and validate one rule file: a regular file of at most 1 MiB, TOML nested at most 200 deep, numbers
    finite (:mod:`gpuadvisor.inputs`). Titles, docs and references keep no control characters: they are escaped
    here (:mod:`gpuadvisor.textsafe`), so that every renderer shows them as text."""
    from gpuadvisor.inputs import InputError, decode_toml, read_text
    from gpuadvisor.textsafe import escape_control

    try:
        data = decode_toml(read_text(path, "rule"), str(path))
    except InputError as exc:
        raise _fail(path, str(exc).removeprefix(f"rule file {path}: ").removeprefix(f"{path}: ")) from None
    for key in _REQUIRED:
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise _fail(path, f"missing or empty '{key}'")
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise _fail(path, f"unknown key(s) {', '.join(sorted(unknown))}")
    if not _ID_RE.match(data["id"]):
        raise _fail(path, f"id '{data['id']}' is not of the form GA<1-7><00-99>")
    if not _NAME_RE.match(data["name"]):
        raise _fail(path, f"name '{data['name']}' is not kebab-case")
    if data["severity"] not in SEVERITIES:
        raise _fail(path, f"severity '{data['severity']}' is not one of {', '.join(SEVERITIES)}")
    if data["category"] not in CATEGORIES:
        raise _fail(path, f"category '{data['category']}' is not one of {', '.join(CATEGORIES)}")
    thresholds = data.get("thresholds", {})
    if not isinstance(thresholds, dict):
        raise _fail(path, "'thresholds' must be a table")
    for key, value in thresholds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, f"threshold '{key}' must be a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise _fail(path, f"threshold '{key}' must be a finite number, not {value}")
    doc = data.get("doc", {})
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), str) or not doc[k].strip() for k in _DOC_FIELDS):
        raise _fail(path, "[doc] must have non-empty what, why, example and fix")
    needs = data.get("needs", [])
    if not isinstance(needs, list) or any(n not in NEEDS for n in needs):
        raise _fail(path, f"'needs' must list some of {', '.join(NEEDS)}")
    fix_id = data.get("fix_id")
    if fix_id is not None and not isinstance(fix_id, str):
        raise _fail(path, "'fix_id' must be a string")
    references = data.get("references", [])
    if not isinstance(references, list) or any(not isinstance(r, str) for r in references):
        raise _fail(path, "'references' must be a list of strings")
    basis = data.get("saving_basis", UPPER_BOUND)
    if basis not in SAVING_BASES:
        raise _fail(path, f"saving_basis '{basis}' is not one of {', '.join(SAVING_BASES)}")
    saving_from = data.get("saving_from", "step")
    if saving_from not in SAVING_SOURCES:
        raise _fail(path, f"saving_from '{saving_from}' is not one of {', '.join(SAVING_SOURCES)}")
    reads = DETECTOR_INPUTS.get(data["detector"])
    if reads is not None and reads not in needs:
        raise _fail(
            path,
            f"detector '{data['detector']}' reads {_INPUT_WORDS[reads]}, not a trace: add \"{reads}\" to needs "
            "(so that analyze and profile skip the rule)",
        )
    return Rule(
        id=data["id"],
        name=data["name"],
        title=escape_control(data["title"].strip()),
        category=data["category"],
        severity=data["severity"],
        detector=escape_control(data["detector"]),
        thresholds={escape_control(k): float(v) for k, v in thresholds.items()},
        doc={k: escape_control(doc[k].strip(), keep_newlines=True) for k in _DOC_FIELDS},
        fix_id=escape_control(fix_id) if fix_id is not None else None,
        needs=list(needs),
        references=[escape_control(r) for r in references],
        path=escape_control(str(path)),
        saving_basis=basis,
        saving_from=saving_from,
    )


def load_rules(extra_dir: str | Path | None = None) -> list[Rule]:
    """The built-in catalog, plus (overriding by id) the rules in ``extra_dir``. Sorted by id."""
    rules: dict[str, Rule] = {}
    for path in sorted(CATALOG_DIR.glob("*.toml")):
        rule = parse_rule(path)
        rules[rule.id] = rule
    if extra_dir is not None:
        folder = Path(extra_dir)
        if not folder.is_dir():
            raise BadInputError(f"{folder}: --rules must name a folder of *.toml rule files")
        try:
            files = sorted(folder.glob("*.toml"))
        except OSError as exc:
            raise BadInputError(f"{folder}: cannot list --rules: {exc.strerror or exc}") from None
        if not files:
            raise BadInputError(f"{folder}: no *.toml rule files")
        first_in_folder: dict[str, Rule] = {}
        for path in files:  # in name order: of two files with one id, the later name wins (and we say so)
            rule = parse_rule(path)
            earlier = first_in_folder.get(rule.id)
            if earlier is not None:
                _warn_once(
                    f"warning: --rules {folder}: rule {rule.id} is defined in {Path(earlier.path).name} and in "
                    f"{path.name}; {path.name} wins (the last in name order)"
                )
            first_in_folder[rule.id] = rule
            rules[rule.id] = rule
    known = set(DETECTORS)
    for rule in rules.values():
        if rule.detector not in known:
            raise BadInputError(f"{rule.path}: unknown detector '{rule.detector}' (known: {', '.join(sorted(known))})")
    return [rules[k] for k in sorted(rules)]


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """One warning line on stderr, once per process (the rules are loaded more than once by some commands)."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    from gpuadvisor.textsafe import escape_control

    sys.stderr.write(escape_control(" ".join(message.split())) + "\n")
    sys.stderr.flush()


def find_rule(rule_id: str, rules: list[Rule]) -> Rule:
    wanted = rule_id.strip().upper()
    for rule in rules:
        if rule.id == wanted or rule.name == rule_id.strip().lower():
            return rule
    raise BadInputError(f"no rule '{rule_id}' (see `gpuadvisor rules`)")


def missing_needs(rule: Rule, analysis: Any) -> str | None:
    """Why the trace cannot feed this rule, or None."""
    trace = analysis.trace
    have = {
        "kernels": len(trace.kernels) > 0,
        "runtime": len(trace.runtime) > 0,
        "cpu_ops": len(trace.cpu_ops) > 0,
        "memcpys": len(trace.memcpys) > 0,
        "steps": len(analysis.steps) > 0,
        "shapes": any(bytes(raw) != b"null" for raw in trace.cpu_ops["input_dims_raw"]),
        "stacks": len(trace.python_frames) > 0,
        "cuda_sources": False,  # GA501 reads CUDA sources: `gpuadvisor scan`
        "ncu_counters": False,  # GA502 reads Nsight Compute counters: `gpuadvisor ncu`
    }
    why = {
        "kernels": "no GPU kernels in the trace",
        "runtime": "no CUDA runtime calls in the trace",
        "cpu_ops": "no CPU operators in the trace",
        "memcpys": "no memcpy/memset in the trace",
        "steps": "no steps (no GPU activity to frame one)",
        "shapes": "no input shapes (record with record_shapes=True)",
        "stacks": "no Python stacks (record with with_stack=True)",
        "cuda_sources": "needs CUDA sources (run `gpuadvisor scan`)",
        "ncu_counters": "needs Nsight Compute counters (run `gpuadvisor ncu`)",
    }
    for need in rule.needs:
        if not have[need]:
            return why[need]
    return None


def run_rules(analysis: Any, rules: list[Rule]) -> tuple[list[Finding], list[dict[str, str]]]:
    """Run each rule's detector. Returns findings sorted by estimated saving (largest first) and the
    skipped rules with their reasons."""
    findings: list[Finding] = []
    skipped: list[dict[str, str]] = []
    for rule in rules:
        reason = missing_needs(rule, analysis)
        if reason:
            skipped.append({"rule_id": rule.id, "reason": reason})
            continue
        try:
            result = detector_function(rule.detector)(analysis, rule)
        except SkipRule as exc:
            skipped.append({"rule_id": rule.id, "reason": str(exc)})
            continue
        if result is None:
            continue
        findings.extend(result if isinstance(result, list) else [result])
    findings.sort(key=rank_key)
    return findings, skipped


def rank_key(finding: Finding | dict[str, Any]) -> tuple[float, int, str]:
    """The sort key of the findings' order (the module docstring states the rule): ranking saving (upper
    bounds x UPPER_BOUND_RANK_FACTOR) largest first, then severity, then rule id. Takes a Finding or a
    report's finding dict (one without ``saving_basis``, from an older report, ranks as a saving with a fix)."""
    get = finding.get if isinstance(finding, dict) else lambda key, default=None: getattr(finding, key, default)
    saving = get("estimated_saving_us_per_step")
    saving = float(saving) if isinstance(saving, (int, float)) and saving == saving else 0.0
    if get("saving_basis") == UPPER_BOUND:
        saving *= UPPER_BOUND_RANK_FACTOR
    return (-saving, SEVERITY_RANK.get(str(get("severity")), 9), str(get("rule_id") or ""))


def combined_estimate(findings: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """What the findings save together, without counting the same idle time or kernel time twice.

    Each finding's saving comes out of one share of the step (``saving_from``: launch idle, sync idle, copy
    time, kernel time, or the step as a whole). Within one share of size S the savings combine as independent
    fractions of it, S x (1 - prod(1 - s_i / S)); the shares are disjoint parts of the step, so their combined
    savings add; savings out of the whole step combine with that sum the same way against the step. Savings
    with a fix behind them and upper bounds are combined separately (the second figure is "up to").

    Returns {combined_saving_us, combined_saving_pct, combined_upper_bound_us, combined_upper_bound_pct,
    combined_saving_basis} (None without a step time)."""
    step = summary.get("step_time_us")
    basis = (
        "savings grouped by the share of the step they come out of (launch idle, sync idle, copies, kernels); "
        "independent fractions within a share, S x (1 - prod(1 - s_i/S)), added across shares; upper bounds "
        "combined separately"
    )
    out: dict[str, Any] = {
        "combined_saving_us": None,
        "combined_saving_pct": None,
        "combined_upper_bound_us": None,
        "combined_upper_bound_pct": None,
        "combined_saving_basis": basis,
    }
    if not isinstance(step, (int, float)) or step <= 0:
        return out
    for upper, prefix in ((False, "combined_saving"), (True, "combined_upper_bound")):
        remaining: dict[str, float] = {}
        for finding in findings:
            saving = finding.get("estimated_saving_us_per_step")
            if (finding.get("saving_basis") == UPPER_BOUND) != upper:
                continue
            if not isinstance(saving, (int, float)) or saving <= 0:
                continue
            source = finding.get("saving_from") or "step"
            size = summary.get(SAVING_SOURCES.get(source) or "")
            if not isinstance(size, (int, float)) or size <= 0:
                source, size = "step", step
            size = min(float(size), float(step))
            remaining[source] = remaining.get(source, 1.0) * (1.0 - min(float(saving) / size, 1.0))
        shares = 0.0
        for source, left in remaining.items():
            if source != "step":
                size = min(float(summary[SAVING_SOURCES[source]]), float(step))
                shares += size * (1.0 - left)
        shares = min(shares, float(step))
        total = step - (step - shares) * remaining.get("step", 1.0)
        out[f"{prefix}_us"] = round(total, 1)
        out[f"{prefix}_pct"] = round(100.0 * total / step, 1)
    return out


def retime_saving(
    finding: dict[str, Any],
    rule: Rule | None,
    timed_us: float,
    profiled_us: float | None,
    timed: dict[str, Any] | None = None,
) -> float:
    """A finding's saving against the timed step, as its detector re-derives it (:class:`DetectorEntry`'s
    ``retime``), clipped to 0 ... timed step; appends the detector's text to the finding's message. ``timed``:
    the other figures of the timed steps (the report's summary: e.g. ``optimizer_step_host_us``)."""
    saving = finding.get("estimated_saving_us_per_step") or 0.0
    fn = retime_function(rule.detector) if rule is not None else None
    if fn is not None:
        saving, extra = fn(finding, rule, timed_us, profiled_us, timed or {})
        if extra:
            finding["message"] = f"{finding['message']} {extra}"
    return min(max(0.0, float(saving)), float(timed_us))


def make_finding(
    rule: Rule,
    analysis: Any,
    message: str,
    evidence: dict[str, Any],
    saving_us: float,
    severity: str | None = None,
    *,
    fix: str | None = None,
    basis: str | None = None,
) -> Finding:
    """A finding for ``rule`` with its saving expressed per step and as % of the median step (``analysis``
    None: no step to compare with, as for ``scan`` and ``ncu``). ``fix`` replaces the rule's own first line;
    ``basis`` the rule's saving_basis (a detector whose figure rests on a measurement or on a roof depending on
    what the trace holds). An upper bound's message says "up to" (the detector words it so, or it is added)."""
    step = analysis.step_time_us if analysis is not None else None
    saving = max(0.0, float(saving_us))
    pct = 100.0 * saving / step if step else None
    basis = basis or rule.saving_basis
    if basis not in SAVING_BASES:
        raise ValueError(f"saving basis '{basis}' is not one of {SAVING_BASES}")
    message = " ".join(message.split())
    if basis == UPPER_BOUND and saving > 0 and "up to" not in message:
        message += f" Saving: up to {saving:,.0f} µs per step (an upper bound: no fix stands behind it)."
    return Finding(
        rule_id=rule.id,
        name=rule.name,
        title=rule.title,
        severity=severity or rule.severity,
        category=rule.category,
        message=message,
        evidence=evidence,
        estimated_saving_us_per_step=round(saving, 1),
        estimated_saving_pct=round(pct, 1) if pct is not None else None,
        fix_id=rule.fix_id,
        fix=fix or rule.doc["fix"].split("\n\n")[0].split("\n")[0],
        saving_basis=basis,
        saving_from=rule.saving_from,
    )
