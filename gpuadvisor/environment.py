"""The environment record of a run (the report's ``env``): what ran the model, so that two runs can be judged
comparable. Torch is imported inside the function (only the commands that run a model call it)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
from typing import Any

# The environment variables that configure torch's CUDA caching allocator (expandable_segments,
# max_split_size_mb, backend, ...): PYTORCH_CUDA_ALLOC_CONF and the device-generic PYTORCH_ALLOC_CONF of newer
# torch releases. With both set, torch 2.13 ran with PYTORCH_CUDA_ALLOC_CONF's value (checked with
# torch._C._accelerator_getAllocatorSettings()). The memory rules (GA601) read them from the report's env.
ALLOC_CONF_VARIABLES = {
    "PYTORCH_CUDA_ALLOC_CONF": "pytorch_cuda_alloc_conf",
    "PYTORCH_ALLOC_CONF": "pytorch_alloc_conf",
}


def run_environment(cuda: bool, driver: str | None, nvml_summary: dict[str, Any] | None) -> dict[str, Any]:
    """``env`` of a ``profile`` or ``apply`` run: torch, triton and Python versions; on a GPU its name, CUDA,
    the driver (from NVML), the clocks NVML saw during timing and the caching allocator's configuration
    (:func:`allocator_config`); on the CPU its name and torch's threads. Keys whose value is unknown are left
    out (the report fills them with null)."""
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
        env.update(allocator_config())
    else:
        env["device"] = "cpu"
        env["cpu_name"] = cpu_name()
        env["cpu_threads"] = torch.get_num_threads()
    return {k: v for k, v in env.items() if v is not None}


def allocator_config(environ: dict[str, str] | None = None) -> dict[str, str]:
    """How the run's CUDA caching allocator was configured, for the memory rules: ``allocator_settings``, the
    settings torch reports it runs with ("" for the defaults; it also sees a
    ``torch.cuda.memory._set_allocator_settings`` call in the model's code, which no environment variable
    shows; left out on a torch without ``torch._C._accelerator_getAllocatorSettings``), and the allocator's
    environment variables as set (``pytorch_cuda_alloc_conf``, ``pytorch_alloc_conf``; each left out when
    unset). Call it after the run, so that a setting made inside ``build()`` is seen."""
    import torch

    environ = os.environ if environ is None else environ
    out = {key: environ[name] for name, key in ALLOC_CONF_VARIABLES.items() if name in environ}
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        try:
            out["allocator_settings"] = str(getter())
        except RuntimeError:  # no accelerator initialised in this torch build
            pass
    return out


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
