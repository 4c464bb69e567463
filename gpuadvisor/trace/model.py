"""The Trace model: one Kineto trace (or several rank traces) as columnar tables.

Every table is a pandas DataFrame. Times are microseconds on the trace's own clock (Kineto writes
``ts``/``dur`` in µs whatever ``displayTimeUnit`` says); ``end_us = ts_us + dur_us``.

kernels        one row per GPU kernel
    rank, name, ts_us, dur_us, end_us, device, stream, correlation, external_id,
    grid_x, grid_y, grid_z, block_x, block_y, block_z, blocks (grid product, -1 when unknown),
    threads_per_block, registers_per_thread, shared_memory_bytes
memcpys        one row per gpu_memcpy / gpu_memset
    rank, name, op ("memcpy" | "memset"), direction ("HtoD", "DtoH", "DtoD", "PtoP", "Memset", "?"),
    src_kind, dst_kind ("Pageable", "Pinned", "Device", ...), ts_us, dur_us, end_us, device, stream,
    correlation, external_id, bytes
runtime        one row per CUDA runtime or driver call on the host (cuda_runtime, cuda_driver)
    rank, name, api ("runtime" | "driver"), ts_us, dur_us, end_us, tid (host thread), correlation, external_id
cpu_ops        one row per CPU operator (cpu_op)
    rank, name, ts_us, dur_us, end_us, tid (host thread), external_id, flops (NaN when not recorded),
    input_dims_raw, input_types_raw, concrete_inputs_raw (the raw JSON; decode with kineto.input_shapes)
annotations    user annotations on the host (user_annotation) and on the GPU (gpu_user_annotation)
    rank, name, on_gpu, ts_us, dur_us, end_us, external_id
syncs          CUPTI synchronization records (cuda_sync), when the trace has them
    rank, name, ts_us, dur_us, end_us, stream, correlation
python_frames  Python stack frames (python_function), when recorded with with_stack=True
    rank, name ("file.py(line): function"), ts_us, dur_us, end_us, tid
steps          one row per ProfilerStep#N annotation (empty when the trace has none)
    rank, step, ts_us, dur_us, end_us
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass
class DeviceInfo:
    """A GPU as the trace's ``deviceProperties`` describe it."""

    index: int
    name: str
    sm_count: int | None = None
    compute_capability: tuple[int, int] | None = None
    total_memory_bytes: int | None = None
    max_threads_per_sm: int | None = None
    registers_per_sm: int | None = None
    shared_memory_per_sm_bytes: int | None = None


@dataclass
class Trace:
    """A parsed trace: tables plus metadata. Built by :func:`gpuadvisor.trace.kineto.load_trace`."""

    source: str
    kernels: pd.DataFrame
    memcpys: pd.DataFrame
    runtime: pd.DataFrame
    cpu_ops: pd.DataFrame
    annotations: pd.DataFrame
    syncs: pd.DataFrame
    python_frames: pd.DataFrame
    steps: pd.DataFrame
    devices: list[DeviceInfo] = field(default_factory=list)
    ranks: list[int] = field(default_factory=lambda: [0])
    metadata: dict[str, Any] = field(default_factory=dict)
    event_count: int = 0
    size_bytes: int = 0
    other_device_events: int = 0  # events on accelerators this reader does not model (mtia_*, ...)
    rank_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (events, bytes) of its file

    @property
    def device(self) -> DeviceInfo | None:
        """The GPU the kernels ran on (the first one listed, or the first one kernels used)."""
        if not self.devices:
            return None
        if len(self.kernels):
            used = int(self.kernels["device"].mode().iloc[0])
            for dev in self.devices:
                if dev.index == used:
                    return dev
        return self.devices[0]

    @property
    def has_gpu_activity(self) -> bool:
        return bool(len(self.kernels) or len(self.memcpys))

    def for_rank(self, rank: int) -> Trace:
        """The same trace restricted to one rank's rows."""

        def pick(df: pd.DataFrame) -> pd.DataFrame:
            return df[df["rank"] == rank].reset_index(drop=True) if len(df) else df

        return Trace(
            source=self.source,
            kernels=pick(self.kernels),
            memcpys=pick(self.memcpys),
            runtime=pick(self.runtime),
            cpu_ops=pick(self.cpu_ops),
            annotations=pick(self.annotations),
            syncs=pick(self.syncs),
            python_frames=pick(self.python_frames),
            steps=pick(self.steps),
            devices=self.devices,
            ranks=[rank],
            metadata=self.metadata,
            event_count=self.rank_sizes.get(rank, (self.event_count, 0))[0],
            size_bytes=self.rank_sizes.get(rank, (0, self.size_bytes))[1],
            other_device_events=self.other_device_events,
            rank_sizes={rank: self.rank_sizes[rank]} if rank in self.rank_sizes else {},
        )
