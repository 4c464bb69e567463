"""benchmarks/auto_vs_compile.py on the committed H200 runs: the pairs it builds are the same-process ones, and
what no run measured is said, with the reason a run gave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "auto_vs_compile.py"
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def avc():
    return load("auto_vs_compile")


@pytest.fixture(scope="module")
def summary(avc):
    return {row["model"]: row for row in avc.summarise(avc.DEFAULT_RUNS, avc.DEFAULT_SEARCH)["models"]}


def test_committed_summary_is_what_the_script_derives(avc):
    committed = json.loads((RESULTS / "auto_vs_compile.json").read_text())
    assert committed["models"] == avc.summarise(avc.DEFAULT_RUNS, avc.DEFAULT_SEARCH)["models"]


def test_pairs_come_from_one_process_each(summary):
    bert = summary["hf_bert_classifier"]
    ro = [p for p in bert["benchmark_pairs"] if p["mode"] == "reduce-overhead"]
    assert len(ro) == 1 and ro[0]["file"].endswith("real_models_a.json")
    assert ro[0]["ratio"] == pytest.approx(809.232 / 807.904)
    assert bert["worst_benchmark_mode"] == "reduce-overhead" and bert["within_bound"] is True
    # llama prefill: reduce-overhead in one run, max-autotune in another, each against its own auto timing
    llama = {p["mode"]: p for p in summary["hf_llama_prefill"]["benchmark_pairs"]}
    assert llama["reduce-overhead"]["auto_us"] != llama["max-autotune"]["auto_us"]
    assert llama["reduce-overhead"]["file"] != llama["max-autotune"]["file"]


def test_decode_rows_time_auto_s_own_stack_as_the_fusion_graphs_variant(summary):
    decode = summary["hf_llama_decode"]
    assert decode["auto_fixes"] == ["fusion", "graphs"]
    (pair,) = decode["benchmark_pairs"]
    assert pair["auto_variant"] == "fusion_graphs" and pair["mode"] == "max-autotune"
    assert pair["ratio"] == pytest.approx(443.472 / 597.136)


def test_what_no_run_measured_is_named_with_its_reason(avc, summary):
    assert summary["timm_resnet50_train"]["modes_missing"] == {"max-autotune": ["not run"]}
    assert summary["hf_vit_infer"]["modes_missing"] == {}
    # BERT fine-tuning's max-autotune was tried twice; both runs were killed while it compiled, and both say so
    attempts = summary["hf_bert_finetune_amp"]["modes_missing"]["max-autotune"]
    assert len(attempts) == 2
    assert all("per-model limit during stage 'compile max-autotune'" in a for a in attempts)
    assert summary["hf_bert_finetune_amp"]["modes_measured"] == ["default", "reduce-overhead"]
    cell = avc._missing_cell("max-autotune", attempts)
    assert cell == "max-autotune (run killed while it compiled, at a per-model limit of 265 and 335 s)"
    assert avc._missing_cell("default", ["not run"]) == "default"


def test_a_mode_killed_in_one_run_and_measured_in_another_is_measured(summary):
    # hf_vit_infer's max-autotune was killed at 320 s in run v; run vm (warm inductor cache) timed it
    vit = {p["mode"]: p for p in summary["hf_vit_infer"]["benchmark_pairs"]}
    assert vit["max-autotune"]["file"].endswith("real_models_vm.json")
    assert vit["max-autotune"]["ratio"] == pytest.approx(vit["max-autotune"]["auto_us"] / 2197.2, rel=1e-3)
    assert summary["hf_vit_infer"]["worst_benchmark_mode"] == "max-autotune"


def test_models_kept_from_a_base_file_do_not_count(avc, tmp_path):
    run = {"command": "python3 new", "models": []}
    run["models"].append({"name": "m", "command": "python3 new", "auto_us": 90.0, "compile": {"default": 100.0}})
    run["models"].append({"name": "n", "command": "python3 old", "auto_us": 500.0, "compile": {"default": 100.0}})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    pairs, _ = avc.benchmark_pairs(path, {"m": ["compile"], "n": ["compile"]})
    assert [(p["model"], p["ratio"]) for p in pairs] == [("m", 0.9)]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"models": 3}'])
def test_a_file_that_is_not_results_is_a_one_line_error(avc, tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as raised:
        avc.benchmark_pairs(path, {})
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_search_pairs_compare_with_compile_of_the_user_s_model(summary):
    # bf16+compile: the compile inside the stack is not torch.compile of the user's model; compile alone is
    (vit,) = summary["hf_vit_infer"]["search_pairs"]
    assert vit["mode"] == "the compile candidate's own choice"
    assert vit["ratio"] == pytest.approx(1205.2 / 2257.4)
    # compile alone kept: each mode its selection timed, against auto's final interleaved median
    bert = {p["mode"]: p["ratio"] for p in summary["hf_bert_finetune_amp"]["search_pairs"]}
    assert bert == pytest.approx({"default": 8818.2 / 22101.7, "reduce-overhead": 8818.2 / 7598.9}, rel=1e-4)
