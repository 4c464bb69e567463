"""``gpuadvisor diff``: the public before/after pair checked against a hand count, and a tiny synthetic pair."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuadvisor import diff

PUBLIC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "public"
CONTROL = PUBLIC / "diff_control.json.gz"
TEST = PUBLIC / "diff_test.json.gz"
needs_public = pytest.mark.skipif(not (CONTROL.is_file() and TEST.is_file()), reason="public traces not present")


def kernel_us_per_step_by_hand(path: Path) -> dict[str, float]:
    """Per kernel name: total duration of the kernels that start inside a ProfilerStep#N window / steps.

    Plain json and loops, independent of the reader: a kernel belongs to the step window its own start
    falls in (the tool attributes it to the step of its launch call; both agree on this pair)."""
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    windows = []
    for event in events:
        if event.get("cat") == "user_annotation" and str(event.get("name", "")).startswith("ProfilerStep#"):
            windows.append((event["ts"], event["ts"] + event["dur"]))
    totals: dict[str, float] = {}
    for event in events:
        if event.get("cat") != "kernel":
            continue
        for start, end in windows:
            if start <= event["ts"] <= end:
                totals[event["name"]] = totals.get(event["name"], 0.0) + event["dur"]
                break
    return {name: total / len(windows) for name, total in totals.items()}


@pytest.fixture(scope="module")
def public_diff() -> dict:
    return diff.diff_paths(CONTROL, TEST)


@needs_public
def test_public_pair_top_kernels_match_a_hand_count(public_diff: dict) -> None:
    before, after = kernel_us_per_step_by_hand(CONTROL), kernel_us_per_step_by_hand(TEST)
    changes = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in set(before) | set(after)}
    by_hand = sorted(changes.items(), key=lambda item: -abs(item[1]))[:3]

    assert public_diff["basis"] == diff.PER_STEP
    assert public_diff["base"]["steps"] == public_diff["current"]["steps"] == 6
    kernels = [row for row in public_diff["gpu"]["rows"] if row["kind"] == "kernel"][:3]
    assert [row["name"] for row in kernels] == [name for name, _ in by_hand]
    for row, (name, change) in zip(kernels, by_hand):
        assert row["change_us_per_step"] == pytest.approx(change, abs=0.05), name
        assert row["base_us_per_step"] == pytest.approx(before.get(name, 0.0), abs=0.05), name
        assert row["current_us_per_step"] == pytest.approx(after.get(name, 0.0), abs=0.05), name
    # The three, as counted: an embedding backward kernel (template <..., 5ul>) added, +10,022 µs per step;
    # the NCCL all-reduce 5,480 -> 15,347 µs per step; the <..., 2ul> instance of the embedding kernel removed.
    assert [row["status"] for row in kernels] == [diff.ADDED, diff.SLOWER, diff.REMOVED]
    assert kernels[1]["name"] == "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
    assert [round(row["change_us_per_step"]) for row in kernels] == [10022, 9867, -6030]


@needs_public
def test_public_pair_rows_are_sorted_by_absolute_change(public_diff: dict) -> None:
    for key in ("gpu", "cpu_ops"):
        changes = [abs(row["change_us_per_step"]) for row in public_diff[key]["rows"]]
        assert changes == sorted(changes, reverse=True) and changes[0] > 0
        assert sum(public_diff[key]["counts"].values()) == public_diff[key]["rows_total"]
    top_copy = public_diff["gpu"]["rows"][0]  # device-to-device copies grew most of all: 3 -> 774 per step
    assert top_copy["kind"] == "memcpy" and top_copy["name"].startswith("Memcpy DtoD")


@needs_public
def test_cli_diff_on_the_public_pair(cli) -> None:
    result = cli("diff", CONTROL, TEST, "--format", "json", "--top", "5")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["gpu"]["rows"]) == len(data["cpu_ops"]["rows"]) == 5
    assert data["gpu"]["rows_total"] > 5
    markdown = cli("diff", CONTROL, TEST, "--format", "markdown", "--top", "3")
    assert markdown.returncode == 0 and markdown.stdout.startswith("### gpuadvisor diff (per step)")
    assert "ncclKernel_AllReduce_RING_LL_Sum_float" in markdown.stdout
    terminal = cli("diff", CONTROL, TEST, "--top", "3")
    assert terminal.returncode == 0 and "GPU kernels and copies" in terminal.stdout and "added" in terminal.stdout


# --- synthetic pair -----------------------------------------------------------------------------


def x(cat: str, name: str, ts: float, dur: float, args: dict | None = None, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def trace_doc(kernels: dict[str, float], ops: list[str], steps: bool = True) -> dict:
    """Two steps 1000 µs apart; in each, every operator of ``ops`` and one launch per kernel in ``kernels``
    (name -> duration in µs)."""
    events = []
    correlation = 0
    for step in range(2):
        t0 = 1000.0 * (step + 1)
        if steps:
            events.append(x("user_annotation", f"ProfilerStep#{step}", t0, 900.0))
        for i, op in enumerate(ops):
            events.append(x("cpu_op", op, t0 + 10 + i, 5.0, {"External id": 10 * step + i}))
        for i, (name, duration) in enumerate(kernels.items()):
            correlation += 1
            launch = t0 + 100 + 50 * i
            events.append(x("cuda_runtime", "cudaLaunchKernel", launch, 4.0, {"correlation": correlation}))
            gpu = {"device": 0, "stream": 7, "correlation": correlation}
            events.append(x("kernel", name, launch + 10, duration, gpu, tid=7))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
        "traceEvents": events,
    }


def write_pair(folder: Path, steps: bool = True) -> tuple[Path, Path]:
    base = trace_doc({"gemm": 100.0, "removed_kernel": 30.0, "softmax": 20.0}, ["aten::mm", "aten::old_op"], steps)
    current = trace_doc({"gemm": 100.0, "softmax": 40.0, "added_kernel": 25.0}, ["aten::mm", "aten::new_op"], steps)
    paths = folder / "base.json.gz", folder / "current.json"
    with gzip.open(paths[0], "wt") as handle:
        json.dump(base, handle)
    paths[1].write_text(json.dumps(current))
    return paths


def rows_by_name(section: dict) -> dict[str, dict]:
    return {row["name"]: row for row in section["rows"]}


def test_synthetic_pair_added_removed_slower(tmp_path: Path) -> None:
    result = diff.diff_paths(*write_pair(tmp_path))
    assert result["basis"] == diff.PER_STEP and result["base"]["steps"] == 2
    gpu = rows_by_name(result["gpu"])
    assert gpu["added_kernel"]["status"] == diff.ADDED and gpu["added_kernel"]["current_us_per_step"] == 25.0
    assert gpu["added_kernel"]["change_pct"] is None
    assert gpu["removed_kernel"]["status"] == diff.REMOVED and gpu["removed_kernel"]["change_us_per_step"] == -30.0
    assert gpu["softmax"]["status"] == diff.SLOWER and gpu["softmax"]["change_pct"] == pytest.approx(100.0)
    assert gpu["gemm"]["status"] == diff.UNCHANGED and gpu["gemm"]["base_count_per_step"] == 1.0
    assert [row["name"] for row in result["gpu"]["rows"]] == ["removed_kernel", "added_kernel", "softmax", "gemm"]
    assert result["gpu"]["counts"] == {"added": 1, "removed": 1, "slower": 1, "faster": 0, "unchanged": 1}
    ops = rows_by_name(result["cpu_ops"])
    assert ops["aten::new_op"]["status"] == diff.ADDED and ops["aten::old_op"]["status"] == diff.REMOVED
    assert ops["aten::mm"]["status"] == diff.UNCHANGED and ops["aten::mm"]["base_us_per_step"] == 5.0


def test_synthetic_pair_without_steps_is_per_trace(tmp_path: Path) -> None:
    result = diff.diff_paths(*write_pair(tmp_path, steps=False))
    assert result["basis"] == diff.PER_TRACE and "per trace" in result["notes"][0]
    assert rows_by_name(result["gpu"])["softmax"]["change_us_per_step"] == 40.0  # two launches of +20 µs


def test_top_keeps_the_largest_changes(tmp_path: Path) -> None:
    result = diff.diff_paths(*write_pair(tmp_path), top=2)
    assert [row["name"] for row in result["gpu"]["rows"]] == ["removed_kernel", "added_kernel"]
    assert result["gpu"]["rows_total"] == 4


def test_cli_diff_formats_and_bad_input(cli, tmp_path: Path) -> None:
    base, current = write_pair(tmp_path)
    data = json.loads(cli("diff", base, current, "--format", "json").stdout)
    assert {row["name"] for row in data["gpu"]["rows"]} == {"gemm", "removed_kernel", "softmax", "added_kernel"}
    markdown = cli("diff", base, current, "-f", "markdown").stdout
    assert "| added | added_kernel |" in markdown
    missing = cli("diff", base, tmp_path / "nosuch.json")
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and len(missing.stderr.splitlines()) == 1
    empty = tmp_path / "empty.json"
    empty.write_text("")
    bad = cli("diff", empty, current)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "empty" in bad.stderr


# --- step time: the same as analyze ------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
STEP_TIME_SAMPLES = [
    "gemm.json.gz",
    "llama_decode.json.gz",
    "input_pipeline.json.gz",
    "real/hf_gpt2_eager_attention.json.gz",
]


@pytest.mark.parametrize("name", STEP_TIME_SAMPLES)
def test_diff_reports_the_step_time_analyze_reports(name: str) -> None:
    """Both use analyze's step window (to the end of the step's GPU work), not the ProfilerStep CPU span:
    on gemm the annotation lasts 459 µs while the step's GPU work runs 6,986 µs (issue 14)."""
    from gpuadvisor.pipeline import analyze_path

    path = SAMPLES / name
    result = diff.diff_paths(path, path)
    analyzed = analyze_path(path)["summary"]["step_time_us"]
    assert analyzed is not None
    for side in ("base", "current"):
        assert result[side]["step_time_us_median"] == pytest.approx(analyzed, abs=0.01), side


def test_cli_diff_and_analyze_print_the_same_gemm_step(cli) -> None:
    path = SAMPLES / "gemm.json.gz"
    analyzed = json.loads(cli("analyze", path, "--format", "json").stdout)["summary"]["step_time_us"]
    assert round(analyzed) == 6986  # the step's GPU work, not the 459 µs annotation
    terminal = cli("diff", path, path)
    assert terminal.returncode == 0, terminal.stderr
    assert terminal.stdout.count("median step 6,986 µs") == 2 and "459 µs" not in terminal.stdout
    data = json.loads(cli("diff", path, path, "--format", "json").stdout)
    assert data["base"]["step_time_us_median"] == pytest.approx(analyzed, abs=0.01)


def test_diff_without_steps_reports_the_whole_trace_as_analyze_does(tmp_path: Path) -> None:
    from gpuadvisor.pipeline import analyze_path

    base, current = write_pair(tmp_path, steps=False)
    result = diff.diff_paths(base, current)
    assert result["base"]["step_time_us_median"] == pytest.approx(analyze_path(base)["summary"]["step_time_us"])
    assert "whole trace" in diff.render_markdown(result)
