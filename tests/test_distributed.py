"""Multi-rank analysis: communication, exposed communication and the straggler, checked against figures taken
here from the raw traces with plain json/gzip and loops, on public traces and on small hand-made rank folders."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from gpuadvisor.analysis.distributed import STEP_TIME_TOLERANCE_PCT, distributed_analysis
from gpuadvisor.pipeline import analyze_path
from gpuadvisor.report.markdown import render_markdown
from gpuadvisor.trace.kineto import load_trace

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "public"
needs_public = pytest.mark.skipif(not PUBLIC.is_dir(), reason=f"{PUBLIC} is not available")
STEP_RE = re.compile(r"ProfilerStep#(\d+)")
DISTRIBUTED_RULES = {"GA701", "GA702"}


# --- by hand, from the raw JSON -----------------------------------------------------------------


def raw_events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def is_nccl(event: dict) -> bool:
    return event.get("cat") == "kernel" and "nccl" in event["name"].lower()


def gpu_intervals(events: list[dict]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(NCCL kernel intervals, intervals of every other kernel, memcpy and memset)."""
    comm, other = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        (comm if is_nccl(e) else other).append((e["ts"], e["ts"] + e["dur"]))
    return comm, other


def sweep(comm: list[tuple[float, float]], other: list[tuple[float, float]]) -> tuple[float, float]:
    """(time with at least one NCCL kernel running, time with an NCCL kernel and nothing else running), by a
    sweep over the start and end points."""
    points = []
    for start, end in comm:
        points += [(start, 0, 1), (end, 0, -1)]
    for start, end in other:
        points += [(start, 1, 1), (end, 1, -1)]
    points.sort()
    active = [0, 0]
    communication = exposed = 0.0
    last = None
    for t, kind, delta in points:
        if last is not None and active[0] > 0:
            communication += t - last
            if active[1] == 0:
                exposed += t - last
        active[kind] += delta
        last = t
    return communication, exposed


def nccl_us_per_step(events: list[dict]) -> dict[int, float]:
    """NCCL kernel time per ProfilerStep#N, each kernel placed in the step whose annotation holds the start of
    its launch call (correlation id)."""
    steps = {}
    for e in events:
        match = STEP_RE.fullmatch(str(e.get("name", "")))
        if e.get("cat") == "user_annotation" and match:
            steps[int(match.group(1))] = (e["ts"], e["ts"] + e["dur"])
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    totals = dict.fromkeys(steps, 0.0)
    for e in events:
        if not is_nccl(e):
            continue
        t = launch.get(e["args"].get("correlation"), e["ts"])
        for n, (start, end) in steps.items():
            if start <= t <= end:
                totals[n] += e["dur"]
    return totals


def ids(report: dict) -> list[str]:
    return [f["rule_id"] for f in report["findings"]]


# --- public traces ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    if not PUBLIC.is_dir():
        pytest.skip(f"{PUBLIC} is not available")
    return analyze_path(PUBLIC / "two_ranks")


@needs_public
def test_two_ranks_communication_and_exposure_match_a_hand_sweep(two_ranks):
    rows = {row["rank"]: row for row in two_ranks["ranks"]["rows"]}
    assert sorted(rows) == [0, 1]
    for rank in (0, 1):
        events = raw_events(PUBLIC / "two_ranks" / f"rank-{rank}.json.gz")
        comm, other = gpu_intervals(events)
        communication, exposed = sweep(comm, other)
        assert communication > 0 and 0 < exposed < communication
        assert sum(end - start for start, end in comm) == pytest.approx(communication)  # no two collectives overlap
        assert rows[rank]["communication_us_total"] == pytest.approx(communication, rel=0.01)
        assert rows[rank]["exposed_communication_us_total"] == pytest.approx(exposed, rel=0.01)
        row = rows[rank]
        assert row["exposed_communication_us_per_step"] <= row["communication_us_per_step"]
        assert row["exposed_communication_us_per_step"] + row["overlapped_communication_us_per_step"] == (
            pytest.approx(row["communication_us_per_step"], abs=0.1)
        )
        # Medians over the two steps of NCCL time placed by launch time, as the report's step windows place it.
        per_step = nccl_us_per_step(events)
        assert sorted(per_step) == two_ranks["ranks"]["matched_steps"] == [551, 552]
        assert row["communication_us_per_step"] == pytest.approx(statistics.median(per_step.values()), rel=0.01)
    # The report itself stays rank 0's.
    assert two_ranks["source"]["ranks"] == [0]
    assert two_ranks["summary"]["step_time_us"] == rows[0]["step_time_us"]


@needs_public
def test_two_ranks_straggler_follows_the_definition(two_ranks):
    """The straggler spends the least time inside collectives (median per step) and its step is not shorter
    than the longest rank's beyond the tolerance; the others' excess is their median minus its time."""
    comm = {}
    for rank in (0, 1):
        events = raw_events(PUBLIC / "two_ranks" / f"rank-{rank}.json.gz")
        comm[rank] = statistics.median(nccl_us_per_step(events).values())
    rows = {row["rank"]: row for row in two_ranks["ranks"]["rows"]}
    steps = {rank: rows[rank]["step_time_us"] for rank in rows}
    lowest = min(comm, key=comm.get)
    assert steps[lowest] >= max(steps.values()) * (1 - STEP_TIME_TOLERANCE_PCT / 100)
    section = two_ranks["ranks"]
    assert section["straggler"] == lowest == 1
    other = 1 - lowest
    assert section["straggler_excess_wait_us_per_step"] == pytest.approx(comm[other] - comm[lowest], rel=0.01)
    # 8.6 ms per step, 1.4% of the step: below GA702's 5%, so no finding; GA701 fires (24-27% exposed).
    assert section["straggler_excess_wait_pct"] < 5
    assert "GA702" not in ids(two_ranks)
    (ga701,) = [f for f in two_ranks["findings"] if f["rule_id"] == "GA701"]
    exposed = [rows[r]["exposed_communication_us_per_step"] for r in (0, 1)]
    assert ga701["evidence"]["exposed_communication_us_per_step"] == pytest.approx(statistics.median(exposed), abs=0.1)
    assert ga701["estimated_saving_us_per_step"] > 0
    assert ga701["estimated_saving_pct"] == pytest.approx(
        100 * ga701["estimated_saving_us_per_step"] / two_ranks["summary"]["step_time_us"], abs=0.05
    )


@needs_public
def test_nccl_rank_figures_match_a_hand_sweep():
    """One rank whose all-reduces overlap compute on another stream: the analysis (not the report, which
    compares ranks only for folders) agrees with the sweep."""
    path = PUBLIC / "nccl_rank.json.gz"
    comm, other = gpu_intervals(raw_events(path))
    communication, exposed = sweep(comm, other)
    analysis = distributed_analysis(load_trace(path))
    (row,) = analysis.rank_table.to_dict("records")
    assert 0 < exposed < communication
    assert row["communication_us_total"] == pytest.approx(communication, rel=0.01)
    assert row["exposed_communication_us_total"] == pytest.approx(exposed, rel=0.01)
    assert analysis.straggler is None


@needs_public
def test_single_rank_traces_get_no_distributed_findings():
    for report in (analyze_path(PUBLIC / "nccl_rank.json.gz"), analyze_path(PUBLIC / "two_ranks", rank=1)):
        assert not DISTRIBUTED_RULES & set(ids(report))
        assert "ranks" not in report
        skipped = {s["rule_id"]: s["reason"] for s in report["skipped_rules"]}
        assert all("single-rank" in skipped[rule] for rule in DISTRIBUTED_RULES)


# --- hand-made rank folders ---------------------------------------------------------------------

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
STEP_US = 1000.0


def write_rank(folder: Path, rank: int, steps: list[int], work: list[tuple[str, str, float, float]], clock: float):
    """A minimal Kineto trace of one rank: each step is a 1000 µs ProfilerStep#N annotation holding the GPU
    activities ``work`` (category, name, start offset, duration; µs), each launched at the step's start.
    ``clock`` offsets every time stamp (ranks do not share a clock)."""
    events = []
    correlation = 1
    for index, step in enumerate(steps):
        t0 = clock + index * STEP_US
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": STEP_US,
            }
        )
        for cat, name, offset, dur in work:
            launch = "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync"
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": launch,
                    "pid": 1,
                    "tid": 1,
                    "ts": t0 + 1,
                    "dur": 4,
                    "args": {"correlation": correlation},
                }
            )
            stream = 20 if name == NCCL else 7
            args = {"device": 0, "stream": stream, "correlation": correlation}
            if cat == "gpu_memcpy":
                args["bytes"] = 1 << 20
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": t0 + offset,
                    "dur": dur,
                    "args": args,
                }
            )
            correlation += 1
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132, "computeMajor": 9, "computeMinor": 0}],
        "traceEvents": events,
    }
    (folder / f"rank-{rank}.json").write_text(json.dumps(doc))


def test_the_rank_with_longer_compute_is_the_straggler(tmp_path):
    """Rank 1 computes 700 µs per step, rank 0 200 µs; both then all-reduce, and rank 0 waits inside its NCCL
    kernel (680 µs) until rank 1 joins (180 µs). Rank 1's clock is 5 s ahead: only durations are compared."""
    write_rank(tmp_path, 0, [1, 2, 3], [("kernel", GEMM, 10, 200), ("kernel", NCCL, 220, 680)], clock=1_000_000)
    write_rank(tmp_path, 1, [1, 2, 3], [("kernel", GEMM, 10, 700), ("kernel", NCCL, 720, 180)], clock=6_000_000)
    report = analyze_path(tmp_path)
    section = report["ranks"]
    assert section["matched_steps"] == [1, 2, 3]
    assert section["straggler"] == 1
    assert section["straggler_excess_wait_us_per_step"] == pytest.approx(680 - 180)
    rows = {row["rank"]: row for row in section["rows"]}
    assert rows[0]["communication_us_per_step"] == 680 and rows[1]["communication_us_per_step"] == 180
    assert rows[0]["compute_us_per_step"] == 200 and rows[1]["compute_us_per_step"] == 700
    assert rows[0]["step_time_us"] == rows[1]["step_time_us"] == STEP_US
    (ga702,) = [f for f in report["findings"] if f["rule_id"] == "GA702"]
    assert ga702["evidence"]["straggler_rank"] == 1
    assert ga702["estimated_saving_us_per_step"] == 500.0
    assert ga702["estimated_saving_pct"] == 50.0
    assert "Rank 1" in ga702["message"] and "more to do" in ga702["message"]
    markdown = render_markdown(report)
    assert "## Ranks" in markdown and "| 1 (straggler) |" in markdown


def test_a_lone_all_reduce_is_exposed_communication(tmp_path):
    """Both ranks: a 600 µs GEMM, then a 280 µs all-reduce of which a 20 µs copy covers the end: 260 µs per step
    with nothing but communication on the GPU. The ranks are alike, so nobody straggles."""
    work = [
        ("kernel", GEMM, 5, 600),
        ("kernel", NCCL, 620, 280),
        ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 880, 20),
    ]
    write_rank(tmp_path, 0, [7, 8], work, clock=0)
    write_rank(tmp_path, 1, [7, 8], work, clock=123_456)
    report = analyze_path(tmp_path)
    assert report["ranks"]["straggler"] is None
    assert "GA702" not in ids(report)
    (ga701,) = [f for f in report["findings"] if f["rule_id"] == "GA701"]
    evidence = ga701["evidence"]
    assert evidence["exposed_communication_us_per_step"] == 260.0
    assert evidence["exposed_communication_us_per_step_by_rank"] == [260, 260]
    assert evidence["communication_us_per_step"] == 280.0
    # Perfect overlap could hide all 260 µs behind the 600 µs of GEMM.
    assert ga701["estimated_saving_us_per_step"] == 260.0 and ga701["estimated_saving_pct"] == 26.0
    for row in report["ranks"]["rows"]:
        assert row["exposed_communication_us_per_step"] == 260.0
        assert row["overlapped_communication_us_per_step"] == 20.0
        assert row["compute_us_per_step"] == 620.0
        assert row["gpu_busy_pct"] == pytest.approx(100 * (620 + 260) / STEP_US)


def test_ranks_without_common_steps_use_whole_trace_figures(tmp_path):
    write_rank(tmp_path, 0, [1, 2], [("kernel", GEMM, 10, 200), ("kernel", NCCL, 300, 100)], clock=0)
    write_rank(tmp_path, 1, [5, 6], [("kernel", GEMM, 10, 200), ("kernel", NCCL, 300, 100)], clock=0)
    report = analyze_path(tmp_path)
    section = report["ranks"]
    assert section["matched_steps"] == []
    assert any("no ProfilerStep number" in note for note in report["notes"])
    for row in section["rows"]:
        assert row["steps"] == 1
        assert row["step_time_us"] == STEP_US + 300 + 100 - 10  # first GEMM start to the last all-reduce's end
        assert row["communication_us_per_step"] == 200 == row["exposed_communication_us_per_step"]


def test_quiet_ranks_give_no_distributed_finding(tmp_path):
    """Collectives hidden behind compute on both ranks: a ranks table, but neither GA701 nor GA702."""
    work = [("kernel", GEMM, 5, 900), ("kernel", NCCL, 100, 300)]
    write_rank(tmp_path, 0, [1, 2], work, clock=0)
    write_rank(tmp_path, 1, [1, 2], work, clock=0)
    report = analyze_path(tmp_path)
    assert not DISTRIBUTED_RULES & set(ids(report))
    assert all(row["exposed_communication_us_per_step"] == 0 for row in report["ranks"]["rows"])


# --- two H200 ranks of examples/ddp_train.py, recorded by `gpuadvisor profile --nproc 2` -----------------------

DDP_H200 = Path(__file__).resolve().parents[1] / "sample_traces" / "ddp_2xh200"


def gpu_step_ends(events: list[dict]) -> dict[int, float]:
    """By hand: per ProfilerStep, the end of the last GPU activity whose launch (runtime or driver call, by
    correlation) happened inside the step's host annotation."""
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e["name"]).startswith("ProfilerStep#")]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    ends = {}
    for step in steps:
        number, lo, hi = int(step["name"].split("#")[1]), step["ts"], step["ts"] + step["dur"]
        mine = [
            e["ts"] + e["dur"]
            for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and lo <= launches.get(e["args"].get("correlation"), -1) <= hi
        ]
        ends[number] = max(mine)
    return ends


def test_h200_ddp_ranks_step_at_the_gpus_period():
    """The host ran one to two steps ahead of the GPU: each step's time is the GPU's period (end of one step's
    work to the end of the next), not a window stretched back to the host's step start."""
    report = analyze_path(DDP_H200 / "plain")
    rows = {row["rank"]: row for row in report["ranks"]["rows"]}
    assert report["ranks"]["matched_steps"] == [2, 3, 4]
    for rank in (0, 1):
        ends = gpu_step_ends(raw_events(DDP_H200 / "plain" / f"rank{rank}.json.gz"))
        periods = [ends[4] - ends[3], ends[3] - ends[2]]
        assert rows[rank]["step_time_us"] == pytest.approx(statistics.median(periods), rel=0.01)
        assert 31_000 < rows[rank]["step_time_us"] < 33_000


def test_h200_ddp_planted_straggler_is_named():
    """Rank 1 slept 80 ms per step between forward and backward: rank 0 waits in its all-reduces."""
    report = analyze_path(DDP_H200 / "straggler")
    section = report["ranks"]
    assert section["straggler"] == 1
    (ga702,) = [f for f in report["findings"] if f["rule_id"] == "GA702"]
    rows = {row["rank"]: row for row in section["rows"]}
    assert rows[0]["communication_us_per_step"] > 80_000 > 5_000 > rows[1]["communication_us_per_step"]
    assert ga702["evidence"]["excess_wait_us_per_step"] == pytest.approx(
        rows[0]["communication_us_per_step"] - rows[1]["communication_us_per_step"], rel=1e-6
    )
