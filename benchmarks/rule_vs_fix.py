"""Each lever rule's estimated saving against its own fix applied alone, on the suite model it fires on.

For each (model, rule, fix) pair below this runs ``gpuadvisor apply MODEL --fix FIX --out DIR`` (one fix, so
the measured saving is that fix's alone: before and after timed interleaved in one process, CUDA events) and
reads from its report the rule's estimate on the before side (``estimated_saving_us_per_step``, rescaled to the
timed step as ``analyze``/``profile`` report it), the fix's status and the measured saving
(median before - median after). A pair is within the issue's bound when
``|measured - estimated| <= 0.30 * estimated``.

Usage (GPU): ``python3 benchmarks/rule_vs_fix.py --out benchmarks/results/rule_vs_fix.json [--pairs ...]``
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
    ("hf_gpt2_eager_attention", "GA303", "compile"),
)
BOUND = 0.30


def _pair_key(model: str, rule: str, fix: str) -> str:
    return f"{model}:{rule}:{fix}"


def run_pair(model: str, rule: str, fix: str, out_dir: Path, rounds: int, steps: int, timeout_s: float) -> dict:
    folder = out_dir / f"{model}.{fix}"
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
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        rc, err = done.returncode, done.stderr[-1500:]
    except subprocess.TimeoutExpired:
        rc, err = 124, "timed out"
    entry = {
        "model": model,
        "rule": rule,
        "fix": fix,
        "command": f"python3 -m gpuadvisor apply examples/real/{model}.py --fix {fix} --rounds {rounds} "
        f"--steps {steps} --out {folder.name}",
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
    estimated = finding.get("estimated_saving_us_per_step") if finding else None
    measured = (before_us - after_us) if before_us and after_us else None
    entry.update(
        {
            "fired": finding is not None,
            "estimated_saving_us": estimated,
            "estimated_saving_pct": finding.get("estimated_saving_pct") if finding else None,
            "basis": (finding.get("evidence") or {}).get("basis") if finding else None,
            "fix_status": outcome.get("status"),
            "fix_reason": outcome.get("reason"),
            "numerics": (outcome.get("numerics") or {}).get("detail"),
            "before_us": before_us,
            "after_us": after_us,
            "speedup": report.get("speedup"),
            "measured_saving_us": measured,
            "measured_saving_pct": round(100.0 * measured / before_us, 2) if measured is not None else None,
        }
    )
    if estimated and measured is not None:
        entry["measured_over_estimated"] = round(measured / estimated, 3)
        entry["within_30pct"] = abs(measured - estimated) <= BOUND * estimated
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apply-dir", type=Path, default=Path("/tmp/rule_vs_fix"))
    parser.add_argument("--pairs", default=None, help="comma-separated model:rule:fix (default: all)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=240)
    parser.add_argument("--base", type=Path, default=None, help="merge into this earlier result (by pair)")
    args = parser.parse_args(argv)
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs else list(PAIRS)
    import torch

    result = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "command": "python3 " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]),
        "bound": f"|measured - estimated| <= {BOUND} x estimated",
        "pairs": [],
    }
    if args.base and args.base.is_file():
        result["pairs"] = json.loads(args.base.read_text()).get("pairs", [])
    for model, rule, fix in pairs:
        entry = run_pair(model, rule, fix, args.apply_dir, args.rounds, args.steps, args.timeout_s)
        entry["date"] = result["date"]
        result["pairs"] = [
            p for p in result["pairs"] if _pair_key(p["model"], p["rule"], p["fix"]) != _pair_key(model, rule, fix)
        ]
        result["pairs"].append(entry)
        print(
            json.dumps(
                {
                    k: entry.get(k)
                    for k in (
                        "model",
                        "rule",
                        "fix",
                        "rc",
                        "seconds",
                        "estimated_saving_us",
                        "measured_saving_us",
                        "within_30pct",
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
