"""`gpuadvisor calibrate`: the no-GPU error, the cache, and measured roofs replacing the datasheet's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from gpuadvisor.device import calibrate
from gpuadvisor.device.calibrate import (
    NO_CUDA_MESSAGE,
    cache_path,
    load_calibration,
    render_calibration,
    run_calibration,
    summarize,
    write_calibration,
)
from gpuadvisor.device.peaks import apply_calibration, lookup_peaks
from gpuadvisor.errors import EXIT_BAD_INPUT, BadInputError

REPO = Path(__file__).resolve().parents[1]
GEMM_SAMPLE = REPO / "sample_traces" / "gemm.json.gz"
T = 1e12


def fake_result(gpu: str = "NVIDIA H200", driver: str = "580.159.04", date: str = "2026-11-29T10:00:00+00:00"):
    """A calibration as run_calibration returns it, with GPU.md's H200 ceilings as the measured values."""
    stats = {"samples": 50, "median": 786 * T, "p10": 780 * T, "p90": 790 * T, "spread_pct": 1.3}
    return {
        "schema_version": 1,
        "gpu": gpu,
        "sm_count": 132,
        "compute_capability": "9.0",
        "memory_bytes": 150109880320,
        "driver": driver,
        "driver_source": "pynvml",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "date": date,
        "method": "test",
        "seconds": 14.0,
        "hbm_bytes_per_s": 4.24 * T,
        "host_to_device_bytes_per_s": 55e9,
        "device_to_host_bytes_per_s": 53e9,
        "flops_per_s": {"bf16": 786 * T, "fp16": 780 * T, "tf32": 400 * T, "fp32": 51 * T, "fp8": 1451 * T},
        "skipped": {},
        "stats": {"hbm_bytes_per_s": dict(stats), "flops_per_s": {"bf16": dict(stats)}},
    }


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty calibration cache under tmp_path (XDG_CACHE_HOME points there)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "gpuadvisor" / "calibration"
    assert calibrate.cache_dir() == folder
    return folder


# --------------------------------------------------------------------------------------------
# no GPU


def test_no_cuda_is_a_one_line_bad_input_error(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BadInputError) as info:
        run_calibration(force=True)
    assert str(info.value) == NO_CUDA_MESSAGE == "no CUDA GPU: calibrate measures the GPU it runs on"
    assert info.value.exit_code == EXIT_BAD_INPUT


def test_no_cuda_cli_exits_2_with_one_line(cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: calibrate would measure it")
    done = cli("calibrate")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {NO_CUDA_MESSAGE}"]
    assert "Traceback" not in done.stderr and done.stdout == ""


# --------------------------------------------------------------------------------------------
# the cache


def test_cache_path_is_gpu_slug_and_driver(cache):
    assert cache_path("NVIDIA H200", "580.159.04") == cache / "nvidia-h200--580.159.04.json"
    assert cache_path("NVIDIA A100-SXM4-80GB", "cuda12.4") == cache / "nvidia-a100-sxm4-80gb--cuda12.4.json"


def test_cache_round_trip(cache):
    result = fake_result()
    path = write_calibration(result)
    assert path == cache / "nvidia-h200--580.159.04.json"
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind

    loaded = load_calibration("NVIDIA H200")
    assert loaded is not None
    assert loaded["cached"] is True and loaded["path"] == str(path)
    assert {k: v for k, v in loaded.items() if k not in ("cached", "path")} == result
    assert load_calibration("nvidia  h200", driver="580.159.04") == loaded  # names compare without case/spacing
    assert load_calibration("NVIDIA H200", driver="550.54") is None
    assert load_calibration("NVIDIA H200 NVL") is None
    assert load_calibration("NVIDIA H100 80GB HBM3") is None
    assert load_calibration(None) is None and load_calibration("") is None


def test_newest_calibration_wins_without_a_driver(cache):
    write_calibration(fake_result(driver="550.54", date="2026-01-01T00:00:00+00:00"))
    newer = fake_result(driver="580.159.04", date="2026-11-29T10:00:00+00:00")
    newer["hbm_bytes_per_s"] = 4.3 * T
    write_calibration(newer)
    assert load_calibration("NVIDIA H200")["driver"] == "580.159.04"
    assert load_calibration("NVIDIA H200", driver="550.54")["hbm_bytes_per_s"] == pytest.approx(4.24 * T)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[1, 2, 3]",
        '{"gpu": "NVIDIA H200"}',  # no rate at all
        '{"gpu": "NVIDIA H200", "hbm_bytes_per_s": -1}',
        '{"gpu": "NVIDIA H200", "hbm_bytes_per_s": "fast"}',
        '{"gpu": "NVIDIA H200", "flops_per_s": {"bf16": 0}}',
        '{"gpu": "NVIDIA H200", "flops_per_s": {"bf17": 1e15}}',
        '{"gpu": "NVIDIA H200", "flops_per_s": [1e15]}',
        '{"gpu": "NVIDIA H100", "hbm_bytes_per_s": 3e12}',  # another GPU's numbers under this name
    ],
)
def test_corrupt_cache_file_is_ignored(cache, text):
    cache.mkdir(parents=True)
    (cache / "nvidia-h200--580.159.04.json").write_text(text)
    assert load_calibration("NVIDIA H200") is None


def test_corrupt_file_beside_a_good_one_is_skipped(cache):
    good = write_calibration(fake_result(driver="550.54", date="2026-01-01T00:00:00+00:00"))
    (cache / "nvidia-h200--580.159.04.json").write_bytes(b"\xff\xfe garbage")
    assert load_calibration("NVIDIA H200")["path"] == str(good)


def test_unreadable_cache_folder_is_no_calibration(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert load_calibration("NVIDIA H200") is None


def test_run_calibration_returns_the_cache_without_measuring(cache, monkeypatch):
    identity = {k: fake_result()[k] for k in ("gpu", "driver")} | {"device_index": 0, "compute_capability": "9.0"}
    monkeypatch.setattr(calibrate, "_import_torch_with_cuda", lambda: object())
    monkeypatch.setattr(calibrate, "_gpu_identity", lambda torch: identity)

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured although a cached result exists")

    monkeypatch.setattr(calibrate, "_measure_copy", no_measuring)
    write_calibration(fake_result())
    result = run_calibration(force=False)
    assert result["cached"] is True and result["hbm_bytes_per_s"] == pytest.approx(4.24 * T)


# --------------------------------------------------------------------------------------------
# the measuring loop, on the CPU with a host clock standing in for CUDA events


class _HostClockEvent:
    def __init__(self, enable_timing: bool = False):
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _HostClockEvent) -> float:
        return (other.t - self.t) * 1e3


def test_measuring_code_paths_on_cpu(cache, monkeypatch):
    """Every measurement runs end to end (tiny sizes, CPU tensors) and the result is cached and renders."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", _HostClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(calibrate, "_import_torch_with_cuda", lambda: torch)
    monkeypatch.setattr(calibrate, "_device", lambda torch, index: torch.device("cpu"))
    monkeypatch.setattr(calibrate, "_pinned_empty_like", lambda torch, t: torch.empty_like(t))
    identity = {k: fake_result()[k] for k in ("gpu", "driver", "torch", "cuda", "sm_count", "compute_capability")}
    monkeypatch.setattr(calibrate, "_gpu_identity", lambda torch: identity | {"device_index": 0})
    for name, value in {
        "COPY_BUFFER_BYTES": 4 << 20,
        "HOST_BUFFER_BYTES": 1 << 20,
        "GEMM_SIZE": 64,
        "_WARMUP_S": 0.001,
        "_BUDGET_S": {"copy": 0.005, "host": 0.005},
        "_GEMM_WARMUP_S": 0.001,
        "_GEMM_BURST_S": 0.005,
        "_GEMM_PAUSE_S": 0.0,
    }.items():
        monkeypatch.setattr(calibrate, name, value)

    result = run_calibration(force=True)
    assert result["cached"] is False and Path(result["path"]).is_file()
    for key in ("hbm_bytes_per_s", "host_to_device_bytes_per_s", "device_to_host_bytes_per_s"):
        assert result[key] > 0 and result["stats"][key]["samples"] >= 10
    measured = set(result["flops_per_s"]) | set(result["skipped"])
    assert measured == {"bf16", "fp16", "tf32", "fp32", "fp8"}  # fp8 measured, or skipped with its reason
    assert set(result["flops_per_s"]) >= {"bf16", "fp16", "tf32", "fp32"}
    bf16 = result["stats"]["flops_per_s"]["bf16"]
    assert len(bf16["burst_medians"]) == calibrate._GEMM_BURSTS and max(bf16["burst_medians"]) == bf16["median"]
    assert torch.backends.cuda.matmul.allow_tf32 is False  # restored after the tf32 measurement
    assert load_calibration("NVIDIA H200")["flops_per_s"] == result["flops_per_s"]


def test_summarize_rates_from_times():
    stats = summarize([2.0, 1.0, 4.0, 1.0, 1.0], work=1e9, what="x")
    assert stats["median"] == pytest.approx(1e12)  # 1e9 per 1 ms
    assert stats["min"] == pytest.approx(2.5e11) and stats["max"] == pytest.approx(1e12)
    assert stats["p10"] <= stats["median"] <= stats["p90"]
    assert stats["samples"] == 5 and stats["spread_pct"] > 0


# --------------------------------------------------------------------------------------------
# measured roofs in the roofline


def test_apply_calibration_replaces_rates_and_source():
    table = lookup_peaks("NVIDIA H200")
    peaks = apply_calibration(table, fake_result())
    assert peaks.hbm_bytes_per_s == pytest.approx(4.24 * T) and table.hbm_bytes_per_s == pytest.approx(4.8 * T)
    assert peaks.flops_per_s["bf16"] == pytest.approx(786 * T) and peaks.flops_per_s["fp8"] == pytest.approx(1451 * T)
    assert peaks.flops_per_s["fp64"] == table.flops_per_s["fp64"]  # not measured: the datasheet's
    assert peaks.host_link_bytes_per_s == pytest.approx(55e9)  # the faster direction
    assert peaks.source.startswith("calibrated on this GPU (2026-11-29)")
    assert "fp64, int8 from NVIDIA H200 datasheet" in peaks.source
    assert peaks.known and peaks.key == table.key and peaks.sm_count == 132


def test_lookup_peaks_with_calibration_for_a_gpu_the_table_lacks():
    peaks = lookup_peaks("NVIDIA Future GPU", calibration=fake_result(gpu="NVIDIA Future GPU"))
    assert peaks.known and peaks.gpu == "NVIDIA Future GPU"
    assert peaks.source == "calibrated on this GPU (2026-11-29)"
    assert peaks.flops_per_s["bf16"] == pytest.approx(786 * T)


def test_calibration_without_rates_changes_nothing():
    table = lookup_peaks("NVIDIA H200")
    assert apply_calibration(table, {"gpu": "NVIDIA H200", "flops_per_s": {"bf16": "fast"}}) == table


def test_peaks_file_wins_over_calibration(tmp_path):
    override = tmp_path / "peaks.toml"
    override.write_text("hbm_tb_per_s = 3.0\n\n[tflops]\nbf16 = 700\n")
    peaks = lookup_peaks("NVIDIA H200", override, calibration=fake_result())
    assert peaks.hbm_bytes_per_s == pytest.approx(3.0 * T)
    assert peaks.flops_per_s["bf16"] == pytest.approx(700 * T)
    assert peaks.flops_per_s["fp8"] == pytest.approx(1451 * T)  # the file leaves fp8 to the calibration
    assert peaks.source.startswith(f"override file {override}, over calibrated on this GPU")


def _bf16_gemm(report: dict) -> dict:
    (kernel,) = [k for k in report["kernels"] if "bfloat16" in (k.get("dtype") or "").lower()]
    return kernel


def test_analyze_uses_the_cached_calibration(cache):
    from gpuadvisor.pipeline import analyze_path

    datasheet = analyze_path(GEMM_SAMPLE)
    assert "calibrated" not in datasheet["peaks"]["source"]
    write_calibration(fake_result())
    calibrated = analyze_path(GEMM_SAMPLE)
    assert "calibrated on this GPU (2026-11-29)" in calibrated["peaks"]["source"]
    assert calibrated["peaks"]["flops_per_s"]["bf16"] == pytest.approx(786 * T)
    # 786 TFLOP/s measured is under the datasheet's 989.5: this kernel (797 TFLOP/s, 80.6% of the datasheet) is above
    # it, which is shown as the roof being off, not as 101% of roof.
    assert 75 < _bf16_gemm(datasheet)["pct_of_roof"] < 90
    kernel = _bf16_gemm(calibrated)
    assert kernel["pct_of_roof"] is None and "above the compute roof in use" in kernel["roof_note"]


def test_analyze_ignores_a_corrupt_cache(cache):
    from gpuadvisor.pipeline import analyze_path

    cache.mkdir(parents=True)
    (cache / "nvidia-h200--580.159.04.json").write_text('{"gpu": "NVIDIA H200", "hbm_bytes_per_s": [')
    report = analyze_path(GEMM_SAMPLE)
    assert report["peaks"]["source"] == "NVIDIA H200 datasheet, SXM (dense)"


def test_analyze_cli_reads_the_cache_without_torch(cache, python):
    write_calibration(fake_result())
    code = (
        "import json, sys\n"
        "from gpuadvisor.pipeline import analyze_path\n"
        f"report = analyze_path({str(GEMM_SAMPLE)!r})\n"
        "print(json.dumps({'source': report['peaks']['source'], 'torch': 'torch' in sys.modules}))\n"
    )
    done = python("-c", code)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["source"].startswith("calibrated on this GPU") and out["torch"] is False


def test_render_calibration_shows_datasheet_and_ratio():
    console = Console(record=True, width=180, force_terminal=False)
    result = fake_result() | {"cached": True, "path": "/tmp/x.json"}
    result["flops_per_s"].pop("fp8")
    result["skipped"] = {"fp8": "compute capability 8.0 < 8.9: no fp8 tensor cores"}
    render_calibration(result, console)
    text = console.export_text()
    assert "4.2 TB/s" in text and "4.8 TB/s" in text and "88%" in text  # 4.24 / 4.8
    assert "786.0 TFLOP/s" in text and "989.5 TFLOP/s" in text and "79%" in text
    assert "skipped fp8: compute capability 8.0 < 8.9" in text
    assert "calibrate --force" in text


def test_calibrate_module_does_not_import_torch(python):
    done = python("-c", "import sys, gpuadvisor.device.calibrate; print('torch' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
