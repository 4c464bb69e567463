"""Each lever rule's estimated saving against its own fix applied alone, on the suite model it fires on.

For each (model, rule, fix) pair below this runs ``gpuadvisor apply MODEL --fix FIX --out DIR`` (one fix, so
the measured saving is that fix's alone: before and after timed interleaved in one process, CUDA events) and
reads from its report the rule's estimate on the before side (``estimated_saving_us_per_step``, rescaled to the
timed step as ``analyze``/``profile`` report it), the fix's status and the measured saving: median before -
median after, or, where the run timed at least 6 rounds, before x (1 - 1 / the paired speedup), the median of
the per-round ratios (:func:`measured_saving`; the pooled difference is kept beside it). A pair is within
the issue's bound when ``|measured - estimated| <= 0.30 * |estimated|``. Where the rule capped its saving by
the eager step's host time (GA203, GA302: ``evidence["expected_alone_us"]``, the signed change it expects from
the fix alone, negative when the fix alone makes a host-bound step slower), that signed figure is the estimate
judged; the clipped saving is kept beside it as ``estimated_saving_us``.

A manual lever (``MANUAL``: ``pad_vocab``, the padded vocabulary GA303 advises) has no ``--fix``: the pair runs
``gpuadvisor profile MODEL`` for the estimate, then times the model's ``build`` and the lever's build function
interleaved in one child process (CUDA events, ``--rounds`` rounds of ``--steps`` steps each, after warm-up).

A pair may name a batch, ``MODEL:RULE:FIX:batch=N``: the workload runs at batch N (GPUADVISOR_REAL_BATCH; the
conv-net training steps have one). A ResNet-50 training step at batch 64 takes as long to enqueue on the H200's
host as to run on its GPU, so a GPU saving shows only in part and its measured size moves with the host's
speed (two runs of channels_last alone: +367 and +2,840 µs); at a larger batch the GPU bounds the step.

Usage (GPU): ``python3 benchmarks/rule_vs_fix.py --out benchmarks/results/rule_vs_fix.json [--pairs ...]``

Without a GPU: ``--rejudge`` re-derives the estimates of pairs already in ``--base`` from the apply runs kept in
``--apply-dir``; ``--from-kept REPORT:TRACE --pairs MODEL:RULE:FIX`` adds a pair from an ``apply --fix FIX`` run
kept elsewhere (a committed report.json and its before trace), its measured saving that run's and its estimate
re-derived with this checkout's rules. Such an entry names its files in ``kept_run`` and stays beside the pair's
other runs.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAIRS = (
    ("hf_gpt2_eager_attention", "GA202", "sdpa"),
    ("timm_resnet50_train", "GA203", "channels_last"),
    ("timm_resnet50_train", "GA302", "bf16"),
    ("hf_gpt2_train_foreach_off", "GA204", "fused_optimizer"),
    ("hf_bert_finetune_amp", "GA205", "fused_optimizer"),
    ("hf_gpt2_eager_attention", "GA303", "pad_vocab"),
    # At batch 1 the host bounds the ViT's eager step and TF32 alone saves nothing; at 32 the GPU bounds it.
    ("hf_vit_infer", "GA301", "tf32", 32),
)
# Manual levers: a pair whose fix is one of these is measured as the user would make it, by a build function of
# the model file that makes the change (the rule's own fix, e.g. GA303's compile, does more than the rule
# estimates: it also fuses the step's elementwise chains). Its estimate comes from ``gpuadvisor profile`` of the
# original, the measured saving from the two builds timed interleaved in one process (``--time-builds``).
MANUAL = {"pad_vocab": "build_padded_vocab"}
BOUND = 0.30


def _pair_key(model: str, rule: str, fix: str, batch: int | None = None) -> str:
    return f"{model}:{rule}:{fix}" + (f":batch={batch}" if batch else "")


def parse_pair(text: str) -> tuple[str, str, str, int | None]:
    """``MODEL:RULE:FIX`` or ``MODEL:RULE:FIX:batch=N`` (the workload at batch N: GPUADVISOR_REAL_BATCH)."""
    parts = text.split(":")
    if len(parts) == 3:
        return parts[0], parts[1], parts[2], None
    if len(parts) == 4 and parts[3].startswith("batch=") and parts[3][6:].isdigit():
        return parts[0], parts[1], parts[2], int(parts[3][6:])
    raise SystemExit(f"error: a pair is MODEL:RULE:FIX or MODEL:RULE:FIX:batch=N, got {text!r}")


def _child_env(batch: int | None) -> dict:
    env = dict(os.environ)
    if batch:
        env["GPUADVISOR_REAL_BATCH"] = str(batch)
    return env


def _pair_head(model: str, rule: str, fix: str, batch: int | None, options: str) -> dict:
    """A pair entry's first fields: what it is and the apply command behind its measurement."""
    return {
        "model": model,
        "rule": rule,
        "fix": fix,
        "batch": batch,
        "command": (f"GPUADVISOR_REAL_BATCH={batch} " if batch else "")
        + f"python3 -m gpuadvisor apply examples/real/{model}.py --fix {fix} {options}",
    }


def _replace_run(pairs: list[dict], entry: dict) -> tuple[list[dict], list[dict]]:
    """``pairs`` with ``entry`` in place of the earlier runs of its pair, and those earlier runs. An entry built
    from a kept apply run (``kept_run``) is another measurement of the pair and is never replaced by a run."""
    key = _pair_key(entry["model"], entry["rule"], entry["fix"], entry.get("batch"))

    def same(p: dict) -> bool:
        return not p.get("kept_run") and _pair_key(p["model"], p["rule"], p["fix"], p.get("batch")) == key

    return [p for p in pairs if not same(p)] + [entry], [p for p in pairs if same(p)]


def _merge_run(doc: dict, entry: dict) -> None:
    """``entry`` (a run of its pair, dated) in ``doc``'s pairs; the earlier run it replaces stays on record in
    ``earlier_runs``, marked as replaced."""
    doc["pairs"], replaced = _replace_run(doc["pairs"], entry)
    if replaced:
        doc.setdefault("earlier_runs", []).extend({**p, "replaced_by": entry["date"]} for p in replaced)


def merge_runs(base: dict, run_paths: list[str], wanted: set[str]) -> None:
    """The entries of the pairs in ``wanted`` that each run file in ``run_paths`` ran itself (dated as the run,
    not merged in from its own base), merged into ``base`` in order as those runs would have been, each run's
    command appended to ``base``'s. Refuses a run from another GPU than ``base``'s, one without such a pair, and
    one ``base`` already holds (among its pairs or earlier runs)."""
    for run_path in run_paths:
        try:
            run = json.loads(Path(run_path).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"error: cannot read {run_path}: {exc}") from None
        if run.get("gpu") != base.get("gpu"):
            raise SystemExit(f"error: {run_path} ran on {run.get('gpu')}, not {base.get('gpu')} as --base did")
        entries = [
            p
            for p in run.get("pairs", [])
            if p.get("date") == run.get("date") and _pair_key(p["model"], p["rule"], p["fix"], p.get("batch")) in wanted
        ]
        if not entries:
            raise SystemExit(f"error: {run_path} did not run any of --pairs")
        held = {(p.get("date"), p.get("command")) for p in [*base.get("pairs", []), *base.get("earlier_runs", [])]}
        if any((entry["date"], entry.get("command")) in held for entry in entries):
            raise SystemExit(f"error: --base already holds the run of {run_path} ({run['date']})")
        for entry in entries:
            _merge_run(base, entry)
            print(
                entry["model"],
                entry["rule"],
                entry["fix"],
                entry.get("batch"),
                entry["date"],
                entry["estimate_judged_us"],
                entry["measured_saving_us"],
                entry.get("within_30pct"),
            )
        base.setdefault("commands", []).append(run["command"])


def run_pair(
    model: str, rule: str, fix: str, out_dir: Path, rounds: int, steps: int, timeout_s: float, batch: int | None = None
) -> dict:
    folder = out_dir / f"{model}.{fix}" if not batch else out_dir / f"{model}.b{batch}.{fix}"
    command = [
        sys.executable,
        "-m",
        "gpuadvisor",
        "apply",
        str(ROOT / "examples" / "real" / f"{model}.py"),
        "--fix",
        fix,
        "--rounds",
        str(rounds),
        "--steps",
        str(steps),
        "--out",
        str(folder),
        "--format",
        "json",
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=_child_env(batch)
        )
        rc, err = done.returncode, done.stderr[-1500:]
    except subprocess.TimeoutExpired:
        rc, err = 124, "timed out"
    entry = {
        **_pair_head(model, rule, fix, batch, f"--rounds {rounds} --steps {steps} --out {folder.name}"),
        "rc": rc,
        "seconds": round(time.monotonic() - started, 1),
    }
    report_path = folder / "report.json"
    if rc or not report_path.is_file():
        entry["error"] = err
        return entry
    report = json.loads(report_path.read_text())
    before = report.get("before", {})
    findings = before.get("findings") or report.get("findings") or []
    finding = next((f for f in findings if f.get("rule_id") == rule), None)
    outcome = next((f for f in report.get("fixes", []) if f.get("fix_id") == fix), {})
    before_us = before.get("step_time_us")
    after_us = report.get("after", {}).get("step_time_us")
    saving = finding.get("estimated_saving_us_per_step") if finding else None
    alone = ((finding or {}).get("evidence") or {}).get("expected_alone_us")
    estimated = alone if isinstance(alone, (int, float)) else saving
    measured, pooled = measured_saving(before_us, after_us, report.get("speedup"))
    entry.update(
        {
            "fired": finding is not None,
            "estimated_saving_us": saving,
            "estimated_alone_us": alone,
            "estimate_judged_us": estimated,
            "host_enqueue_us": ((finding or {}).get("evidence") or {}).get("host_enqueue_us"),
            "host_after_fix_us": ((finding or {}).get("evidence") or {}).get("host_after_fix_us"),
            # the after side's own probe: what the host-capped estimate assumed, measured
            "host_after_fix_measured_us": report.get("after", {}).get("host_enqueue_us"),
            "gpu_saving_us": ((finding or {}).get("evidence") or {}).get("gpu_saving_us"),
            "tf32_step_delta_us": ((finding or {}).get("evidence") or {}).get("tf32_step_delta_us"),
            "estimated_saving_pct": finding.get("estimated_saving_pct") if finding else None,
            "basis": (finding.get("evidence") or {}).get("basis") if finding else None,
            "fix_status": outcome.get("status"),
            "fix_reason": outcome.get("reason"),
            "numerics": (outcome.get("numerics") or {}).get("detail"),
            "before_us": before_us,
            "after_us": after_us,
            "speedup": report.get("speedup"),
            "measured_saving_us": measured,
            "measured_saving_pooled_us": pooled,
            "measured_saving_pct": round(100.0 * measured / before_us, 2) if measured is not None else None,
        }
    )
    if estimated and measured is not None:
        entry["measured_over_estimated"] = round(measured / estimated, 3)
        entry["within_30pct"] = abs(measured - estimated) <= BOUND * abs(estimated)
    add_saving_interval(entry)
    return entry


def from_kept(model: str, rule: str, fix: str, batch: int | None, report_path: Path, trace_path: Path) -> dict:
    """A pair from an ``apply --fix FIX`` run made earlier and kept (its report.json and before trace, e.g. one
    committed under benchmarks/results/): the measured saving is that run's (median before - median after,
    timed interleaved in its process), the estimate is re-derived from its before trace with this checkout's
    rules (:func:`rejudge`). No GPU needed."""
    for path in (report_path, trace_path):
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file")
    try:
        report = json.loads(report_path.read_text())
    except ValueError as error:
        raise SystemExit(f"error: {report_path}: not a JSON report ({error})") from None
    if not isinstance(report, dict):
        raise SystemExit(f"error: {report_path}: not an apply report")
    before, after = report.get("before") or {}, report.get("after") or {}
    outcome = next((f for f in report.get("fixes", []) if f.get("fix_id") == fix), None)
    if outcome is None or (report.get("source") or {}).get("fix_ids") != [fix]:
        raise SystemExit(f"error: {report_path} is not an apply run of --fix {fix} alone")
    rounds = len(before.get("round_medians_us") or [])
    steps = len(before.get("samples_us") or []) // max(1, rounds)
    before_us, after_us = before.get("step_time_us"), after.get("step_time_us")
    entry = {
        **_pair_head(model, rule, fix, batch, f"--rounds {rounds} --steps {steps}"),
        "kept_run": {"report": _relative(report_path), "before_trace": _relative(trace_path)},
        "rc": 0,
        "fix_status": outcome.get("status"),
        "fix_reason": outcome.get("reason"),
        "numerics": (outcome.get("numerics") or {}).get("detail"),
        "host_enqueue_us": before.get("host_enqueue_us"),
        "host_after_fix_measured_us": after.get("host_enqueue_us"),
        "before_us": before_us,
        "after_us": after_us,
        "speedup": report.get("speedup"),
    }
    entry["measured_saving_us"], entry["measured_saving_pooled_us"] = measured_saving(
        before_us, after_us, report.get("speedup")
    )
    if entry["measured_saving_us"] is not None:
        entry["measured_saving_pct"] = round(100.0 * entry["measured_saving_us"] / before_us, 2)
    return rejudge(entry, report_path, trace_path)


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def measured_saving(before_us, after_us, speedup: dict | None) -> tuple[float | None, float | None]:
    """(the saving judged, the pooled median before - median after). Where the run timed enough rounds for a
    paired speedup (``speedup.paired``: the median of per-round ratios, each round's two blocks back to back),
    the saving judged is before x (1 - 1 / paired speedup): on a host whose speed drifts over seconds (the
    H200 machine's vCPUs, benchmarks/results/host_noise.json) the pooled medians mix speeds the rounds saw at
    different times, and the pairing cancels that. Otherwise it is the pooled difference."""
    if not before_us or not after_us:
        return None, None
    pooled = round(before_us - after_us, 2)
    paired = (speedup or {}).get("paired") or {}
    ratio = paired.get("median")
    if isinstance(ratio, (int, float)) and ratio > 0:
        return round(before_us * (1.0 - 1.0 / ratio), 2), pooled
    return pooled, pooled


def add_saving_interval(entry: dict) -> None:
    """The measured saving's 95% interval, from the speedup's (saving = before - before / speedup), and whether
    the estimate falls inside it: where the step's own noise is wider than 30% of the estimate (a host-bound
    step whose host time varies between rounds), that is the test the measurement can make."""
    speedup, before = entry.get("speedup") or {}, entry.get("before_us")
    speedup = speedup.get("paired") or speedup  # the interval of the figure judged (measured_saving)
    low, high = speedup.get("ci_low"), speedup.get("ci_high")
    if not before or not low or not high:
        return
    interval = [round(before - before / low, 1), round(before - before / high, 1)]
    entry["measured_saving_ci_us"] = interval
    estimate = entry.get("estimate_judged_us")
    if isinstance(estimate, (int, float)):
        entry["estimate_within_ci"] = interval[0] <= estimate <= interval[1]


def time_builds(model: str, entries: list[str], rounds: int, steps: int) -> dict:
    """Child: each build of the model file timed interleaved; {entry: samples_us}."""
    import torch

    sys.path.insert(0, str(ROOT))
    from real_models import time_group  # the suite benchmark's interleaved timing (this file's folder)

    from gpuadvisor.workload import load_workload

    path = str(ROOT / "examples" / "real" / f"{model}.py")
    workloads = {entry: load_workload(path, entry if entry != "build" else None) for entry in entries}
    cuda = torch.cuda.is_available()
    for workload in workloads.values():
        for _ in range(5):
            workload.step_fn()
    if cuda:
        torch.cuda.synchronize()
    errors: dict[str, str] = {}
    samples = time_group({entry: w.step_fn for entry, w in workloads.items()}, steps, rounds, cuda, errors)
    if errors:
        raise RuntimeError(f"a build failed while timed: {errors}")
    return samples


def run_manual_pair(model: str, rule: str, fix: str, out_dir: Path, rounds: int, steps: int, timeout_s: float) -> dict:
    from statistics import median

    sys.path.insert(0, str(ROOT))
    from gpuadvisor.stats import speedup_interval

    folder = out_dir / f"{model}.{fix}"
    path = ROOT / "examples" / "real" / f"{model}.py"
    entry_name = MANUAL[fix]
    entry = {
        "model": model,
        "rule": rule,
        "fix": fix,
        "command": f"python3 -m gpuadvisor profile examples/real/{model}.py --out {folder.name}; then the builds "
        f"build and {entry_name} timed interleaved ({rounds} rounds of {steps} steps)",
    }
    started = time.monotonic()
    profile = [sys.executable, "-m", "gpuadvisor", "profile", str(path), "--out", str(folder), "--format", "json"]
    timing_json = out_dir / f"{model}.{fix}.timing.json"
    child = [
        sys.executable,
        __file__,
        "--time-builds",
        f"{model}:build,{entry_name}",
        "--rounds",
        str(rounds),
        "--steps",
        str(steps),
        "--out",
        str(timing_json),
    ]
    try:
        for command in (profile, child):
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
            if done.returncode != 0:
                entry.update(rc=done.returncode, error=done.stderr[-1500:])
                return entry
    except subprocess.TimeoutExpired:
        entry.update(rc=124, error="timed out")
        return entry
    entry.update(rc=0, seconds=round(time.monotonic() - started, 1))
    report = json.loads((folder / "report.json").read_text())
    finding = next((f for f in report.get("findings") or [] if f.get("rule_id") == rule), None)
    samples = json.loads(timing_json.read_text())
    before, after = samples["build"], samples[entry_name]
    estimated = finding.get("estimated_saving_us_per_step") if finding else None
    measured = median(before) - median(after)
    entry.update(
        {
            "fired": finding is not None,
            "estimated_saving_us": estimated,
            "estimate_judged_us": estimated,
            "estimated_saving_pct": finding.get("estimated_saving_pct") if finding else None,
            "basis": (finding.get("evidence") or {}).get("basis") if finding else None,
            "fix_status": "measured (manual lever)",
            "before_us": round(median(before), 2),
            "after_us": round(median(after), 2),
            "speedup": speedup_interval(before, after),
            "measured_saving_us": round(measured, 2),
            "measured_saving_pct": round(100.0 * measured / median(before), 2),
        }
    )
    if estimated:
        entry["measured_over_estimated"] = round(measured / estimated, 3)
        entry["within_30pct"] = abs(measured - estimated) <= BOUND * abs(estimated)
    add_saving_interval(entry)
    return entry


def rejudge(entry: dict, report_path: Path, trace_path: Path) -> dict:
    """The pair's estimate re-derived with this checkout's rules from the apply run it kept (its report.json and
    before trace: the timed step and host time as that run measured them); the measured saving stays the run's.
    No GPU needed."""
    from gpuadvisor.pipeline import analyze_path
    from gpuadvisor.report.profiled import rescale_savings
    from gpuadvisor.rules.engine import load_rules

    kept = json.loads(report_path.read_text())
    report = analyze_path(trace_path)
    summary = report["summary"]
    summary["trace_step_time_us"] = summary.get("step_time_us")
    # The before side's figures: the report's summary is the after side's (an apply report describes the result),
    # and a report older than the side's optimizer_step_host_us has none for the before side (None: the rule
    # then scales its profiled region by timed / profiled step).
    for key in (
        "step_time_us",
        "host_enqueue_us",
        "optimizer_step_host_us",
        "tf32_step_delta_us",
        "tf32_step_delta_rounds",
    ):
        summary[key] = (kept.get("before") or {}).get(key)
    rescale_savings(report, load_rules())
    finding = next((f for f in report["findings"] if f.get("rule_id") == entry["rule"]), None)
    evidence = (finding or {}).get("evidence") or {}
    saving = finding.get("estimated_saving_us_per_step") if finding else None
    alone = evidence.get("expected_alone_us")
    estimated = alone if isinstance(alone, (int, float)) else saving
    entry.update(
        fired=finding is not None,
        estimated_saving_us=saving,
        estimated_alone_us=alone,
        estimate_judged_us=estimated,
        gpu_saving_us=evidence.get("gpu_saving_us"),
        host_after_fix_us=evidence.get("host_after_fix_us"),
        estimated_saving_pct=finding.get("estimated_saving_pct") if finding else None,
        basis=evidence.get("basis"),
        estimate_rederived="from the kept before trace with the rules of the checkout that wrote this entry",
    )
    measured = entry.get("measured_saving_us")
    if estimated and measured is not None:
        entry["measured_over_estimated"] = round(measured / estimated, 3)
        entry["within_30pct"] = abs(measured - estimated) <= BOUND * abs(estimated)
    add_saving_interval(entry)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apply-dir", type=Path, default=Path("/tmp/rule_vs_fix"))
    parser.add_argument(
        "--pairs", default=None, help="comma-separated model:rule:fix or model:rule:fix:batch=N (default: all)"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=240)
    parser.add_argument("--base", type=Path, default=None, help="merge into this earlier result (by pair)")
    parser.add_argument("--time-builds", default=None, help=argparse.SUPPRESS)  # child: MODEL:ENTRY,ENTRY
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="no runs: re-derive the estimates of --pairs in --base from the apply runs kept in --apply-dir",
    )
    parser.add_argument(
        "--from-kept",
        metavar="REPORT:TRACE",
        help="no runs: the one pair of --pairs from a kept apply run (its report.json and before trace); "
        "merged into --base, written to --out",
    )
    parser.add_argument(
        "--merge",
        metavar="RUN.json[,RUN.json]",
        help="no runs: the entries of --pairs from earlier run files of this script (in the order given) merged "
        "into --base as those runs would have been (the pair's entry replaced, the old one kept in earlier_runs); "
        "each run file must name --base's GPU; written to --out",
    )
    args = parser.parse_args(argv)
    if args.merge:
        if not args.pairs or args.base is None:
            parser.error("--merge takes --pairs and a --base to merge into")
        base = json.loads(args.base.read_text())
        merge_runs(base, args.merge.split(","), {_pair_key(*parse_pair(p)) for p in args.pairs.split(",")})
        base.setdefault("commands", []).append(
            "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])])
        )
        args.out.write_text(json.dumps(base, indent=2, ensure_ascii=False) + "\n")  # as the committed files are
        return 0
    if args.from_kept:
        if not args.pairs or "," in args.pairs or args.base is None:
            parser.error("--from-kept takes one pair in --pairs and a --base to merge into")
        model, rule, fix, batch = parse_pair(args.pairs)
        report_path, _, trace_path = args.from_kept.partition(":")
        entry = from_kept(model, rule, fix, batch, Path(report_path), Path(trace_path))
        base = json.loads(args.base.read_text())
        key = _pair_key(model, rule, fix, batch)
        base["pairs"] = [  # the pair's own runs stay; only an earlier entry of this same kept run is replaced
            p
            for p in base["pairs"]
            if p.get("kept_run") != entry["kept_run"]
            or _pair_key(p["model"], p["rule"], p["fix"], p.get("batch")) != key
        ]
        base["pairs"].append(entry)
        base.setdefault("commands", []).append(
            "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])])
        )
        args.out.write_text(json.dumps(base, indent=2) + "\n")
        print(key, entry["estimate_judged_us"], entry["measured_saving_us"], entry.get("within_30pct"))
        return 0
    if args.rejudge:
        base = json.loads(args.base.read_text())
        wanted = {_pair_key(*parse_pair(p)) for p in args.pairs.split(",")} if args.pairs else None
        for entry in base["pairs"]:
            key = _pair_key(entry["model"], entry["rule"], entry["fix"], entry.get("batch"))
            folder = args.apply_dir / Path(entry["command"].rsplit("--out ", 1)[-1].split()[0]).name
            if (wanted is None or key in wanted) and (folder / "before_trace.json.gz").is_file():
                rejudge(entry, folder / "report.json", folder / "before_trace.json.gz")
                print(key, entry["estimate_judged_us"], entry["measured_saving_us"], entry["within_30pct"])
        base.setdefault("commands", []).append(
            "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])])
        )
        args.out.write_text(json.dumps(base, indent=2) + "\n")
        return 0
    if args.time_builds:
        model, entries = args.time_builds.split(":", 1)
        samples = time_builds(model, entries.split(","), args.rounds, args.steps)
        args.out.write_text(json.dumps(samples) + "\n")
        return 0
    pairs = [parse_pair(p) for p in args.pairs.split(",")] if args.pairs else [(*p, None)[:4] for p in PAIRS]
    import torch

    result = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "command": "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]),
        "bound": f"|measured - estimated| <= {BOUND} x |estimated| (estimated: expected_alone_us where given)",
        "pairs": [],
    }
    if args.base and args.base.is_file():
        base = json.loads(args.base.read_text())
        result["pairs"] = base.get("pairs", [])
        result["earlier_runs"] = base.get("earlier_runs", [])
        result["commands"] = [*base.get("commands", []), result["command"]]
        for key, value in base.items():  # what the file says of itself (method, kept_files) stays
            result.setdefault(key, value)
    for model, rule, fix, batch in pairs:
        args.apply_dir.mkdir(parents=True, exist_ok=True)
        if fix in MANUAL:
            if batch:
                raise SystemExit(f"error: {fix} is a manual lever, timed at the model's own batch only")
            entry = run_manual_pair(model, rule, fix, args.apply_dir, args.rounds, args.steps, args.timeout_s)
        else:
            entry = run_pair(model, rule, fix, args.apply_dir, args.rounds, args.steps, args.timeout_s, batch)
        entry["date"] = result["date"]
        _merge_run(result, entry)
        print(
            json.dumps(
                {
                    k: entry.get(k)
                    for k in (
                        "model",
                        "batch",
                        "rule",
                        "fix",
                        "rc",
                        "seconds",
                        "estimated_saving_us",
                        "estimate_judged_us",
                        "measured_saving_us",
                        "within_30pct",
                        "measured_saving_ci_us",
                        "estimate_within_ci",
                        "fix_status",
                    )
                }
            ),
            flush=True,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
