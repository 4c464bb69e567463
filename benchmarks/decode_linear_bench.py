"""Time gpuadvisor/kernels/decode_linear.py against cuBLAS at LLM decode shapes, and sweep its launch configs.

The decode shapes of a Llama-style model (d=2048, MLP 5632, vocab 32000, bf16): (N, K) = (6144, 2048) qkv,
(2048, 2048) out-proj, (5632, 2048) gate and up, (2048, 5632) down, (32000, 2048) logits; M rows of x.
Cases, each against torch F.linear (cuBLAS) on the bf16 weight of the same shape:

- ``linear/bf16`` at M = 1, 4, 16; ``linear/fp8`` (weight-only e4m3, per-row scales) at M = 1, 16;
- ``gate_up/bf16`` and ``gate_up/fp8`` (silu(x @ Wg.T) * (x @ Wu.T), one kernel) at (5632, 2048), M = 1, 16,
  against eager ``silu(F.linear(x, Wg)) * F.linear(x, Wu)`` and against one F.linear on the concatenated
  [2N, K] weight followed by the SwiGLU (what a model with a fused gate_up projection runs).

For each case: the kernel with the launch settings of ``config_for`` (the heuristic table), then every
candidate of a sweep (BLOCK_N, BLOCK_K, unroll, num_warps, num_stages, FMA or tl.dot path; split-K 1, 2, 4, 8
for each), each checked against a float64 reference before it is timed; all are recorded, so the table in
``config_for`` can be set from the JSON (``best`` per case, and every candidate's numbers).

Timing: per call, from CUDA-graph replays. One graph holds >= 20 calls that cycle through enough copies of
the weight to exceed 4x the L2 (a decode step streams every weight from HBM; re-reading one 8 MiB weight
would time L2), and it is replayed 10 times after a warm-up replay; the number is the median replay time
divided by the calls. Graph replay removes Python launch overhead, which at 2-30 us per call would
otherwise be all that events measure; each call still pays the kernel's own launch inside the graph (and
split-K pays for its second kernel). Bandwidth = (weight + scales + x + y bytes) / time, against the
device-to-device copy bandwidth measured in the same run (a 2 GiB copy, bytes read + written).

Compilation: the sweep has ~300 kernel variants; compiled one after another they would take minutes, so
worker processes (spawned, one CUDA context each) compile them first into Triton's on-disk cache and the
timing process loads the binaries from it. ``--budget-s`` bounds the whole run: past it, the remaining
sweep candidates are skipped (and said so in the JSON), never the baselines and heuristic timings.

    python3 benchmarks/decode_linear_bench.py [--out benchmarks/results/decode_linear_bench.json] [--budget-s 200]

Without CUDA it runs in Triton's interpreter on tiny shapes with ``--smoke`` (a test of this script, not a
measurement).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
# One on-disk cache shared by the compile workers and this process (spawned workers inherit the environment).
os.environ.setdefault("TRITON_CACHE_DIR", str(Path(tempfile.gettempdir()) / "decode_linear_bench_triton_cache"))

import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuadvisor.kernels.decode_linear import (  # noqa: E402
    DecodeLinearConfig,
    _launch,
    config_for,
    decode_gate_up_swiglu_reference,
    decode_linear_reference,
    quantize_fp8_rows,
)

DECODE_SHAPES = {"qkv": (6144, 2048), "out_proj": (2048, 2048), "gate_up": (5632, 2048), "down": (2048, 5632)}
DECODE_SHAPES["logits"] = (32000, 2048)
SMOKE_SHAPES = {"small": (40, 64), "odd": (33, 96)}
SPLITS = (1, 2, 4, 8)
TARGET_PCT_OF_COPY = 80.0
# The float64-reference check before timing: outputs are O(1) (x ~ N(0, 1), weight rows of norm ~1), bf16
# is rounded once (2**-9 relative) and the interpreter truncates (2**-8): 1.6e-2, as in the tests.
TOLERANCE = 1.6e-2
# Graph timing: calls per graph, replays timed, and the weight bytes cycled through per graph (x L2 size).
CALLS_PER_GRAPH = 20
REPLAYS = 10
L2_MULTIPLE = 4
# Largest fp32 accumulator per thread of the FMA path: [BLOCK_N, BLOCK_K] over 32 * num_warps threads. At 64
# the kernel compiles to 163 registers (sm_90, triton 3.9, 16x512 bf16, 4 warps); at 128 to 253, and a
# 16x2048 fp8 tile (256 per thread) spills 416 bytes of stack.
MAX_FMA_ACC_PER_THREAD = 64
# Shared memory the tl.dot path may stage (x and weight tiles times num_stages); 227 KiB is the per-block limit.
MAX_DOT_SMEM_BYTES = 160 * 1024


# ---- the sweep -------------------------------------------------------------------------------------------


def sweep_configs(op: str, weight_kind: str, rows: int, smoke: bool = False) -> list[DecodeLinearConfig]:
    """Candidate launch settings (split_k=1: splits are swept at run time, they need no other binary).

    FMA path (one row only): BLOCK_N x BLOCK_K tiles of 32 or MAX_FMA_ACC_PER_THREAD (64) fp32 accumulators per
    thread, at 4 warps (and 8 and 2 at 64), unroll 1 and 2, num_stages 1 (Triton does not pipeline these loads:
    the sm_90 PTX has no cp.async at num_stages 1, 2 or 3) plus one num_stages=3 control. tl.dot path
    (any rows): BLOCK_N 16-64 x BLOCK_K, num_stages 3 (2 where 3 would stage more than MAX_DOT_SMEM_BYTES),
    with num_warps 2 and 8 and num_stages 2 and 4 around a 32-wide tile.
    """
    weight_bytes = 1 if weight_kind == "fp8" else 2
    accumulators = 2 if op == "gate_up" else 1
    if smoke:
        configs = [DecodeLinearConfig(16, 32, use_dot=True, num_stages=2)]
        if rows == 1:
            configs += [DecodeLinearConfig(8, 32, num_stages=1), DecodeLinearConfig(4, 16, num_stages=1, unroll=2)]
        return configs
    block_ks = [128, 256, 512, 1024] if weight_bytes == 2 else [256, 512, 1024, 2048]
    configs: list[DecodeLinearConfig] = []
    if rows == 1:
        # (num_warps, fp32 accumulators per thread, unrolls): 4 warps at half and full accumulator budget,
        # 8 and 2 warps at the full budget only.
        for warps, acc_per_thread, unrolls in ((4, 32, (1, 2)), (4, 64, (1, 2)), (8, 64, (1, 2)), (2, 64, (1,))):
            tile_elements = acc_per_thread * 32 * warps // accumulators
            for block_k in block_ks:
                block_n = tile_elements // block_k
                if block_n < 4 or block_n > 64 or (warps != 4 and block_n < 8):
                    continue
                for unroll in unrolls:
                    configs.append(DecodeLinearConfig(block_n, block_k, 1, warps, 1, False, unroll))
        configs.append(DecodeLinearConfig(16 // accumulators, block_ks[2], 1, 4, 3, False, 1))  # the stages control

    def dot(block_n: int, block_k: int, warps: int = 4, stages: int = 3) -> DecodeLinearConfig | None:
        stage_bytes = 16 * block_k * 2 + accumulators * block_n * block_k * weight_bytes
        while stages > 2 and stages * stage_bytes > MAX_DOT_SMEM_BYTES:
            stages -= 1
        if stages * stage_bytes > MAX_DOT_SMEM_BYTES:
            return None
        return DecodeLinearConfig(block_n, block_k, 1, warps, stages, True, 1)

    dot_ks = [64, 128, 256, 512] if weight_bytes == 2 else [128, 256, 512, 1024]
    dot_ns = (16, 32, 64) if op == "linear" else (16, 32)
    if rows == 1:  # a short list: the FMA path is expected to win at one row
        dot_ns, dot_ks = dot_ns[:2], dot_ks[1:3]
    for block_n in dot_ns:
        for block_k in dot_ks:
            configs.append(dot(block_n, block_k))
    if rows > 1:
        anchor_k = dot_ks[2]
        configs += [dot(32, anchor_k, warps=2), dot(32, anchor_k, warps=8), dot(32, anchor_k, stages=2)]
        configs.append(dot(32, anchor_k, stages=4))
    unique = []
    for config in configs:
        if config is not None and config not in unique:
            unique.append(config)
    return unique


def build_cases(smoke: bool) -> list[dict]:
    shapes = SMOKE_SHAPES if smoke else DECODE_SHAPES
    cases = []
    for weight_kind, rows in (("bf16", 1), ("bf16", 16), ("fp8", 1), ("fp8", 16)):
        for shape_name, (n, k) in shapes.items():
            cases.append(dict(op="linear", weight_kind=weight_kind, rows=rows, shape=shape_name, n=n, k=k))
    gate_up_name = "small" if smoke else "gate_up"
    n, k = shapes[gate_up_name]
    for weight_kind in ("bf16", "fp8"):
        for rows in (1, 16):
            cases.append(dict(op="gate_up", weight_kind=weight_kind, rows=rows, shape=gate_up_name, n=n, k=k))
    # M=4 last: if the time budget runs out, its sweep (the M=16 tl.dot list) is what gets cut.
    for shape_name, (n, k) in shapes.items():
        cases.append(dict(op="linear", weight_kind="bf16", rows=4, shape=shape_name, n=n, k=k))
    for case in cases:
        case["name"] = f"{case['op']}/{case['weight_kind']} {case['shape']} {case['n']}x{case['k']} M={case['rows']}"
    return cases


def heuristic_config(case: dict) -> DecodeLinearConfig:
    weight_dtype = torch.float8_e4m3fn if case["weight_kind"] == "fp8" else torch.bfloat16
    return config_for(case["rows"], case["n"], case["k"], weight_dtype, gate_up=case["op"] == "gate_up")


def effective_splits(config: DecodeLinearConfig, k: int) -> dict[int, int]:
    """Requested split -> the number of K slices _launch will use (duplicates are timed once)."""
    step = config.block_k * config.unroll
    steps = triton.cdiv(k, step)
    result: dict[int, int] = {}
    for split in SPLITS:
        n_splits = triton.cdiv(k, triton.cdiv(steps, split) * step)
        if n_splits not in result.values():
            result[split] = n_splits
    return result


# ---- inputs and the two callables per case ---------------------------------------------------------------


def make_inputs(case: dict, device: torch.device, copies: int, seed: int = 0) -> dict:
    """x and ``copies`` weight sets (random, never zeros; rows of norm ~1 so y is O(1)), fp8-quantized if asked."""
    g = torch.Generator(device=device).manual_seed(seed)
    n, k, rows = case["n"], case["k"], case["rows"]
    x = torch.randn((rows, k), generator=g, device=device).to(torch.bfloat16)
    halves = 2 if case["op"] == "gate_up" else 1
    first = []
    for _ in range(halves):
        w = torch.randn((n, k), generator=g, device=device) / math.sqrt(k)
        first.append(w)
    if case["op"] == "gate_up":
        first[0] *= 3.0  # gate values reach silu's saturated tails
    sets = []
    if case["weight_kind"] == "fp8":
        quantized = [quantize_fp8_rows(w) for w in first]
        bf16_equivalent = [(w8.float() * s[:, None]).to(torch.bfloat16) for w8, s in quantized]
        base = [w8 for w8, _ in quantized]
        scales = [s for _, s in quantized]
    else:
        base = [w.to(torch.bfloat16) for w in first]
        bf16_equivalent = base
        scales = [None] * halves
    for i in range(copies):
        sets.append([w if i == 0 else w.clone() for w in base])
    torch_sets = [[w if i == 0 else w.clone() for w in bf16_equivalent] for i in range(copies)]
    if case["weight_kind"] != "fp8":
        torch_sets = sets  # the very same bf16 weights
    return {"x": x, "sets": sets, "scales": scales, "torch_sets": torch_sets}


def kernel_call(case: dict, inputs: dict, config: DecodeLinearConfig):
    x, sets, scales = inputs["x"], inputs["sets"], inputs["scales"]
    if case["op"] == "gate_up":
        return lambda i: _launch(x, sets[i][0], scales[0], None, config, weight2=sets[i][1], scale2=scales[1])
    return lambda i: _launch(x, sets[i][0], scales[0], None, config)


def torch_calls(case: dict, inputs: dict) -> dict:
    """The cuBLAS baselines on bf16 weights (for fp8 cases: the dequantized weights, the same bytes as bf16)."""
    x, sets = inputs["x"], inputs["torch_sets"]
    linear = torch.nn.functional.linear
    if case["op"] == "linear":
        return {"torch_linear": lambda i: linear(x, sets[i][0])}
    fused = [torch.cat(pair, dim=0) for pair in sets]
    n = case["n"]

    def concatenated(i):
        gate_up = linear(x, fused[i])
        return torch.nn.functional.silu(gate_up[:, :n]) * gate_up[:, n:]

    return {
        "torch_eager_gate_up": lambda i: torch.nn.functional.silu(linear(x, sets[i][0])) * linear(x, sets[i][1]),
        "torch_fused_weight_gate_up": concatenated,
    }


def reference(case: dict, inputs: dict) -> torch.Tensor:
    x, weights, scales = inputs["x"], inputs["sets"][0], inputs["scales"]
    if case["op"] == "gate_up":
        return decode_gate_up_swiglu_reference(x, weights[0], weights[1], scales[0], scales[1])
    return decode_linear_reference(x, weights[0], scales[0])


def useful_bytes(case: dict, inputs: dict, weight_set: str = "sets") -> int:
    """Bytes each call must move: its weights (and scales) + x + y. ``torch_sets``: the bf16 baseline's weights."""
    weights = inputs[weight_set][0]
    total = sum(w.numel() * w.element_size() for w in weights)
    if weight_set == "sets":
        total += sum(s.numel() * 4 for s in inputs["scales"] if s is not None)
    return total + inputs["x"].numel() * 2 + case["rows"] * case["n"] * 2


# ---- timing ----------------------------------------------------------------------------------------------


def time_per_call_us(call, copies: int, device: torch.device) -> tuple[float, str]:
    """Median time of one ``call(i)`` (i cycling over the weight copies), in microseconds, and the method."""
    for i in range(copies):
        call(i)  # compile / load and warm the allocator outside any capture
    if device.type != "cuda":
        start = time.perf_counter()
        call(0)
        return (time.perf_counter() - start) * 1e6, "perf_counter (CPU interpreter)"
    torch.cuda.synchronize()
    calls = copies * max(1, math.ceil(CALLS_PER_GRAPH / copies))
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                call(i % copies)
        graph.replay()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPLAYS)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPLAYS)]
        for start, end in zip(starts, ends):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        us = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)) / calls
        del graph
        return us, f"cuda_graph_replay ({calls} calls per graph, median of {REPLAYS} replays)"
    except Exception as exc:  # a capture failure: fall back to events per call, which include launch overhead
        torch.cuda.synchronize()
        note = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        samples = []
        for rep in range(3 * REPLAYS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(rep % copies)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return statistics.median(samples), f"cuda_events_per_call (graph capture failed: {note})"


def copy_bandwidth(copy_gib: float, device: torch.device) -> dict:
    """Device-to-device copy of a ``copy_gib`` GiB tensor: bytes read + written per second (median of 50)."""
    n = int(copy_gib * 2**30) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    samples = []
    for rep in range(60):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            if rep >= 10:
                samples.append(start.elapsed_time(end) * 1e3)
        else:
            started = time.perf_counter()
            dst.copy_(src)
            if rep >= 10:
                samples.append((time.perf_counter() - started) * 1e6)
    us = statistics.median(samples)
    moved = 2 * src.numel() * src.element_size()
    return {"tensor_bytes": moved // 2, "bytes": moved, "us": us, "bytes_per_s": moved / (us * 1e-6)}


def check(out: torch.Tensor, expected: torch.Tensor) -> dict:
    err = (out.double() - expected).abs()
    ok = bool((err <= TOLERANCE + TOLERANCE * expected.abs()).all().item()) and bool(torch.isfinite(out).all().item())
    return {"max_abs_error": err.max().item(), "correct": ok}


def measure(call, copies, device, moved, copy_bps, expected=None) -> dict:
    row: dict = {}
    try:
        if expected is not None:
            row.update(check(call(0), expected))
        us, method = time_per_call_us(call, copies, device)
        row.update(us=us, bytes_per_s=moved / (us * 1e-6), timing=method)
        row["pct_of_copy"] = 100.0 * row["bytes_per_s"] / copy_bps
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        row["correct"] = False
    return row


# ---- parallel precompilation ----------------------------------------------------------------------------

_WORKER_INPUTS: dict = {}


def _precompile(task: dict) -> dict:
    """In a worker: launch one config on every shape of its op with split 1 and 2, filling Triton's disk cache."""
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = DecodeLinearConfig(**task["config"])
    errors = []
    for case in task["cases"]:
        key = (case["op"], case["weight_kind"], case["rows"], case["n"], case["k"])
        if key not in _WORKER_INPUTS:
            _WORKER_INPUTS[key] = make_inputs(case, device, copies=1)
        for split in (1, 2):
            try:
                kernel_call(case, _WORKER_INPUTS[key], replace(config, split_k=split))(0)
            except Exception as exc:
                errors.append(f"{case['name']} split {split}: {type(exc).__name__}: {str(exc)[:200]}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "errors": errors}


def precompile(cases: list[dict], sweeps: dict, workers: int, limit_s: float) -> dict:
    """Compile every (op, weight kind, config) in ``workers`` spawned processes; returns a summary."""
    tasks: dict = {}
    for case in cases:
        rows_key = (case["op"], case["weight_kind"], case["rows"])
        for config in [*sweeps[rows_key], heuristic_config(case)]:
            config = replace(config, split_k=1)
            # rows is not specialized: one binary serves 1..16 rows, so one task per (op, weight, config).
            key = (case["op"], case["weight_kind"], config)
            task = tasks.setdefault(key, {"config": asdict(config), "cases": {}})
            for c in cases:
                if c["op"] == case["op"] and c["weight_kind"] == case["weight_kind"]:
                    shape_key = (c["n"], c["k"])
                    if shape_key not in task["cases"] and (config.use_dot or c["rows"] == 1):
                        task["cases"][shape_key] = c
    task_list = [{"config": t["config"], "cases": list(t["cases"].values())} for t in tasks.values()]
    summary = {"tasks": len(task_list), "workers": workers, "finished": 0, "errors": [], "timed_out": False}
    started = time.perf_counter()
    if workers <= 0 or not task_list:
        summary["note"] = "no workers: kernels compile on first use in the timing loop"
        return summary
    executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn")
    )
    try:
        futures = [executor.submit(_precompile, task) for task in task_list]
        done, not_done = concurrent.futures.wait(futures, timeout=limit_s)
        for future in done:
            try:
                result = future.result()
                summary["finished"] += 1
                summary["errors"] += result["errors"]
            except Exception as exc:
                summary["errors"].append(f"worker: {type(exc).__name__}: {str(exc)[:200]}")
        summary["timed_out"] = bool(not_done)
    except Exception as exc:
        summary["errors"].append(f"pool: {type(exc).__name__}: {str(exc)[:200]}")
        summary["timed_out"] = True
    if not summary["timed_out"]:
        executor.shutdown(wait=True)
    else:  # stop the workers this script started, so they do not compile while the timing runs
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
    summary["seconds"] = time.perf_counter() - started
    summary["errors"] = summary["errors"][:50]
    return summary


# ---- main ------------------------------------------------------------------------------------------------


def config_label(config: DecodeLinearConfig, n_splits: int | None = None) -> str:
    path = "dot" if config.use_dot else "fma"
    split = n_splits if n_splits is not None else config.split_k
    return (
        f"{path} n{config.block_n} k{config.block_k} u{config.unroll} "
        f"w{config.num_warps} s{config.num_stages} split{split}"
    )


def run_case(case, device, copy_bps, sweeps, deadline, l2_bytes) -> dict:
    weight_bytes_one = case["n"] * case["k"] * (1 if case["weight_kind"] == "fp8" else 2)
    weight_bytes_one *= 2 if case["op"] == "gate_up" else 1
    copies = max(2, math.ceil(L2_MULTIPLE * l2_bytes / weight_bytes_one)) if device.type == "cuda" else 1
    inputs = make_inputs(case, device, copies)
    moved = useful_bytes(case, inputs)
    expected = reference(case, inputs)
    row: dict = {k: case[k] for k in ("name", "op", "weight_kind", "rows", "shape", "n", "k")}
    row.update(bytes=moved, weight_copies=copies, floor_us=moved / copy_bps * 1e6)
    torch_moved = useful_bytes(case, inputs, "torch_sets")
    for name, call in torch_calls(case, inputs).items():
        row[name] = {"bytes": torch_moved, **measure(call, copies, device, torch_moved, copy_bps)}
    baseline = "torch_linear" if case["op"] == "linear" else "torch_eager_gate_up"
    heuristic = heuristic_config(case)
    row["heuristic"] = {"config": asdict(heuristic), "label": config_label(heuristic)}
    row["heuristic"].update(measure(kernel_call(case, inputs, heuristic), copies, device, moved, copy_bps, expected))
    candidates = []
    skipped = 0
    for config in sweeps[(case["op"], case["weight_kind"], case["rows"])]:
        for split, n_splits in effective_splits(config, case["k"]).items():
            if time.perf_counter() > deadline:
                skipped += 1
                continue
            cfg = replace(config, split_k=split)
            result = {"config": asdict(cfg), "n_splits": n_splits, "label": config_label(cfg, n_splits)}
            result["programs"] = triton.cdiv(case["n"], cfg.block_n) * n_splits
            result.update(measure(kernel_call(case, inputs, cfg), copies, device, moved, copy_bps, expected))
            candidates.append(result)
    row["candidates"] = candidates
    if skipped:
        row["skipped_candidates"] = f"{skipped} (time budget reached)"
    good = [c for c in candidates if c.get("correct") and "us" in c]
    if row["heuristic"].get("correct") and "us" in row["heuristic"]:
        good.append({**row["heuristic"], "n_splits": None, "from": "heuristic"})
    if good:
        best = min(good, key=lambda c: c["us"])
        row["best"] = {k: v for k, v in best.items() if k in ("config", "label", "n_splits", "us", "pct_of_copy")}
        row["best"]["bytes_per_s"] = best["bytes_per_s"]
        # Split-K sums in a fixed order: two runs of the best config give the same bits.
        call = kernel_call(case, inputs, DecodeLinearConfig(**best["config"]))
        row["best"]["bitwise_reproducible"] = bool(torch.equal(call(0), call(0)))
        if "us" in row[baseline]:
            row["best"]["speedup_vs_" + baseline] = row[baseline]["us"] / best["us"]
            if "us" in row["heuristic"]:
                row["heuristic"]["speedup_vs_" + baseline] = row[baseline]["us"] / row["heuristic"]["us"]
        row["best"]["meets_target"] = best["pct_of_copy"] >= TARGET_PCT_OF_COPY
    row["incorrect_candidates"] = [c["label"] for c in candidates if not c.get("correct")]
    del inputs, expected
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_row(row: dict) -> None:
    baseline = row.get("torch_linear") or row.get("torch_eager_gate_up") or {}
    heuristic, best = row.get("heuristic", {}), row.get("best", {})
    speedup = baseline["us"] / best["us"] if "us" in baseline and "us" in best else None
    print(
        f"{row['name']:<40} torch {fmt(baseline.get('us'), '8.2f')} us ({fmt(baseline.get('pct_of_copy'), '5.1f')}%)"
        f"  heuristic {fmt(heuristic.get('us'), '8.2f')} us ({fmt(heuristic.get('pct_of_copy'), '5.1f')}%)"
        f"  best {fmt(best.get('us'), '8.2f')} us ({fmt(best.get('pct_of_copy'), '5.1f')}%, x{fmt(speedup, '4.2f')})"
        f"  {best.get('label', '-')}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_linear_bench.json"))
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop sweeping after this many seconds")
    parser.add_argument("--workers", type=int, default=-1, help="compile processes (default: CPUs - 2, at most 12)")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copied tensor, GiB")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and sweeps: a test of this script")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("no CUDA: Triton's interpreter on the CPU; the timings mean nothing", flush=True)
        args.smoke = True
        args.copy_gib = min(args.copy_gib, 0.01)
    workers = args.workers if args.workers >= 0 else min(12, max(1, (os.cpu_count() or 2) - 2))
    deadline = started + args.budget_s
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    result: dict = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "gpu": torch.cuda.get_device_name(device) if props else "none (CPU, Triton interpreter)",
        "sm_count": props.multi_processor_count if props else None,
        "l2_bytes": l2_bytes if props else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timing": "per call from CUDA-graph replays of >= 20 calls cycling through weight copies > 4x L2",
        "bytes": "weight + scales + x + y, each once",
        "target_pct_of_copy": TARGET_PCT_OF_COPY,
        "budget_s": args.budget_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        result["elapsed_s"] = time.perf_counter() - started
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    copy = copy_bandwidth(args.copy_gib, device)
    result["copy"] = copy
    print(f"copy {copy['tensor_bytes'] / 2**30:.2f} GiB: {copy['us']:.1f} us = {copy['bytes_per_s'] / 1e12:.2f} TB/s")
    if device.type == "cuda":
        torch.cuda.empty_cache()

    cases = build_cases(args.smoke)
    sweeps = {}
    for case in cases:
        key = (case["op"], case["weight_kind"], case["rows"])
        sweeps.setdefault(key, sweep_configs(case["op"], case["weight_kind"], case["rows"], args.smoke))
    result["sweep_sizes"] = {"/".join(map(str, k)): len(v) for k, v in sweeps.items()}
    compile_limit = max(30.0, 0.5 * args.budget_s - (time.perf_counter() - started))
    print(f"compiling in {workers} processes (at most {compile_limit:.0f} s) ...", flush=True)
    result["precompile"] = precompile(cases, sweeps, workers, compile_limit)
    pre = result["precompile"]
    print(
        f"  {pre['finished']}/{pre['tasks']} compile tasks in {pre.get('seconds', 0):.0f} s, "
        f"{len(pre['errors'])} launch errors{' (timed out)' if pre['timed_out'] else ''}",
        flush=True,
    )
    write()

    result["cases"] = []
    for case in cases:
        try:
            row = run_case(case, device, copy["bytes_per_s"], sweeps, deadline, l2_bytes)
        except Exception as exc:
            row = {"name": case["name"], "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            row["traceback"] = traceback.format_exc()[-2000:]
            if device.type == "cuda":
                torch.cuda.empty_cache()
        result["cases"].append(row)
        print_row(row) if "error" not in row else print(f"{case['name']}: {row['error']}", flush=True)
        write()

    rows = result["cases"]
    result["all_heuristic_correct"] = all(r.get("heuristic", {}).get("correct") for r in rows)
    result["best_table"] = {
        r["name"]: {"label": r["best"]["label"], "us": r["best"]["us"], "pct_of_copy": r["best"]["pct_of_copy"]}
        for r in rows
        if "best" in r
    }
    write()
    print(
        f"{len(rows)} cases in {result['elapsed_s']:.0f} s; heuristic correct everywhere: "
        f"{result['all_heuristic_correct']}; wrote {args.out}",
        flush=True,
    )
    return 0 if result["all_heuristic_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
