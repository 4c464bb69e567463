"""Report writers: terminal and Markdown rendering, JSON round trip and loading, atomic writes."""

from __future__ import annotations

import copy
import json as stdlib_json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from gpuadvisor import outputs as write_module  # the module that writes (report.write delegates to it)
from gpuadvisor.errors import BadInputError
from gpuadvisor.report.formatting import format_bytes_per_s, format_flops_per_s, format_pct, format_us, mangled_leaf
from gpuadvisor.report.json import REQUIRED_KEYS, SCHEMA_VERSION, load_report, to_json
from gpuadvisor.report.markdown import render_markdown
from gpuadvisor.report.terminal import render_terminal, short_kernel_name
from gpuadvisor.report.write import write_atomic, write_reports

CAT_KERNEL = (
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous "
    "namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::OpaqueType<4u>*, "
    "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<4u>, "
    "unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"
)
XMMA_GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
CUTLASS_KERNEL = (
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>"
    "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)"
)
ADD_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
)
PIPE_KERNEL = "custom|kernel[1]"


def realistic_report() -> dict:
    """An eager Llama decode step on an H200, shaped like what `gpuadvisor analyze` produces."""
    samples = [1843.2, 1851.0, 1838.7, 1902.4, 1846.1, 1849.9, 1855.3, 1840.0, 1861.8, 1844.6]
    return {
        "schema_version": 1,
        "tool": {"name": "gpuadvisor", "version": "0.1.0"},
        "command": "analyze",
        "source": {
            "path": "sample_traces/llm_decode/trace.json.gz",
            "ranks": [0],
            "events": 48213,
            "size_bytes": 1_843_211,
        },
        "env": {
            "gpu_name": "NVIDIA H200",
            "sm_count": 132,
            "compute_capability": "9.0",
            "driver": "550.54.15",
            "cuda": "12.4",
            "torch": "2.5.1",
            "triton": "3.1.0",
            "clocks": {"sm_mhz": 1980, "mem_mhz": 3201},
        },
        "peaks": {
            "gpu": "NVIDIA H200",
            "known": True,
            "source": "table",
            "hbm_bytes_per_s": 4.8e12,
            "flops_per_s": {"bf16": 989e12, "fp8": 1979e12, "tf32": 494e12, "fp32": 67e12},
        },
        "summary": {
            "steps": 5,
            "step_time_us": 1847.55,
            "samples_us": samples,
            "step_time_source": "trace ProfilerStep annotations",
            "gpu_busy_us": 702.1,
            "gpu_busy_pct": 38.0,
            "kernels_per_step": 612.0,
            "idle_launch_us": 1021.4,
            "idle_sync_us": 88.2,
            "idle_other_us": 35.9,
            "host_syncs_per_step": 1.0,
            "launch_calls_per_step": 614.0,
            "launch_call_us_per_step": 1540.2,
            "kernels_shorter_than_launch_pct": 83.5,
            "memcpy_us_per_step": 4.1,
            "top_finding": "GA101 launch-bound: the GPU waits on kernel launches for 55% of the step",
        },
        "steps": [
            {
                "step": n,
                "start_us": 1000.0 + n * 1850,
                "step_time_us": 1850.0 + n,
                "gpu_busy_us": 702.0,
                "gpu_busy_pct": 37.9,
                "idle_launch_us": 1020.0,
                "idle_sync_us": 88.0,
                "idle_other_us": 40.0,
                "kernels": 612,
                "host_syncs": 1,
            }
            for n in range(5)
        ],
        "kernels": [
            {
                "name": XMMA_GEMM,
                "family": "gemm",
                "count": 160,
                "count_per_step": 32.0,
                "total_us": 1405.0,
                "us_per_step": 281.0,
                "mean_us": 8.78,
                "pct_of_gpu_time": 40.0,
                "flops": 2.1e12,
                "bytes": 1.1e10,
                "intensity": 190.9,
                "achieved_flops_per_s": 1.49e14,
                "achieved_bytes_per_s": 7.8e11,
                "bound": "latency",
                "pct_of_roof": 15.1,
                "estimated": False,
                "blocks": 64,
                "dtype": "bf16",
            },
            {
                "name": ADD_KERNEL,
                "family": "elementwise",
                "count": 1280,
                "count_per_step": 256.0,
                "total_us": 1152.0,
                "us_per_step": 230.4,
                "mean_us": 0.9,
                "pct_of_gpu_time": 32.8,
                "flops": 1.3e8,
                "bytes": 7.9e8,
                "intensity": 0.167,
                "achieved_flops_per_s": 1.1e11,
                "achieved_bytes_per_s": 6.9e11,
                "bound": "launch",
                "pct_of_roof": 14.3,
                "estimated": True,
                "blocks": 8,
                "dtype": "bf16",
            },
            {
                "name": CAT_KERNEL,
                "family": "copy",
                "count": 320,
                "count_per_step": 64.0,
                "total_us": 512.0,
                "us_per_step": 102.4,
                "mean_us": 1.6,
                "pct_of_gpu_time": 14.6,
                "flops": None,
                "bytes": 9.4e8,
                "intensity": None,
                "achieved_flops_per_s": None,
                "achieved_bytes_per_s": 1.84e12,
                "bound": "memory",
                "pct_of_roof": 38.3,
                "estimated": True,
                "blocks": 132,
                "dtype": None,
            },
            {
                "name": PIPE_KERNEL,
                "family": "other",
                "count": 5,
                "count_per_step": 1.0,
                "total_us": 20.0,
                "us_per_step": 4.0,
                "mean_us": 4.0,
                "pct_of_gpu_time": 0.6,
                "flops": None,
                "bytes": None,
                "intensity": None,
                "achieved_flops_per_s": None,
                "achieved_bytes_per_s": None,
                "bound": "unknown",
                "pct_of_roof": None,
                "estimated": False,
                "blocks": None,
                "dtype": None,
            },
        ],
        "transfers": [
            {
                "direction": "HtoD",
                "src_kind": "Pageable",
                "dst_kind": "Device",
                "count": 5,
                "bytes": 40960,
                "total_us": 20.5,
                "bytes_per_s": 2.0e9,
                "pageable": True,
                "sync": True,
            }
        ],
        "host_syncs": [
            {"name": "cudaStreamSynchronize", "count": 5, "total_us": 441.0, "per_step": 1.0, "source": "aten::item"}
        ],
        "findings": [
            {
                "rule_id": "GA401",
                "name": "host-sync-in-step",
                "title": "The host waits for the GPU inside the step",
                "severity": "medium",
                "category": "transfers-syncs",
                "message": "aten::item synchronizes once per step; the GPU idles 88 µs (4.8% of the step).",
                "evidence": {"syncs_per_step": 1.0, "idle_sync_us": 88.2, "op": "aten::item"},
                "estimated_saving_us_per_step": 88.2,
                "estimated_saving_pct": 4.8,
                "fix_id": None,
                "fix": "Keep the value on the GPU, or read it once after the loop.",
            },
            {
                "rule_id": "GA101",
                "name": "launch-bound",
                "title": "The GPU waits for kernel launches",
                "severity": "high",
                "category": "launch",
                "message": "614 launches per step take 1,540 µs of CPU; the GPU is idle for 1,021 µs (55%) waiting.",
                "evidence": {"launch_calls_per_step": 614, "idle_launch_us": 1021.4, "gpu_busy_pct": 38.0},
                "estimated_saving_us_per_step": 1021.4,
                "estimated_saving_pct": 55.3,
                "fix_id": "graphs",
                "fix": "Capture the step in a CUDA graph.",
            },
        ],
        "skipped_rules": [{"rule_id": "GA501", "reason": "needs CUDA sources (run `gpuadvisor scan`)"}],
        "notes": ["FLOPs of 2 of 4 kernels are estimated from recorded input shapes."],
    }


def empty_report() -> dict:
    """A CPU-only trace on an unknown GPU: every number None, every list empty."""
    return {
        "schema_version": 1,
        "tool": {"name": "gpuadvisor", "version": "0.1.0"},
        "command": "analyze",
        "source": {"path": "cpu_only.json.gz", "ranks": [], "events": 0, "size_bytes": 0},
        "env": {
            "gpu_name": None,
            "sm_count": None,
            "compute_capability": None,
            "driver": None,
            "cuda": None,
            "torch": None,
            "triton": None,
            "clocks": None,
        },
        "peaks": {"gpu": "unknown", "known": False, "source": "none", "hbm_bytes_per_s": None, "flops_per_s": {}},
        "summary": {
            "steps": 0,
            "step_time_us": None,
            "samples_us": [],
            "step_time_source": None,
            "gpu_busy_us": None,
            "gpu_busy_pct": None,
            "kernels_per_step": None,
            "idle_launch_us": None,
            "idle_sync_us": None,
            "idle_other_us": None,
            "host_syncs_per_step": None,
            "launch_calls_per_step": None,
            "launch_call_us_per_step": None,
            "kernels_shorter_than_launch_pct": None,
            "memcpy_us_per_step": None,
            "top_finding": None,
        },
        "steps": [],
        "kernels": [],
        "transfers": [],
        "host_syncs": [],
        "findings": [],
        "skipped_rules": [],
        "notes": [],
    }


def render_text(report: dict, width: int = 100, top: int = 10) -> str:
    console = Console(record=True, width=width, file=open(os.devnull, "w"), color_system=None)
    render_terminal(report, console, top=top)
    console.file.close()
    return console.export_text()


# --- short_kernel_name -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (CAT_KERNEL, "CatArrayBatchedCopy_aligned16_contig"),
        ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
        ("triton_poi_fused_add_cos_sin_0", "triton_poi_fused_add_cos_sin_0"),
        (ADD_KERNEL, "vectorized_elementwise_kernel<CUDAFunctor_add>"),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
            "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, "
            "float, float>, unsigned int, float, 4>)",
            "reduce_kernel<MeanOps>",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 1, false, false>"
            "(float*, float const*, int, int, int, bool const*, int, bool)",
            "softmax_warp_forward",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
        (
            "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock"
            "22ImplicitGemmMultistageEEEEEvNT_6ParamsE",
            "ImplicitGemmConvolution",
        ),
    ],
)
def test_short_kernel_name_keeps_the_informative_part(name: str, expected: str) -> None:
    assert short_kernel_name(name) == expected


@pytest.mark.parametrize(
    ("name", "leaf"),
    [
        ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionIEEEEvNT_6ParamsE", "Kernel"),
        ("_ZNK3foo3barEv", "bar"),  # a const member function
        ("_Z10add_kernelPfS_", "add_kernel"),  # not nested
        ("void cutlass::Kernel<int>(int)", None),  # already demangled
        ("_Z", None),
        ("_ZN99tooshortE", None),  # a length past the end is not a name
    ],
)
def test_mangled_leaf_reads_the_function_s_own_name(name: str, leaf: str | None) -> None:
    assert mangled_leaf(name) == leaf


def test_short_kernel_name_long_library_names_keep_both_ends() -> None:
    short = short_kernel_name(XMMA_GEMM)
    assert len(short) <= 60
    assert short.startswith("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn")
    assert short.endswith("cublas")
    assert "…" in short


def test_short_kernel_name_cutlass_names_the_wrapped_kernel() -> None:
    short = short_kernel_name(CUTLASS_KERNEL)
    assert "void" not in short and "Params" not in short and "Kernel2" not in short
    assert short.startswith("cutlass_80_tensorop_bf16_s16816gemm")
    assert short.endswith("align8")


@pytest.mark.parametrize("name", [None, "", "   ", "a<b", "x>y", "f(((", "<<<>>>", 42, float("nan")])
def test_short_kernel_name_never_raises(name: object) -> None:
    assert isinstance(short_kernel_name(name), str)


def test_short_kernel_name_honours_a_smaller_width() -> None:
    assert len(short_kernel_name(XMMA_GEMM, 30)) <= 30


# --- number formatting -----------------------------------------------------------------------------


def test_numbers_are_formatted_for_people() -> None:
    assert format_us(1847.55) == "1,848 µs"
    assert format_us(12_345.0) == "12.3 ms"
    assert format_us(0.85) == "0.85 µs"
    assert format_us(None) == format_us(float("nan")) == "—"
    assert format_bytes_per_s(4.8e12) == "4.80 TB/s"
    assert format_flops_per_s(989e12) == "989 TFLOP/s"
    assert format_pct(np.float32(38.0)) == "38.0%"
    assert format_us(3_056_561) == "3,057 ms"
    assert format_us(42_931_211) == "42.9 s"


# --- terminal --------------------------------------------------------------------------------------


def test_terminal_shows_step_time_kernel_class_and_findings() -> None:
    out = render_text(realistic_report())
    assert "1,848 µs" in out  # median step time
    assert "p10" in out and "p90" in out
    assert "GA101" in out and "GA401" in out
    assert "latency" in out and "launch" in out and "memory" in out
    assert "CatArrayBatchedCopy_aligned16_contig" in out
    assert "~14.3%" in out  # estimated roof share is marked
    assert "NVIDIA H200" in out and "4.80 TB/s" in out
    assert "needs CUDA sources" in out  # skipped rule
    assert "estimated from recorded input shapes" in out  # note
    assert "custom|kernel[1]" in out  # brackets are not read as rich markup


def test_terminal_orders_findings_by_saving() -> None:
    out = render_text(realistic_report())
    assert out.index("GA101") < out.index("GA401")


def test_terminal_fits_100_columns() -> None:
    out = render_text(realistic_report(), width=100)
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("width", [60, 40])
def test_terminal_narrow_console_does_not_crash(width: int) -> None:
    out = render_text(realistic_report(), width=width)
    assert "GA101" in out


def test_terminal_without_kernels_steps_or_peaks() -> None:
    out = render_text(empty_report())
    assert "No GPU kernels" in out
    assert "No findings" in out
    assert "no % of roof" in out


def test_kernels_that_shorten_alike_are_numbered() -> None:
    report = realistic_report()
    twin = dict(report["kernels"][2], name=CAT_KERNEL.replace("1, 128, 1>", "2, 128, 1>", 1), total_us=400.0)
    report["kernels"].insert(3, twin)
    lines = [line for line in render_text(report).splitlines() if line.startswith("CatArrayBatchedCopy")]
    assert len(lines) == 2
    assert " (2) " in lines[1] and " (2) " not in lines[0]
    assert "CatArrayBatchedCopy_aligned16_contig (2)" in render_markdown(report)


def test_terminal_total_columns_without_steps() -> None:
    report = realistic_report()
    for kernel in report["kernels"]:
        kernel["count_per_step"] = kernel["us_per_step"] = None
    out = render_text(report)
    assert "Total" in out and "1,405 µs" in out


@pytest.mark.parametrize("top", [0, 1, 100])
def test_terminal_top_limits_the_kernel_rows(top: int) -> None:
    out = render_text(realistic_report(), top=top)
    assert ("CatArrayBatchedCopy" in out) == (top >= 3)


def test_renderers_tolerate_missing_sections() -> None:
    skeleton = {"schema_version": 1, "kernels": None, "findings": [None, {"rule_id": "GA999"}], "summary": None}
    assert "GA999" in render_text(skeleton)
    assert "GA999" in render_markdown(skeleton)
    assert render_text({})
    assert render_markdown({})


# --- markdown --------------------------------------------------------------------------------------


def test_markdown_has_the_tables_and_details() -> None:
    md = render_markdown(realistic_report())
    assert md.startswith("# ")
    assert "## Summary" in md and "## Top kernels" in md and "## Findings" in md
    assert "| Metric | Value |" in md
    assert "|---" in md or "| ---" in md
    assert "GA101" in md and "graphs" in md
    assert "1,848 µs" in md
    assert "### GA101" in md
    assert md.index("### GA101") < md.index("### GA401")


def test_markdown_escapes_pipes_and_angle_brackets_in_kernel_names() -> None:
    md = render_markdown(realistic_report())
    assert "custom\\|kernel\\[1\\]" in md
    assert "vectorized_elementwise_kernel&lt;CUDAFunctor_add&gt;" in md
    assert "custom|kernel" not in md
    assert "<CUDAFunctor_add>" not in md


def test_markdown_table_rows_have_as_many_cells_as_the_header() -> None:
    md = render_markdown(realistic_report())
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace(" ", "")) <= set("|-:"):
            cells = line.count("|")
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert lines[j].replace("\\|", "").count("|") == cells, lines[j]
                j += 1


def test_markdown_empty_report() -> None:
    md = render_markdown(empty_report())
    assert "No GPU kernels" in md
    assert "No findings" in md
    assert "None" not in md and "nan" not in md.lower()


# --- JSON ------------------------------------------------------------------------------------------


def test_to_json_round_trips_and_cleans_numpy_pandas_and_nan() -> None:
    report = realistic_report()
    report["summary"]["gpu_busy_pct"] = np.float32(38.0)
    report["summary"]["steps"] = np.int64(5)
    report["summary"]["idle_other_us"] = float("nan")
    report["summary"]["samples_us"] = np.array([1.0, 2.0, np.inf])
    report["kernels"][0]["pct_of_roof"] = pd.NA
    report["kernels"][0]["blocks"] = np.int32(64)
    report["kernels"][0]["estimated"] = np.bool_(False)
    report["notes"].append(Path("some/path"))
    report["env"]["clocks"] = {np.int64(0): 1980}

    text = to_json(report)
    data = stdlib_json.loads(text)
    assert text.startswith('{\n  "schema_version": 1')
    assert data["summary"]["gpu_busy_pct"] == 38.0
    assert data["summary"]["steps"] == 5
    assert data["summary"]["idle_other_us"] is None
    assert data["summary"]["samples_us"] == [1.0, 2.0, None]
    assert data["kernels"][0]["pct_of_roof"] is None
    assert data["kernels"][0]["blocks"] == 64 and data["kernels"][0]["estimated"] is False
    assert data["notes"][-1] == "some/path"
    assert data["env"]["clocks"] == {"0": 1980}
    assert "NaN" not in text and "Infinity" not in text


def test_to_json_rejects_objects_it_cannot_represent() -> None:
    with pytest.raises(TypeError, match="kernels"):
        to_json({"kernels": [{"name": object()}]})


def test_load_report_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(to_json(realistic_report()), encoding="utf-8")
    loaded = load_report(path)
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["findings"][0]["rule_id"] == "GA401"
    assert set(REQUIRED_KEYS) <= set(loaded)


def _bad_report_files(tmp_path: Path) -> dict[str, Path]:
    good = to_json(realistic_report())
    files = {
        "empty": "",
        "whitespace": "  \n",
        "truncated": good[: len(good) // 2],
        "not json": "this is not json",
        "array": "[]",
        "number": "3",
        "no version": stdlib_json.dumps({k: v for k, v in realistic_report().items() if k != "schema_version"}),
        "wrong version": good.replace('"schema_version": 1', '"schema_version": 99', 1),
        "string version": good.replace('"schema_version": 1', '"schema_version": "1"', 1),
        "missing key": stdlib_json.dumps({k: v for k, v in realistic_report().items() if k != "kernels"}),
        "wrong type": good.replace('"findings": [', '"findings": {"x": [', 1).replace(
            '"skipped_rules"', '"x2": 0}, "skipped_rules"', 1
        ),
    }
    paths = {}
    for label, content in files.items():
        path = tmp_path / f"{label.replace(' ', '_')}.json"
        path.write_text(content, encoding="utf-8")
        paths[label] = path
    paths["binary"] = tmp_path / "binary.json"
    paths["binary"].write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    paths["missing"] = tmp_path / "does_not_exist.json"
    paths["directory"] = tmp_path
    return paths


@pytest.mark.parametrize(
    "label",
    [
        "missing",
        "directory",
        "empty",
        "whitespace",
        "truncated",
        "not json",
        "binary",
        "array",
        "number",
        "no version",
        "wrong version",
        "string version",
        "missing key",
        "wrong type",
    ],
)
def test_load_report_bad_files_raise_one_line_errors(tmp_path: Path, label: str) -> None:
    path = _bad_report_files(tmp_path)[label]
    with pytest.raises(BadInputError) as info:
        load_report(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path.name) in message or str(path) in message


def test_load_report_names_the_version_it_found(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="99"):
        load_report(_bad_report_files(tmp_path)["wrong version"])


def test_load_report_names_the_missing_key(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="kernels"):
        load_report(_bad_report_files(tmp_path)["missing key"])


# --- writing ---------------------------------------------------------------------------------------


def test_write_reports_writes_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "out" / "nested"
    written = write_reports(realistic_report(), out, ["json", "markdown"])
    assert sorted(p.name for p in written) == ["report.json", "report.md"]
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert load_report(out / "report.json")["command"] == "analyze"
    assert (out / "report.md").read_text(encoding="utf-8").startswith("# ")


def test_write_reports_only_the_formats_asked(tmp_path: Path) -> None:
    write_reports(realistic_report(), tmp_path, ["markdown"])
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_write_reports_terminal_format_writes_no_file(tmp_path: Path) -> None:
    assert write_reports(realistic_report(), tmp_path / "out", ["terminal"]) == []
    assert not (tmp_path / "out").exists()


def test_write_reports_rejects_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="html5"):
        write_reports(realistic_report(), tmp_path / "out", ["json", "html5"])
    assert not (tmp_path / "out").exists()


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, target: object, attribute: str, n: int, exc: BaseException) -> None:
    original = getattr(target, attribute)
    calls = {"n": 0}

    def failing(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return original(*args, **kwargs)

    monkeypatch.setattr(target, attribute, failing)


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("stage", ["write", "replace"])
def test_write_reports_leaves_nothing_when_the_second_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, stage: str
) -> None:
    out = tmp_path / "created" / "out"
    if stage == "write":
        _fail_on_call(monkeypatch, write_module.os, "fsync", 2, exc)
    else:
        _fail_on_call(monkeypatch, write_module.os, "replace", 2, exc)
    expected = KeyboardInterrupt if isinstance(exc, KeyboardInterrupt) else BadInputError
    with pytest.raises(expected):
        write_reports(realistic_report(), out, ["json", "markdown"])
    assert not out.exists()
    assert not (tmp_path / "created").exists()
    assert list(tmp_path.iterdir()) == []


def test_write_reports_keeps_an_existing_folder_and_its_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    _fail_on_call(monkeypatch, write_module.os, "replace", 2, OSError(5, "I/O error"))
    with pytest.raises(BadInputError):
        write_reports(realistic_report(), tmp_path, ["json", "markdown"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_write_reports_failure_before_replacing_keeps_the_previous_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_reports(realistic_report(), tmp_path, ["json", "markdown"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    changed = realistic_report()
    changed["command"] = "profile"
    _fail_on_call(monkeypatch, write_module.os, "fsync", 2, OSError(28, "No space left on device"))
    with pytest.raises(BadInputError):
        write_reports(changed, tmp_path, ["json", "markdown"])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_write_reports_out_dir_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x", encoding="utf-8")
    with pytest.raises(BadInputError):
        write_reports(realistic_report(), target, ["json"])
    assert target.read_text(encoding="utf-8") == "x"


def test_write_atomic_replaces_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.txt"
    write_atomic(path, "first")
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second"
    _fail_on_call(monkeypatch, write_module.os, "replace", 1, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "third")
    assert path.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_write_atomic_files_are_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    old = os.umask(0o022)
    try:
        write_atomic(path, "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_report_inputs_are_not_modified() -> None:
    report = realistic_report()
    snapshot = copy.deepcopy(report)
    render_text(report)
    render_markdown(report)
    to_json(report)
    assert report == snapshot
    assert not math.isnan(report["summary"]["step_time_us"])


def test_summary_completes_a_bare_top_finding_id_and_shows_class_totals() -> None:
    report = realistic_report()
    report["summary"]["top_finding"] = "GA101"
    report["kernel_classes"] = {"latency": 281.0, "launch": 230.4, "memory": 102.4}
    out = render_text(report)
    assert "GA101: The GPU waits for kernel launches" in out
    assert "latency 281 µs" in out
    md = render_markdown(report)
    assert "GA101: The GPU waits for kernel launches" in md
    assert "latency 281 µs · launch 230 µs · memory 102 µs" in md


def test_load_report_says_when_it_was_given_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text('{"traceEvents": []}', encoding="utf-8")
    with pytest.raises(BadInputError, match="profiler trace"):
        load_report(trace)
    with pytest.raises(BadInputError, match="gzip"):
        load_report(_bad_report_files(tmp_path)["binary"])
