"""The memory-capacity rules (GA601 fragmentation, GA602 KV-cache capacity, GA603 headroom): gpuadvisor/rules/
detectors_memory.py over the report's ``memory`` section (capture/memory.py's summaries) and its ``env``.

The allocator figures are those of the H200 runs kept in benchmarks/results (the decode example before the fixes,
as tests/test_capture_memory.py uses them) or planted; every KV-cache figure is worked out by hand in the comments.
The H200 profiles of examples/variable_batches.py (default allocator and expandable segments) and of
examples/real/hf_llama_decode.py with --memory are checked when they are in benchmarks/results.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuadvisor.capture import memory
from gpuadvisor.environment import allocator_config
from gpuadvisor.rules.detectors_memory import (
    NO_ALLOCATOR,
    MemoryFacts,
    allocator_fragmentation,
    expandable_segments,
    kv_cache_capacity,
    memory_headroom,
    run_memory_rules,
)
from gpuadvisor.rules.engine import load_rules

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MB = 1 << 20
GIB = 1 << 30
RULES = {r.id: r for r in load_rules()}

# The H200's memory (torch.cuda.mem_get_info total, as in tests/test_capture_memory.py) and the allocator's peaks
# of examples/llama_decode.py there (benchmarks/results/apply_llama_decode_all, before the fixes).
H200_TOTAL_BYTES = 150_109_880_320
DECODE_STATS = {
    "allocated_bytes.all.peak": 2_051_764_736,
    "reserved_bytes.all.peak": 2_908_749_824,
    "num_alloc_retries": 0,
    "num_ooms": 0,
}
DEFAULTS_ENV = {"allocator_settings": ""}  # what environment.allocator_config records with the defaults


def facts(stats, total=H200_TOTAL_BYTES, free=None, env=DEFAULTS_ENV, **sections) -> MemoryFacts:
    section = {"allocator": memory.allocator_summary(stats, total, free), **sections, "notes": []}
    return MemoryFacts(memory=section, env=dict(env))


def stats(allocated: int, reserved: int, **more) -> dict:
    return {"allocated_bytes.all.peak": allocated, "reserved_bytes.all.peak": reserved, **more}


# --- the catalog --------------------------------------------------------------------------------------------


def test_the_memory_rules_are_listed_and_explained(cli):
    assert [RULES[i].detector for i in ("GA601", "GA602", "GA603")] == [
        "allocator_fragmentation",
        "kv_cache_capacity",
        "memory_headroom",
    ]
    assert all(RULES[i].category == "capacity" for i in ("GA601", "GA602", "GA603"))
    listed = cli("rules", "--format", "markdown")
    assert listed.returncode == 0
    assert all(f"| {i} |" in listed.stdout for i in ("GA601", "GA602", "GA603"))
    explained = cli("explain", "GA601")
    assert explained.returncode == 0 and "expandable_segments:True" in explained.stdout
    assert "min_fragmentation_pct" in explained.stdout


def test_analyze_of_a_trace_says_the_memory_rules_do_not_apply():
    from gpuadvisor.pipeline import analyze_path

    report = analyze_path(REPO / "sample_traces" / "llama_decode.json.gz")
    skipped = {s["rule_id"]: s["reason"] for s in report["skipped_rules"]}
    assert all(skipped[i] == NO_ALLOCATOR for i in ("GA601", "GA602", "GA603"))
    assert NO_ALLOCATOR.startswith("not applicable: no allocator figures")
    assert not [f for f in report["findings"] if f["rule_id"].startswith("GA6")]


# --- GA601 fragmentation ------------------------------------------------------------------------------------


def test_fragmentation_fires_on_a_large_share_and_a_large_slack():
    # 2 GiB of tensors at most, 6 GiB reserved: 4 GiB of slack, 66.67% of the reserve (>= 25% and >= 1 GiB).
    f = allocator_fragmentation(facts(stats(2 * GIB, 6 * GIB, num_device_alloc=9)), RULES["GA601"])
    assert f is not None and f.rule_id == "GA601" and f.severity == "medium"
    e = f.evidence
    assert e["allocated_peak_bytes"] == 2 * GIB and e["reserved_peak_bytes"] == 6 * GIB
    assert e["reserved_minus_allocated_peak_bytes"] == 4 * GIB and e["fragmentation_pct"] == 66.67
    assert e["num_alloc_retries"] == 0 and e["expandable_segments"] == "off"
    assert e["allocator_settings"] == "the allocator's settings: the defaults"
    # Memory, not time: 0 µs and no % of the step (GA501's convention; report.html says "saving not estimated").
    assert f.estimated_saving_us_per_step == 0.0 and f.estimated_saving_pct is None
    assert "memory, not time" in e["saving"]
    assert "expandable_segments:True" in f.fix and "4.29 GB" in f.message  # 4 GiB in the report's decimal units


def test_fragmentation_stays_quiet_below_either_threshold():
    rule = RULES["GA601"]
    # The decode run: 856,985,088 B of slack (29.46%, above 25%) but under 1 GiB.
    assert allocator_fragmentation(facts(DECODE_STATS), rule) is None
    # 1.5 GiB of slack over a 10 GiB reserve: 15%, under 25%.
    assert allocator_fragmentation(facts(stats(8.5 * GIB, 10 * GIB)), rule) is None


def test_fragmentation_fires_on_allocation_retries_at_high_severity():
    # 100 MiB of slack only, but 3 retries: cudaMalloc failed and the cache was flushed.
    f = allocator_fragmentation(facts(stats(40 * GIB, 40 * GIB + 100 * MB, num_alloc_retries=3)), RULES["GA601"])
    assert f is not None and f.severity == "high" and f.evidence["num_alloc_retries"] == 3
    assert "3 allocation(s) failed" in f.message


@pytest.mark.parametrize(
    "env, snapshot",
    [
        ({"allocator_settings": "expandable_segments:True"}, None),
        ({"pytorch_cuda_alloc_conf": "max_split_size_mb:512,expandable_segments:True"}, None),
        ({"pytorch_alloc_conf": "expandable_segments:true"}, None),
        ({}, {"expandable_segments": 2, "bytes_by_category": {}, "top_sites": []}),
    ],
)
def test_fragmentation_does_not_fire_when_expandable_segments_are_on(env, snapshot):
    extra = {"snapshot": snapshot} if snapshot else {}
    a = facts(stats(2 * GIB, 6 * GIB, num_alloc_retries=1), env=env, **extra)
    assert expandable_segments(a)[0] is True
    assert allocator_fragmentation(a, RULES["GA601"]) is None


def test_fragmentation_reads_every_recorded_setting_and_says_when_none_is():
    # torch's own settings say the defaults, but the variable turns them on (read when CUDA started): on.
    env = {"allocator_settings": "", "pytorch_cuda_alloc_conf": "expandable_segments:True"}
    assert expandable_segments(facts(DECODE_STATS, env=env)) == (
        True,
        "PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True'",
    )
    # Recorded and off: another option only.
    off = expandable_segments(facts(DECODE_STATS, env={"pytorch_cuda_alloc_conf": "max_split_size_mb:512"}))
    assert off == (False, "PYTORCH_CUDA_ALLOC_CONF: 'max_split_size_mb:512'")
    # A report written before env recorded the settings: unknown, and the rule still fires, saying so.
    f = allocator_fragmentation(facts(stats(2 * GIB, 6 * GIB), env={}), RULES["GA601"])
    assert f.evidence["expandable_segments"] == "unknown" and "records no allocator settings" in f.message


def test_environment_records_the_allocator_variables():
    got = allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HOME": "/root"})
    assert got["pytorch_cuda_alloc_conf"] == "expandable_segments:True" and "pytorch_alloc_conf" not in got
    assert isinstance(got.get("allocator_settings", ""), str)
    assert "pytorch_cuda_alloc_conf" not in allocator_config({})


# --- GA603 headroom -----------------------------------------------------------------------------------------


def test_headroom_fires_at_a_95_pct_peak():
    # 95% of the H200's 150,109,880,320 B = 142,604,386,304 B reserved; 7,505,494,016 B (5%) left.
    reserved = 142_604_386_304
    f = memory_headroom(facts(stats(reserved - 2 * GIB, reserved)), RULES["GA603"])
    assert f is not None and f.severity == "medium"
    e = f.evidence
    assert e["reserved_peak_bytes"] == reserved and e["device_total_bytes"] == H200_TOTAL_BYTES
    assert e["headroom_bytes"] == 7_505_494_016 and e["reserved_peak_pct_of_device"] == 95.0
    assert e["reserved_minus_allocated_peak_bytes"] == 2 * GIB
    assert f.estimated_saving_us_per_step == 0.0
    assert "activation checkpointing" in RULES["GA603"].doc["fix"]


def test_headroom_is_quiet_at_half_the_device_and_high_after_an_oom():
    half = H200_TOTAL_BYTES // 2
    assert memory_headroom(facts(stats(half - GIB, half)), RULES["GA603"]) is None
    at_limit = stats(140 * GIB, 0.97 * H200_TOTAL_BYTES, num_alloc_retries=5, num_ooms=1)
    assert memory_headroom(facts(at_limit), RULES["GA603"]).severity == "high"


# --- GA602 KV-cache capacity --------------------------------------------------------------------------------


def _decode_kv_section(allocator: dict) -> dict:
    """memory.kv_cache as capture/memory_run.kv_cache_section builds it for examples/llama_decode.py on the H200
    (the same shapes as hf_llama_decode's full size): 8 layers x (k, v), each (1, 16, 1024, 128) bf16."""
    found = memory.kv_cache_from_tensors([((1, 16, 1024, 128), 2)] * 16)
    free = allocator["headroom_bytes"] + found["cache_bytes"]
    capacity = memory.kv_cache_capacity(found["bytes_per_token"], free, found["tokens"], itemsize=2)
    return {**capacity, "cache_bytes": found["cache_bytes"], "cache_tensors": 16, "batch": 1, "itemsize": 2}


def test_kv_cache_capacity_of_the_decode_example_by_hand():
    allocator = memory.allocator_summary(DECODE_STATS, H200_TOTAL_BYTES)
    a = MemoryFacts(memory={"allocator": allocator, "kv_cache": _decode_kv_section(allocator)}, env={})
    f = kv_cache_capacity(a, RULES["GA602"])
    e = f.evidence
    # 2 (key, value) x 8 layers x 16 KV heads x 128 x 2 bytes = 65,536 B a token; x 1,024 slots = 64 MiB a
    # sequence, the whole cache (batch 1).
    assert e["bytes_per_token"] == 65_536 and e["bytes_per_sequence"] == 64 * MB == e["cache_bytes"]
    assert e["slots_per_sequence"] == 1024 and e["batch"] == 1 and e["element_size"] == 2
    # Headroom: 150,109,880,320 - 2,908,749,824 = 147,201,130,496 B (no free figure from the driver here).
    # Margin: 10% of 150,109,880,320 = 15,010,988,032 B. Free for the cache: 132,190,142,464 B.
    assert e["safety_margin_bytes"] == 15_010_988_032 and e["free_for_cache_bytes"] == 132_190_142_464
    # 132,190,142,464 / 65,536 = 2,017,061.5 -> 2,017,061 more tokens; / 67,108,864 = 1,969.8 -> 1,969 more
    # sequences of 1,024 slots.
    assert e["more_tokens"] == 2_017_061 and e["more_sequences"] == 1969
    # With the cache's own 64 MiB: 132,257,251,328 B -> 1,970.8 -> 1,970 sequences in all.
    assert e["sequences_in_all"] == 1970
    # FP8: 32,768 B a token, 32 MiB a sequence: 132,257,251,328 / 33,554,432 = 3,941.6 -> 3,941 in all.
    assert e["fp8_bytes_per_token"] == 32_768 and e["fp8_sequences_in_all"] == 3941
    # Paged, 16-token pages of 1 MiB (512 KiB in FP8): 126,130 whole pages -> 2,018,080 tokens; 252,260 -> 4,036,160.
    assert e["page_tokens"] == 16 and e["paged_tokens_in_all"] == 2_018_080
    assert e["fp8_paged_tokens_in_all"] == 4_036_160
    assert e["paged_sequences_in_all"] is None  # the run does not say how long sequences grow
    assert f.severity == "info" and f.estimated_saving_us_per_step == 0.0
    assert "2,017,061 more tokens" in f.message and "1,969 more sequences of 1,024 slots" in f.message


def test_kv_cache_capacity_uses_the_drivers_free_figure_when_smaller_and_reports_a_full_device():
    # The driver saw 146,000,000,000 B free (a context and another process outside torch's reserve), less than
    # the 147,201,130,496 B of headroom: 146,000,000,000 - 15,010,988,032 = 130,989,011,968 B for the cache,
    # / 65,536 = 1,998,733.7 -> 1,998,733 more tokens.
    allocator = memory.allocator_summary(DECODE_STATS, H200_TOTAL_BYTES, 146_000_000_000)
    a = MemoryFacts(memory={"allocator": allocator, "kv_cache": _decode_kv_section(allocator)}, env={})
    e = kv_cache_capacity(a, RULES["GA602"]).evidence
    assert e["free_for_cache_bytes"] == 130_989_011_968 and e["more_tokens"] == 1_998_733
    # At 92% of the device the margin eats the headroom: nothing more fits, and the rule says so (low).
    full = memory.allocator_summary(stats(GIB, int(0.92 * H200_TOTAL_BYTES)), H200_TOTAL_BYTES)
    f = kv_cache_capacity(MemoryFacts(memory={"allocator": full, "kv_cache": _decode_kv_section(full)}), RULES["GA602"])
    assert f.evidence["more_sequences"] == 0 and f.evidence["more_tokens"] == 0 and f.severity == "low"


def test_kv_cache_capacity_skips_a_run_without_a_cache():
    from gpuadvisor.rules.engine import SkipRule

    with pytest.raises(SkipRule, match="no KV cache found"):
        kv_cache_capacity(facts(DECODE_STATS), RULES["GA602"])
    with pytest.raises(SkipRule, match="not applicable: no allocator figures"):
        kv_cache_capacity(MemoryFacts(memory=None), RULES["GA602"])


@pytest.mark.slow
def test_kv_cache_capacity_of_the_transformers_decode_example_on_the_cpu():
    """examples/real/hf_llama_decode.py at its small size (the CPU default): transformers' own StaticCache, found by
    capture/memory_run.py as `profile` finds it (CPU tensors counted here), under the H200 decode run's figures."""
    pytest.importorskip("transformers")
    from gpuadvisor.capture.memory_run import kv_cache_section
    from gpuadvisor.workload import load_workload

    workload = load_workload(str(REPO / "examples" / "real" / "hf_llama_decode.py"))
    allocator = memory.allocator_summary(DECODE_STATS, H200_TOTAL_BYTES)
    kv, notes = kv_cache_section(workload, allocator, cuda_only=False)
    assert notes == [] and kv["cache_tensors"] == 4  # 2 layers x (keys, values)
    e = kv_cache_capacity(MemoryFacts(memory={"allocator": allocator, "kv_cache": kv}), RULES["GA602"]).evidence
    # 2 x 2 layers x 4 KV heads x head_dim 16 (64 / 4) x 4 bytes (float32) = 1,024 B a token; 32 slots: 32 KiB.
    assert e["bytes_per_token"] == 1024 and e["slots_per_sequence"] == 32 and e["cache_bytes"] == 32 * 1024
    # 132,190,142,464 B free for the cache (as above) / 1,024 = 129,091,936 more tokens; / 32,768 = 4,034,123
    # more sequences (both exact: 4,034,123 x 32,768 = 132,190,142,464). FP8 stores 1 byte of the 4: 256 B a token.
    assert e["more_tokens"] == 129_091_936 and e["more_sequences"] == 4_034_123
    assert e["fp8_bytes_per_token"] == 256


# --- over a finished report ---------------------------------------------------------------------------------


def test_run_memory_rules_over_a_report_keeps_it_valid():
    import msgspec

    from gpuadvisor.pipeline import analyze_path
    from gpuadvisor.report.json import to_json
    from gpuadvisor.report.markdown import render_markdown
    from gpuadvisor.report.schema import check_report, decode_report

    report = analyze_path(REPO / "sample_traces" / "llama_decode.json.gz")
    before = [f["rule_id"] for f in report["findings"]]
    # Planted: 95% of the device reserved, a third of it cached and unused.
    reserved = 142_604_386_304
    report["memory"] = {
        "allocator": memory.allocator_summary(stats(reserved * 2 // 3, reserved), H200_TOTAL_BYTES),
        "notes": [],
    }
    report["env"].update(DEFAULTS_ENV)
    run_memory_rules(report)
    ids = [f["rule_id"] for f in report["findings"]]
    assert ids[: len(before)] == before and set(ids[len(before) :]) == {"GA601", "GA603"}  # 0 µs: ranked last
    skipped = {s["rule_id"]: s["reason"] for s in report["skipped_rules"]}
    assert "GA601" not in skipped and "GA603" not in skipped and "no KV cache found" in skipped["GA602"]
    assert report["summary"]["top_finding"] == "GA101"
    check_report(report)
    decoded = decode_report(to_json(report))
    assert msgspec.to_builtins(decoded)["findings"] == json.loads(to_json(report))["findings"]
    assert "GA601" in render_markdown(report)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(to_json(report)), json.loads((REPO / "docs" / "report.schema.json").read_text()))
    # A report without allocator figures is left as it is.
    bare = analyze_path(REPO / "sample_traces" / "gemm.json.gz")
    assert run_memory_rules(json.loads(to_json(bare))) == json.loads(to_json(bare))


# --- H200 profiles in benchmarks/results (written on the GPU; skipped until they are there) ------------------


def _h200_report(name: str) -> dict:
    path = RESULTS / name / "report.json"
    if not path.is_file():
        pytest.skip(f"{path.relative_to(REPO)} is not there yet (an H200 profile)")
    return run_memory_rules(json.loads(path.read_text(encoding="utf-8")))


def _finding(report: dict, rule_id: str) -> dict | None:
    found = [f for f in report["findings"] if f["rule_id"] == rule_id]
    return found[0] if found else None


def test_ga601_fires_on_the_h200_profile_of_variable_batches_with_the_default_allocator():
    report = _h200_report("profile_variable_batches")
    finding = _finding(report, "GA601")
    assert finding is not None, report["memory"]["allocator"]
    allocator = report["memory"]["allocator"]
    e = finding["evidence"]
    assert e["reserved_minus_allocated_peak_bytes"] == allocator["reserved_minus_allocated_peak_bytes"] >= GIB
    assert e["fragmentation_pct"] >= RULES["GA601"].thresholds["min_fragmentation_pct"]


def test_ga601_does_not_fire_on_the_h200_profile_with_expandable_segments():
    report = _h200_report("profile_variable_batches_expandable")
    assert _finding(report, "GA601") is None, report["memory"]["allocator"]


def test_ga602_fires_on_the_h200_memory_profile_of_hf_llama_decode():
    report = _h200_report("profile_llama_memory")
    finding = _finding(report, "GA602")
    assert finding is not None, report["memory"].get("kv_cache")
    e = finding["evidence"]
    # Full size: 8 layers, 16 KV heads, head_dim 2048 / 16 = 128, bf16, a StaticCache of 1,024 slots, batch 1:
    # 2 x 8 x 16 x 128 x 2 = 65,536 B a token, 64 MiB in all.
    assert e["bytes_per_token"] == 65_536 and e["slots_per_sequence"] == 1024 and e["batch"] == 1
    assert e["cache_bytes"] == 64 * MB and e["element_size"] == 2
    allocator = report["memory"]["allocator"]
    free = min(allocator["headroom_bytes"], allocator["device_free_bytes"] or allocator["headroom_bytes"])
    usable = free - allocator["device_total_bytes"] // 10  # the 10% safety margin
    assert e["free_for_cache_bytes"] == usable
    assert e["more_tokens"] == usable // 65_536 and e["more_sequences"] == usable // (64 * MB)


def test_profile_runs_the_memory_rules_on_its_memory_section(tmp_path, monkeypatch):
    """profile builds the memory section after the other rules ran; GA601-603 must still read it. On the CPU
    there is no allocator, so the H200 section of the fragmenting workload stands in for it."""
    from gpuadvisor.capture import memory_run
    from gpuadvisor.profile import run_profile

    section = json.loads((RESULTS / "profile_variable_batches" / "report.json").read_text())["memory"]
    monkeypatch.setattr(memory_run, "memory_section", lambda *a, **k: copy.deepcopy(section))
    model = Path(__file__).resolve().parents[1] / "examples" / "tiny_mlp.py"
    report = run_profile(
        model, warmup=1, timed_steps=2, profiled_steps=1, min_time_s=0, out_dir=tmp_path / "o", nvml=False
    )
    ids = [f["rule_id"] for f in report["findings"]]
    assert "GA601" in ids, ids
    assert "GA601" not in [s.get("rule_id") for s in report.get("skipped_rules") or []]
    written = json.loads((tmp_path / "o" / "report.json").read_text())
    assert "GA601" in [f["rule_id"] for f in written["findings"]]
