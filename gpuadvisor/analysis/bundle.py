"""All analyses of one trace, computed once and shared by the rules and the report."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuadvisor.analysis.harness import harness_note
from gpuadvisor.analysis.linking import gpu_activities, step_windows
from gpuadvisor.analysis.roofline import kernel_summary, kernel_table
from gpuadvisor.analysis.timeline import (
    host_sync_table,
    launch_calls,
    median_step_time_us,
    step_breakdown,
    sync_calls,
    user_frames,
)
from gpuadvisor.analysis.transfers import transfer_rows, transfer_summary
from gpuadvisor.device.peaks import DevicePeaks
from gpuadvisor.trace.model import Trace


@dataclass
class Analysis:
    """The tables every rule and report reads (see each function's docstring for columns and units)."""

    trace: Trace
    peaks: DevicePeaks
    activities: pd.DataFrame  # linking.gpu_activities
    steps: pd.DataFrame  # timeline.step_breakdown
    kernels: pd.DataFrame  # roofline.kernel_table (one row per launch)
    kernel_names: pd.DataFrame  # roofline.kernel_summary (one row per kernel name)
    transfers: pd.DataFrame  # transfers.transfer_rows
    transfer_groups: pd.DataFrame  # transfers.transfer_summary
    host_syncs: pd.DataFrame  # timeline.host_sync_table
    frames: pd.DataFrame  # timeline.user_frames
    synthetic_step: bool = False
    notes: list[str] = field(default_factory=list)
    syncs: pd.DataFrame | None = None  # timeline.sync_calls (None: not kept; step_timeline recomputes it)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def median(self, column: str) -> float | None:
        """Median of a per-step column, None without steps."""
        if not len(self.steps):
            return None
        value = float(np.nanmedian(self.steps[column].to_numpy(float))) if self.steps[column].notna().any() else None
        return value

    @property
    def step_time_us(self) -> float | None:
        return median_step_time_us(self.steps)


def analyze_trace(trace: Trace, peaks: DevicePeaks) -> Analysis:
    """Run every analysis on one rank's trace."""
    notes = []
    windows = step_windows(trace)
    synthetic = bool(len(windows) and windows["synthetic"].iloc[0])
    if synthetic:
        notes.append("the trace has no ProfilerStep annotations: the whole trace is treated as one step")
    cut = trace.steps[trace.steps["cut_us"] > 0]
    if len(cut):
        first = cut.iloc[0]
        notes.append(
            f"{len(cut)} ProfilerStep annotation(s) end after the last event the profiler recorded "
            f"(ProfilerStep#{int(first['step'])} by {float(first['cut_us']):,.0f} µs): each step is cut at the end "
            "of the recording, since what came after it was not recorded"
        )
    if not peaks.known:
        notes.append(f"no peak figures for '{peaks.gpu}': kernels are classified without % of roof (use --peaks FILE)")
    acts = gpu_activities(trace)
    syncs = sync_calls(trace)
    steps = step_breakdown(trace, acts, syncs, launch_calls(trace))
    kernels = kernel_table(trace, peaks, acts)
    frames = user_frames(trace)
    harness = sync_calls(trace, harness=True)
    # Only the harness's syncs inside the trace's steps (or in a whole-trace step) changed a figure: those
    # outside every ProfilerStep never counted.
    note = harness_note(trace, harness[harness["step_index"] >= 0] if len(trace.steps) else harness, frames)
    if note:
        notes.append(note)
    xfer = transfer_rows(trace, acts)
    return Analysis(
        trace=trace,
        peaks=peaks,
        activities=acts,
        steps=steps,
        kernels=kernels,
        kernel_names=kernel_summary(kernels, peaks, len(steps)),
        transfers=xfer,
        transfer_groups=transfer_summary(xfer, len(steps)),
        host_syncs=host_sync_table(trace, frames, syncs=syncs),
        frames=frames,
        synthetic_step=synthetic,
        notes=notes,
        syncs=syncs,
    )
