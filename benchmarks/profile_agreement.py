"""Does `gpuadvisor profile` time a step the way a plain script does? Both, alternately, several rounds.

    python3 benchmarks/profile_agreement.py --rounds 3     # on a CUDA GPU

Each round runs benchmarks/plain_decode_timing.py (no gpuadvisor code) and then
`gpuadvisor profile examples/llama_decode.py`, each in a fresh process pinned to the same two CPU cores
(the eager decode step is bound by the host's launch rate; on one core the NVML sampler thread competes with
the step),
and compares their median step times. It also times one default `gpuadvisor profile` run (wall clock,
warm-up and profiling included). Writes benchmarks/results/profile_agreement.json (or --out).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--cores", default="2,3", help="CPU cores to pin both processes to, taskset syntax ('' for none)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "profile_agreement.json")
    args = parser.parse_args()
    core = args.cores or None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            plain_json = Path(tmp) / f"plain{i}.json"
            subprocess.run(
                pinned(
                    [
                        sys.executable,
                        str(ROOT / "benchmarks" / "plain_decode_timing.py"),
                        "--steps",
                        str(args.steps),
                        "--out",
                        str(plain_json),
                    ],
                    core,
                ),
                check=True,
                env=env,
                capture_output=True,
            )
            plain = json.loads(plain_json.read_text())["median_us"]
            out_dir = Path(tmp) / f"profile{i}"
            proc = subprocess.run(
                pinned(
                    [
                        sys.executable,
                        "-m",
                        "gpuadvisor",
                        "profile",
                        str(ROOT / "examples" / "llama_decode.py"),
                        "--steps",
                        str(args.steps),
                        "--out",
                        str(out_dir),
                        "--format",
                        "json",
                    ],
                    core,
                ),
                check=True,
                env=env,
                capture_output=True,
                text=True,
            )
            report = json.loads(proc.stdout)
            profiled = report["summary"]["step_time_us"]
            rounds.append(
                {
                    "plain_median_us": plain,
                    "profile_median_us": profiled,
                    "difference_pct": round(100 * (profiled - plain) / plain, 2),
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
                str(ROOT / "examples" / "llama_decode.py"),
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
        "torch": torch.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": f"per round: plain script then gpuadvisor profile, {args.steps} timed steps each, fresh processes"
        + (f" pinned to CPU cores {core}" if core else ""),
        "rounds": rounds,
        "median_abs_difference_pct": round(statistics.median(abs(r["difference_pct"]) for r in rounds), 2),
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
