"""Ground truth for `gpuadvisor scan`: Nsight Compute's shared-memory counters for every kernel of
tests/scan_corpus, on the GPU this runs on.

    python3 benchmarks/bank_conflicts_ncu.py --out benchmarks/results

compiles each tests/scan_corpus/*.cu with ``nvcc -arch=sm_90 -cubin`` (or cupy's NVRTC when nvcc is missing),
then runs itself in launcher mode under

    ncu --clock-control none --target-processes all --csv --print-units base --metrics <gpuadvisor.ncu METRICS>

which launches every kernel ``--launches`` times (64 blocks, the block shape and dynamic shared memory of its
``// gpuadvisor: blockDim=... dynamicShared=...`` hint, inputs of uniform random floats). It writes into --out:

- ``bank_conflicts_ncu.csv``: the CSV exactly as ncu printed it (``gpuadvisor ncu --import`` reads it);
- ``bank_conflicts_ncu.json``: the command lines, GPU, driver, nvcc/ncu versions, date, and per kernel the
  summed counters and wavefronts per instruction;
- ``bank_conflicts_ncu_ideal.csv`` (best effort): ncu's source-level ``memory_l1_wavefronts_shared`` and
  ``memory_l1_wavefronts_shared_ideal`` for the same launches, to check the ideal the scan assumes.

Needs: an NVIDIA GPU, ncu on PATH, cupy; stdlib otherwise. Takes well under 3 minutes on an H200.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "scan_corpus"
GRID_BLOCKS = 64
# in/out hold 16 MiB each: the largest kernel reads 2**20 floats (stride32_float's fill).
BUFFER_BYTES = 16 * 1024 * 1024
KERNEL_RE = re.compile(
    r"//\s*gpuadvisor:\s*(?P<hint>[^\n]*)\n\s*extern\s+\"C\"\s+__global__\s+void\s+(?P<name>\w+)\s*\(", re.M
)
IDEAL_METRICS = "memory_l1_wavefronts_shared,memory_l1_wavefronts_shared_ideal"


def corpus_kernels(corpus: Path) -> list[dict]:
    """[{file, name, block (x, y, z), dynamic_shared}] from each kernel's hint line."""
    kernels = []
    for path in sorted(corpus.glob("*.cu")):
        for match in KERNEL_RE.finditer(path.read_text()):
            hint = dict(re.findall(r"(\w+)=([^\s]+)", match.group("hint")))
            block = [int(v) for v in hint.get("blockDim", "256").split(",")] + [1, 1]
            kernels.append(
                {
                    "file": str(path),
                    "name": match.group("name"),
                    "block": tuple(block[:3]),
                    "dynamic_shared": int(hint.get("dynamicShared", "0")),
                }
            )
    return kernels


def compile_corpus(corpus: Path, build: Path) -> dict[str, str]:
    """{source path: cubin path} with nvcc; {} when nvcc is missing (the launcher then uses NVRTC)."""
    nvcc = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))
    if nvcc is None:
        return {}
    cubins = {}
    for path in sorted(corpus.glob("*.cu")):
        cubin = build / (path.stem + ".cubin")
        subprocess.run([nvcc, "-arch=sm_90", "-O3", "-cubin", "-o", str(cubin), str(path)], check=True, timeout=120)
        cubins[str(path)] = str(cubin)
    return cubins


def launch(cubins: dict[str, str], launches: int) -> None:
    """Launcher mode (runs under ncu): every corpus kernel, ``launches`` times."""
    import cupy as cp

    modules = {}
    for path in sorted({k["file"] for k in corpus_kernels(CORPUS)}):
        if path in cubins:
            modules[path] = cp.RawModule(path=cubins[path])
        else:
            modules[path] = cp.RawModule(code=Path(path).read_text(), options=("-std=c++17",))
    rng = cp.random.default_rng(1234)
    floats = BUFFER_BYTES // 4
    data_in = rng.random(floats, dtype=cp.float32) + 0.5  # non-zero, and random low bits for the index kernel
    data_out = cp.zeros(floats, dtype=cp.float32)
    for kernel in corpus_kernels(CORPUS):
        function = modules[kernel["file"]].get_function(kernel["name"])
        for _ in range(launches):
            function((GRID_BLOCKS, 1, 1), kernel["block"], (data_in, data_out), shared_mem=kernel["dynamic_shared"])
    cp.cuda.runtime.deviceSynchronize()


def run_ncu(metrics: str, cubin_json: Path, launches: int, timeout_s: float) -> tuple[str, list[str], float]:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("ncu (Nsight Compute) is not on PATH")
    command = [
        ncu,
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--csv",
        "--print-units",
        "base",
        "--metrics",
        metrics,
        sys.executable,
        str(Path(__file__).resolve()),
        "--launcher",
        str(cubin_json),
        "--launches",
        str(launches),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    elapsed = time.perf_counter() - start
    rows = [line for line in done.stdout.splitlines() if line.startswith('"')]
    if done.returncode != 0 or not rows:
        tail = "\n".join((done.stderr + done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"ncu exited {done.returncode} with {len(rows)} CSV rows:\n{tail}")
    return "\n".join(rows) + "\n", command, elapsed


def environment() -> dict:
    info: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for key, command in (
        ("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"]),
        ("ncu_version", ["ncu", "--version"]),
        ("nvcc_version", ["nvcc", "--version"]),
    ):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
            info[key] = out.splitlines()[-1] if key != "gpu" else out
        except (OSError, subprocess.TimeoutExpired) as exc:
            info[key] = f"unavailable ({exc})"
    try:
        import cupy as cp

        info["cupy"] = cp.__version__
    except ImportError:
        info["cupy"] = None
    return info


def summarize(csv_text: str) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from gpuadvisor.ncu.counters import kernel_table, parse_csv

    return kernel_table(parse_csv(csv_text, "ncu output"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--no-ideal", action="store_true", help="skip the source-level ideal-wavefront pass")
    parser.add_argument("--launcher", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.launcher is not None:
        launch(json.loads(args.launcher.read_text()), args.launches)
        return 0
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from gpuadvisor.ncu.counters import METRICS

    kernels = corpus_kernels(CORPUS)
    print(f"{len(kernels)} corpus kernels: {', '.join(k['name'] for k in kernels)}", flush=True)
    meta: dict = {
        "environment": environment(),
        "kernels": kernels,
        "grid_blocks": GRID_BLOCKS,
        "launches_per_kernel": args.launches,
    }
    with tempfile.TemporaryDirectory(prefix="bank-conflicts-") as tmp:
        build = Path(tmp)
        try:
            cubins = compile_corpus(CORPUS, build)
            meta["compiler"] = "nvcc -arch=sm_90 -O3 -cubin" if cubins else "cupy NVRTC (nvcc not found)"
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            print(f"nvcc failed ({exc}); falling back to cupy NVRTC", flush=True)
            cubins, meta["compiler"] = {}, f"cupy NVRTC (nvcc failed: {exc})"
        cubin_json = build / "cubins.json"
        cubin_json.write_text(json.dumps(cubins))
        csv_text, command, elapsed = run_ncu(",".join(METRICS.values()), cubin_json, args.launches, 150)
        (args.out / "bank_conflicts_ncu.csv").write_text(csv_text)
        meta["command"] = "python3 benchmarks/bank_conflicts_ncu.py --out " + str(args.out)
        meta["ncu_command"] = " ".join(command[:-3] + ["<launcher>"])
        meta["ncu_seconds"] = round(elapsed, 1)
        try:
            meta["per_kernel"] = summarize(csv_text)
        except Exception as exc:  # noqa: BLE001 - the raw CSV is already written; keep going
            meta["per_kernel_error"] = repr(exc)
        if not args.no_ideal:
            try:
                remaining = max(20.0, 170.0 - (time.perf_counter() - started))
                ideal_text, ideal_command, ideal_elapsed = run_ncu(IDEAL_METRICS, cubin_json, 1, remaining)
                (args.out / "bank_conflicts_ncu_ideal.csv").write_text(ideal_text)
                meta["ideal_ncu_command"] = " ".join(ideal_command[:-3] + ["<launcher>"])
                meta["ideal_ncu_seconds"] = round(ideal_elapsed, 1)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                meta["ideal_error"] = str(exc)[-2000:]
    meta["total_seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "bank_conflicts_ncu.json").write_text(json.dumps(meta, indent=2) + "\n")
    for row in meta.get("per_kernel", []):
        print(
            f"{row['kernel']:32s} ld {row['ld_wavefronts_per_instruction']!s:>7} wf/inst "
            f"(conflicts {row.get('ld_bank_conflicts', 0):>9,.0f})  st {row['st_wavefronts_per_instruction']!s:>7}",
            flush=True,
        )
    print(f"wrote {args.out}/bank_conflicts_ncu.csv and .json in {meta['total_seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
