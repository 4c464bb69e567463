"""The environment record of a run (the report's ``env``): what ran the model, so that two runs can be judged
comparable. Torch is imported inside the function (only the commands that run a model call it)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from typing import Any


def run_environment(cuda: bool, driver: str | None, nvml_summary: dict[str, Any] | None) -> dict[str, Any]:
    """``env`` of a ``profile`` or ``apply`` run: torch, triton and Python versions; on a GPU its name, CUDA,
    the driver (from NVML) and the clocks NVML saw during timing; on the CPU its name and torch's threads.
    Keys whose value is unknown are left out (the report fills them with null)."""
    import torch

    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "triton": triton_version(),
        "python": platform.python_version(),
    }
    if cuda:
        env["gpu_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        if driver:
            env["driver"] = driver
        if nvml_summary and nvml_summary.get("clocks"):
            env["clocks"] = nvml_summary["clocks"]
    else:
        env["device"] = "cpu"
        env["cpu_name"] = cpu_name()
        env["cpu_threads"] = torch.get_num_threads()
    return {k: v for k, v in env.items() if v is not None}


def triton_version() -> str | None:
    """The installed triton's version (any of its distributions), or None without triton."""
    if importlib.util.find_spec("triton") is None:
        return None
    for distribution in ("triton", "pytorch-triton", "triton-nightly"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
