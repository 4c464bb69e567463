"""What `apply --fix auto` plans from a before-trace: the fixes the findings name, judged against the step a
CUDA graph would leave when the step is launch-bound."""

from __future__ import annotations

from pathlib import Path

from gpuadvisor.apply import _recommended, _rules_after_graph
from gpuadvisor.pipeline import analyze_trace_object
from gpuadvisor.rules.engine import load_rules
from gpuadvisor.trace.kineto import load_trace

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def test_a_launch_bound_decode_plans_fusion_under_the_graph():
    trace_path = SAMPLES / "llama_decode.json.gz"  # recorded on the H200: 3.6% GPU busy
    report = analyze_trace_object(load_trace(trace_path), command="apply")
    named = [finding["fix_id"] for finding in report["findings"] if finding["fix_id"]]
    assert named == ["graphs"]  # against the 10 ms launch-bound step the unfused chains are too small
    # Against the ~0.4 ms the graph leaves, they are not: fusion is planned beneath the graph.
    assert _recommended(trace_path, load_rules(), None) == ["graphs", "fusion"]


def test_a_gpu_bound_step_is_judged_against_its_own_step():
    # add_rmsnorm is 98% GPU busy: no graph planned, fusion from its own finding; gemm's fp32 GEMM on the CUDA
    # cores gets both precision levers: tf32 (GA301's) and bf16 (GA302: the same GEMM under autocast); the
    # findings rank them, the search times them.
    assert _recommended(SAMPLES / "add_rmsnorm.json.gz", load_rules(), None) == ["fusion"]
    assert sorted(_recommended(SAMPLES / "gemm.json.gz", load_rules(), None)) == ["bf16", "tf32"]


def test_only_share_of_step_thresholds_of_fixable_rules_are_scaled():
    rules = {rule.id: rule for rule in _rules_after_graph(load_rules(), 10.0)}
    original = {rule.id: rule for rule in load_rules()}
    assert (
        rules["GA201"].thresholds["min_share_of_step_pct"] == original["GA201"].thresholds["min_share_of_step_pct"] / 10
    )
    assert rules["GA101"].thresholds == original["GA101"].thresholds  # the graph's own rule is unchanged
