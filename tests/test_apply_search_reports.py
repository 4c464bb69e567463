"""``apply --fix auto`` reports from the H200 (benchmarks/results/real_auto_reports/, written by
``benchmarks/real_models.py --auto-only --apply-dir``): the search section, its rendering, and the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuadvisor.fixes.coverage import addressed_saving, combined_saving, fix_covers
from gpuadvisor.report.apply_sections import render_apply_markdown, search_table

REPORTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "real_auto_reports"
NAMES = sorted(p.name.removesuffix(".report.json") for p in REPORTS.glob("*.report.json"))


def report(name: str) -> dict:
    return json.loads((REPORTS / f"{name}.report.json").read_text())


def test_the_reports_are_there():
    assert len(NAMES) >= 7


@pytest.mark.parametrize("name", NAMES)
def test_the_kept_candidate_is_what_the_report_applied_and_beat_every_other(name):
    r = report(name)
    search = r["search"]
    applied = [f["fix_id"] for f in r["fixes"] if f["status"] == "applied"]
    kept = [row for row in search["candidates"] if row["status"] == "kept"]
    if not kept:
        # Nothing paid (hf_resnet_train): nothing is applied, and every timed candidate says why it lost.
        assert applied == [] and r["speedup"]["ci_low"] <= 1.0 <= r["speedup"]["ci_high"]
        timed = [row for row in search["candidates"] if row["step_us"] is not None]
        for row in timed:
            assert row["status"] == "slower" and "not 2% faster" in row["why"]
            assert row["step_us"] > 0.98 * search["original_us"]
        return
    assert len(kept) == 1 and kept[0]["applied"] == applied
    assert kept[0]["step_us"] < search["original_us"]
    for row in search["candidates"]:
        if row["status"] == "slower":
            assert row["step_us"] > kept[0]["step_us"] and "(kept)" in row["why"]
        if row["status"] == "duplicate":
            assert row["why"].startswith("applied the same fixes as candidate")
    # The report's own before/after agree with the search's verdict: the kept stack is faster than eager.
    assert r["speedup"]["ci_low"] > 1.05


@pytest.mark.parametrize("name", NAMES)
def test_the_search_renders_one_row_per_candidate_and_the_original(name):
    r = report(name)
    table = search_table(r)
    assert len(table.rows) == len(r["search"]["candidates"]) + 1
    assert table.rows[-1][1] == "original"
    markdown = render_apply_markdown(r)
    assert "## Search (--fix auto)" in markdown
    assert ("| kept |" in markdown) == any(row["status"] == "kept" for row in r["search"]["candidates"])


def test_bert_compile_wins_where_the_graph_is_refused_and_its_prediction_is_ga101():
    r = report("hf_bert_classifier")
    rows = {"+".join(row["fixes"]): row for row in r["search"]["candidates"]}
    assert rows["graphs"]["status"] == "nothing applied"
    graphs = next(f for f in r["fixes"] if f["fix_id"] == "graphs")
    assert graphs["status"] == "refused" and "_ignore_bidirectional_mask_sdpa" in graphs["reason"]
    compiled = next(f for f in r["fixes"] if f["fix_id"] == "compile")
    assert compiled["facts"]["mode"] == "reduce-overhead"
    covered = fix_covers("compile", compiled["facts"])
    assert covered == {"compile", "fusion", "sdpa", "channels_last", "graphs"}
    ga101 = next(f for f in r["before"]["findings"] if f["rule_id"] == "GA101")
    step = r["before"]["step_time_us"]
    # GA101 is the addressed finding; compile also fuses the few short kernels behind GA102 (a part of its
    # saving, under 1% of GA101's), so the combined saving is GA101's and that part.
    addressed = {f["rule_id"]: addressed_saving(f, covered) for f in r["before"]["findings"]}
    assert addressed["GA101"] == ga101["estimated_saving_us_per_step"]
    assert 0 <= sum(addressed.values()) - addressed["GA101"] < 0.01 * addressed["GA101"]
    assert combined_saving(r["before"]["findings"], covered, step) == pytest.approx(
        ga101["estimated_saving_us_per_step"], rel=0.01
    )


def test_combined_savings_multiply_the_shares_that_remain():
    findings = [
        {"rule_id": "GA101", "fix_id": "graphs", "estimated_saving_us_per_step": 600.0},
        {"rule_id": "GA201", "fix_id": "fusion", "estimated_saving_us_per_step": 500.0},
        {"rule_id": "GA301", "fix_id": None, "estimated_saving_us_per_step": 100.0},
    ]
    assert combined_saving(findings, {"graphs", "fusion"}, 1000.0) == pytest.approx(800.0)
    assert combined_saving(findings, {"graphs"}, 1000.0) == pytest.approx(600.0)
    assert combined_saving(findings, {"bf16"}, 1000.0) == pytest.approx(100.0)  # bf16 addresses GA301
    assert combined_saving(findings, set(), 1000.0) == 0.0
    assert combined_saving(findings, {"graphs"}, None) is None
