"""Measure this GPU's roofs (device copy bandwidth, pinned host copies, GEMM rate per dtype) and cache them.

``gpuadvisor calibrate`` runs :func:`run_calibration`; ``analyze`` and ``profile`` read the cache with
:func:`load_calibration` and put the measured numbers over the datasheet table
(:func:`gpuadvisor.device.peaks.apply_calibration`). Torch and pynvml are imported inside the
measuring functions only: reading the cache imports neither.

Method (every figure): random data, never zeros (a bf16 GEMM ran 13% faster on zeros than on random
data on an H200); warm-up first (cuBLAS handles, heuristics, clocks); then many calls queued back to back,
each between two CUDA events, and the median of the per-call times, with p10/p90 kept as the spread.

- ``hbm_bytes_per_s``: ``dst.copy_(src)`` of a 2 GiB bf16 tensor on the device, counting bytes read plus
  bytes written (2 x 2 GiB per call), far past the L2 (50 MiB on an H200), so the copy streams from HBM.
- ``host_to_device_bytes_per_s`` / ``device_to_host_bytes_per_s``: one direction at a time, 256 MiB
  between a pinned host buffer and the device (``non_blocking=True``).
- ``flops_per_s``: 2·n³ FLOP per call of an n = 8192 square product: ``torch.matmul`` for bf16 and fp16;
  fp32 inputs with ``torch.backends.cuda.matmul.allow_tf32`` True (tf32) and False (fp32), restored after;
  fp8 e4m3 through ``torch._scaled_mm`` with per-tensor scales, bf16 output and fast accumulation, on
  compute capability 8.9 or newer only. GEMMs are timed in a few short bursts, each after an idle pause,
  and the best burst's median is the roof: the rate at full clocks, before sustained GEMMs bring the
  clocks down (686 against 807 TFLOP/s bf16 on the H200; the constants below hold the measurements).
  ``stats`` keeps each burst's median.

The result is cached as JSON in ``${XDG_CACHE_HOME:-~/.cache}/gpuadvisor/calibration/<gpu>--<driver>.json``
(written to a temporary name, then renamed).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError, GpuAdvisorError

__all__ = [
    "CALIBRATION_SCHEMA_VERSION",
    "cache_dir",
    "cache_path",
    "load_calibration",
    "render_calibration",
    "run_calibration",
    "write_calibration",
]

CALIBRATION_SCHEMA_VERSION = 1
NO_CUDA_MESSAGE = "no CUDA GPU: calibrate measures the GPU it runs on"

# 2 GiB source + 2 GiB destination: 80x the H200's 50 MiB L2, so every call streams from device memory.
COPY_BUFFER_BYTES = 2 << 30
# 256 MiB over PCIe Gen5 (~55 GB/s one way) is ~5 ms per copy: far past the ~10 µs fixed cost of a copy.
HOST_BUFFER_BYTES = 256 << 20
# 8192³ is where GPU.md's H200 ceilings were measured (786 TFLOP/s bf16, 1451 TFLOP/s fp8): 1.1 TFLOP per call.
GEMM_SIZE = 8192
GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)  # Ada and Hopper have fp8 tensor cores; Ampere has none.

# Time budgets: the whole calibration (torch import, CUDA start, data, nine measurements) must stay under a
# minute (19 s on the H200 with 0.1 s GEMM bursts). Samples are capped so a very fast call does not queue
# thousands of events. Copies: one burst, 0.25 s warm-up then 0.5 s (device) / 0.3 s (host) of calls; on the
# H200 their p10-p90 spread was 0.2% (device) and 0.4% (host).
_WARMUP_S = 0.25
_BUDGET_S = {"copy": 0.5, "host": 0.3}
# GEMMs bring the clocks down within about 0.1 s. On the H200 (2026-11-29, benchmarks/results/
# calibrate_check.json), after 1 s idle, bf16 8192³ GEMMs queued back to back ran the first 10 calls at
# 807 TFLOP/s with NVML reading 1980 MHz; from 0.13 s on the SM clock read 1500-1560 MHz and the rate
# held at 686 (1.3 s). Bursts of 25 ms warm-up + 0.1 s of calls after 0.5 s idle gave burst medians of
# 688-695 TFLOP/s (p90 805: the start of each burst). The profiled steps of the gemm sample ran their bf16
# GEMM at 798. A roof is an upper bound, so a GEMM roof is the rate at full clocks: the best of 3 bursts
# of ~20 calls (~35 ms for bf16), each after 1 s idle; each burst's median is kept in the stats.
_GEMM_WARMUP_S = 0.003
_GEMM_BURST_S = 0.028
_GEMM_BURSTS = 3
_GEMM_PAUSE_S = 1.0
_MIN_SAMPLES = 10
_MAX_SAMPLES = 200
_MAX_WARMUP_CALLS = 1000
_MAX_CACHE_FILE_BYTES = 1 << 20

_ROOF_KEYS = ("hbm_bytes_per_s", "host_to_device_bytes_per_s", "device_to_host_bytes_per_s")
_FLOPS_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


# --------------------------------------------------------------------------------------------
# the cache


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/gpuadvisor/calibration`` (a relative XDG_CACHE_HOME is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "gpuadvisor" / "calibration"


def _slug(text: str, keep: str = "") -> str:
    return re.sub(rf"[^a-z0-9{re.escape(keep)}]+", "-", str(text).strip().lower()).strip("-")


def cache_path(gpu_name: str, driver: str) -> Path:
    """``<cache_dir>/<gpu-name-slug>--<driver-slug>.json`` (``nvidia-h200--580.95.05.json``)."""
    return cache_dir() / f"{_slug(gpu_name) or 'gpu'}--{_slug(driver, keep='.') or 'unknown'}.json"


def write_calibration(result: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``result`` as JSON to ``path`` (default: its cache path) atomically; returns the path."""
    path = Path(path) if path is not None else cache_path(result["gpu"], result.get("driver") or "unknown")
    path.parent.mkdir(parents=True, exist_ok=True)
    stored = {k: v for k, v in result.items() if k not in ("cached", "path")}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(stored, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _is_rate(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _same_gpu(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _read_cache_file(path: Path, gpu_name: str | None) -> dict[str, Any] | None:
    """The calibration in ``path``, or None when it is unreadable, corrupt, of another GPU or has no rate."""
    try:
        if path.stat().st_size > _MAX_CACHE_FILE_BYTES:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpu"), str):
        return None
    if gpu_name is not None and not _same_gpu(doc["gpu"], gpu_name):
        return None
    for key in _ROOF_KEYS:
        if doc.get(key) is not None and not _is_rate(doc[key]):
            return None
    flops = doc.get("flops_per_s", {})
    if not isinstance(flops, dict) or not all(k in _FLOPS_KEYS and _is_rate(v) for k, v in flops.items()):
        return None
    if not flops and not any(doc.get(k) is not None for k in _ROOF_KEYS):
        return None
    if not isinstance(doc.get("date", ""), str):
        return None
    doc["cached"] = True
    doc["path"] = str(path)
    return doc


def load_calibration(gpu_name: str | None, driver: str | None = None) -> dict[str, Any] | None:
    """The cached calibration of the GPU named ``gpu_name`` (and ``driver``, when given), or None.

    With ``driver`` None the newest (by its ``date``) of that GPU's cache files wins. A file that is
    unreadable, not JSON, of another GPU or without a valid rate is ignored, never an error. The result
    carries ``"cached": True`` and the file's ``"path"``.
    """
    if not gpu_name or not _slug(gpu_name):
        return None
    try:
        folder = cache_dir()
        if driver is not None:
            files = [cache_path(gpu_name, driver)]
        else:
            files = sorted(folder.glob(f"{_slug(gpu_name)}--*.json"))
        found = []
        for path in files:
            doc = _read_cache_file(path, gpu_name)
            if doc is not None:
                found.append((doc.get("date", ""), path.stat().st_mtime, str(path), doc))
    except (OSError, RuntimeError):  # no home folder, unreadable cache folder
        return None
    if not found:
        return None
    return max(found, key=lambda item: item[:3])[3]


# --------------------------------------------------------------------------------------------
# measuring


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ms: list[float], work: float, what: str) -> dict[str, Any]:
    """Rates (``work`` per second) from per-call times: median, p10/p90, min/max, spread in %."""
    ms = sorted(samples_ms)
    median_ms = statistics.median(ms)
    p10_ms, p90_ms = _quantile(ms, 0.1), _quantile(ms, 0.9)
    return {
        "median": work / (median_ms * 1e-3),
        "p10": work / (p90_ms * 1e-3),  # the slow tail of the times is the low tail of the rates
        "p90": work / (p10_ms * 1e-3),
        "min": work / (ms[-1] * 1e-3),
        "max": work / (ms[0] * 1e-3),
        "samples": len(ms),
        "median_ms": median_ms,
        "spread_pct": 100.0 * (p90_ms - p10_ms) / median_ms,
        "what": what,
    }


def time_calls(torch: Any, fn: Callable[[], Any], budget_s: float, warmup_s: float = _WARMUP_S) -> list[float]:
    """Milliseconds per call of ``fn`` from CUDA events: warm-up, then calls queued back to back."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end), 1e-3)
    for _ in range(min(_MAX_WARMUP_CALLS, max(2, math.ceil(warmup_s * 1e3 / estimate_ms)))):
        fn()
    count = min(_MAX_SAMPLES, max(_MIN_SAMPLES, math.ceil(budget_s * 1e3 / estimate_ms)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for first, last in events:
        first.record()
        fn()
        last.record()
    torch.cuda.synchronize()
    return [first.elapsed_time(last) for first, last in events]


def time_bursts(torch: Any, fn: Callable[[], Any]) -> tuple[list[float], list[float]]:
    """The per-call times (ms) of the fastest of a few short bursts (lowest median), and each burst's median."""
    runs = []
    for _ in range(_GEMM_BURSTS):
        time.sleep(_GEMM_PAUSE_S)
        runs.append(time_calls(torch, fn, _GEMM_BURST_S, _GEMM_WARMUP_S))
    medians = [statistics.median(run) for run in runs]
    return runs[medians.index(min(medians))], medians


def _measure_copy(torch: Any, device: Any) -> dict[str, Any]:
    src = torch.randn(COPY_BUFFER_BYTES // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    samples = time_calls(torch, lambda: dst.copy_(src), _BUDGET_S["copy"])
    if not torch.equal(dst[:: 1 << 20], src[:: 1 << 20]):
        raise RuntimeError("device copy check failed: the destination differs from the source")
    nbytes = src.numel() * src.element_size()
    return summarize(samples, 2 * nbytes, f"dst.copy_(src), {nbytes / (1 << 30):g} GiB bf16, bytes read + written")


def _measure_host(torch: Any, device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    on_device = torch.randn(HOST_BUFFER_BYTES // 4, dtype=torch.float32, device=device)
    host = _pinned_empty_like(torch, on_device)
    host.copy_(on_device)  # random data in the pinned buffer
    target = torch.empty_like(on_device)
    nbytes = host.numel() * host.element_size()
    size = f"{nbytes / (1 << 20):g} MiB pinned"
    h2d = time_calls(torch, lambda: target.copy_(host, non_blocking=True), _BUDGET_S["host"])
    d2h = time_calls(torch, lambda: host.copy_(on_device, non_blocking=True), _BUDGET_S["host"])
    return (
        summarize(h2d, nbytes, f"host to device, {size}, one direction"),
        summarize(d2h, nbytes, f"device to host, {size}, one direction"),
    )


def _pinned_empty_like(torch: Any, tensor: Any) -> Any:
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)


def _gemm_call(torch: Any, dtype_key: str, device: Any, n: int) -> Callable[[], Any]:
    if dtype_key == "fp8":
        fp8 = torch.float8_e4m3fn
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16).to(fp8)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16).to(fp8)
        b_cols = b.t()  # _scaled_mm wants the second operand column-major
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(
            a, b_cols, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[dtype_key]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def _measure_gemm(torch: Any, dtype_key: str, device: Any) -> dict[str, Any]:
    import warnings

    n = GEMM_SIZE
    what = {
        "bf16": "torch.matmul bf16",
        "fp16": "torch.matmul fp16",
        "tf32": "torch.matmul fp32, allow_tf32=True",
        "fp32": "torch.matmul fp32, allow_tf32=False",
        "fp8": "torch._scaled_mm e4m3, per-tensor scales, bf16 out, fast accumulation",
    }[dtype_key]
    matmul_flags = torch.backends.cuda.matmul
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer torch suggests fp32_precision over allow_tf32
        saved = matmul_flags.allow_tf32
        try:
            if dtype_key in ("tf32", "fp32"):
                matmul_flags.allow_tf32 = dtype_key == "tf32"
            samples, burst_medians_ms = time_bursts(torch, _gemm_call(torch, dtype_key, device, n))
        finally:
            matmul_flags.allow_tf32 = saved
    work = 2.0 * n**3
    stats = summarize(samples, work, f"{what}, {n}x{n}x{n}, best of {len(burst_medians_ms)} short bursts")
    stats["burst_medians"] = [work / (ms * 1e-3) for ms in burst_medians_ms]
    return stats


def _fp8_unsupported(torch: Any, capability: tuple[int, int]) -> str | None:
    if tuple(capability) < FP8_MIN_COMPUTE_CAPABILITY:
        need = ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))
        return f"compute capability {capability[0]}.{capability[1]} < {need}: no fp8 tensor cores"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn / _scaled_mm"
    return None


def _driver_version(torch: Any) -> tuple[str, str]:
    """(driver version, where it came from): NVML's driver version, else torch's CUDA driver API version."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return (version.decode() if isinstance(version, bytes) else str(version)), "pynvml"
    except Exception:  # noqa: BLE001 - pynvml missing or NVML unusable: fall back to torch
        pass
    try:
        api = int(torch._C._cuda_getDriverVersion())  # 13000 for CUDA 13.0
        return f"cuda{api // 1000}.{(api % 1000) // 10}", "torch (CUDA driver API version)"
    except Exception:  # noqa: BLE001
        return "unknown", "unavailable"


def _gpu_identity(torch: Any) -> dict[str, Any]:
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    driver, driver_source = _driver_version(torch)
    return {
        "gpu": props.name,
        "device_index": index,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_bytes": props.total_memory,
        "driver": driver,
        "driver_source": driver_source,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _device(torch: Any, index: int) -> Any:
    return torch.device("cuda", index)


def _import_torch_with_cuda() -> Any:
    try:
        import torch
    except ImportError:
        raise BadInputError(f"{NO_CUDA_MESSAGE} (torch is not installed)") from None
    if not torch.cuda.is_available():
        raise BadInputError(NO_CUDA_MESSAGE)
    return torch


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _method_text() -> str:
    return (
        "CUDA events around each call, calls queued back to back after warm-up, median of the per-call times; "
        f"random data; device copy of {COPY_BUFFER_BYTES / (1 << 30):g} GiB counting bytes read + written; "
        f"pinned host copies of {HOST_BUFFER_BYTES / (1 << 20):g} MiB, one direction each; "
        f"GEMMs {GEMM_SIZE}^3 at 2n^3 FLOP (fp8: torch._scaled_mm e4m3, fast accumulation), the best of "
        f"{_GEMM_BURSTS} bursts of {_GEMM_BURST_S:g} s after {_GEMM_PAUSE_S:g} s idle (the rate at full clocks)"
    )


def run_calibration(force: bool = False, progress: bool = False) -> dict[str, Any]:
    """Measure this GPU's roofs (or return the cached ones, with ``"cached": True``, unless ``force``).

    Raises :class:`BadInputError` without a CUDA GPU. A measurement that fails (fp8 on a GPU without fp8
    tensor cores, pinned memory refused, out of memory) is left out and its reason kept in ``skipped``.
    """
    started = time.perf_counter()
    torch = _import_torch_with_cuda()
    identity = _gpu_identity(torch)
    if not force:
        cached = load_calibration(identity["gpu"], identity["driver"])
        if cached is not None:
            return cached

    device = _device(torch, identity["device_index"])
    capability = tuple(int(x) for x in identity["compute_capability"].split("."))
    result: dict[str, Any] = {
        "schema_version": CALIBRATION_SCHEMA_VERSION,
        **identity,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "method": _method_text(),
        "hbm_bytes_per_s": None,
        "host_to_device_bytes_per_s": None,
        "device_to_host_bytes_per_s": None,
        "flops_per_s": {},
        "skipped": {},
        "stats": {"flops_per_s": {}},
    }

    def copy_step() -> None:
        stats = _measure_copy(torch, device)
        result["hbm_bytes_per_s"] = stats["median"]
        result["stats"]["hbm_bytes_per_s"] = stats

    def host_step() -> None:
        h2d, d2h = _measure_host(torch, device)
        result["host_to_device_bytes_per_s"] = h2d["median"]
        result["device_to_host_bytes_per_s"] = d2h["median"]
        result["stats"]["host_to_device_bytes_per_s"] = h2d
        result["stats"]["device_to_host_bytes_per_s"] = d2h

    def gemm_step(key: str) -> Callable[[], None]:
        def step() -> None:
            if key == "fp8":
                reason = _fp8_unsupported(torch, capability)
                if reason is not None:
                    result["skipped"]["fp8"] = reason
                    return
            stats = _measure_gemm(torch, key, device)
            result["flops_per_s"][key] = stats["median"]
            result["stats"]["flops_per_s"][key] = stats

        return step

    steps: list[tuple[str, str, Callable[[], None]]] = [
        ("hbm_bytes_per_s", "device copy bandwidth", copy_step),
        ("host_bytes_per_s", "pinned host copies", host_step),
    ] + [(key, f"GEMM {key} {GEMM_SIZE}³", gemm_step(key)) for key in GEMM_DTYPES]

    with _ProgressSteps(progress, len(steps)) as advance:
        for key, label, step in steps:
            advance(label)
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - one failed roof must not lose the others
                result["skipped"][key] = _one_line(exc)
            finally:
                torch.cuda.empty_cache()
        advance(None)

    if result["hbm_bytes_per_s"] is None and not result["flops_per_s"]:
        reasons = "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())
        raise GpuAdvisorError(f"calibrate measured nothing on {identity['gpu']} ({reasons})")
    result["seconds"] = round(time.perf_counter() - started, 2)
    try:
        result["path"] = str(write_calibration(result))
    except OSError as exc:
        result["path"] = None
        result["skipped"]["cache"] = f"not cached: {_one_line(exc)}"
    result["cached"] = False
    return result


class _ProgressSteps:
    """``with _ProgressSteps(on, total) as advance: advance(label)`` — a rich bar on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self.bar = None
        self.task = None
        self.done = -1

    def __enter__(self) -> Callable[[str | None], None]:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("calibrating: {task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=self.total)
        return self.advance

    def advance(self, label: str | None) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, description=label or "done")

    def __exit__(self, *exc: Any) -> bool:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


# --------------------------------------------------------------------------------------------
# rendering


def _datasheet(result: dict[str, Any]):
    from types import SimpleNamespace

    from gpuadvisor.device.peaks import lookup_peaks

    device = SimpleNamespace(
        name=result.get("gpu"), sm_count=result.get("sm_count"), total_memory_bytes=result.get("memory_bytes")
    )
    return lookup_peaks(device)


def _roof_rows(result: dict[str, Any], datasheet) -> list[tuple[str, str, float | None, float | None, dict]]:
    """(label, unit, measured, datasheet, stats) per roof; unit is 'TB/s', 'GB/s' or 'TFLOP/s'."""
    stats = result.get("stats") or {}
    link = datasheet.host_link_bytes_per_s if datasheet.known else None
    rows = [
        (
            "device memory (copy, read + write)",
            "TB/s",
            result.get("hbm_bytes_per_s"),
            datasheet.hbm_bytes_per_s,
            stats.get("hbm_bytes_per_s"),
        ),
        (
            "host → device (pinned)",
            "GB/s",
            result.get("host_to_device_bytes_per_s"),
            link,
            stats.get("host_to_device_bytes_per_s"),
        ),
        (
            "device → host (pinned)",
            "GB/s",
            result.get("device_to_host_bytes_per_s"),
            link,
            stats.get("device_to_host_bytes_per_s"),
        ),
    ]
    flops = result.get("flops_per_s") or {}
    flop_stats = stats.get("flops_per_s") or {}
    for key in GEMM_DTYPES:
        rows.append(
            (f"GEMM {key} {GEMM_SIZE}³", "TFLOP/s", flops.get(key), datasheet.flops_per_s.get(key), flop_stats.get(key))
        )
    return rows


_SCALE = {"TB/s": 1e12, "GB/s": 1e9, "TFLOP/s": 1e12}


def render_calibration(result: dict[str, Any], console: Any) -> None:
    """A rich table: each roof, measured, the datasheet figure and measured/datasheet, samples and spread."""
    from rich.markup import escape
    from rich.table import Table

    datasheet = _datasheet(result)
    env = " · ".join(
        part
        for part in (
            result.get("gpu"),
            f"sm {result['compute_capability']}" if result.get("compute_capability") else None,
            f"driver {result['driver']}" if result.get("driver") else None,
            f"CUDA {result['cuda']}" if result.get("cuda") else None,
            f"torch {result['torch']}" if result.get("torch") else None,
            f"measured {result['date']}" if result.get("date") else None,
            f"in {result['seconds']:.1f} s" if isinstance(result.get("seconds"), (int, float)) else None,
        )
        if part
    )
    table = Table(title=escape(f"Calibrated roofs: {env}"), title_justify="left")
    table.add_column("roof")
    table.add_column("measured", justify="right")
    table.add_column("datasheet", justify="right")
    table.add_column("measured / datasheet", justify="right")
    table.add_column("samples", justify="right")
    table.add_column("spread p10–p90", justify="right")
    skipped = result.get("skipped") or {}
    for label, unit, measured, sheet, stats in _roof_rows(result, datasheet):
        scale = _SCALE[unit]
        measured_text = f"{measured / scale:,.1f} {unit}" if _is_rate(measured) else "[dim]not measured[/dim]"
        sheet_text = f"{sheet / scale:,.1f} {unit}" if _is_rate(sheet) else "[dim]—[/dim]"
        ratio = f"{100 * measured / sheet:.0f}%" if _is_rate(measured) and _is_rate(sheet) else ""
        samples = str(stats.get("samples", "")) if isinstance(stats, dict) else ""
        spread = f"{stats['spread_pct']:.1f}%" if isinstance(stats, dict) and "spread_pct" in stats else ""
        table.add_row(label, measured_text, sheet_text, ratio, samples, spread)
    console.print(table)
    if datasheet.known:
        console.print(f"[dim]datasheet: {escape(datasheet.source)} ({escape(datasheet.gpu)})[/dim]")
    else:
        console.print(f"[dim]datasheet: no table entry for '{escape(str(result.get('gpu')))}'[/dim]")
    for key, reason in skipped.items():
        console.print(f"[yellow]skipped {escape(key)}:[/yellow] {escape(str(reason))}")
    path = escape(str(result.get("path")))
    if result.get("cached"):
        console.print(f"[dim]cached in {path}; gpuadvisor calibrate --force measures again[/dim]")
    elif result.get("path"):
        console.print(f"[dim]saved to {path}: analyze and profile use these roofs for this GPU[/dim]")
