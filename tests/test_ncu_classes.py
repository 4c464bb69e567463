"""The roofline classes of the four sample traces against Nsight Compute's verdicts for the same workloads.

``benchmarks/results/ncu_classes/*.csv.gz`` are ``ncu --csv`` exports of one step of each example behind a
sample trace, recorded on the H200 (``benchmarks/ncu_classes.py``; index.json has the commands and the date).
gpuadvisor/ncu/sol.py states how a verdict is read off the Speed-of-Light figures and how the classes map.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest
from benchmark_scripts import load

from gpuadvisor.ncu.counters import parse_csv
from gpuadvisor.ncu.sol import agreement, launch_verdicts, verdict
from gpuadvisor.pipeline import analyze_path

ROOT = Path(__file__).resolve().parents[1]
NCU = ROOT / "benchmarks" / "results" / "ncu_classes"
# Every workload the index records: the four samples, and suite models once they are recorded (their traces are
# sample_traces/real/NAME.json.gz).
WORKLOADS = tuple(json.loads((NCU / "index.json").read_text())["workloads"])


def _trace(name: str) -> Path:
    sample = ROOT / "sample_traces" / f"{name}.json.gz"
    return sample if sample.is_file() else ROOT / "sample_traces" / "real" / f"{name}.json.gz"


def _launches(name: str):
    return launch_verdicts(parse_csv(gzip.open(NCU / f"{name}.csv.gz", "rt").read(), name))


@pytest.mark.parametrize("name", WORKLOADS)
def test_classes_agree_with_nsight_compute_on_95_pct_of_gpu_time(name):
    report = analyze_path(str(_trace(name)))
    result = agreement(report["kernels"], _launches(name))
    wrong = sorted((r for r in result["rows"] if not r["agrees"]), key=lambda r: -r["us_per_step"])[:5]
    assert result["agree_pct"] >= 95.0, (name, round(result["agree_pct"], 1), wrong)


def test_the_exports_are_the_h200_runs_the_index_names():
    index = json.loads((NCU / "index.json").read_text())
    assert index["gpu"].startswith("NVIDIA H200")
    assert {"gemm", "add_rmsnorm", "input_pipeline", "llama_decode"} <= set(WORKLOADS)
    for name in WORKLOADS:
        entry = index["workloads"][name]
        assert entry["rc"] == 0 and re.search(rf"examples/(real/)?{name}\.py", entry["command"])
        assert len(_launches(name)) >= 4 and _trace(name).is_file()


def test_a_run_adds_its_workloads_to_the_index_and_keeps_the_earlier_ones(tmp_path, monkeypatch):
    """benchmarks/ncu_classes.py without a GPU: ncu and nvidia-smi faked, the suite's model files resolved."""
    script = load("ncu_classes")
    out = tmp_path / "ncu"
    out.mkdir()
    earlier = {"gpu": "NVIDIA H200, 580", "date": "2026-12-02", "ncu": "2025.3", "workloads": {"gemm": {"rc": 0}}}
    (out / "index.json").write_text(json.dumps(earlier))
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        if command[0] == "nvidia-smi":
            return subprocess.CompletedProcess(command, 0, "NVIDIA H200, 590\n", "")
        if "--version" in command:
            return subprocess.CompletedProcess(command, 0, "Version 2026.1\n", "")
        Path(command[command.index("--log-file") + 1]).write_text("ID,Kernel Name\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(script.shutil, "which", lambda name: "/opt/ncu/ncu")
    monkeypatch.setattr(script.subprocess, "run", fake_run)
    assert script.main(["--out", str(out), "--workloads", "hf_gpt2_eager_attention"]) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["workloads"]["gemm"] == {"rc": 0, "gpu": "NVIDIA H200, 580", "date": "2026-12-02", "ncu": "2025.3"}
    new = index["workloads"]["hf_gpt2_eager_attention"]
    assert new["gpu"] == "NVIDIA H200, 590" and new["ncu"] == "Version 2026.1" and new["rc"] == 0
    assert "examples/real/hf_gpt2_eager_attention.py" in new["command"]
    (profiled,) = [c for c in commands if "--log-file" in c]
    assert profiled[0] == "/opt/ncu/ncu"
    assert str(ROOT / "examples" / "real" / "hf_gpt2_eager_attention.py") in map(str, profiled)
    assert new["csv"] == "hf_gpt2_eager_attention.csv.gz"
    assert gzip.open(out / new["csv"], "rt").read() == "ID,Kernel Name\n"
    assert not (out / "hf_gpt2_eager_attention.csv").exists()
    with pytest.raises(SystemExit, match="no examples/nothing_here.py"):
        script.main(["--out", str(out), "--workloads", "nothing_here"])


def test_verdicts():
    assert verdict(93.4, 20.0, 1.0) == "compute"  # the bf16 GEMM: SM at 93%, DRAM at 20%
    assert verdict(9.0, 89.0, 62.0) == "memory"
    assert verdict(30.0, 18.0, 0.2) == "latency"  # 160 blocks, 6 resident per SM: 0.2 waves
    assert verdict(57.5, 55.7, 124.0) == "compute"  # a full grid under 60%: the unit nearer its peak
    assert verdict(None, 50.0) is None


def test_gemm_sample_big_gemm_is_compute_per_both():
    report = analyze_path(str(ROOT / "sample_traces" / "gemm.json.gz"))
    rows = {r["kernel"]: r for r in agreement(report["kernels"], _launches("gemm"))["rows"]}
    nvjet = next(r for k, r in rows.items() if k.startswith("nvjet_sm90"))
    assert nvjet["ours"] == "compute" and nvjet["ncu"] == "compute"
