"""Time rope_kv_update + decode_attention against the eager decode attention of examples/llama_decode.py.

At the example's decode shape (B=1, H=16, S=1, hd=128, T=1024, bf16), for the query at slot T-1 (the whole
cache) and at T/2, on random data:

- eager: the example's code path per layer: split of qkv, ``apply_rotary`` on q and k (fp32), transposes,
  two ``index_copy_`` into the caches, ``F.scaled_dot_product_attention`` with the boolean causal-mask row
  (reads all T slots), and the transpose/reshape to [B, S, H * hd];
- fused: ``rope_kv_update`` then ``decode_attention`` (two launches, reads K and V only up to the position).

Each is timed two ways, with CUDA events after warm-up, median of --iters runs:

- per call, launched from Python (what an eager model pays: mostly launch overhead at this size);
- replayed from one captured ``torch.cuda.CUDAGraph`` that holds --layers layers' worth of calls (each layer
  its own caches, as in the model), divided by --layers (what a graph-captured decode step pays).

Each layer has its own 8 MiB of K and V, so --layers 8 (64 MiB) overflows the H200's 50 MiB L2 and the
rotating per-call timings, like the graph, mostly read from HBM. Bytes read is K and V up to the position
(what the fused kernels must read); the floor is those bytes over the device-to-device copy bandwidth
measured in the same run (bytes read + written per second, shared/GPU.md's yardstick).

The chunk size (slots per split program) and warp count of decode_attention are swept, graph-replayed, at
both positions: the evidence for ``chunk_for`` and ``NUM_WARPS`` in gpuadvisor/kernels/decode_attention.py
(``chosen_vs_best`` in the JSON). Outputs are checked against the float64 reference and eager's.

    python3 benchmarks/decode_attention_bench.py [--out benchmarks/results/decode_attention_bench.json]

Without CUDA it runs a tiny shape in Triton's interpreter (no graphs: the captured calls are run directly):
a smoke test of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_common import copy_bandwidth, load_example, median_us  # noqa: E402

from gpuadvisor.kernels import decode_attention as decode_attention_module  # noqa: E402
from gpuadvisor.kernels.decode_attention import chunk_for, decode_attention_reference  # noqa: E402
from gpuadvisor.kernels.rope_cache import rope_kv_update  # noqa: E402

CHUNKS = (16, 32, 64, 128, 256, 512)
NUM_WARPS = (1, 2, 4, 8)
# Largest |bf16 output - float64 reference| allowed, relative to the largest |reference|: the output's own
# rounding is 2**-9 of it at most; a lost or double-counted chunk is off by O(1) of it.
TOLERANCE = 1.6e-2


def capture(calls: list[Callable[[], object]], device: torch.device) -> Callable[[], object]:
    """One CUDA graph that runs ``calls`` in order; returns its replay. Without CUDA, a plain loop over them."""

    def run_all():
        for call in calls:
            call()

    if device.type != "cuda":
        return run_all
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and allocate outside the capture
            run_all()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_all()
    torch.cuda.synchronize()
    return graph.replay


def gpu_ops_per_call(fn: Callable[[], object], device: torch.device) -> int | str:
    """Kernels (and memcpy/memset) one call puts on the GPU, counted with the torch profiler."""
    if device.type != "cuda":
        return "n/a without CUDA"
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as exc:  # a profiler that cannot start must not cost the timings
        return f"profiler failed: {type(exc).__name__}: {exc}".splitlines()[0]


def max_abs_error(out: torch.Tensor, ref64: torch.Tensor) -> dict:
    err = (out.double() - ref64).abs().max().item()
    scale = ref64.abs().max().item()
    return {"max_abs_error": err, "max_abs_reference": scale, "within_tolerance": err <= TOLERANCE * scale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_attention_bench.json"))
    parser.add_argument("--iters", type=int, default=200, help="timed runs per median (>= 100 on a GPU)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8, help="layers' worth of calls per captured graph")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=1024, help="KV cache slots T")
    parser.add_argument("--copy-gib", type=float, default=1.0, help="size of the copied tensor, GiB")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("no CUDA: Triton's interpreter on a tiny shape, no graphs; the timings mean nothing", flush=True)
        args.heads, args.head_dim, args.slots, args.layers = 2, 16, 64, 2
        args.iters, args.warmup, args.copy_gib = 3, 1, 0.001
    batch, seq, n_heads, head_dim, n_slots, n_layers = 1, 1, args.heads, args.head_dim, args.slots, args.layers
    d_model, dtype = n_heads * head_dim, torch.bfloat16
    es = torch.empty((), dtype=dtype).element_size()
    example = load_example()

    result: dict = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU, Triton interpreter)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "shape": {"batch": batch, "heads": n_heads, "seq": seq, "head_dim": head_dim, "slots": n_slots},
        "dtype": "bf16",
        "layers_per_graph": n_layers,
        "iters": args.iters,
        "warmup": args.warmup,
        "timing": "median of CUDA-event timings after warm-up; graph rows: one replay / layers_per_graph",
    }
    copy = copy_bandwidth(args.copy_gib, args.iters, args.warmup, device)
    copy_bps = copy["bytes_per_s"]
    result["copy"] = copy
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the copy's 2 x copy_gib back
    print(f"copy {copy['tensor_bytes'] / 2**30:.2f} GiB: {copy['us']:.1f} us = {copy_bps / 1e12:.2f} TB/s", flush=True)

    g = torch.Generator(device=device).manual_seed(0)
    layers = [
        {
            "qkv": torch.randn((batch, seq, 3 * d_model), generator=g, device=device, dtype=dtype),
            "k_cache": torch.randn((batch, n_heads, n_slots, head_dim), generator=g, device=device, dtype=dtype),
            "v_cache": torch.randn((batch, n_heads, n_slots, head_dim), generator=g, device=device, dtype=dtype),
        }
        for _ in range(n_layers)
    ]
    # The model's tables as examples/llama_decode.py builds them (the rope table in bf16 after model.to(bf16)).
    config = example.LlamaConfig(n_heads=n_heads, d_model=d_model, max_seq_len=n_slots)
    rope_table = example.rotary_table(config).to(device=device, dtype=dtype)
    causal = torch.tril(torch.ones(n_slots, n_slots, dtype=torch.bool, device=device))
    input_pos = torch.zeros(seq, dtype=torch.int64, device=device)
    rope = rope_table[input_pos].clone()
    mask = causal[None, None, input_pos].clone()
    scale = 1.0 / math.sqrt(head_dim)

    def set_position(position: int) -> None:
        """In place, so captured graphs see it: the step's input_pos, its rope rows and its mask row."""
        input_pos.fill_(position)
        rope.copy_(rope_table[input_pos])
        mask.copy_(causal[None, None, input_pos])

    def eager(layer: dict) -> torch.Tensor:
        q, k, v = layer["qkv"].split(d_model, dim=-1)
        q = example.apply_rotary(q.view(batch, seq, n_heads, head_dim), rope)
        k = example.apply_rotary(k.view(batch, seq, n_heads, head_dim), rope)
        v = v.view(batch, seq, n_heads, head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        layer["k_cache"].index_copy_(2, input_pos, k)
        layer["v_cache"].index_copy_(2, input_pos, v)
        y = F.scaled_dot_product_attention(q, layer["k_cache"], layer["v_cache"], attn_mask=mask)
        return y.transpose(1, 2).reshape(batch, seq, d_model)

    def fused(layer: dict, chunk: int | None = None, num_warps: int = decode_attention_module.NUM_WARPS):
        q = rope_kv_update(layer["qkv"], rope, input_pos, layer["k_cache"], layer["v_cache"], n_heads)
        return decode_attention_module._launch(
            q, layer["k_cache"], layer["v_cache"], input_pos, scale, chunk, num_warps
        )

    def rotating(fn: Callable[[dict], object]) -> Callable[[], object]:
        state = {"i": 0}

        def call():
            state["i"] = (state["i"] + 1) % n_layers
            return fn(layers[state["i"]])

        return call

    chosen_chunk = chunk_for(batch, n_heads, seq, n_slots)
    chosen = {"chunk": chosen_chunk, "num_warps": decode_attention_module.NUM_WARPS}
    result["chosen"] = chosen
    print(f"chunk_for({batch}, {n_heads}, {seq}, {n_slots}) = {chosen_chunk}", flush=True)
    positions = {"last": n_slots - 1, "middle": n_slots // 2}
    all_correct = True
    runs: dict = {}
    sweep: list = []

    for name, position in positions.items():
        set_position(position)
        kv_bytes = 2 * batch * n_heads * (position + 1) * head_dim * es  # K and V up to the position
        row: dict = {
            "position": position,
            "kv_bytes_read_fused": kv_bytes,
            "kv_bytes_read_eager": 2 * batch * n_heads * n_slots * head_dim * es,  # the masked SDPA reads all T
            "floor_us": kv_bytes / copy_bps * 1e6,
        }
        # Correctness on layer 0: fused against float64 and against eager (which rewrites the same slot).
        out_eager = eager(layers[0]).clone()
        q = rope_kv_update(layers[0]["qkv"], rope, input_pos, layers[0]["k_cache"], layers[0]["v_cache"], n_heads)
        out_fused = decode_attention_module._launch(
            q, layers[0]["k_cache"], layers[0]["v_cache"], input_pos, scale, None, chosen["num_warps"]
        )
        ref = decode_attention_reference(q, layers[0]["k_cache"], layers[0]["v_cache"], input_pos)
        row["fused_error"] = max_abs_error(out_fused, ref)
        row["eager_error"] = max_abs_error(out_eager, ref)
        row["max_abs_fused_minus_eager"] = (out_fused.double() - out_eager.double()).abs().max().item()
        all_correct &= row["fused_error"]["within_tolerance"]
        row["gpu_ops_per_layer"] = {
            "eager": gpu_ops_per_call(lambda: eager(layers[0]), device),
            "fused": gpu_ops_per_call(lambda: fused(layers[0]), device),
        }

        for label, fn in (("eager", eager), ("fused", fused)):
            timing: dict = {"per_call_us": median_us(rotating(fn), args.iters, args.warmup, device)}
            try:
                replay = capture([lambda layer=layer, fn=fn: fn(layer) for layer in layers], device)
                timing["graph_us_per_layer"] = median_us(replay, args.iters, args.warmup, device) / n_layers
            except Exception as exc:
                timing["graph_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                traceback.print_exc()
            if "graph_us_per_layer" in timing:
                timing["graph_pct_of_copy_bandwidth"] = (
                    100 * kv_bytes / (timing["graph_us_per_layer"] * 1e-6) / copy_bps
                )
            row[label] = timing
        if "graph_us_per_layer" in row["eager"] and "graph_us_per_layer" in row["fused"]:
            row["graph_speedup"] = row["eager"]["graph_us_per_layer"] / row["fused"]["graph_us_per_layer"]
        row["per_call_speedup"] = row["eager"]["per_call_us"] / row["fused"]["per_call_us"]
        runs[name] = row
        print(
            f"pos {position:5d}: eager {row['eager']['per_call_us']:7.1f} us/call "
            f"{row['eager'].get('graph_us_per_layer', float('nan')):7.2f} us/layer in a graph | "
            f"fused {row['fused']['per_call_us']:7.1f} us/call "
            f"{row['fused'].get('graph_us_per_layer', float('nan')):7.2f} us/layer in a graph | "
            f"floor {row['floor_us']:.2f} us | ops/layer {row['gpu_ops_per_layer']} | "
            f"error {row['fused_error']['max_abs_error']:.2e}",
            flush=True,
        )

        # Sweep decode_attention alone (q fixed per layer), graph-replayed.
        queries = [
            rope_kv_update(layer["qkv"], rope, input_pos, layer["k_cache"], layer["v_cache"], n_heads)
            for layer in layers
        ]
        for chunk in CHUNKS:
            for num_warps in NUM_WARPS:
                entry: dict = {"position": position, "chunk": chunk, "num_warps": num_warps}
                try:

                    def attend(i, chunk=chunk, num_warps=num_warps, queries=queries):
                        layer = layers[i]
                        return decode_attention_module._launch(
                            queries[i], layer["k_cache"], layer["v_cache"], input_pos, scale, chunk, num_warps
                        )

                    out = attend(0)
                    ref = decode_attention_reference(queries[0], layers[0]["k_cache"], layers[0]["v_cache"], input_pos)
                    entry["within_tolerance"] = max_abs_error(out, ref)["within_tolerance"]
                    all_correct &= entry["within_tolerance"]
                    replay = capture([lambda i=i: attend(i) for i in range(n_layers)], device)
                    entry["graph_us_per_layer"] = median_us(replay, args.iters, args.warmup, device) / n_layers
                    entry["pct_of_copy_bandwidth"] = 100 * kv_bytes / (entry["graph_us_per_layer"] * 1e-6) / copy_bps
                except Exception as exc:  # one failing configuration must not lose the others
                    entry["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                sweep.append(entry)
        timed = [e for e in sweep if e["position"] == position and "graph_us_per_layer" in e]
        if timed:
            best = min(timed, key=lambda e: e["graph_us_per_layer"])
            mine = next(
                (e for e in timed if e["chunk"] == chosen["chunk"] and e["num_warps"] == chosen["num_warps"]), None
            )
            row["sweep_best"] = {k: best[k] for k in ("chunk", "num_warps", "graph_us_per_layer")}
            if mine is not None:
                row["chosen_vs_best"] = mine["graph_us_per_layer"] / best["graph_us_per_layer"]
            print(
                "  sweep (attention only, us/layer in a graph): "
                + " ".join(f"c{e['chunk']}w{e['num_warps']}={e['graph_us_per_layer']:.2f}" for e in timed)
                + f"\n  best c{best['chunk']}w{best['num_warps']}; chosen/best {row.get('chosen_vs_best', 'n/a')}",
                flush=True,
            )

    result["runs"] = runs
    result["sweep"] = sweep
    result["all_correct"] = bool(all_correct)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"all outputs within tolerance: {all_correct}; wrote {args.out}", flush=True)
    return 0 if all_correct else 1


if __name__ == "__main__":
    sys.exit(main())
