"""Does `gpuadvisor profile --nproc 2` measure a DDP job right? Two runs of examples/ddp_train.py on two GPUs.

    python3 benchmarks/ddp_profile_check.py --out "$OUT"      # on a machine with 2 CUDA GPUs, ~2-3 minutes

1. `python3 -m gpuadvisor profile --nproc 2 examples/ddp_train.py --out OUT/ddp`
2. the same with a planted straggler (GPUADVISOR_EXAMPLE_STRAGGLER_RANK=1, GPUADVISOR_EXAMPLE_STRAGGLER_MS=80:
   rank 1 sleeps 80 ms between forward and backward in every step, longer than a step of GPU work) into
   OUT/ddp_straggler.

For each run it records, per rank, the median step time of the CUDA-event timing phase (no profiler) beside the
step time the trace analysis finds in the profiled steps, and their difference in % (the acceptance line: within
5%); the GPU busy, communication and exposed communication per step; the straggler the analysis names and the
GA701/GA702 findings. Writes OUT/ddp_profile_check.json (the rank folders and reports stay in OUT/ddp*).
Exit code 0 when both runs succeeded, 1 otherwise (the JSON is written either way).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_train.py"
AGREEMENT_PCT = 5.0  # the acceptance line for trace vs CUDA-event step times


def gpus() -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def profile_run(name: str, out_root: Path, nproc: int, env_extra: dict[str, str], timeout_s: float) -> dict:
    out = out_root / name
    command = [
        sys.executable,
        "-m",
        "gpuadvisor",
        "profile",
        "--nproc",
        str(nproc),
        str(EXAMPLE),
        "--out",
        str(out),
        "-f",
        "json",
    ]
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL
    )
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: gpuadvisor stops torchrun and the ranks, leaves nothing
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
        returncode, stderr = None, f"timed out after {timeout_s} s: {stderr or ''}"
    wall_s = time.perf_counter() - start
    record: dict = {
        "command": " ".join(f"{k}={v}" for k, v in env_extra.items())
        + (" " if env_extra else "")
        + f"python3 -m gpuadvisor profile --nproc {nproc} examples/ddp_train.py --out {out}",
        "returncode": returncode,
        "wall_s": round(wall_s, 1),
        "stderr_tail": stderr[-2000:] if stderr else "",
    }
    report_path = out / "report.json"
    if returncode != 0 or not report_path.is_file():
        return record
    report = json.loads(report_path.read_text())
    ranks = report.get("ranks") or {}
    rows = []
    for row in ranks.get("rows", []):
        rows.append(
            {
                "rank": row.get("rank"),
                "cuda_event_median_us": row.get("timed_step_time_us"),
                "cuda_event_p10_us": row.get("timed_step_p10_us"),
                "cuda_event_p90_us": row.get("timed_step_p90_us"),
                "trace_step_time_us": row.get("step_time_us"),
                "trace_vs_cuda_event_pct": row.get("trace_vs_timed_pct"),
                "gpu_busy_pct": row.get("gpu_busy_pct"),
                "compute_us_per_step": row.get("compute_us_per_step"),
                "communication_us_per_step": row.get("communication_us_per_step"),
                "exposed_communication_us_per_step": row.get("exposed_communication_us_per_step"),
            }
        )
    differences = [abs(r["trace_vs_cuda_event_pct"]) for r in rows if r["trace_vs_cuda_event_pct"] is not None]
    findings = {f["rule_id"]: f for f in report.get("findings", []) if f["rule_id"] in ("GA701", "GA702")}
    record.update(
        env={k: report.get("env", {}).get(k) for k in ("gpu_name", "driver", "cuda", "torch", "python")},
        backend=ranks.get("backend"),
        matched_steps=ranks.get("matched_steps"),
        ranks=rows,
        max_abs_trace_vs_cuda_event_pct=max(differences) if differences else None,
        within_5_pct=(max(differences) <= AGREEMENT_PCT) if differences else None,
        straggler_named=ranks.get("straggler"),
        straggler_excess_wait_us_per_step=ranks.get("straggler_excess_wait_us_per_step"),
        findings={
            rule: {
                "message": f.get("message"),
                "estimated_saving_us_per_step": f.get("estimated_saving_us_per_step"),
                "evidence": f.get("evidence"),
            }
            for rule, f in findings.items()
        },
        skipped_distributed_rules=[s for s in report.get("skipped_rules", []) if s["rule_id"].startswith("GA7")],
        notes=report.get("notes", [])[:2],
    )
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results"))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--straggler-ms", type=float, default=80.0)
    parser.add_argument("--timeout", type=float, default=110.0, help="seconds per profile run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc)
    runs = {
        "ddp": profile_run("ddp", args.out, args.nproc, {}, args.timeout),
        "ddp_straggler": profile_run(
            "ddp_straggler",
            args.out,
            args.nproc,
            {"GPUADVISOR_EXAMPLE_STRAGGLER_RANK": "1", "GPUADVISOR_EXAMPLE_STRAGGLER_MS": f"{args.straggler_ms:g}"},
            args.timeout,
        ),
    }
    result = {
        "benchmark": "benchmarks/ddp_profile_check.py",
        "date_utc": started.isoformat(timespec="seconds"),
        "gpus": gpus(),
        "acceptance": f"per-rank trace step time within {AGREEMENT_PCT:.0f}% of the CUDA-event median; "
        "the straggler run names rank 1",
        "runs": runs,
        "straggler_run_names_rank_1": runs["ddp_straggler"].get("straggler_named") == 1,
    }
    path = args.out / "ddp_profile_check.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for name, run in runs.items():
        print(f"{name}: rc={run['returncode']} wall={run['wall_s']} s straggler={run.get('straggler_named')}")
        for row in run.get("ranks", []):
            print(
                f"  rank {row['rank']}: CUDA events {row['cuda_event_median_us']} µs, trace {row['trace_step_time_us']}"
                f" µs, {row['trace_vs_cuda_event_pct']}%"
            )
    print(f"wrote {path}")
    return 0 if all(run["returncode"] == 0 for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
