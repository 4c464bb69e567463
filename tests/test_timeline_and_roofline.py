"""Idle-gap classification and roofline classes on hand-made traces whose answers are worked out below."""

from __future__ import annotations

import json

import pytest

from gpuadvisor.analysis.bundle import analyze_trace
from gpuadvisor.device.peaks import lookup_peaks
from gpuadvisor.trace.kineto import load_trace

H200 = dict(id=0, name="NVIDIA H200", totalGlobalMem=150109880320, computeMajor=9, computeMinor=0, numSms=132)


def x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(name, ts, dur, corr, ext, grid=(264, 1, 1)):
    return x(
        "kernel",
        name,
        ts,
        dur,
        tid=7,
        device=0,
        stream=7,
        correlation=corr,
        grid=list(grid),
        block=[128, 1, 1],
        **{"External id": ext},
    )


def launch(ts, dur, corr, ext, name="cudaLaunchKernel"):
    return x("cuda_runtime", name, ts, dur, correlation=corr, **{"External id": ext})


def write(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"deviceProperties": [H200], "traceEvents": events}))
    return load_trace(path)


def test_idle_gaps_are_split_by_what_ended_them(tmp_path):
    """One 100 µs step. Kernel A 10-20 (launched 5-8), a stream sync 15-21; kernel B 40-50 launched at
    35-37, after the GPU went idle at 20 but the sync returned inside that gap -> the 20 µs gap is sync;
    kernel C 55-60 was launched at 30-33, before the gap 50-55 began -> other; the lead 0-10 (A's launch
    ended at 8, inside the gap) and the tail 60-100 (no more work) are launch. Busy 25, launch 50, sync 20,
    other 5."""
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        launch(5, 3, 1, 11),
        kernel("gemm_a", 10, 10, 1, 11),
        x("cuda_runtime", "cudaStreamSynchronize", 15, 6, correlation=2),
        launch(30, 3, 3, 13),
        launch(35, 2, 4, 14),
        kernel("gemm_b", 40, 10, 4, 14),
        kernel("gemm_c", 55, 5, 3, 13),
    ]
    steps = analyze_trace(write(tmp_path, events), lookup_peaks(None)).steps
    row = steps.iloc[0]
    assert (row.step_time_us, row.gpu_busy_us) == (100, 25)
    assert (row.idle_launch_us, row.idle_sync_us, row.idle_other_us) == (50, 20, 5)
    assert row.host_syncs == 1 and row.launch_calls == 3 and row.kernels == 3


def test_a_gap_the_host_spends_in_long_cuda_calls_is_not_launch_idle(tmp_path):
    """One 10 ms step. Kernel A 0.1-0.2 ms; then the host sits in a 3 ms cudaMalloc and a 2 ms first launch of
    kernel B (its module loading) before B runs at 5.4-5.5 ms: that 5.2 ms gap is "other". Kernel C's ordinary
    launch (0.02 ms) ends a 0.3 ms gap at 5.8 ms: "launch". A 4 ms cudaStreamSynchronize stays a sync: the
    4 ms tail in which it returns is sync idle. The report's timeline strip splits the gaps the same way."""
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 10_000),
        launch(50, 10, 1, 11),
        kernel("gemm_a", 100, 100, 1, 11),
        x("cuda_runtime", "cudaMalloc", 300, 3_000, correlation=9),
        launch(3_300, 2_000, 2, 12),
        kernel("gemm_b", 5_400, 100, 2, 12),
        launch(5_780, 20, 3, 13),
        kernel("gemm_c", 5_800, 100, 3, 13),
        launch(5_900, 10, 4, 14),
        kernel("gemm_d", 5_950, 50, 4, 14),
        x("cuda_runtime", "cudaStreamSynchronize", 6_000, 4_000, correlation=10),
    ]
    trace = write(tmp_path, events)
    analysis = analyze_trace(trace, lookup_peaks(None))
    row = analysis.steps.iloc[0]
    assert row.gpu_busy_us == 350
    assert row.idle_other_us == pytest.approx(5_200)
    assert row.idle_sync_us == pytest.approx(4_000)  # the tail, in which the long sync returns
    assert row.idle_launch_us == pytest.approx(100 + 300 + 50)  # the lead and the gaps before C and D
    from gpuadvisor.analysis.timeline import long_host_calls, step_timeline, sync_calls

    strip = step_timeline(analysis.steps, analysis.activities, sync_calls(trace), long_host_calls(trace))
    assert sum(d for _, d in strip["idle_other"]) == pytest.approx(5_200)
    assert [round(s) for s, _ in strip["idle_other"]] == [200]


def test_roofline_classes_from_shapes_grids_and_launches(tmp_path):
    """On an H200 (132 SMs; datasheet bf16 989.5 TFLOP/s, 4.8 TB/s; 25 MB of a kernel's writes still in the L2
    when it ends, roofline.L2_DEFERRED_WRITE_BYTES):
    - a bf16 4096^3 mm: 137.4 GFLOP over 100.7 MB, less 25 MB of its 33.6 MB output -> intensity 1816 FLOP/B,
      above the ridge (206): compute; in 200 µs it runs at 687 TFLOP/s = 69.4% of its roof;
    - a bf16 add of two 4096x4096 tensors: 16.8 M FLOP over 75.7 MB (100.7 counted, 25 of its writes held in the
      L2) -> memory; 22 µs -> 3.44 TB/s = 71.7%;
    - the same add with a 64-block grid (under one wave of 132 SMs) at the same 71.7%: memory, whatever its grid
      (>= 60% of its roof); with that grid in 300 µs (5%): latency;
    - a 2 µs kernel whose launch call took 5 µs: launch."""
    mm_args = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    add_args = {
        "Input Dims": [[4096, 4096], [4096, 4096], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "Scalar"],
    }
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 1000),
        x("cpu_op", "aten::mm", 1, 9, **{"External id": 1, "flops": 2 * 4096**3, **mm_args}),
        launch(2, 5, 1, 1),
        kernel("nvjet_gemm", 10, 200, 1, 1),
        x("cpu_op", "aten::add", 300, 9, **{"External id": 2, **add_args}),
        launch(301, 5, 2, 2),
        kernel("vectorized_elementwise_kernel_add", 310, 22, 2, 2),
        x("cpu_op", "aten::add", 400, 9, **{"External id": 3, **add_args}),
        launch(401, 5, 3, 3),
        kernel("vectorized_elementwise_kernel_add_small", 410, 22, 3, 3, grid=(64, 1, 1)),
        launch(500, 5, 4, 4),
        kernel("tiny_fill", 510, 2, 4, 4),
        x("cpu_op", "aten::add", 520, 9, **{"External id": 5, **add_args}),
        launch(521, 5, 5, 5),
        kernel("vectorized_elementwise_kernel_add_slow", 530, 300, 5, 5, grid=(64, 1, 1)),
    ]
    trace = write(tmp_path, events)
    k = analyze_trace(trace, lookup_peaks(trace.device)).kernels.set_index("name")
    assert k.loc["nvjet_gemm", "bound"] == "compute"
    assert k.loc["nvjet_gemm", "intensity"] == pytest.approx(2 * 4096**3 / (3 * 4096 * 4096 * 2 - 25e6), rel=1e-9)
    assert k.loc["nvjet_gemm", "pct_of_roof"] == pytest.approx(100 * 2 * 4096**3 / 200e-6 / 989.5e12, rel=1e-3)
    assert not k.loc["nvjet_gemm", "estimated"]  # the profiler's own FLOP count
    assert k.loc["vectorized_elementwise_kernel_add", "bound"] == "memory"
    assert k.loc["vectorized_elementwise_kernel_add", "pct_of_roof"] == pytest.approx(
        100 * (3 * 4096 * 4096 * 2 - 25e6) / 22e-6 / 4.8e12, rel=1e-3
    )
    assert k.loc["vectorized_elementwise_kernel_add", "bytes_basis"].endswith(
        "; less 25.0 MB of its writes still in the L2 at its end"
    )
    assert k.loc["vectorized_elementwise_kernel_add_small", "bound"] == "memory"
    assert k.loc["vectorized_elementwise_kernel_add_slow", "bound"] == "latency"
    assert k.loc["tiny_fill", "bound"] == "launch"


# Bytes per operator family, the 100% ceiling and the class order, on the committed traces ------------------

from pathlib import Path  # noqa: E402

from gpuadvisor.analysis.op_costs import op_cost  # noqa: E402
from gpuadvisor.pipeline import analyze_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT.parent / "shared" / "traces" / "public"
ALL_TRACES = sorted(ROOT.glob("sample_traces/*.json.gz")) + sorted(ROOT.glob("sample_traces/real/*.json.gz"))
ALL_TRACES += sorted(PUBLIC.glob("*.json.gz")) + sorted(PUBLIC.glob("two_ranks/*.json.gz"))


def test_gathers_and_slice_writes_count_what_they_touch():
    """The decode sample's embedding lookup (index_select of 1 row of a 32000x2048 bf16 table) and KV-cache
    write (index_copy_ of one [1, 16, 1, 128] slot into a [1, 16, 1024, 128] cache), as recorded: the index,
    the row or slot read and written, not the 131 MB table or the 4.2 MB cache."""
    bf16, long = "c10::BFloat16", "long int"
    row = op_cost("aten::index_select", [[32000, 2048], [], [1]], [bf16, "Scalar", long], 0.0)
    assert row.bytes == 8 + 2 * 2048 * 2 and "index" in row.basis
    slot = op_cost("aten::index_copy_", [[1, 16, 1024, 128], [], [1], [1, 16, 1, 128]], [bf16, "Scalar", long, bf16], 0)
    assert slot.bytes == 8 + 2 * 16 * 128 * 2
    fill = op_cost("aten::fill_", [[4096, 4096], []], ["float", "Scalar"], 0.0)
    assert fill.bytes == 4096 * 4096 * 4  # written only
    gather = op_cost("aten::gather", [[50257, 768], [], [8192, 768]], ["c10::Half", "Scalar", long], 0.0)
    assert gather.bytes == 8192 * 768 * (8 + 2 * 2)
    # what each writes, of those bytes (the L2 holds a kernel's last writes: roofline.l2_deferred_writes)
    assert (row.written, slot.written, fill.written, gather.written) == (
        2048 * 2,
        16 * 128 * 2,
        fill.bytes,
        8192 * 768 * 2,
    )


def test_convolution_backward_reads_the_output_grad_once_per_gradient_kernel():
    """A ResNet-50 bottleneck's 3x3 convolution backward (batch 64, 64 channels, 56x56, fp32): dy is read by the
    grad-input and the grad-weight kernels; x and w read once; dx and dw written."""
    dy = x = [64, 64, 56, 56]
    w = [64, 64, 3, 3]
    cost = op_cost("aten::convolution_backward", [dy, x, w], ["float", "float", "float"], 0.0)
    act, weight = 64 * 64 * 56 * 56 * 4, 64 * 64 * 9 * 4
    assert cost.bytes == 2 * act + act + weight + act + weight
    assert "dgrad and the wgrad" in cost.basis


def test_convolution_backward_counts_only_the_gradients_its_output_mask_asks_for():
    """A network's first convolution has no grad input (output_mask "[False, True, False]", as the ResNet-50
    step's stem records it) and a frozen layer no grad weight: one GEMM's FLOPs, not two; the mask's text is
    argument 10 of the call's Concrete Inputs."""
    dy, x, w = [64, 64, 112, 112], [64, 3, 224, 224], [64, 3, 7, 7]
    types = ["float"] * 3
    concrete = ["", "", "", "[0]", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"]
    both = op_cost("aten::convolution_backward", [dy, x, w], types, 0.0, [*concrete, "[True, True, False]"])
    stem = op_cost("aten::convolution_backward", [dy, x, w], types, 0.0, [*concrete, "[False, True, False]"])
    frozen = op_cost("aten::convolution_backward", [dy, x, w], types, 0.0, [*concrete, "[True, False, False]"])
    gemm = 2.0 * 64 * 64 * 112 * 112 * 3 * 7 * 7
    assert both.flops == 2 * gemm and stem.flops == gemm and frozen.flops == gemm
    moved = (64 * 64 * 112 * 112 + 64 * 3 * 224 * 224 + 64 * 3 * 7 * 7) * 4
    assert stem.bytes == frozen.bytes == moved < both.bytes
    assert "grad weight only (output_mask)" in stem.basis and "grad input only (output_mask)" in frozen.basis
    # no mask recorded, or a mask that is not one: both gradients, as before
    for tail in ([], ["nonsense"], ["[False, False, True]"]):
        assert op_cost("aten::convolution_backward", [dy, x, w], types, 0.0, [*concrete, *tail]).flops == 2 * gemm
    trace = load_trace(ROOT / "sample_traces" / "real" / "timm_resnet50_train.json.gz")
    k = analyze_trace(trace, lookup_peaks(trace.device, None)).kernels
    stem_grad = k[k["bytes_basis"].astype(str).str.contains("grad weight only", regex=False)]
    assert len(stem_grad) == 2 * 3 and stem_grad["flops"].max() == pytest.approx(gemm)


def test_a_strided_convolution_counts_its_output_from_the_recorded_stride():
    """ResNet-50's stem (a 7x7 convolution, stride 2, padding 3, as the profiler's Concrete Inputs record them):
    a 112x112 output, not a 224x224 one; without the record, stride 1 is assumed and said."""
    dims, types = [[64, 3, 224, 224], [64, 3, 7, 7], [], [], []], ["float", "float"] + ["ScalarList"] * 3
    concrete = ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]
    cost = op_cost("aten::cudnn_convolution", dims, types, 0.0, concrete)
    out = 64 * 64 * 112 * 112
    assert cost.flops == 2.0 * out * 3 * 7 * 7
    assert cost.bytes == (64 * 3 * 224 * 224 + 64 * 3 * 49 + out) * 4
    assert "as recorded" in cost.basis
    assumed = op_cost("aten::cudnn_convolution", dims, types, 0.0)
    assert assumed.flops == 4 * cost.flops and "stride 1 assumed" in assumed.basis
    # aten::convolution (input, weight, bias, stride, padding, dilation, transposed, ...): a transposed one is
    # not a strided forward one
    dims3 = [[8, 16, 32, 32], [32, 16, 3, 3], [32], [], [], [], []]
    types3 = ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    strided = op_cost("aten::convolution", dims3, types3, 0.0, ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False"])
    assert strided.flops == 2.0 * 8 * 32 * 16 * 16 * 16 * 9
    transposed = op_cost("aten::convolution", dims3, types3, 0.0, ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True"])
    assert "stride 1 assumed" in transposed.basis
    assert "stride 1 assumed" in op_cost("aten::conv2d", dims3, types3, 0.0, ["", "", "", "'same'"]).basis


def test_a_strided_convolution_reads_only_the_input_its_windows_touch():
    """A 1x1 convolution of stride 2 (ResNet-50's downsampling shortcut) reads one input pixel in four; a 3x3 of
    stride 2 and padding 1, or the 7x7 stem of stride 2, every pixel."""
    from gpuadvisor.analysis.op_costs import conv_input_read_share

    name, concrete = "aten::cudnn_convolution", lambda p, s, d: ["", "", f"[{p}, {p}]", f"[{s}, {s}]", f"[{d}, {d}]"]
    assert conv_input_read_share(name, [64, 256, 56, 56], [512, 256, 1, 1], concrete(0, 2, 1)) == 0.25
    assert conv_input_read_share(name, [64, 256, 56, 56], [256, 256, 3, 3], concrete(1, 2, 1)) == 1.0
    assert conv_input_read_share(name, [64, 3, 224, 224], [64, 3, 7, 7], concrete(3, 2, 1)) == 1.0
    assert conv_input_read_share(name, [8, 16, 9, 9], [16, 16, 1, 1], concrete(0, 3, 1)) == pytest.approx(1 / 9)
    assert conv_input_read_share(name, [8, 16, 32, 32], [16, 16, 3, 3], concrete(2, 1, 2)) == 1.0  # dilated
    assert conv_input_read_share(name, [8, 16, 32, 32], [16, 16, 1, 1], None) == 1.0  # not recorded: all of it
    dims, types = [[64, 256, 56, 56], [512, 256, 1, 1], [], [], []], ["float", "float"] + ["ScalarList"] * 3
    cost = op_cost(name, dims, types, 0.0, concrete(0, 2, 1) + ["1", "False", "False", "True"])
    assert cost.bytes == (64 * 256 * 56 * 56 // 4 + 512 * 256 + 64 * 512 * 28 * 28) * 4
    assert "its windows read 25% of the input" in cost.basis
    # its backward: the wgrad kernel reads the input where the windows touched it; dgrad writes all of grad input
    x, w, g = 64 * 256 * 56 * 56 * 4, 512 * 256 * 4, 64 * 512 * 28 * 28 * 4
    bw_dims = [[64, 512, 28, 28], [64, 256, 56, 56], [512, 256, 1, 1], [], [], [], [], [], [], [], []]
    bw_types = ["float"] * 3 + ["ScalarList"] * 8
    bw = ["", "", "", "[0]", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    assert op_cost("aten::convolution_backward", bw_dims, bw_types, 0.0, bw).bytes == 2 * g + x / 4 + w + x + w
    whole = op_cost("aten::convolution_backward", bw_dims, bw_types, 0.0, bw[:7] + ["True"] + bw[8:])
    assert whole.bytes == 2 * g + 2 * x + 2 * w  # transposed: not a strided read


@pytest.mark.parametrize("fast", [True, False])
def test_both_readers_keep_the_concrete_inputs(fast, monkeypatch):
    from gpuadvisor.trace import columns
    from gpuadvisor.trace.kineto import concrete_inputs_raw, load_trace

    declined = []
    if not fast:  # the checked reader, as for a file the fast one declines
        monkeypatch.setattr(columns, "load_columns", lambda *args, **kwargs: declined.append(1))
    path = Path(__file__).resolve().parents[1] / "sample_traces" / "real" / "timm_resnet50_train.json.gz"
    ops = load_trace(path).cpu_ops
    assert len(declined) == (0 if fast else 1)
    conv = ops[ops["name"] == "aten::cudnn_convolution"]
    first = concrete_inputs_raw(conv["concrete_inputs_raw"].iloc[:1])[0]
    assert first[2:5] == ["[3, 3]", "[2, 2]", "[1, 1]"]  # the stem: padding 3, stride 2, dilation 1


@pytest.fixture(scope="module")
def every_report() -> dict[str, dict]:
    reports = {}
    for path in ALL_TRACES:
        try:
            reports[str(path.relative_to(path.parents[1]))] = analyze_path(path)
        except Exception as exc:  # CPU-only and other-accelerator traces: no kernels (test_public_traces)
            assert "GPU kernels" in str(exc)
    return reports


def test_no_kernel_row_shows_more_than_100_pct_of_roof(every_report):
    # The committed traces always; the public ones where ../shared/traces/public is there (not in every clone).
    assert len(every_report) >= (20 if PUBLIC.is_dir() else 11)
    inconsistent = bounded = 0
    for name, report in every_report.items():
        for k in report["kernels"]:
            assert k["pct_of_roof"] is None or k["pct_of_roof"] <= 100.0, (name, k["name"], k["pct_of_roof"])
            if k["roof_note"]:
                inconsistent += 1
                if "multi_tensor_apply_kernel" in k["name"]:  # bytes bounded by the grid's chunks
                    assert k["roof_note"].startswith("bytes upper bound above the HBM roof ("), k["roof_note"]
                    bounded += 1
                else:
                    assert "estimate inconsistent" in k["roof_note"], k["roof_note"]
    assert inconsistent > bounded > 0  # L2-resident optimizer updates (GPT-2 training), small foreach lists


def test_decode_embedding_kv_write_and_gemv_classes(every_report):
    """llama_decode on the H200: the embedding lookup and the KV-cache write move kilobytes, not the table or
    cache; the 126-block lm-head GEMV is memory-bound (>= 60% of the HBM roof) and out of GA102."""
    report = every_report["sample_traces/llama_decode.json.gz"]
    rows = {k["name"]: k for k in report["kernels"]}
    embedding = next(k for n, k in rows.items() if "indexSelectSmallIndex" in n)
    kv_write = next(k for n, k in rows.items() if "index_copy_kernel" in n)
    gemv = rows["nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT"]
    # the index and the row (slot) read; the row (slot) written is still in the L2 when the kernel ends
    assert embedding["bytes"] / embedding["count"] == 8 + 2048 * 2 and embedding["pct_of_roof"] < 1
    assert kv_write["bytes"] / kv_write["count"] == 8 + 16 * 128 * 2 and kv_write["pct_of_roof"] < 1
    assert gemv["blocks"] == 126 and gemv["bound"] == "memory" and 60 <= gemv["pct_of_roof"] <= 100
    ga102 = next(f for f in report["findings"] if f["rule_id"] == "GA102")
    assert "256x8_64x6" not in ga102["message"]


def test_no_kernel_near_its_roof_is_latency_or_in_ga102():
    """Over a real trace (hf_bert_finetune_amp, H200): every launch at >= 60% of its roof is memory or compute,
    whatever its grid, and GA102's time is that of the under-wave launches below 60% only."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.analysis.roofline import NEAR_ROOF_PCT
    from gpuadvisor.rules.engine import load_rules, run_rules

    trace = load_trace(ROOT / "sample_traces/real/hf_bert_finetune_amp.json.gz")
    a = analyze_trace(trace, lookup_peaks(trace.device))
    k = a.kernels
    near = k[(k["pct_of_roof"] >= NEAR_ROOF_PCT) & (k["family"] != "communication")]
    assert len(near) and set(near["bound"]) <= {"memory", "compute"}
    assert ((near["blocks"] > 0) & (near["blocks"] < 132)).any()  # under one wave, still roof-bound
    findings, _ = run_rules(a, load_rules())
    ga102 = next(f for f in findings if f.rule_id == "GA102")
    inside = k[(k["step_index"] >= 0) & (k["blocks"] > 0) & (k["blocks"] < 132) & ~(k["pct_of_roof"] >= 60)]
    inside = inside[inside["family"] != "communication"]
    assert ga102.evidence["us_per_step"] == pytest.approx(inside["dur_us"].sum() / a.n_steps, abs=0.1)


@pytest.mark.skipif(not (PUBLIC / "diff_test.json.gz").exists(), reason="shared/traces/public is not available")
def test_graph_replayed_kernels_are_never_launch_bound():
    """diff_test (HTA's test data, a V100 job replaying CUDA graphs): 744 kernels per step linked to
    cudaGraphLaunch calls, nearly all shorter than that call. None is launch-bound in the analysis, and apply's
    graph_replay_facts reports the same classes as the analysis."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.analysis.graph_replay import graph_replay_facts

    path = PUBLIC / "diff_test.json.gz"
    trace = load_trace(path)
    k = analyze_trace(trace, lookup_peaks(trace.device)).kernels
    replayed = k[k["graph_replay"]]
    assert len(replayed) > 1000 and (replayed["dur_us"] < replayed["launch_dur_us"]).mean() > 0.9
    assert "launch" not in set(replayed["bound"])
    assert (k.loc[~k["graph_replay"], "bound"] == "launch").any()  # kernels with a launch call of their own can be
    facts = graph_replay_facts(path)
    report = analyze_path(path)
    assert facts["kernels_per_step"] == 744
    assert facts["classes_us_per_step"] == pytest.approx(report["kernel_classes"], abs=0.05)
    assert facts["relabelled_launch_us_per_step"] > 0.9 * facts["us_per_step"]


def test_roof_cell_says_when_the_estimate_is_inconsistent():
    from gpuadvisor.report.sections import roof_cell

    note = "bytes estimate inconsistent: 25.2 MB per call in 4.42 µs would be 119% of the HBM roof (...)"
    assert roof_cell({"pct_of_roof": None, "roof_note": note}, "—", False) == ">100% (bytes estimate inconsistent)"
    assert roof_cell({"pct_of_roof": None, "roof_note": note}, "—", True) == f">100% ({note})"
    assert roof_cell({"pct_of_roof": 71.3, "roof_note": None}, "~71.3%", False) == "~71.3%"
