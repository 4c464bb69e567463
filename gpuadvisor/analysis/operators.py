"""The CPU operator tree and the kernels each operator launched.

The profiler records operators as nested intervals on their host thread (``aten::matmul`` holds the
``aten::reshape`` and ``aten::bmm`` it calls); an operator launches the kernels whose External id is its own
or one of its descendants'. Pure functions over ``Trace.cpu_ops`` (times in µs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuadvisor.trace.kineto import input_shapes_raw


def operator_parents(cpu_ops: pd.DataFrame) -> np.ndarray:
    """Row position (into ``cpu_ops``) of each operator's innermost enclosing operator on the same rank and
    host thread, -1 for a top-level one. An operator encloses another when its interval holds the other's."""
    n = len(cpu_ops)
    parents = np.full(n, -1, dtype=np.int64)
    if not n:
        return parents
    ts = cpu_ops["ts_us"].to_numpy(float)
    end = cpu_ops["end_us"].to_numpy(float)
    thread = pd.factorize(cpu_ops["rank"].astype(str) + ":" + cpu_ops["tid"].astype(str))[0]
    # Within a thread, by start; of two that start together the longer one encloses the other.
    order = np.lexsort((-(end - ts), ts, thread))
    stack: list[int] = []
    previous_thread = -1
    for i in order.tolist():
        if thread[i] != previous_thread:
            stack.clear()
            previous_thread = thread[i]
        # Close the operators that ended before this one starts. One that starts inside the top of the stack
        # but ends after it (clock rounding) is taken as its child.
        while stack and ts[i] >= end[stack[-1]]:
            stack.pop()
        parents[i] = stack[-1] if stack else -1
        stack.append(i)
    return parents


def operator_inputs(cpu_ops: pd.DataFrame, rows) -> dict[int, tuple[list | None, list | None]]:
    """Decoded ``Input Dims`` and ``Input type`` of the operators at the given row positions:
    {row: (dims, types)} (None where the trace recorded none)."""
    rows = list(rows)
    if not rows:
        return {}
    sub = cpu_ops.iloc[rows]
    dims, types = input_shapes_raw(sub["input_dims_raw"], sub["input_types_raw"])
    return {r: (d, t) for r, d, t in zip(rows, dims, types)}


def tensor_dims(dims: list | None) -> list[list[int]]:
    """The tensor shapes among an operator's inputs (lists of ints, scalars and tensor lists left out)."""
    if not isinstance(dims, list):
        return []
    return [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]


def kernels_launched(acts: pd.DataFrame, cpu_ops: pd.DataFrame, rows) -> np.ndarray:
    """Boolean mask over ``acts`` of the kernels launched by the operators at ``rows`` (positions into
    ``cpu_ops``) or by any operator running inside one of them on the same thread."""
    rows = list(rows)
    mask = np.zeros(len(acts), dtype=bool)
    if not rows or not len(acts):
        return mask
    ts = cpu_ops["ts_us"].to_numpy(float)
    end = cpu_ops["end_us"].to_numpy(float)
    tid = cpu_ops["tid"].astype(str).to_numpy(object)
    rank = cpu_ops["rank"].to_numpy()
    ext = cpu_ops["external_id"].to_numpy()
    wanted: set[tuple[int, int]] = set()
    for r in rows:
        inside = (ts >= ts[r]) & (end <= end[r]) & (tid == tid[r]) & (rank == rank[r])
        wanted.update(zip(rank[inside].tolist(), ext[inside].tolist()))
    keys = zip(acts["rank"].tolist(), acts["external_id"].tolist())
    mask[:] = [(k in wanted) for k in keys]
    return mask & (acts["kind"] == "kernel").to_numpy()
