"""`gpuadvisor profile` on a machine without a GPU, and the parts of it that need none.

Without CUDA, profile runs the model on the CPU: steps timed with time.perf_counter, a CPU-only trace, a
report whose cpu_ops say where the CPU time went and whose notes name the GPU analyses that were skipped.
nvml.csv is not written there (NVML samples a GPU; there is none), and the note says so.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpuadvisor.capture import nvml as nvml_module  # noqa: E402
from gpuadvisor.capture.timing import StepTimes, percentile, time_steps  # noqa: E402
from gpuadvisor.report.profiled import RunFacts, rescale_savings, use_timed_steps  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY_MLP = REPO / "examples" / "tiny_mlp.py"
SAMPLES = REPO / "sample_traces"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, cli):
    """One CPU profile of the tiny MLP into a folder that already holds an older run's report (with --memory,
    which needs CUDA: skipped with a note)."""
    root = tmp_path_factory.mktemp("profile")
    out = root / "out"
    out.mkdir()
    (out / "report.json").write_text('{"stale": true}')
    result = cli(
        "profile",
        TINY_MLP,
        "--out",
        out,
        "--steps",
        "5",
        "--warmup",
        "1",
        "--profile-steps",
        "2",
        "--memory",
        "-f",
        "json",
    )
    return root, out, result


def test_profile_writes_the_folder(profiled):
    root, out, result = profiled
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["report.html", "report.json", "report.md", "trace.json.gz"]  # no nvml.csv without a GPU
    assert sorted(p.name for p in root.iterdir()) == ["out"]  # the temporary folder is gone
    with gzip.open(out / "trace.json.gz", "rt") as handle:
        events = json.load(handle)["traceEvents"]
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == 2
    assert any(e.get("cat") == "python_function" for e in events)  # recorded with Python stacks
    assert "# gpuadvisor report: profile" in (out / "report.md").read_text()


def test_profile_writes_report_html(profiled):
    from gpuadvisor.report.html import render_html

    _, out, _ = profiled
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.html").read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
    assert text == render_html(report).rstrip("\n") + "\n"
    assert any(n.startswith("wrote ") and "report.html" in n for n in report["notes"])


def test_memory_without_cuda_is_skipped_with_a_note(profiled):
    _, out, result = profiled
    report = json.loads((out / "report.json").read_text())
    assert "--memory skipped: no CUDA GPU" in report["notes"]
    assert report.get("memory") is None  # no allocator without CUDA
    assert report["timeline"] is None


def test_kv_cache_capacity_of_a_decode_workload_by_hand():
    """A model with two layers of k_cache/v_cache buffers (batch 1, 4 KV heads, 32 slots, head_dim 16, bf16):
    2 x 2 layers x 4 heads x 16 x 2 bytes = 512 bytes a token; 4 tensors of 4,096 bytes = 16,384 bytes of cache."""
    import torch

    from gpuadvisor.capture.memory_run import is_decode, kv_cache_section, memory_section
    from gpuadvisor.workload import Workload

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k_cache", torch.zeros(1, 4, 32, 16, dtype=torch.bfloat16))
            self.register_buffer("v_cache", torch.zeros(1, 4, 32, 16, dtype=torch.bfloat16))

    model = torch.nn.Sequential(Layer(), Layer())
    workload = Workload("m.py", model, (), lambda: None, None, "m")
    assert is_decode(workload)
    allocator = {"headroom_bytes": 1 << 20}
    kv, notes = kv_cache_section(workload, allocator, cuda_only=False)
    assert notes == []
    free = (1 << 20) + 16_384  # what the cache could use: the headroom plus its own bytes
    assert kv["bytes_per_token"] == 512 and kv["cache_bytes"] == 16_384 and kv["free_bytes"] == free
    assert kv["sequence_tokens"] == 32 and kv["tokens_that_fit"] == free // 512 == 2080
    assert kv["sequences_that_fit"] == free // (512 * 32) == 65
    assert kv["fp8_bytes_per_token"] == 256 and kv["fp8_sequences_that_fit"] == free // (256 * 32) == 130
    # On the GPU path (CUDA tensors only) the CPU buffers are not a cache: a note, no figures.
    kv, notes = kv_cache_section(workload, allocator)
    assert kv is None and "no KV-cache tensor" in notes[0]
    # Not a decoder: no kv_cache section at all; without an allocator (no CUDA): no memory section.
    plain = Workload("m.py", torch.nn.Linear(2, 2), (), lambda: None, None, "m")
    assert not is_decode(plain) and kv_cache_section(plain, allocator) == (None, [])
    assert memory_section(plain, None, None) is None
    assert memory_section(plain, allocator, None) == {"allocator": allocator, "notes": []}
    assert is_decode(Workload("m.py", torch.nn.Linear(2, 2), (), lambda: None, None, "m", kind="decode"))


def test_profile_report_on_cpu(profiled):
    _, out, result = profiled
    report = json.loads((out / "report.json").read_text())
    assert "stale" not in report  # the older folder was replaced
    assert json.loads(result.stdout)["summary"]["samples_us"] == report["summary"]["samples_us"]
    assert report["command"] == "profile"
    summary = report["summary"]
    assert len(summary["samples_us"]) == 5 and all(s > 0 for s in summary["samples_us"])
    assert summary["step_time_us"] == pytest.approx(percentile(summary["samples_us"], 50), abs=0.01)
    assert summary["step_time_source"].startswith("CPU wall clock (time.perf_counter), 5 steps, no profiler")
    assert summary["tokens_per_s"] == pytest.approx(16 * 1e6 / summary["step_time_us"], rel=1e-3)
    assert summary["steps"] == 2
    assert report["env"]["device"] == "cpu" and report["env"]["torch"]
    assert report["kernels"] == [] and report["findings"] == []
    cpu_note = [n for n in report["notes"] if "ran on the CPU" in n]
    assert cpu_note and all(
        word in cpu_note[0] for word in ("roofline", "GPU busy/idle", "transfers", "NVML", "skipped")
    )
    ops = {op["name"]: op for op in report["cpu_ops"]}
    assert "aten::addmm" in ops
    # Two Linear layers per step, two profiled steps; self time never exceeds total time.
    assert ops["aten::addmm"]["count"] == 4 and ops["aten::addmm"]["count_per_step"] == 2
    assert all(0 <= op["self_us"] <= op["total_us"] + 0.01 for op in report["cpu_ops"])
    assert ops["aten::linear"]["total_us"] >= ops["aten::addmm"]["total_us"] - 0.01


def test_cpu_report_keeps_the_schema_keys(profiled):
    """The CPU-only report is built without the trace analysis; it must still have every key analyze writes."""
    from gpuadvisor.pipeline import analyze_path

    _, out, _ = profiled
    report = json.loads((out / "report.json").read_text())
    analyzed = analyze_path(SAMPLES / "gemm.json.gz")
    assert set(analyzed) - {"cpu_ops"} <= set(report)
    assert set(analyzed["summary"]) <= set(report["summary"])
    assert set(analyzed["env"]) <= set(report["env"])


# --- the measuring parts, without a subprocess ----------------------------------------------------


def test_time_steps_on_cpu_measures_each_step():
    durations = [0.002, 0.001, 0.003]
    seen = []

    def run(i):
        seen.append(i)
        end = __import__("time").perf_counter() + durations[i]
        while __import__("time").perf_counter() < end:
            pass

    ticks = []
    times = time_steps(run, 3, cuda=False, on_step=lambda: ticks.append(1))
    assert seen == [0, 1, 2] and len(ticks) == 3
    # Each sample is its own step's busy-wait: never shorter; a preempted host (a loaded CI machine) only
    # lengthens one, so the upper bound is loose.
    for sample, seconds in zip(times.samples_us, durations):
        assert seconds * 1e6 <= sample < seconds * 1e6 + 50_000, times.samples_us
    assert 2000 <= times.median_us < 52_000
    assert "perf_counter" in times.source and "3 steps" in times.source
    assert times.wall_s * 1e6 >= sum(times.samples_us)


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (10, 50, 90):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None and percentile([math.nan], 50) is None


class FakeNvml:
    """The pynvml calls the sampler makes, with a device at 1980 MHz that then throttles for power."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        self.energy_mj = 1_000_000
        self.calls = 0
        self.shut = False

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_mj += 700  # 0.7 J per reading
        return self.energy_mj

    def nvmlDeviceGetClockInfo(self, handle, which):
        self.calls += 1
        return (1980 if self.calls < 6 else 1755) if which == 1 else 3201

    def nvmlDeviceGetPowerUsage(self, handle):
        return 350_000  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 41

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"used": 2 * 2**30})()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x4 if self.calls >= 6 else 0

    def nvmlShutdown(self):
        self.shut = True


def test_nvml_sampler_summary_and_csv(tmp_path):
    fake = FakeNvml()
    sampler = nvml_module.NvmlSampler(fake, handle="gpu0", interval_s=0.001)
    with sampler:
        __import__("time").sleep(0.05)
    assert fake.shut and len(sampler.samples) >= 3
    summary = nvml_module.summarize(sampler, [2000.0] * 10)
    # A phase of 0.05 s is shorter than one update of the energy counter: no energy figure, never 0.
    assert summary["energy_j_per_step"] is None and summary["power_w_average"] is None
    assert summary["energy_source"].startswith("not measured: the timed span lasted 0.0")
    assert summary["power_w_median"] == 350.0 and summary["temperature_c_max"] == 41
    assert summary["clocks"]["mem_mhz_median"] == 3201
    assert summary["clocks"]["sm_mhz_max"] == 1980 and summary["clocks"]["sm_mhz_min"] == 1755
    assert summary["throttle_reasons"] == ["sw_power_cap"]

    path = tmp_path / "nvml.csv"
    nvml_module.write_csv(sampler.samples, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(sampler.samples)
    assert list(rows[0]) == nvml_module.CSV_COLUMNS
    assert rows[-1]["throttle_reasons"] == "sw_power_cap" and rows[0]["power_w"] == "350.0"


def test_average_power_from_the_energy_counter():
    """The counter advances in ~100 ms steps: its slope between the first and last change, over >= 0.5 s."""
    sampler = nvml_module.NvmlSampler(FakeNvml(), handle=None)
    sampler.energy_start_mj = 1_000_000
    sampler.duration_s = 1.01
    sampler.energy_end_mj = 1_000_000 + 10 * 14_000
    readings = []
    for i in range(50):  # every 20 ms; the counter adds 14 J (140 W) every 100 ms
        t = 0.02 * i + 0.005
        readings.append(nvml_module.NvmlSample(t, 1980, 3201, 130.0, 1_000_000 + 14_000 * int(t / 0.1), 40, 1))
    sampler.samples = readings
    power, source = nvml_module.average_power(sampler)
    assert power == pytest.approx(140.0, rel=0.05)
    assert source.startswith("NVML energy counter")
    summary = nvml_module.summarize(sampler, [5000.0, 7000.0])
    assert summary["energy_j_per_step"] == pytest.approx(power * 6000e-6)
    assert summary["power_w_median"] == 130.0


def sampler_over(duration_s: float, watts: float, *, counter: bool = True) -> nvml_module.NvmlSampler:
    """A finished sampler of FakeNvml's calls over ``duration_s``, read every 20 ms, at ``watts``: the energy
    counter adds watts x 0.1 s every 100 ms (frozen when ``counter`` is False); the power reading says 130 W."""
    sampler = nvml_module.NvmlSampler(FakeNvml(), handle=None)
    start = 1_000_000

    def energy(t: float) -> int:
        return start + int(watts * 100) * int(t / 0.1) if counter else start

    sampler.energy_start_mj = energy(0.0)
    sampler.duration_s = duration_s
    sampler.energy_end_mj = energy(duration_s)
    times = [0.02 * i + 0.005 for i in range(int(duration_s / 0.02))]
    sampler.samples = [nvml_module.NvmlSample(t, 1980, 3201, 130.0, energy(t), 40, 1) for t in times]
    return sampler


def test_energy_over_a_40_ms_window_is_not_measured():
    """apply's after side once read 0.0 J per step off 3 blocks of 0.04 s in all (issue 14): under the counter's
    ~100 ms update interval there is no energy figure, and the reason says so."""
    sampler = sampler_over(0.04, 140.0)
    assert nvml_module.average_power(sampler) == (None, nvml_module.summarize(sampler, [13_000.0])["energy_source"])
    summary = nvml_module.summarize(sampler, [13_000.0, 13_500.0, 12_900.0])
    assert summary["energy_j_per_step"] is None and summary["power_w_average"] is None
    assert summary["energy_source"] == (
        "not measured: the timed span lasted 0.04 s, under the ~0.1 s between updates of NVML's energy counter"
    )
    assert summary["power_w_median"] == 130.0  # the readings themselves are kept


def test_energy_over_a_2_s_window_with_a_counter_rise_is_a_number():
    sampler = sampler_over(2.0, 140.0)
    summary = nvml_module.summarize(sampler, [5000.0, 7000.0])
    assert summary["power_w_average"] == pytest.approx(140.0, rel=0.01)
    assert summary["energy_j_per_step"] == pytest.approx(140.0 * 6000e-6, rel=0.01)
    assert summary["energy_source"].startswith("NVML energy counter (")


def test_energy_with_a_counter_that_did_not_advance_is_not_measured():
    summary = nvml_module.summarize(sampler_over(0.3, 140.0, counter=False), [5000.0])
    assert summary["energy_j_per_step"] is None
    assert summary["energy_source"] == "not measured: NVML's energy counter did not advance over 0.30 s"


def test_profile_report_says_not_measured_never_0():
    """The JSON summary, the terminal and Markdown rows and the note of a profile timed for 0.04 s."""
    import io

    from rich.console import Console

    from gpuadvisor.report.markdown import render_markdown
    from gpuadvisor.report.profiled import analyze_run
    from gpuadvisor.report.terminal import render_terminal
    from gpuadvisor.rules.engine import load_rules

    timed = [13_000.0, 13_500.0, 12_900.0]
    facts = RunFacts(
        model_path=Path("examples/gemm.py"),
        out_dir=Path("out"),
        times=StepTimes(timed, "CUDA events, 3 steps, no profiler", 0.04),
        tokens_per_step=None,
        nvml_summary=nvml_module.summarize(sampler_over(0.04, 140.0), timed),
        nvml_reason="",
        memory={},
        profiled_steps=3,
    )
    report = analyze_run(SAMPLES / "gemm.json.gz", facts, {}, rules=load_rules(), peaks_file=None, cuda=True)
    summary = report["summary"]
    assert summary["energy_j_per_step"] is None and summary["energy_source"].startswith("not measured")
    note = next(n for n in report["notes"] if n.startswith("energy per step"))
    assert note.startswith("energy per step not measured: the timed span lasted 0.04 s") and "--min-time" in note
    console = Console(file=io.StringIO(), width=120, color_system=None)
    render_terminal(report, console)
    terminal = console.file.getvalue()
    row = next(line for line in terminal.splitlines() if "Energy per step" in line)
    assert row.split("  ")[0] == "Energy per step" and row.split()[3:5] == ["not", "measured"]
    assert "mJ" not in row and " J " not in row
    markdown_row = next(line for line in render_markdown(report).splitlines() if "Energy per step" in line)
    assert markdown_row.split("|")[2].strip() == "not measured" and "mJ" not in markdown_row


def test_clock_reasons_decoded():
    assert nvml_module.decode_clock_reasons(0) == []
    assert nvml_module.decode_clock_reasons(0x1 | 0x20) == ["gpu_idle", "sw_thermal_slowdown"]
    assert nvml_module.decode_clock_reasons(0x4 | 0x800) == ["sw_power_cap", "bit_0x800"]


def test_nvml_unavailable_without_pynvml(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    sampler, reason = nvml_module.open_sampler(0)
    assert sampler is None and "pynvml" in reason


def test_savings_rescaled_to_the_timed_step():
    """The decode sample (profiled on the H200) against the step timed without the profiler (GPU.md: 5856 µs)."""
    from gpuadvisor.pipeline import analyze_path
    from gpuadvisor.rules.engine import load_rules

    report = analyze_path(SAMPLES / "llama_decode.json.gz")
    rules = load_rules()
    profiled_step = report["summary"]["step_time_us"]
    timed = [5850.0, 5856.0, 5870.0]
    facts = RunFacts(
        model_path=Path("examples/llama_decode.py"),
        out_dir=Path("out"),
        times=StepTimes(timed, "CUDA events, 3 steps, no profiler", 0.02),
        tokens_per_step=1,
        nvml_summary=None,
        nvml_reason="test",
        memory={},
        profiled_steps=3,
    )
    use_timed_steps(report, facts)
    rescale_savings(report, rules)
    summary = report["summary"]
    assert summary["step_time_us"] == 5856.0 and summary["trace_step_time_us"] == profiled_step
    assert summary["tokens_per_s"] == pytest.approx(1e6 / 5856, abs=0.1)
    assert summary["profiler_slowdown"] == pytest.approx(profiled_step / 5856, abs=0.01)

    launch = next(f for f in report["findings"] if f["rule_id"] == "GA101")
    overhead = next(r for r in rules if r.id == "GA101").thresholds["graph_overhead_us_per_kernel"]
    evidence = launch["evidence"]
    expected = 5856.0 - (evidence["gpu_busy_us"] + evidence["kernels_per_step"] * overhead)
    assert launch["estimated_saving_us_per_step"] == pytest.approx(max(0.0, expected), abs=0.1)
    assert launch["estimated_saving_pct"] == pytest.approx(100 * max(0.0, expected) / 5856, abs=0.05)
    assert "Timed without the profiler" in launch["message"]
    for finding in report["findings"]:
        assert 0 <= finding["estimated_saving_us_per_step"] <= 5856.0
        assert finding["estimated_saving_pct"] == pytest.approx(
            100 * finding["estimated_saving_us_per_step"] / 5856, abs=0.06
        )
    savings = [f["estimated_saving_us_per_step"] for f in report["findings"]]
    assert savings == sorted(savings, reverse=True)
    assert summary["top_finding"] == report["findings"][0]["rule_id"]
    assert any("rescaled to the timed step" in note for note in report["notes"])


def test_unsteady_step_times_get_a_note():
    from gpuadvisor.report.profiled import spread_note

    assert spread_note(1000.0, 1150.0) is None
    note = spread_note(8391.0, 12500.0)
    assert note and "49% apart" in note and "\n" not in note
    assert spread_note(None, 10.0) is None


def test_short_steps_are_timed_for_the_minimum_time():
    from gpuadvisor.profile import MAX_TIMED_STEPS, timed_step_count

    assert timed_step_count(30, 0.006, 5.0) == 834  # 6 ms steps: 834 fill 5 s
    assert timed_step_count(30, 0.5, 5.0) == 30  # 30 half-second steps take 15 s already
    assert timed_step_count(2000, 0.006, 5.0) == 2000  # never fewer than asked
    assert timed_step_count(30, 0.006, 0.0) == 30  # --min-time 0: exactly --steps
    assert timed_step_count(30, None, 5.0) == 30  # no warm-up, no pace to go by
    assert timed_step_count(30, 1e-6, 5.0) == MAX_TIMED_STEPS


def test_min_time_reaches_the_ranks_and_defaults_agree():
    import inspect

    from gpuadvisor.cli import profile as profile_command
    from gpuadvisor.distributed_child import _parser
    from gpuadvisor.profile import MIN_TIMING_S
    from gpuadvisor.profile_ranks import RankOptions

    default = inspect.signature(profile_command).parameters["min_time"].default
    assert default == MIN_TIMING_S
    options = RankOptions(REPO / "m.py", None, 5, 30, 3, REPO / "out", None, None, True, min_time_s=2.5)
    args = _parser().parse_args([*options.child_args(), "--staging", "s"])
    assert args.min_time == 2.5


@pytest.mark.parametrize("value", ["-1", "601", "soon"])
def test_bad_min_time_is_a_usage_error(cli, tmp_path, value):
    result = cli("profile", TINY_MLP, "--min-time", value, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert "--min-time" in result.stderr
    assert not (tmp_path / "out").exists()


def test_run_profile_checks_min_time(tmp_path):
    from gpuadvisor.errors import BadInputError
    from gpuadvisor.profile import run_profile

    with pytest.raises(BadInputError, match="--min-time"):
        run_profile(TINY_MLP, min_time_s=-2, out_dir=tmp_path / "out")


@pytest.mark.parametrize(("min_time_s", "expect_more"), [(0.3, True), (0.0, False)])
def test_measure_times_for_the_minimum_time_on_a_gpu(monkeypatch, min_time_s, expect_more):
    """The GPU branch of _measure with the CUDA calls stubbed: steps of ~2 ms, 3 s of warm-up shortened to
    0.05 s; the timed count follows the warm-up's pace, and every count goes through agree_steps."""
    import time

    import torch

    from gpuadvisor import profile as profile_module
    from gpuadvisor.capture import timing as timing_module
    from gpuadvisor.progress import ProgressDisplay

    monkeypatch.setattr(profile_module, "MIN_WARMUP_S", 0.05)
    monkeypatch.setattr(profile_module, "synchronize", lambda *args: None)
    for name in ("reset_peak_memory_stats", "max_memory_allocated", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda *args: 0)
    from gpuadvisor.capture import memory as memory_module

    stats = {"allocated_bytes.all.peak": 0, "reserved_bytes.all.peak": 0}
    monkeypatch.setattr(
        memory_module, "read_allocator_stats", lambda: {"stats": stats, "free_bytes": 1, "total_bytes": 1}
    )
    timed = []

    def fake_time_steps(run_step, steps, *, cuda, on_step=None):
        assert cuda
        timed.append(steps)
        return StepTimes([2000.0] * steps, "stub", 0.0)

    monkeypatch.setattr(timing_module, "time_steps", fake_time_steps)
    probed = []

    def fake_probe_host(run_step, first_index, probes):
        probed.append((first_index, probes))
        return [1500.0] * probes

    monkeypatch.setattr(timing_module, "probe_host", fake_probe_host)
    agreed = []

    def agree(count):
        agreed.append(count)
        return count

    def run_step(phase, index, total):
        time.sleep(0.002)

    with ProgressDisplay(False) as display:
        profile_module.measure(run_step, "m.py", True, 2, 30, False, display, agree_steps=agree, min_time_s=min_time_s)
    assert agreed[-1] == timed[0]  # the ranks agree on the timed count too
    # After the timed steps, the host's time per step from an idle GPU: the summary's host_enqueue_us.
    assert probed == [(timed[0], profile_module.HOST_PROBES)]
    if expect_more:
        assert 30 < timed[0] <= 0.3 / 0.002 + 1  # about 0.3 s of ~2 ms steps, never more than sleep allows
    else:
        assert timed == [30]


def test_timing_turns_a_cuda_error_into_a_user_error_and_stops_the_sampler():
    from gpuadvisor.errors import UserCodeError
    from gpuadvisor.steps import sampling_while_timing

    class Sampler:
        started = stopped = 0

        def start(self):
            self.started += 1

        def stop(self):
            self.stopped += 1

    sampler = Sampler()
    with pytest.raises(
        UserCodeError, match="m.py: the GPU reported an error during timing: RuntimeError: CUDA error: boom more"
    ):
        with sampling_while_timing(sampler, "m.py", cuda=True):
            raise RuntimeError("CUDA error: boom\nmore")
    assert (sampler.started, sampler.stopped) == (1, 1)
    with pytest.raises(RuntimeError, match="not ours"):  # not a CUDA error: the user's own, as it is
        with sampling_while_timing(sampler, "m.py", cuda=True):
            raise RuntimeError("not ours")
    assert sampler.stopped == 2


def test_paired_blocks_alternate_and_time_what_the_context_does_to_the_step(monkeypatch):
    """time_paired_blocks: blocks in alternating order, each after an untimed call in its own setting; each
    round's figure is the inside block's median step over the outside one's (here 4 ms of sleep against 1)."""
    import contextlib
    import time

    from gpuadvisor.capture import timing as timing_module
    from gpuadvisor.capture.timing import time_paired_blocks

    def fake_cuda(run_step, steps, on_step):  # the host clock in place of CUDA events, on the CPU
        samples = []
        for i in range(steps):
            start = time.perf_counter()
            run_step(i)
            samples.append((time.perf_counter() - start) * 1e6)
        return StepTimes(samples, "stub", 0.0)

    monkeypatch.setattr(timing_module, "_time_cuda", fake_cuda)
    inside = []
    calls = []

    @contextlib.contextmanager
    def wrap():
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    def run_step(index):
        calls.append((index, bool(inside)))
        time.sleep(0.004 if inside else 0.001)

    ratios = time_paired_blocks(run_step, wrap, 40, 3, 2)
    assert [c[0] for c in calls] == list(range(40, 58))
    # off x3, on x3 | on x3, off x3 | off x3, on x3: the first call of each block is untimed, after a switch
    assert [c[1] for c in calls] == [False] * 3 + [True] * 6 + [False] * 6 + [True] * 3
    assert len(ratios) == 3 and all(2.0 < x < 8.0 for x in ratios)


def test_tf32_is_timed_on_and_off_only_where_the_fix_applies_and_the_host_may_bound_the_step(monkeypatch):
    from gpuadvisor import profile as profile_module
    from gpuadvisor.capture import timing as timing_module
    from gpuadvisor.fixes import tf32 as tf32_module
    from gpuadvisor.fixes.base import Refusal
    from gpuadvisor.profile import tf32_step_delta
    from gpuadvisor.progress import ProgressDisplay

    seen = []

    def fake_blocks(run_step, wrap, first_index, rounds, steps):
        seen.append((first_index, rounds, steps, wrap))
        return [1.036, 1.0335, 1.035, 1.12, 1.034]  # ratios of on to off

    monkeypatch.setattr(timing_module, "time_paired_blocks", fake_blocks)
    host_bound = StepTimes([7_756.0] * 30, "stub", 0.0, host_us=[7_790.0] * 5)
    gpu_bound = StepTimes([30_000.0] * 30, "stub", 0.0, host_us=[9_900.0] * 5)  # ViT-B/16 at batch 32
    with ProgressDisplay(False) as display:
        monkeypatch.setattr(tf32_module.Tf32Fix, "check", lambda self, w: Refusal("no float32 matmuls", "nothing"))
        assert tf32_step_delta(object(), lambda *a: None, 35, display, host_bound) == []
        monkeypatch.setattr(tf32_module.Tf32Fix, "check", lambda self, w: None)
        assert tf32_step_delta(object(), lambda *a: None, 35, display, gpu_bound) == []
        assert seen == []
        delta = tf32_step_delta(object(), lambda *a: None, 35, display, host_bound)
    # 12 s of 7.8 ms steps, two blocks of 5 (+1 untimed) a round: 128 rounds fit, 120 at most
    assert seen == [(35, profile_module.TF32_ROUNDS[1], profile_module.TF32_BLOCK_STEPS, tf32_module.tf32_allowed)]
    times = StepTimes([7_756.0], "stub", 0.0, host_us=[7_790.0], tf32_step_delta_us=delta)
    # each round's ratio less 1 times the timed median (7,756 µs); the median: one slow round does not move it
    assert times.tf32_step_delta_median_us == pytest.approx(0.035 * 7_756.0)
    from gpuadvisor.report.profiled import timed_summary

    facts = RunFacts(Path("m.py"), Path("out"), times, None, None, "off", {}, 1)
    assert timed_summary(facts)["tf32_step_delta_us"] == round(0.035 * 7_756.0, 2)
    assert timed_summary(facts)["tf32_step_delta_rounds"] == 5
