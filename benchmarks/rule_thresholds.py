"""Measurements behind the thresholds in rules/ (GA301, GA401, GA402).

Run on a CUDA GPU: python3 benchmarks/rule_thresholds.py
(prints JSON; the results are in benchmarks/results/rule_thresholds.json)
CUDA-event medians of 30 runs after 5 warm-ups; host-blocked times with perf_counter.
"""

import json
import statistics as st
import time

import torch

d = "cuda"
tb = torch.backends.cuda.matmul


def ev(fn, n=30, w=5):
    for _ in range(w):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(True)
        b = torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return round(st.median(ts), 1)


r = {}
for M, N, K in [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 4096, 4096)]:
    A = torch.randn(M, K, device=d)
    B = torch.randn(K, N, device=d)
    tb.allow_tf32 = False
    f = ev(lambda: A @ B)
    tb.allow_tf32 = True
    t = ev(lambda: A @ B)
    tb.allow_tf32 = False
    Ab, Bb = A.bfloat16(), B.bfloat16()
    b = ev(lambda: Ab @ Bb)
    fl = 2 * M * N * K / 1e6
    r[f"{M}x{N}x{K}"] = dict(
        fp32_us=f, tf32_us=t, bf16_us=b, fp32_tf=round(fl / f), tf32_tf=round(fl / t), bf16_tf=round(fl / b)
    )
X = torch.randn(4096, 4096, device=d)


def host(fn):
    hs = []
    for _ in range(10):
        torch.cuda.synchronize()
        for _ in range(5):
            X @ X
        t0 = time.perf_counter()
        fn()
        hs.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(st.median(hs), 1)


for mib in [1, 64]:
    n = mib * 2**20 // 4
    pg = torch.randn(n)
    pn = torch.randn(n).pin_memory()
    g = torch.empty(n, device=d)
    r[f"h2d_{mib}MiB"] = dict(
        pageable_us=ev(lambda: g.copy_(pg)),
        pinned_us=ev(lambda: g.copy_(pn, non_blocking=True)),
        host_blocked_pageable_us=host(lambda: g.copy_(pg)),
        host_blocked_pinned_nb_us=host(lambda: g.copy_(pn, non_blocking=True)),
    )
r["gemm_queue_us"] = ev(lambda: [X @ X for _ in range(5)], 10, 2)
x = torch.randn(1024, device=d)
ts = []
for _ in range(200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x.sum().item()
    ts.append((time.perf_counter() - t0) * 1e6)
r["item_idle_us"] = round(st.median(ts[20:]), 1)
r["torch"] = torch.__version__
r["gpu"] = torch.cuda.get_device_name()
print(json.dumps(r))
