"""Host/device transfers: memcpy and memset by direction and memory kind, pageable copies, sync copies."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import gpu_activities
from gpuadvisor.trace.model import Trace

# Synchronous copy calls: the host waits until the copy is done (cudaMemcpy without Async, driver
# equivalents). A pageable copy through cudaMemcpyAsync is also synchronous for the host: the driver stages
# it through a pinned bounce buffer before returning.
SYNC_COPY_CALLS = {
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cudaMemcpy3D",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpy",
    "hipMemcpy",
}

TRANSFER_COLUMNS = [
    "direction",
    "src_kind",
    "dst_kind",
    "count",
    "count_per_step",
    "bytes",
    "bytes_per_step",
    "total_us",
    "us_per_step",
    "bytes_per_s",
    "pageable",
    "sync",
]


def transfer_rows(trace: Trace, acts: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per memcpy/memset with its launch call. Columns: name, op, direction, src_kind, dst_kind,
    ts_us, dur_us, bytes, step_index, launch_name, correlation, pageable (a side is pageable host memory),
    sync (the host waited for it: a synchronous call or a pageable source/destination)."""
    m = trace.memcpys
    if not len(m):
        return pd.DataFrame(
            {
                c: []
                for c in [
                    "name",
                    "op",
                    "direction",
                    "src_kind",
                    "dst_kind",
                    "ts_us",
                    "dur_us",
                    "bytes",
                    "step_index",
                    "launch_name",
                    "correlation",
                    "pageable",
                    "sync",
                ]
            }
        )
    if acts is None:
        acts = gpu_activities(trace)
    a = acts[acts["kind"] != "kernel"][["row", "step_index", "launch_name"]]
    rows = m.reset_index(drop=True).join(a.set_index("row"), how="left")
    pageable = (rows["src_kind"] == "Pageable") | (rows["dst_kind"] == "Pageable")
    sync = pageable | rows["launch_name"].isin(SYNC_COPY_CALLS)
    return pd.DataFrame(
        {
            "name": rows["name"],
            "op": rows["op"],
            "direction": rows["direction"],
            "src_kind": rows["src_kind"],
            "dst_kind": rows["dst_kind"],
            "ts_us": rows["ts_us"],
            "dur_us": rows["dur_us"],
            "bytes": rows["bytes"],
            "step_index": rows["step_index"].fillna(-1).astype(np.int64),
            "launch_name": rows["launch_name"],
            "correlation": rows["correlation"],
            "pageable": pageable.to_numpy(bool),
            "sync": sync.to_numpy(bool),
        }
    )


def transfer_summary(rows: pd.DataFrame, n_steps: int) -> pd.DataFrame:
    """Transfers grouped by direction and memory kinds. Columns: direction, src_kind, dst_kind, count,
    count_per_step, bytes, bytes_per_step, total_us, us_per_step, bytes_per_s (achieved), pageable, sync
    (any of the group's copies blocked the host). ``*_per_step`` count copies inside steps only."""
    if not len(rows):
        return pd.DataFrame({c: [] for c in TRANSFER_COLUMNS})
    r = rows.copy()
    r["step_bytes"] = np.where(r["step_index"] >= 0, r["bytes"].clip(lower=0), 0)
    r["step_us"] = np.where(r["step_index"] >= 0, r["dur_us"], 0.0)
    r["step_count"] = (r["step_index"] >= 0).astype(int)
    g = r.groupby(["direction", "src_kind", "dst_kind"], sort=False)
    out = g.agg(
        count=("dur_us", "size"),
        bytes=("bytes", lambda s: int(s.clip(lower=0).sum())),
        total_us=("dur_us", "sum"),
        pageable=("pageable", "any"),
        sync=("sync", "any"),
        step_bytes=("step_bytes", "sum"),
        step_us=("step_us", "sum"),
        step_count=("step_count", "sum"),
    ).reset_index()
    steps = max(n_steps, 1)
    out["count_per_step"] = out["step_count"] / steps
    out["bytes_per_step"] = out["step_bytes"] / steps
    out["us_per_step"] = out["step_us"] / steps
    out["bytes_per_s"] = np.where(out["total_us"] > 0, out["bytes"] / (out["total_us"] * 1e-6), np.nan)
    return out[TRANSFER_COLUMNS].sort_values("total_us", ascending=False).reset_index(drop=True)
