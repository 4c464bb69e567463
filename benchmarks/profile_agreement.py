"""Does `gpuadvisor profile` time a step the way a plain script does? Both, alternately, several rounds.

    python3 benchmarks/profile_agreement.py --rounds 4     # on a CUDA GPU

Each round runs benchmarks/plain_decode_timing.py (no gpuadvisor code) and `gpuadvisor profile
examples/llama_decode.py` (or --example), alternately first, each in a fresh process pinned to the same two CPU
cores (the eager decode step is bound by the host's launch rate; on one core the NVML sampler thread competes
with the step), and compares their median step times, per round and pooled over the rounds. Both use their
default timing (at least 30 steps and at least 5 s of them) unless --steps fixes the count. It also times one
default `gpuadvisor profile` run (wall clock, warm-up and profiling included). Writes
benchmarks/results/profile_agreement.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pinned(cmd: list[str], cores: str | None) -> list[str]:
    return (["taskset", "-c", cores] if cores and shutil.which("taskset") else []) + cmd


def plain_run(tmp: Path, i: int, args, env) -> dict:
    out = tmp / f"plain{i}.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "plain_decode_timing.py"), "--out", str(out)]
    cmd += ["--example", str(args.example)]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps), "--min-time", "0"]
    subprocess.run(pinned(cmd, args.cores or None), check=True, env=env, capture_output=True)
    result = json.loads(out.read_text())
    return {"median_us": result["median_us"], "samples_us": result["samples_us"]}


def profile_run(tmp: Path, i: int, args, env) -> dict:
    cmd = [sys.executable, "-m", "gpuadvisor", "profile", str(args.example)]
    cmd += ["--out", str(tmp / f"profile{i}"), "--format", "json"]
    if args.steps is not None:
        cmd += ["--steps", str(args.steps), "--min-time", "0"]
    proc = subprocess.run(pinned(cmd, args.cores or None), check=True, env=env, capture_output=True, text=True)
    summary = json.loads(proc.stdout)["summary"]
    return {"median_us": summary["step_time_us"], "samples_us": summary["samples_us"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--example", type=Path, default=ROOT / "examples" / "llama_decode.py", help="the model.py (default: decode)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="exactly this many timed steps each (default: both tools' defaults)"
    )
    parser.add_argument(
        "--cores", default="2,3", help="CPU cores to pin both processes to, taskset syntax ('' for none)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "profile_agreement.json")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rounds = []
    all_plain: list[float] = []
    all_profile: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i in range(args.rounds):
            # Alternate which runs first, so a drift of the host over the session favours neither.
            if i % 2 == 0:
                plain, profiled = plain_run(tmp, i, args, env), profile_run(tmp, i, args, env)
            else:
                profiled, plain = profile_run(tmp, i, args, env), plain_run(tmp, i, args, env)
            all_plain += plain["samples_us"]
            all_profile += profiled["samples_us"]
            rounds.append(
                {
                    "first": "plain" if i % 2 == 0 else "profile",
                    "plain_median_us": plain["median_us"],
                    "plain_steps": len(plain["samples_us"]),
                    "profile_median_us": profiled["median_us"],
                    "profile_steps": len(profiled["samples_us"]),
                    "difference_pct": round(100 * (profiled["median_us"] - plain["median_us"]) / plain["median_us"], 2),
                }
            )
            print(rounds[-1], flush=True)
        start = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuadvisor",
                "profile",
                str(args.example),
                "--out",
                str(Path(tmp) / "default"),
                "--format",
                "json",
            ],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        default = json.loads(proc.stdout)
    import torch

    result = {
        "command": "python3 benchmarks/profile_agreement.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "example": str(args.example.resolve().relative_to(ROOT))
        if args.example.resolve().is_relative_to(ROOT)
        else str(args.example),
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": "per round: plain script and gpuadvisor profile, alternately first, "
        + (
            f"{args.steps} timed steps each"
            if args.steps
            else "each with its default timing (at least 30 steps and 5 s)"
        )
        + ", fresh processes"
        + (f" pinned to CPU cores {args.cores}" if args.cores else "")
        + "; pooled: the median of every sample of each side",
        "rounds": rounds,
        "rounds_within_5pct": sum(abs(r["difference_pct"]) <= 5 for r in rounds),
        "median_abs_difference_pct": round(statistics.median(abs(r["difference_pct"]) for r in rounds), 2),
        "pooled": {
            "plain_median_us": round(statistics.median(all_plain), 2),
            "profile_median_us": round(statistics.median(all_profile), 2),
            "difference_pct": round(100 * (statistics.median(all_profile) / statistics.median(all_plain) - 1), 2),
            "plain_steps": len(all_plain),
            "profile_steps": len(all_profile),
        },
        "default_profile_run": {
            "wall_s": round(wall, 1),
            "step_time_us": default["summary"]["step_time_us"],
            "top_finding": default["findings"][0]["rule_id"] if default["findings"] else None,
            "energy_j_per_step": default["summary"].get("energy_j_per_step"),
            "clocks": default["env"].get("clocks"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
