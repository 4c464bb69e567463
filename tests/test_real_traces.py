"""The real-model suite's H200 traces (sample_traces/real/*.json.gz, recorded from examples/real/ with
sample_traces/record_real.sh) against the findings committed beside them (<name>.expected.json).

Every trace in the folder is picked up; a new one without its expectation fails until it is written with
``GPUADVISOR_UPDATE_EXPECTED=1 python -m pytest tests/test_real_traces.py`` and reviewed. The explicit tests
below pin what the GA2xx/GA3xx model-pattern rules must find in which trace, with numbers counted here from
the raw JSON where they can be.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from gpuadvisor.pipeline import analyze_path
from gpuadvisor.rules.engine import load_rules

REAL = Path(__file__).resolve().parents[1] / "sample_traces" / "real"
TRACES = sorted(p.name[: -len(".json.gz")] for p in REAL.glob("*.json.gz"))
UPDATE = os.environ.get("GPUADVISOR_UPDATE_EXPECTED") == "1"
SUMMARY_KEYS = ["steps", "step_time_us", "gpu_busy_pct", "kernels_per_step", "host_syncs_per_step"]
NEW_RULES = ("GA202", "GA203", "GA204", "GA205", "GA302", "GA303")


def snapshot(report: dict) -> dict:
    return {
        "findings": [
            {
                "rule_id": f["rule_id"],
                "severity": f["severity"],
                "estimated_saving_pct": round(f["estimated_saving_pct"]),
                "fix_id": f["fix_id"],
            }
            for f in report["findings"]
        ],
        "summary": {k: report["summary"][k] for k in SUMMARY_KEYS},
        "gpu": report["env"]["gpu_name"],
    }


_REPORTS: dict[str, dict] = {}


def report_of(name: str) -> dict:
    if name not in _REPORTS:
        _REPORTS[name] = analyze_path(REAL / f"{name}.json.gz")
    return _REPORTS[name]


def finding(name: str, rule_id: str) -> dict | None:
    return next((f for f in report_of(name)["findings"] if f["rule_id"] == rule_id), None)


def _events(name: str) -> list[dict]:
    with gzip.open(REAL / f"{name}.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


def test_the_suite_has_traces():
    assert {"hf_gpt2_eager_attention", "hf_gpt2_train_foreach_off", "hf_bert_classifier"} <= set(TRACES)


@pytest.mark.parametrize("name", TRACES)
def test_findings_match_expectations(name):
    got = snapshot(report_of(name))
    path = REAL / f"{name}.expected.json"
    if UPDATE:
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"{path.name} missing: write it with GPUADVISOR_UPDATE_EXPECTED=1 and review it"
    expected = json.loads(path.read_text())
    assert got["gpu"] == expected["gpu"] == "NVIDIA H200"
    assert [f["rule_id"] for f in got["findings"]] == [f["rule_id"] for f in expected["findings"]]
    for g, e in zip(got["findings"], expected["findings"]):
        assert g["severity"] == e["severity"] and g["fix_id"] == e["fix_id"], g["rule_id"]
        assert g["estimated_saving_pct"] == pytest.approx(e["estimated_saving_pct"], abs=1), g["rule_id"]
    for key in SUMMARY_KEYS:
        assert got["summary"][key] == pytest.approx(expected["summary"][key], rel=1e-3, abs=0.05), key


@pytest.mark.parametrize("name", TRACES)
def test_every_new_finding_carries_a_saving_and_its_basis(name):
    for f in report_of(name)["findings"]:
        if f["rule_id"] in NEW_RULES:
            assert f["estimated_saving_us_per_step"] > 0 and f["estimated_saving_pct"] > 0
            assert isinstance(f["evidence"].get("basis"), str) and len(f["evidence"]["basis"]) > 30


# GA202 unfused attention ---------------------------------------------------------------------------


def test_eager_gpt2_attention_is_found_with_its_score_tensor():
    f = finding("hf_gpt2_eager_attention", "GA202")
    assert f is not None and f["fix_id"] == "sdpa" and f["category"] == "memory"
    ev = f["evidence"]
    assert ev["score_shape"] == [8, 12, 1024, 1024] and ev["score_shapes"] == [[8, 12, 1024, 1024]]
    assert ev["head_dim"] == 64 and ev["dtype"] == "c10::Half" and ev["causal"] is True
    # One chain per layer: the example builds 6 layers.
    assert ev["attention_blocks_per_step"] == 6
    assert ev["ops"][0] == "aten::matmul" and "aten::softmax" in ev["ops"] and ev["ops"][-1] == "aten::matmul"
    # 4·B·H·N²·d, halved (causal), per layer, 6 layers.
    assert ev["sdpa_flops_per_step"] == pytest.approx(6 * 4 * 8 * 12 * 1024 * 1024 * 64 / 2)
    # The softmax kernels alone, counted from the raw trace, are part of the chains' time.
    events = _events("hf_gpt2_eager_attention")
    softmax_us = sum(e["dur"] for e in events if e.get("cat") == "kernel" and "softmax_warp_forward" in e["name"])
    assert ev["eager_us_per_step"] > softmax_us / 3
    # GPU.md measured 16.1 ms eager against 11.8 ms with SDPA for this workload: 4.3 ms.
    assert f["estimated_saving_us_per_step"] == pytest.approx(4300, rel=0.15)


@pytest.mark.parametrize("name", [n for n in TRACES if n.startswith("hf_bert")])
def test_bert_uses_sdpa_and_gets_no_attention_finding(name):
    assert finding(name, "GA202") is None


def _optimizer_regions(name: str, annotation: str) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """(the Optimizer.step annotations, the kernels launched inside each, all events), counted from the raw trace
    through the launches' correlation ids."""
    events = _events(name)
    regions = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == annotation]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "LaunchKernel" in e["name"] and "correlation" in e.get("args", {})
    }
    kernels = [e for e in events if e.get("cat") == "kernel"]
    inside = [
        [k for k in kernels if r["ts"] <= launches.get(k["args"].get("correlation"), -1) <= r["ts"] + r["dur"]]
        for r in regions
    ]
    return regions, inside, events


# GA204 optimizer per-parameter loop -----------------------------------------------------------------


def test_foreach_off_adamw_loop_is_found():
    f = finding("hf_gpt2_train_foreach_off", "GA204")
    assert f is not None and f["fix_id"] == "fused_optimizer" and f["category"] == "launch"
    ev = f["evidence"]
    assert ev["optimizer"] == "AdamW" and ev["parameter_tensors"] == 148
    # Kernels launched inside Optimizer.step#AdamW.step, counted here through the correlation ids.
    regions, inside, _ = _optimizer_regions("hf_gpt2_train_foreach_off", "Optimizer.step#AdamW.step")
    per_region = [len(kernels) for kernels in inside]
    assert len(regions) == 3 and per_region == [1184, 1184, 1184]
    assert ev["kernels_per_step"] == 1184 and ev["kernels_per_parameter"] == 8.0
    # GPT-2 small, tied embeddings: 124.4 M parameters; a fused AdamW moves 7 fp32 words per parameter.
    assert ev["parameter_elements"] == pytest.approx(124.44e6, rel=1e-3)
    assert ev["fused_bytes"] == 28 * ev["parameter_elements"]
    assert ev["fused_estimate_us"] < 1500 < 30000 < f["estimated_saving_us_per_step"] < ev["region_us_per_step"]


def test_foreach_adamw_is_not_a_per_parameter_loop():
    assert finding("hf_bert_finetune_amp", "GA204") is None


# GA205 foreach optimizer update where fused=True exists -----------------------------------------------------


def test_bert_foreach_adamw_is_found_with_its_host_and_gpu_parts():
    """BERT-base fine-tuning with AdamW at PyTorch's CUDA default (foreach): 48 multi-tensor kernels and the CPU step
    counters read with .item() per tensor inside optimizer.step(), counted here from the raw trace."""
    f = finding("hf_bert_finetune_amp", "GA205")
    assert f is not None and f["fix_id"] == "fused_optimizer" and f["saving_basis"] == "roof"
    ev = f["evidence"]
    assert ev["optimizer"] == "AdamW" and ev["implementation"] == "foreach" and ev["parameter_tensors"] == 201
    regions, inside, events = _optimizer_regions("hf_bert_finetune_amp", "Optimizer.step#AdamW.step")
    assert len(regions) == 3 and [len(ks) for ks in inside] == [48, 48, 48]
    assert all("multi_tensor_apply_kernel" in k["name"] for ks in inside for k in ks)
    gpu = sorted(sum(k["dur"] for k in ks) for ks in inside)[1]
    wall = sorted(r["dur"] for r in regions)[1]
    assert ev["region_gpu_us_per_step"] == pytest.approx(gpu, rel=1e-3)
    assert ev["region_us_per_step"] == pytest.approx(wall, rel=1e-3)
    items = [
        sum(
            1
            for e in events
            if e.get("cat") == "cpu_op" and e["name"] == "aten::item" and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]
        )
        for r in regions
    ]
    assert items == [402, 402, 402]  # two per parameter tensor: the CPU step counters
    # 109.5 M float32 parameters; a fused AdamW moves 7 words per parameter once, at 0.7 of the 4.8 TB/s peak.
    assert ev["fused_bytes"] == 28 * ev["parameter_elements"] and ev["parameter_elements"] == pytest.approx(
        109.48e6, rel=1e-3
    )
    assert ev["fused_gpu_us"] == pytest.approx(ev["fused_bytes"] / (0.7 * 4.8e12) * 1e6, rel=1e-3)
    assert ev["optimizer_gpu_saving_us"] == pytest.approx(gpu - ev["fused_gpu_us"], abs=1)
    assert ev["optimizer_host_saving_us"] == pytest.approx(0.65 * wall, abs=1)
    # Under the profiler the step is bound by its host (GPU busy 7.5%): the host's part is the saving.
    assert f["estimated_saving_us_per_step"] == pytest.approx(ev["optimizer_host_saving_us"], abs=1)
    assert 4 <= f["estimated_saving_pct"] < 12


def test_resnet_foreach_sgd_costs_too_little_for_a_finding():
    """timm ResNet-50's foreach SGD: 9 multi-tensor kernels (277 µs) and a 3.8 ms region under the profiler; fused
    would take 0.4 of the host part, under 4% of the 56 ms profiled step."""
    assert finding("timm_resnet50_train", "GA205") is None


def test_a_foreach_off_loop_is_ga204s_not_ga205s():
    assert finding("hf_gpt2_train_foreach_off", "GA205") is None


# GA303 misaligned GEMMs -----------------------------------------------------------------------------


def test_gpt2_lm_head_is_a_misaligned_gemm():
    f = finding("hf_gpt2_eager_attention", "GA303")
    assert f is not None and f["fix_id"] == "compile" and f["category"] == "precision"
    assert "multiple of 64" in f["fix"]
    ev = f["evidence"]
    assert ev["gemms_per_step"] == 1
    head = ev["gemms"][0]
    assert head["m_n_k"] == [8192, 50257, 768] and head["align_kernel"] is True
    assert "align1" in head["kernel"] and head["us_per_step"] > 6000
    # The aligned fp16 GEMMs of the same trace run at several hundred TFLOP/s; the LM head under 100.
    assert head["achieved_tflops"] < 100 < 400 < ev["reference_tflops"] < 800
    flops = 2 * 8192 * 50257 * 768
    assert f["estimated_saving_us_per_step"] == pytest.approx(
        head["us_per_step"] - flops / (ev["reference_tflops"] * 1e12) * 1e6, rel=0.01
    )
    assert f is report_of("hf_gpt2_eager_attention")["findings"][0]  # the largest saving of that trace


# GA302 fp32/TF32 compute, GA203 layout conversions --------------------------------------------------


@pytest.mark.parametrize("name", TRACES)
def test_fp32_compute_only_where_the_gemms_are_fp32(name):
    f = finding(name, "GA302")
    report = report_of(name)
    fp32_gemm_us = sum(
        k["us_per_step"]
        for k in report["kernels"]
        if k["family"] in ("gemm", "convolution") and k["dtype"] in ("float", "c10::Float")
    )
    gemm_us = sum(k["us_per_step"] for k in report["kernels"] if k["family"] in ("gemm", "convolution"))
    if name.startswith(("hf_bert", "hf_gpt2")):  # fp16 models and bf16 autocast: no fp32 matrix work
        assert f is None and fp32_gemm_us < 0.05 * gemm_us
    if f is not None:
        assert f["fix_id"] == "bf16" and fp32_gemm_us > 0


@pytest.mark.parametrize("name", TRACES)
def test_layout_conversions_match_the_raw_kernels(name):
    events = _events(name)
    conversions = [
        e for e in events if e.get("cat") == "kernel" and ("nchwToNhwc" in e["name"] or "nhwcToNchw" in e["name"])
    ]
    f = finding(name, "GA203")
    if not conversions:
        assert f is None
    elif f is not None:
        assert f["fix_id"] == "channels_last"
        assert f["evidence"]["conversion_kernels_per_step"] * report_of(name)["summary"]["steps"] <= len(conversions)


def test_gemm_sample_gets_fp32_compute_on_top_of_ga301():
    """sample_traces/gemm.json.gz runs a 4096³ fp32 GEMM with TF32 off: GA301 moves it to TF32, GA302 counts
    what bf16 saves beyond that (its TF32 time x (1 - 494.7/989.5)), so the two add up."""
    report = analyze_path(REAL.parent / "gemm.json.gz")
    by_id = {f["rule_id"]: f for f in report["findings"]}
    simt_us = by_id["GA301"]["evidence"]["us_per_step"]
    assert by_id["GA302"]["estimated_saving_us_per_step"] == pytest.approx(simt_us * 67 / 494.7 * 0.5, rel=0.02)
    assert by_id["GA302"]["evidence"]["simt_us_per_step_left_to_ga301"] == pytest.approx(simt_us, rel=0.01)


PUBLIC = REAL.parents[2] / "shared" / "traces" / "public"


@pytest.mark.skipif(not (PUBLIC / "nccl_rank.json.gz").exists(), reason="shared/traces/public is not available")
def test_layout_conversions_on_a_public_convnet_trace(tmp_path):
    """nccl_rank (A100, a convolutional net's training step) spends 2.3% of its launch-bound step in cuDNN's
    conversions, under GA203's 3%; with the threshold at 1% the finding's figures match the raw kernels."""
    from gpuadvisor.rules.engine import CATALOG_DIR

    assert "GA203" not in [f["rule_id"] for f in analyze_path(PUBLIC / "nccl_rank.json.gz")["findings"]]
    text = (CATALOG_DIR / "GA203-layout-conversions.toml").read_text()
    (tmp_path / "GA203.toml").write_text(text.replace("min_share_of_step_pct = 3.0", "min_share_of_step_pct = 1.0"))
    report = analyze_path(PUBLIC / "nccl_rank.json.gz", rules_dir=tmp_path)
    f = next(f for f in report["findings"] if f["rule_id"] == "GA203")
    with gzip.open(PUBLIC / "nccl_rank.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    raw_us = sum(e["dur"] for e in events if e.get("cat") == "kernel" and re.search("nchwToNhwc|nhwcToNchw", e["name"]))
    assert len(steps) == report["summary"]["steps"] == 3
    assert f["evidence"]["conversion_us_per_step"] == pytest.approx(raw_us / 3, rel=0.01)
    assert f["estimated_saving_us_per_step"] == pytest.approx(raw_us / 3, rel=0.01)
    assert f["fix_id"] == "channels_last" and 1.0 <= f["estimated_saving_pct"] < 3.0
    assert set(f["evidence"]["launching_ops"]) <= {"aten::cudnn_convolution", "aten::convolution_backward"}


# Where each new rule must fire, and where not, across the whole real suite ---------------------------------

MUST_FIRE = {
    "GA202": {"hf_gpt2_eager_attention"},
    "GA203": {"timm_resnet50_train"},
    "GA204": {"hf_gpt2_train_foreach_off"},
    "GA205": {"hf_bert_finetune_amp"},
    "GA303": {"hf_gpt2_eager_attention"},
}


@pytest.mark.parametrize("rule_id", sorted(MUST_FIRE))
def test_each_new_rule_fires_on_its_pattern_and_on_no_other_suite_trace(rule_id):
    fired = {name for name in TRACES if finding(name, rule_id) is not None}
    assert fired == MUST_FIRE[rule_id] & set(TRACES)


def test_resnet50_in_fp32_nchw_gets_layout_and_precision_findings():
    """timm ResNet-50 training, fp32, NCHW, batch 64 (H200): cuDNN runs its convolutions in NHWC and converts
    around them, and the fp32 convolutions would halve under bf16."""
    layout = finding("timm_resnet50_train", "GA203")
    precision = finding("timm_resnet50_train", "GA302")
    assert layout is not None and precision is not None
    assert layout["fix_id"] == "channels_last" and precision["fix_id"] == "bf16"
    events = _events("timm_resnet50_train")
    steps = report_of("timm_resnet50_train")["summary"]["steps"]
    conversion_us = sum(
        e["dur"]
        for e in events
        if e.get("cat") == "kernel" and ("nchwToNhwc" in e["name"] or "nhwcToNchw" in e["name"])
    )
    nchw_bn_us = sum(
        e["dur"]
        for e in events
        if e.get("cat") == "kernel" and ("bn_fw_tr_1C11" in e["name"] or "bn_bw_1C11" in e["name"])
    )
    evidence = layout["evidence"]
    # Every conversion kernel in the profiled steps, per step (a kernel outside the steps would only lower it).
    assert evidence["conversion_us_per_step"] == pytest.approx(conversion_us / steps, rel=0.05)
    # cuDNN's NCHW batch-norm kernels, which channels_last swaps for its NHWC ones: they run at about a quarter
    # of their memory roof, the NHWC ones at 0.45, so a part of their time goes, not all of it.
    # (The trace holds some outside the profiled steps, which the per-step figure leaves out.)
    assert 0.85 * nchw_bn_us / steps < evidence["nchw_batchnorm_us_per_step"] <= nchw_bn_us / steps
    assert 0.2 * nchw_bn_us / steps < evidence["batchnorm_saving_us_per_step"] < 0.6 * nchw_bn_us / steps
    # No timed steps in a trace: the GPU's saving stands (the H200 measured 8.9 ms less GPU time per step in
    # channels_last, benchmarks/results/host_bound_check.json).
    assert layout["estimated_saving_us_per_step"] == pytest.approx(
        evidence["conversion_us_per_step"] + evidence["batchnorm_saving_us_per_step"], abs=0.2
    )
    assert 6_000 < layout["estimated_saving_us_per_step"] < 9_000
    # bf16 autocast would add a cast per fp32 convolution and linear call of the forward pass (53 + 1) and one
    # per gradient back in the backward pass.
    assert precision["evidence"]["forward_fp32_compute_calls_per_step"] == 54
    assert precision["evidence"]["autocast_casts_per_step"] == 108


def test_vit_in_fp32_gets_no_layout_finding_and_its_fp32_gemms_are_split_with_ga301():
    assert finding("hf_vit_infer", "GA203") is None
    simt = finding("hf_vit_infer", "GA301")
    tf32 = finding("hf_vit_infer", "GA302")
    assert simt is not None and tf32 is not None  # CUDA-core fp32 GEMMs to GA301, the rest to GA302


def test_a_small_foreach_adamw_in_a_gpu_bound_step_gets_no_finding():
    """The input-pipeline sample's AdamW over 6 tensors: its profiled region is 6.4% of the step, but its 50
    operator calls would cost ~140 µs without the profiler, so fused=True would save under min_saving_us."""
    report = analyze_path(REAL.parent / "input_pipeline.json.gz")
    assert "GA205" not in [f["rule_id"] for f in report["findings"]]
    rule = next(r for r in load_rules() if r.id == "GA205")
    events = json.load(gzip.open(REAL.parent / "input_pipeline.json.gz", "rt"))["traceEvents"]
    regions = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "Optimizer.step#AdamW.step"]
    calls = sorted(
        sum(
            1
            for e in events
            if e.get("cat") == "cpu_op" and r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"]
        )
        for r in regions
    )
    assert calls[len(calls) // 2] == 50
    assert 0.65 * 50 * rule.threshold("host_us_per_operator_call") < rule.threshold("min_saving_us") / 2
