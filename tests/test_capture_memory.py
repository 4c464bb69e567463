"""gpuadvisor/capture/memory.py: allocator statistics, memory-snapshot summary, KV-cache capacity.

Pure functions, so these run on a CPU: the allocator figures are those of a real H200 run (the apply report
in benchmarks/results/apply_llama_decode_all: the decode example before the fixes), the snapshot is built
here in torch's documented layout (``torch.cuda.memory._snapshot``), and the KV-cache figures are worked out
by hand in the comments.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpuadvisor.capture import memory

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
GIB = 1 << 30

# torch.cuda.memory_stats() keys, figures of the H200 decode run before the fixes (apply_llama_decode_all:
# before.peak_memory_bytes and peak_memory_reserved_bytes); device total from the H200 trace's DeviceInfo.
H200_TOTAL_BYTES = 150_109_880_320
DECODE_STATS = {
    "allocated_bytes.all.peak": 2_051_764_736,
    "reserved_bytes.all.peak": 2_908_749_824,
    "active_bytes.all.peak": 2_051_764_736,
    "requested_bytes.all.peak": 2_051_700_000,
    "inactive_split_bytes.all.peak": 48 * MB,
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "num_device_alloc": 31,
    "num_device_free": 0,
}


def test_allocator_summary_of_the_decode_run():
    s = memory.allocator_summary(DECODE_STATS, H200_TOTAL_BYTES, 140 * GIB)
    assert s["allocated_peak_bytes"] == 2_051_764_736 and s["reserved_peak_bytes"] == 2_908_749_824
    # 2,908,749,824 - 2,051,764,736 = 856,985,088 bytes held beyond the tensors' peak: 29.46% of the reserve.
    assert s["reserved_minus_allocated_peak_bytes"] == 856_985_088
    assert s["fragmentation_pct"] == 29.46
    # 2.91 GB of 150.1 GB: 1.94% of the device; 147.2 GB of headroom.
    assert s["peak_pct_of_device"] == 1.94
    assert s["headroom_bytes"] == 147_201_130_496
    assert s["inactive_split_peak_bytes"] == 48 * MB
    assert s["num_alloc_retries"] == 0 and s["num_ooms"] == 0 and s["notes"] == []


def test_allocator_summary_says_what_retries_and_ooms_mean_and_survives_missing_keys():
    s = memory.allocator_summary(dict(DECODE_STATS, num_alloc_retries=3, num_ooms=1))
    assert any("3 allocation(s) failed" in n for n in s["notes"])
    assert any("1 out-of-memory" in n for n in s["notes"])
    assert s["headroom_bytes"] is None and s["peak_pct_of_device"] is None  # no device total given
    empty = memory.allocator_summary({})
    assert empty["allocated_peak_bytes"] is None and empty["fragmentation_pct"] is None


def _frames(line: int, name: str = "step") -> list[dict]:
    """A Python stack as torch records it, innermost first: torch's own frames, then the user's line."""
    return [
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": "model.py", "line": line, "name": name},
        {"filename": "??", "line": 0, "name": "PyEval_EvalFrame"},
    ]


def _snapshot() -> dict:
    """One 1 GiB segment: a 400 MB parameter block allocated before recording, a 100 MB block of activations
    alive at the snapshot, and free space 300 MB + 224 MB; one small segment of 2 MB, all free. The history:
    an input buffer from before recording freed first, then two activations (100 MB at model.py:10,
    200 MB at model.py:12), and their frees; the peak is 400 + 100 + 200 MB right after the 200 MB one."""
    base = 0x7F0000000000
    param, act1, act2, old_input = base, base + 400 * MB, base + 500 * MB, base + 700 * MB
    segments = [
        {
            "device": 0,
            "address": base,
            "total_size": 1024 * MB,
            "allocated_size": 500 * MB,
            "segment_type": "large",
            "is_expandable": False,
            "blocks": [
                {
                    "address": param,
                    "size": 400 * MB,
                    "requested_size": 400 * MB,
                    "state": "active_allocated",
                    "frames": _frames(3, "build"),
                },
                {
                    "address": act1,
                    "size": 100 * MB,
                    "requested_size": 100 * MB,
                    "state": "active_allocated",
                    "frames": _frames(10),
                },
                {"address": act2, "size": 300 * MB, "requested_size": 0, "state": "inactive", "frames": []},
                {"address": base + 800 * MB, "size": 224 * MB, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        },  # fmt: skip
        {
            "device": 0,
            "address": base + 2048 * MB,
            "total_size": 2 * MB,
            "allocated_size": 0,
            "segment_type": "small",
            "is_expandable": False,
            "blocks": [{"address": base + 2048 * MB, "size": 2 * MB, "state": "inactive", "frames": []}],
        },
    ]
    trace = [
        {"action": "free_requested", "addr": old_input, "size": 50 * MB, "frames": _frames(7)},
        {"action": "free_completed", "addr": old_input, "size": 50 * MB, "frames": _frames(7)},
        {"action": "segment_alloc", "addr": base, "size": 1024 * MB, "frames": []},
        {"action": "alloc", "addr": act1, "size": 100 * MB, "frames": _frames(10)},
        {"action": "alloc", "addr": act2, "size": 200 * MB, "frames": _frames(12)},
        {"action": "free_requested", "addr": act2, "size": 200 * MB, "frames": _frames(12)},
        {"action": "free_completed", "addr": act2, "size": 200 * MB, "frames": _frames(12)},
        {"action": "alloc", "addr": act2, "size": 20 * MB, "frames": _frames(14)},
        {"action": "free_completed", "addr": act2, "size": 20 * MB, "frames": _frames(14)},
    ]
    return {"segments": segments, "device_traces": [trace]}, param


def test_snapshot_summary_segments_peak_categories_and_sites():
    snapshot, param = _snapshot()
    s = memory.snapshot_summary(snapshot, {"parameters": [(param + 4096, 400 * MB - 4096)]})
    assert s["segments"] == 2 and s["segments_by_type"] == {"large": 1, "small": 1}
    assert s["reserved_bytes"] == 1026 * MB
    assert s["allocated_bytes"] == 500 * MB
    # Free: 300 + 224 + 2 = 526 MB; the largest piece is 300 MB: 1 - 300/526 = 42.97% of it unusable at once.
    assert s["free_bytes"] == 526 * MB and s["largest_free_block_bytes"] == 300 * MB
    assert s["external_fragmentation_pct"] == 42.97
    # Peak: 400 (parameters, there all along) + 100 + 200 MB = 700 MB; the old input was freed before it.
    assert s["peak_bytes"] == 700 * MB
    assert s["bytes_by_category"] == {"parameters": 400 * MB, memory.CATEGORY_ACTIVATIONS: 300 * MB}
    assert s["top_sites"] == [
        {"site": "model.py:3 (build)", "bytes": 400 * MB, "count": 1},
        {"site": "model.py:12 (step)", "bytes": 200 * MB, "count": 1},
        {"site": "model.py:10 (step)", "bytes": 100 * MB, "count": 1},
    ]
    assert s["trace_events"] == s["trace_events_used"] == 9 and s["ooms"] == 0 and s["notes"] == []


def test_snapshot_summary_reads_only_the_last_events_of_a_long_history():
    snapshot, param = _snapshot()
    trace = snapshot["device_traces"][0]
    # 10,000 alloc/free pairs of 1 MB before the interesting part: read the last 9 events only.
    filler = []
    for i in range(10_000):
        filler += [
            {"action": "alloc", "addr": 0x10 + i, "size": MB},
            {"action": "free_completed", "addr": 0x10 + i, "size": MB},
        ]
    snapshot["device_traces"][0] = filler + trace
    s = memory.snapshot_summary(snapshot, {"parameters": [(param, 400 * MB)]}, max_events=len(trace))
    assert s["trace_events"] == 20_009 and s["trace_events_used"] == 9
    assert s["peak_bytes"] == 700 * MB
    assert "the last 9 were read" in s["notes"][0]
    # Without history (context "state" only): the figures at the snapshot.
    bare = memory.snapshot_summary({"segments": snapshot["segments"], "device_traces": [[]]})
    assert bare["peak_bytes"] == 500 * MB
    assert bare["bytes_by_category"] == {memory.CATEGORY_BEFORE: 500 * MB}
    assert "no allocation history" in bare["notes"][0]


def test_kv_bytes_per_token_by_hand():
    # Llama-2-7B: 32 layers, 32 KV heads (no GQA), head_dim 128, fp16: 2 x 32 x 32 x 128 x 2 = 524,288 B (0.5 MiB).
    llama2 = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": "float16"}
    dims = memory.kv_dims_from_config(llama2)
    assert dims == (32, 32, 128)
    per_token = memory.kv_bytes_per_token(*dims, itemsize=2)
    assert per_token == 524_288
    # The figure: batch 64 x 2,048 tokens = 131,072 tokens -> 64 GiB, "over 30 GB".
    assert per_token * 64 * 2048 == 64 * GIB
    # Llama-3-8B has GQA: 8 KV heads for 32 query heads -> a quarter: 131,072 B a token.
    llama3 = dict(llama2, num_key_value_heads=8)
    assert memory.kv_bytes_per_token(*memory.kv_dims_from_config(llama3), itemsize=2) == 131_072
    # GPT-2 names: n_layer 12, n_head 12, n_embd 768 -> head_dim 64.
    assert memory.kv_dims_from_config({"n_layer": 12, "n_head": 12, "n_embd": 768}) == (12, 12, 64)
    assert memory.kv_dims_from_config({"n_layer": 12}) is None


def test_kv_cache_capacity_by_hand():
    # 100 GiB free, 0.5 MiB a token, sequences up to 2,048 tokens: 1 GiB each -> 100 sequences, 204,800 tokens.
    c = memory.kv_cache_capacity(524_288, 100 * GIB, 2048, itemsize=2, mean_tokens=700)
    assert c["bytes_per_sequence"] == GIB
    assert c["tokens_that_fit"] == 204_800 and c["sequences_that_fit"] == 100
    # FP8 halves the bytes: 200 sequences.
    assert c["fp8_bytes_per_token"] == 262_144 and c["fp8_sequences_that_fit"] == 200
    # Paged at 700 tokens on average: 44 pages of 16 = 704 tokens -> 352 MiB a sequence -> 290 (581 in FP8).
    assert c["paged_sequences_that_fit"] == 290 and c["paged_fp8_sequences_that_fit"] == 581
    # An 8-bit cache has nothing to halve; without a mean length paging is not estimated.
    c8 = memory.kv_cache_capacity(262_144, 100 * GIB, 2048, itemsize=1)
    assert c8["fp8_sequences_that_fit"] is None and c8["paged_sequences_that_fit"] is None
    assert "already stores 1 byte" in c8["notes"][0]


def test_kv_cache_of_the_decode_example_by_hand():
    """examples/llama_decode.py on the H200: 8 layers, 16 heads of 128, bf16, a static cache of 1,024 slots
    (batch 1): each layer's k_cache and v_cache are (1, 16, 1024, 128) bf16 = 4 MiB."""
    tensors = [((1, 16, 1024, 128), 2)] * 16
    found = memory.kv_cache_from_tensors(tensors)
    # 2 x 8 x 16 x 128 x 2 bytes = 65,536 B a token; 64 MiB in all; 1,024 slots, batch 1.
    assert found == {"bytes_per_token": 65_536, "cache_bytes": 64 * MB, "tokens": 1024, "batch": 1, "itemsize": 2}
    assert memory.kv_bytes_per_token(8, 16, 128, 2) == found["bytes_per_token"]
    # Headroom of the H200 run: 150,109,880,320 - 2,908,749,824 = 147,201,130,496 B. A 1,024-token sequence
    # takes 64 MiB: 2,193 sequences fit (4,386 with an FP8 cache); 2,246,111 tokens.
    headroom = memory.allocator_summary(DECODE_STATS, H200_TOTAL_BYTES)["headroom_bytes"]
    c = memory.kv_cache_capacity(found["bytes_per_token"], headroom, found["tokens"], itemsize=found["itemsize"])
    assert c["sequences_that_fit"] == 2193 and c["fp8_sequences_that_fit"] == 4386
    assert c["tokens_that_fit"] == 2_246_111


def _load_example():
    spec = importlib.util.spec_from_file_location("llama_decode_example", REPO / "examples" / "llama_decode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_cache_tensors_found_in_the_decode_example_model():
    torch = pytest.importorskip("torch")
    example = _load_example()
    config = example.CPU_CONFIG  # 2 layers, 4 heads, d_model 64 (head_dim 16), 32 slots
    model = example.build_model(config, device="cpu", dtype=torch.bfloat16)
    tensors = memory.cache_tensors(model)
    assert len(tensors) == 2 * config.n_layers
    found = memory.kv_cache_from_tensors((t.shape, t.element_size()) for t in tensors)
    # 2 x 2 layers x 4 heads x 16 x 2 bytes = 512 B a token, 32 slots.
    assert found["bytes_per_token"] == 512 == memory.kv_bytes_per_token(2, 4, 16, 2)
    assert found["tokens"] == config.max_seq_len
    dims = memory.kv_dims_from_config(
        {"n_layers": config.n_layers, "n_heads": config.n_heads, "d_model": config.d_model}
    )
    assert dims == (2, 4, 16)


def test_cache_tensors_of_a_transformers_like_cache_object():
    torch = pytest.importorskip("torch")

    class Layer:
        def __init__(self):
            self.keys = torch.zeros(2, 4, 8, 16, dtype=torch.float16)
            self.values = torch.zeros(2, 4, 8, 16, dtype=torch.float16)
            self.is_initialized = True

    class Cache:  # transformers 5: cache.layers[i].keys / .values
        def __init__(self):
            self.layers = [Layer() for _ in range(3)]

    tensors = memory.cache_tensors(Cache())
    assert len(tensors) == 6
    found = memory.kv_cache_from_tensors((t.shape, t.element_size()) for t in tensors)
    assert found["bytes_per_token"] == memory.kv_bytes_per_token(3, 4, 16, 2) and found["batch"] == 2


def test_category_ranges_of_a_training_step():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    ranges = memory.category_ranges(model, optimizer, cuda_only=False)
    assert len(ranges["parameters"]) == 4 + 3  # weight, bias, BN weight, bias; BN's running stats and count
    assert len(ranges["gradients"]) == 4
    assert len(ranges["optimizer state"]) == 4 * 2 + 4  # exp_avg, exp_avg_sq per parameter; 4 step counters
    assert memory.category_ranges(model, optimizer) == {"parameters": [], "gradients": [], "optimizer state": []}


def test_the_module_imports_without_torch(python):
    result = python("-c", "import sys, gpuadvisor.capture.memory; sys.exit('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
