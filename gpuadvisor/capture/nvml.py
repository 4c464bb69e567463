"""Sample the GPU with NVML in a background thread while steps are timed: clocks, power, energy, temperature,
throttle reasons and memory.

A step time means little without the clocks it ran at: two runs at different SM clocks are not
comparable (DESIGN.md, "Measuring"). :class:`NvmlSampler` reads the device every ``interval_s`` (20 ms by
default) and reads the total-energy counter once more at start and stop. Energy per step is the average
power over the timed phase (from the energy counter's slope when it advanced often enough, see
:func:`average_power`) times the mean step time. A phase shorter than the counter's update interval, or one
over which the counter did not advance, has no energy figure: "not measured" (None, with the reason from
:func:`energy_not_measured`), never 0.

pynvml (the ``nvidia-ml-py`` package) is imported inside :func:`open_sampler`, never at import time.
A reading that the device does not support is recorded as None; the sampler never raises from its thread.
"""

from __future__ import annotations

import csv
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_INTERVAL_S = 0.02

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits (the same values in both names of the API).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}

CSV_COLUMNS = [
    "time_s",
    "sm_mhz",
    "mem_mhz",
    "power_w",
    "energy_mj",
    "temperature_c",
    "memory_used_bytes",
    "throttle_reasons",
]


def decode_clock_reasons(mask: int | None) -> list[str]:
    """The names of the bits set in an NVML clocks-event (throttle) reason mask; unknown bits as ``bit_0x…``."""
    if not mask:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"bit_{bit:#x}")
            unknown &= ~bit
        bit <<= 1
    return names


@dataclass
class NvmlSample:
    """One reading. time_s from the start of sampling; None where the device gave no value."""

    time_s: float
    sm_mhz: int | None
    mem_mhz: int | None
    power_w: float | None
    energy_mj: int | None
    temperature_c: int | None
    memory_used_bytes: int | None
    throttle_reasons: list[str] = field(default_factory=list)


class NvmlSampler:
    """Read one GPU every ``interval_s`` in a daemon thread between :meth:`start` and :meth:`stop`.

    Built by :func:`open_sampler`; ``stop()`` also shuts NVML down. Usable as a context manager.
    """

    def __init__(self, nvml: Any, handle: Any, *, interval_s: float = DEFAULT_INTERVAL_S, driver: str | None = None):
        self._nvml = nvml
        self._handle = handle
        self.interval_s = interval_s
        self.driver = driver
        self.samples: list[NvmlSample] = []
        self.energy_start_mj: int | None = None
        self.energy_end_mj: int | None = None
        self.duration_s: float | None = None
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.energy_start_mj = self._read(self._nvml.nvmlDeviceGetTotalEnergyConsumption)
        self._thread = threading.Thread(target=self._run, name="gpuadvisor-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (a last reading of the energy counter first) and shut NVML down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self.energy_end_mj = self._read(self._nvml.nvmlDeviceGetTotalEnergyConsumption)
            self.duration_s = time.perf_counter() - self._t0
            self._thread.join(timeout=5.0)
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down must not turn a result into an error
            pass

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> NvmlSample:
        nvml, handle = self._nvml, self._handle
        power_mw = self._read(nvml.nvmlDeviceGetPowerUsage, handle)
        memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
        reasons = self._read(self._reasons, handle) if self._reasons else None
        return NvmlSample(
            time_s=round(time.perf_counter() - self._t0, 6),
            sm_mhz=self._read(nvml.nvmlDeviceGetClockInfo, handle, getattr(nvml, "NVML_CLOCK_SM", 1)),
            mem_mhz=self._read(nvml.nvmlDeviceGetClockInfo, handle, getattr(nvml, "NVML_CLOCK_MEM", 2)),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            energy_mj=self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
            temperature_c=self._read(nvml.nvmlDeviceGetTemperature, handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
            memory_used_bytes=getattr(memory, "used", None),
            throttle_reasons=decode_clock_reasons(reasons),
        )

    def _read(self, fn, *args):
        if fn is None:
            return None
        if not args:
            args = (self._handle,)
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: no value for this reading
            return None


def open_sampler(torch_device: int = 0, *, interval_s: float = DEFAULT_INTERVAL_S) -> tuple[NvmlSampler | None, str]:
    """An (unstarted) sampler for the GPU torch calls ``torch_device``, or (None, why not).

    The NVML device is found by the GPU's UUID (so CUDA_VISIBLE_DEVICES is respected), else by torch's
    own NVML index, else by the same index.
    """
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML could not start ({error})"
    try:
        handle = _handle_for(pynvml, torch_device)
    except Exception as error:  # noqa: BLE001
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        return None, f"NVML has no handle for CUDA device {torch_device} ({error})"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # noqa: BLE001
        driver = None
    return NvmlSampler(pynvml, handle, interval_s=interval_s, driver=driver), ""


def _handle_for(pynvml: Any, torch_device: int) -> Any:
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch_device).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - older torch without .uuid, or NVML that does not know it
        pass
    index = torch_device
    get_index = getattr(torch.cuda, "_get_nvml_device_index", None)
    if get_index is not None:
        try:
            index = get_index(torch_device)
        except Exception:  # noqa: BLE001
            index = torch_device
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _values(samples: list[NvmlSample], name: str) -> list[float]:
    return [value for value in (getattr(s, name) for s in samples) if value is not None]


# NVML's total-energy counter (and its power reading) advance in steps of about 100 ms: on the H200 (driver
# 580) a 0.25 s timed phase sampled every 20 ms saw 3 distinct counter values. A span shorter than one update
# holds no energy measurement at all: `apply`'s after side, 3 blocks of 0.04 s in all, read a counter rise of
# 0 and reported 0.0 J per step (issue 14).
COUNTER_UPDATE_INTERVAL_S = 0.1
# Over a span shorter than this the counter's slope is mostly that quantisation, and the median power reading
# is the better estimate.
MIN_COUNTER_SPAN_S = 0.5

NOT_MEASURED = "not measured"


def energy_not_measured(duration_s: float | None, counter_rise_mj: float | None) -> str | None:
    """Why the energy over a timed span of ``duration_s`` cannot be measured, or None when it can.

    Not measured: a span shorter than :data:`COUNTER_UPDATE_INTERVAL_S` (the counter's reading is then mostly
    whether an update happened to fall inside it), or a counter that did not advance over the span.
    ``counter_rise_mj`` None means the counter was not read (the median power reading may still serve).
    """
    if duration_s is not None and duration_s < COUNTER_UPDATE_INTERVAL_S:
        return (
            f"{NOT_MEASURED}: the timed span lasted {duration_s:.2f} s, under the ~{COUNTER_UPDATE_INTERVAL_S:.1f} s "
            "between updates of NVML's energy counter"
        )
    if counter_rise_mj is not None and counter_rise_mj <= 0:
        span = f" over {duration_s:.2f} s" if duration_s is not None else ""
        return f"{NOT_MEASURED}: NVML's energy counter did not advance{span}"
    return None


def average_power(sampler: NvmlSampler | None) -> tuple[float | None, str | None]:
    """Average power (W) over the sampled phase and where it came from, or (None, None) without a sampler.

    From the energy counter: its rise between the first and the last time it changed, over the time between
    those changes, when that span is at least :data:`MIN_COUNTER_SPAN_S`; else the median power reading.
    (None, why) when the energy is not measured (:func:`energy_not_measured`: a phase shorter than the
    counter's update interval, or a counter that did not advance).
    """
    if sampler is None:
        return None, None
    rise = None
    if sampler.energy_start_mj is not None and sampler.energy_end_mj is not None:
        rise = sampler.energy_end_mj - sampler.energy_start_mj
    reason = energy_not_measured(sampler.duration_s, rise)
    if reason is not None:
        return None, reason
    points = [(0.0, sampler.energy_start_mj)] + [(s.time_s, s.energy_mj) for s in sampler.samples]
    if sampler.duration_s is not None:
        points.append((sampler.duration_s, sampler.energy_end_mj))
    points = [(t, e) for t, e in points if e is not None]
    changes = [points[i] for i in range(1, len(points)) if points[i][1] != points[i - 1][1]]
    if len(changes) >= 2:
        (t0, e0), (t1, e1) = changes[0], changes[-1]
        if t1 - t0 >= MIN_COUNTER_SPAN_S and e1 >= e0:
            return (e1 - e0) / 1000.0 / (t1 - t0), f"NVML energy counter ({len(changes)} updates over {t1 - t0:.2f} s)"
    power = _values(sampler.samples, "power_w")
    if power:
        return statistics.median(power), f"median of {len(power)} NVML power readings"
    return None, f"{NOT_MEASURED}: NVML gave neither an energy counter nor power readings"


def summarize(sampler: NvmlSampler | None, step_times_us: list[float]) -> dict[str, Any]:
    """The figures the report keeps from a finished sampler that ran while ``step_times_us`` were measured.

    Returns {energy_j_per_step, energy_source, power_w_average, power_w_median, temperature_c_max,
    throttle_reasons [names seen, in order], memory_used_bytes_max, clocks {sm_mhz_median, mem_mhz_median,
    sm_mhz_min, sm_mhz_max}, samples}. Energy per step = average power (:func:`average_power`) x the mean
    step time. None where unknown; energy_j_per_step is None when not measured, and energy_source says why.
    """
    samples = sampler.samples if sampler is not None else []
    power_average, source = average_power(sampler)
    steps = [t for t in step_times_us if t is not None]
    energy = power_average * (sum(steps) / len(steps)) / 1e6 if power_average is not None and steps else None
    sm = _values(samples, "sm_mhz")
    mem = _values(samples, "mem_mhz")
    power = _values(samples, "power_w")
    temperature = _values(samples, "temperature_c")
    memory = _values(samples, "memory_used_bytes")
    reasons: list[str] = []
    for sample in samples:
        for reason in sample.throttle_reasons:
            if reason not in reasons:
                reasons.append(reason)
    clocks = None
    if sm or mem:
        clocks = {
            "sm_mhz_median": statistics.median(sm) if sm else None,
            "mem_mhz_median": statistics.median(mem) if mem else None,
            "sm_mhz_min": min(sm) if sm else None,
            "sm_mhz_max": max(sm) if sm else None,
        }
    return {
        "energy_j_per_step": energy,
        "energy_source": source,
        "power_w_average": power_average,
        "power_w_median": statistics.median(power) if power else None,
        "temperature_c_max": max(temperature) if temperature else None,
        "throttle_reasons": reasons,
        "memory_used_bytes_max": max(memory) if memory else None,
        "clocks": clocks,
        "samples": len(samples),
        "duration_s": sampler.duration_s if sampler is not None else None,
    }


def write_csv(samples: list[NvmlSample], path: Path) -> None:
    """Every sample as a row of :data:`CSV_COLUMNS` (throttle reasons joined with ``|``; empty where unknown),
    written atomically with the mode of every output file (:mod:`gpuadvisor.outputs`)."""
    import io

    from gpuadvisor.outputs import write_atomic

    with io.StringIO(newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for s in samples:
            writer.writerow(
                [
                    f"{s.time_s:.6f}",
                    _cell(s.sm_mhz),
                    _cell(s.mem_mhz),
                    _cell(None if s.power_w is None else round(s.power_w, 3)),
                    _cell(s.energy_mj),
                    _cell(s.temperature_c),
                    _cell(s.memory_used_bytes),
                    "|".join(s.throttle_reasons),
                ]
            )
        write_atomic(path, handle.getvalue())


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
