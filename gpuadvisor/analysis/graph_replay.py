"""Kernels a CUDA graph replayed, counted in a trace (``apply`` reports them in its kernel diff)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuadvisor.stats import finite_round


def graph_replay_facts(trace_path: Path, peaks_file=None) -> dict[str, Any] | None:
    """Kernels of the trace's steps that a CUDA graph replay launched, or None when there are none.

    A graph replay shows in the trace as the graph's kernels, all linked to the one ``cudaGraphLaunch``
    call: kernels per step stay what they were (the graph runs them all), launch calls drop to about one.
    The analysis itself (:func:`gpuadvisor.analysis.roofline.graph_replayed`) never calls a replayed kernel
    launch-bound, so analyze, profile and apply give it the same class; this only counts them.

    Returns {kernels_per_step, us_per_step, relabelled_launch_us_per_step (replayed kernels shorter than the
    graph launch call, which a per-kernel launch test would have called launch-bound), classes_us_per_step}.
    """
    import numpy as np
    import pandas as pd

    from gpuadvisor.analysis.linking import gpu_activities, step_windows
    from gpuadvisor.analysis.roofline import kernel_table
    from gpuadvisor.device.calibrate import load_calibration
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(trace_path)
    device = trace.device
    calibration = load_calibration(device.name) if device is not None else None
    peaks = lookup_peaks(device, peaks_file, calibration=calibration)
    kernels = kernel_table(trace, peaks, gpu_activities(trace))
    graph = kernels["graph_replay"].to_numpy(bool)
    if not graph.any():
        return None
    n_steps = len(step_windows(trace)) or 1
    inside = kernels["step_index"].to_numpy() >= 0
    duration = kernels["dur_us"].to_numpy(float)
    shorter = graph & (duration < kernels["launch_dur_us"].to_numpy(float))
    classes = pd.Series(duration[inside]).groupby(kernels["bound"].to_numpy(object)[inside]).sum() / n_steps
    return {
        "kernels_per_step": finite_round(float((graph & inside).sum()) / n_steps),
        "us_per_step": finite_round(float(duration[graph & inside].sum()) / n_steps),
        "relabelled_launch_us_per_step": finite_round(float(np.sum(duration[shorter & inside])) / n_steps),
        "classes_us_per_step": {str(k): finite_round(float(v)) for k, v in classes.items()},
    }
