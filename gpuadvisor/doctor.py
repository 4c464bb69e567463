"""``gpuadvisor doctor``: can this machine profile? One check per thing ``profile``, ``apply`` and ``calibrate`` need.

Each check returns ``{"name", "ok", "detail"}``: ``detail`` is what was found (a version, a device) or,
when ``ok`` is False, why not, in one line. A check never raises: an unexpected error becomes its detail.
The command exits 0 when every check the GPU path needs (``GPU_PATH_CHECKS``: torch with CUDA, a CUDA device,
the driver, CUPTI and NVML) passed, 1 when one did not: profile and apply then run on the CPU, or without
GPU activity or power and energy. triton, Nsight Compute and a calibration are optional: a failure there is
listed but does not change the exit code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["GPU_PATH_CHECKS", "gpu_path_missing", "run_checks", "render_checks"]

MIN_PYTHON = (3, 10)
NCU_TIMEOUT_S = 10.0


class _Skip(Exception):
    """A check that cannot run here (no torch, no GPU): ``ok`` False, the message says why."""


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error(exc: BaseException) -> str:
    message = _one_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class _Context:
    """What the checks share: torch (imported once), whether CUDA works, the GPU's name."""

    def __init__(self) -> None:
        self._torch: Any = None
        self._torch_error: str | None = None
        self._torch_tried = False

    def torch(self) -> Any:
        if not self._torch_tried:
            self._torch_tried = True
            try:
                import torch

                self._torch = torch
            except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install's OSError
                self._torch_error = _error(exc)
        if self._torch is None:
            raise _Skip(f"skipped: torch is not importable ({self._torch_error})")
        return self._torch

    def cuda_torch(self) -> Any:
        torch = self.torch()
        if not torch.cuda.is_available():
            raise _Skip("skipped: no CUDA GPU")
        return torch

    def gpu_name(self) -> str:
        torch = self.cuda_torch()
        return torch.cuda.get_device_name(torch.cuda.current_device())


def _check_python(ctx: _Context) -> tuple[bool, str]:
    version = ".".join(map(str, sys.version_info[:3]))
    need = ".".join(map(str, MIN_PYTHON))
    if sys.version_info[:2] < MIN_PYTHON:
        return False, f"{version} ({sys.executable}); gpuadvisor needs {need} or newer"
    return True, f"{version} ({sys.executable})"


def _check_torch(ctx: _Context) -> tuple[bool, str]:
    try:
        torch = ctx.torch()
    except _Skip:
        return False, f"not importable ({ctx._torch_error}); profile, apply and calibrate need it"
    cuda = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    if cuda:
        build = f"CUDA {cuda} build"
    elif hip:
        build = f"ROCm {hip} build (gpuadvisor profiles NVIDIA GPUs)"
    else:
        build = "CPU-only build: no CUDA; install a CUDA build of torch to profile a GPU"
    return True, f"{torch.__version__}, {build}"


def _check_cuda(ctx: _Context) -> tuple[bool, str]:
    torch = ctx.torch()
    if not torch.version.cuda:
        return False, "not available: this torch is a CPU-only build"
    if not torch.cuda.is_available():
        return False, "not available: torch.cuda.is_available() is False (no GPU visible, or no/old NVIDIA driver)"
    count = torch.cuda.device_count()
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    memory_gib = props.total_memory / (1 << 30)
    return True, (
        f"{props.name} (device {index} of {count}), compute capability {props.major}.{props.minor}, "
        f"{props.multi_processor_count} SMs, {memory_gib:.0f} GiB"
    )


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise _Skip("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError: no driver, no GPU, no permission
        raise _Skip(f"NVML does not start: {_error(exc)}") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_driver(ctx: _Context) -> tuple[bool, str]:
    pynvml = _pynvml()
    try:
        version = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            api = pynvml.nvmlSystemGetCudaDriverVersion()
            api_text = f", supports CUDA up to {api // 1000}.{(api % 1000) // 10}"
        except Exception:  # noqa: BLE001 - older NVML
            api_text = ""
    finally:
        pynvml.nvmlShutdown()
    return True, f"NVIDIA driver {version}{api_text} (pynvml)"


def _check_cuda_runtime(ctx: _Context) -> tuple[bool, str]:
    torch = ctx.torch()
    cuda = torch.version.cuda
    if not cuda:
        return False, "none: this torch is a CPU-only build (torch.version.cuda is None)"
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    return True, f"CUDA {cuda} (torch.version.cuda)" + (f", cuDNN {cudnn}" if cudnn else "")


def _check_triton(ctx: _Context) -> tuple[bool, str]:
    try:
        import triton
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install
        return False, f"not importable ({_error(exc)}); the fusion fix and the bundled kernels need it"
    return True, f"{getattr(triton, '__version__', 'unknown version')}"


def _check_cupti(ctx: _Context) -> tuple[bool, str]:
    torch = ctx.cuda_torch()
    import warnings

    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            (a @ b).sum()
            torch.cuda.synchronize()
        events = list(prof.events())
    on_gpu = sum(1 for e in events if "CUDA" in str(getattr(e, "device_type", "")))
    on_gpu = on_gpu or sum(len(getattr(e, "kernels", None) or ()) for e in events)  # kernels under their ops
    if not on_gpu:
        return False, (
            f"torch.profiler recorded {len(events)} events but no GPU kernel: CUPTI gives no CUDA activity "
            "(another profiler such as ncu attached, or no permission for the counters)"
        )
    return True, f"torch.profiler recorded {on_gpu} GPU kernel event(s) for a 256x256 matmul"


def _check_nvml(ctx: _Context) -> tuple[bool, str]:
    pynvml = _pynvml()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        power_w = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3  # mW
        try:
            energy_j = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ since the driver loaded
        except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError_NotSupported on older GPUs
            return False, f"{name}: power {power_w:.0f} W readable, energy counter not ({_error(exc)})"
    finally:
        pynvml.nvmlShutdown()
    return True, f"{count} GPU(s); {name}: power {power_w:.0f} W, energy counter {energy_j / 1e6:.3f} MJ"


def _check_ncu(ctx: _Context) -> tuple[bool, str]:
    path = shutil.which("ncu")
    if path is None:
        return False, "ncu not on PATH (Nsight Compute; bank-conflict counters need it, the rest does not)"
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=NCU_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return False, f"{path}: `ncu --version` did not answer within {NCU_TIMEOUT_S:g} s"
    except OSError as exc:
        return False, f"{path}: cannot run it ({_error(exc)})"
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        return False, f"{path}: `ncu --version` exited {done.returncode}: {_one_line(output, 160)}"
    match = re.search(r"Version\s+(\S+)", output)
    version = match.group(1) if match else _one_line(output.strip().splitlines()[-1] if output.strip() else "", 80)
    return True, f"{version} ({path})"


def _check_calibration(ctx: _Context) -> tuple[bool, str]:
    from gpuadvisor.device.calibrate import cache_dir, load_calibration

    name = ctx.gpu_name()
    found = load_calibration(name)
    if found is None:
        return False, f"none for {name} in {cache_dir()}: run gpuadvisor calibrate (under a minute)"
    parts = [f"{name}, {str(found.get('date', ''))[:10]}"]
    if found.get("hbm_bytes_per_s"):
        parts.append(f"copy {found['hbm_bytes_per_s'] / 1e12:.2f} TB/s")
    bf16 = (found.get("flops_per_s") or {}).get("bf16")
    if bf16:
        parts.append(f"bf16 {bf16 / 1e12:.0f} TFLOP/s")
    return True, ", ".join(parts) + f" ({found['path']})"


_CHECKS: tuple[tuple[str, Callable[[_Context], tuple[bool, str]]], ...] = (
    ("Python", _check_python),
    ("torch", _check_torch),
    ("CUDA device", _check_cuda),
    ("NVIDIA driver", _check_driver),
    ("CUDA runtime", _check_cuda_runtime),
    ("triton", _check_triton),
    ("CUPTI (profiler GPU activity)", _check_cupti),
    ("NVML (power, energy)", _check_nvml),
    ("Nsight Compute (ncu)", _check_ncu),
    ("calibration", _check_calibration),
)


# What profiling a GPU needs; the other checks (triton, ncu, calibration) serve one fix, rule or figure each.
GPU_PATH_CHECKS = (
    "Python",
    "torch",
    "CUDA device",
    "NVIDIA driver",
    "CUDA runtime",
    "CUPTI (profiler GPU activity)",
    "NVML (power, energy)",
)


def gpu_path_missing(checks: list[dict[str, Any]]) -> list[str]:
    """The names of the GPU path's checks that did not pass (empty: profile and apply can use the GPU)."""
    passed = {check["name"] for check in checks if check["ok"]}
    return [name for name in GPU_PATH_CHECKS if name not in passed]


def run_checks() -> list[dict[str, Any]]:
    """Every check, in order: ``[{"name": str, "ok": bool, "detail": str}, ...]``. Never raises."""
    ctx = _Context()
    results = []
    for name, check in _CHECKS:
        try:
            ok, detail = check(ctx)
        except _Skip as skip:
            ok, detail = False, str(skip)
        except Exception as exc:  # noqa: BLE001 - a check reports its failure, it never crashes doctor
            ok, detail = False, f"check failed: {_error(exc)}"
        results.append({"name": name, "ok": bool(ok), "detail": _one_line(detail, 400)})
    return results


def render_checks(checks: list[dict[str, Any]], console: Any) -> None:
    """One line per check: ✓ or ✗, the name, the detail."""
    from rich.markup import escape

    width = max((len(c["name"]) for c in checks), default=0)
    for check in checks:
        mark = "[green]✓[/green]" if check["ok"] else "[red]✗[/red]"
        console.print(f"{mark} {escape(check['name'].ljust(width))}  {escape(check['detail'])}", soft_wrap=True)
    passed = sum(1 for c in checks if c["ok"])
    missing = gpu_path_missing(checks)
    verdict = (
        f"the GPU path is not usable: {', '.join(missing)} failed (exit 1)"
        if missing
        else "the GPU path is usable (exit 0)"
    )
    console.print(f"[dim]{passed} of {len(checks)} OK; {escape(verdict)}[/dim]", soft_wrap=True)
