"""The per-GPU peak table: name matching, datasheet numbers, --peaks override files, dtype roofs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuadvisor import inputs as inputs_mod
from gpuadvisor.device.peaks import (
    DTYPE_KEYS,
    DevicePeaks,
    all_entries,
    dtype_key,
    lookup_peaks,
    peak_flops,
    read_peaks_file,
    ridge_point,
)
from gpuadvisor.errors import EXIT_BAD_INPUT, BadInputError
from gpuadvisor.trace.model import DeviceInfo

T = 1e12
G = 1e9


def dev(name: str, sm_count: int | None = None, memory_gb: float | None = None) -> DeviceInfo:
    mem = None if memory_gb is None else int(memory_gb * (1 << 30))
    return DeviceInfo(index=0, name=name, sm_count=sm_count, total_memory_bytes=mem)


# --------------------------------------------------------------------------------------------
# names from real traces


@pytest.mark.parametrize(
    ("name", "sms", "key", "hbm", "bf16", "fp32"),
    [
        ("NVIDIA A100-PG509-200", 108, "a100-sxm-40gb", 1.555 * T, 312 * T, 19.5 * T),
        ("NVIDIA A100-SXM4-80GB", 108, "a100-sxm-80gb", 2.039 * T, 312 * T, 19.5 * T),
        ("NVIDIA A100-SXM4-40GB", 108, "a100-sxm-40gb", 1.555 * T, 312 * T, 19.5 * T),
        ("NVIDIA A100-PCIE-40GB", 108, "a100-pcie-40gb", 1.555 * T, 312 * T, 19.5 * T),
        ("NVIDIA A100 80GB PCIe", 108, "a100-pcie-80gb", 1.935 * T, 312 * T, 19.5 * T),
        ("Tesla V100-SXM2-32GB", 80, "v100-sxm2", 0.9 * T, None, 15.7 * T),
        ("Tesla V100-PCIE-16GB", 80, "v100-pcie", 0.9 * T, None, 14 * T),
        ("NVIDIA H200", 132, "h200-sxm", 4.8 * T, 989.5 * T, 67 * T),
        ("NVIDIA H200 NVL", 132, "h200-nvl", 4.8 * T, 835.5 * T, 60 * T),
        ("NVIDIA H100 80GB HBM3", 132, "h100-sxm", 3.35 * T, 989.5 * T, 67 * T),
        ("NVIDIA H100 PCIe", 114, "h100-pcie", 2.0 * T, 756.5 * T, 51 * T),
        ("NVIDIA H100 NVL", 132, "h100-nvl", 3.9 * T, 835.5 * T, 60 * T),
        ("NVIDIA B200", 148, "b200", 7.7 * T, 2250 * T, 75 * T),
        ("NVIDIA L4", 58, "l4", 0.3 * T, 121 * T, 30.3 * T),
        ("NVIDIA L40", 142, "l40", 0.864 * T, 181.05 * T, 90.5 * T),
        ("NVIDIA L40S", 142, "l40s", 0.864 * T, 362.05 * T, 91.6 * T),
        ("NVIDIA A10", 72, "a10", 0.6 * T, 125 * T, 31.2 * T),
        ("NVIDIA A10G", 80, "a10g", 0.6 * T, 70 * T, 35 * T),
        ("NVIDIA GeForce RTX 4090", 128, "rtx-4090", 1.008 * T, 165.2 * T, 82.6 * T),
        ("NVIDIA GeForce RTX 3090", 82, "rtx-3090", 0.936 * T, 71 * T, 35.6 * T),
        ("Tesla T4", 40, "t4", 0.32 * T, None, 8.1 * T),
        ("AMD Instinct MI300X", 304, "mi300x", 5.3 * T, 1307.4 * T, 163.4 * T),
    ],
)
def test_trace_names_resolve_to_datasheet_figures(name, sms, key, hbm, bf16, fp32):
    p = lookup_peaks(dev(name, sm_count=sms))
    assert p.known and p.key == key
    assert p.hbm_bytes_per_s == pytest.approx(hbm)
    assert p.flops_per_s.get("bf16") == (None if bf16 is None else pytest.approx(bf16))
    assert p.flops_per_s["fp32"] == pytest.approx(fp32)
    assert p.sm_count == sms
    assert p.source and p.references and all(r.startswith("https://") for r in p.references)


def test_h200_holds_datasheet_not_measured_numbers():
    p = lookup_peaks(dev("NVIDIA H200", sm_count=132))
    assert p.gpu == "NVIDIA H200 SXM 141GB"
    assert "H200 datasheet" in p.source and "dense" in p.source
    assert p.hbm_bytes_per_s == pytest.approx(4.8e12)
    assert p.flops_per_s == pytest.approx(
        {
            "fp64": 34e12,
            "fp32": 67e12,
            "tf32": 494.7e12,
            "bf16": 989.5e12,
            "fp16": 989.5e12,
            "fp8": 1979e12,
            "int8": 1979e12,
        }
    )
    assert p.host_link_bytes_per_s == pytest.approx(64e9)
    assert ridge_point(p, "c10::BFloat16") == pytest.approx(989.5e12 / 4.8e12)
    assert ridge_point(p, "bfloat16") == pytest.approx(206.1, abs=0.1)


def test_pg509_is_the_40gb_sxm_a100():
    p = lookup_peaks(dev("NVIDIA A100-PG509-200", sm_count=108, memory_gb=39.4))
    assert p.key == "a100-sxm-40gb"
    assert "fp8" not in p.flops_per_s
    assert peak_flops(p, "c10::Float8_e4m3fn") is None
    assert peak_flops(p, "float") == pytest.approx(19.5e12)


def test_v100_has_no_bf16_or_tf32_roof():
    p = lookup_peaks(dev("Tesla V100-SXM2-32GB", sm_count=80))
    assert p.flops_per_s["fp16"] == pytest.approx(125e12)
    assert peak_flops(p, "c10::BFloat16") is None
    assert peak_flops(p, "tf32") is None
    assert ridge_point(p, "c10::Half") == pytest.approx(125e12 / 0.9e12)


@pytest.mark.parametrize("name", ["AMD Radeon Graphics", "ARTEMIS", "NVIDIA H800", "NVIDIA GeForce RTX 3090 Ti"])
def test_unknown_names(name):
    p = lookup_peaks(dev(name, sm_count=42))
    assert p == DevicePeaks(gpu=name, known=False, source=f"no entry for '{name}'", sm_count=42)
    assert p.flops_per_s == {} and p.hbm_bytes_per_s is None and p.host_link_bytes_per_s is None
    assert ridge_point(p, "float") is None and peak_flops(p, "float") is None


@pytest.mark.parametrize("device", [None, dev(""), dev("unknown GPU"), "   "])
def test_no_device(device):
    p = lookup_peaks(device)
    assert not p.known and p.flops_per_s == {} and p.hbm_bytes_per_s is None
    assert p.gpu in ("unknown", "unknown GPU")
    assert p.source.startswith("no entry for ")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200-hbm3e"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie"),
        ("nvidia h100 pcie", "h100-pcie"),
        ("NVIDIA_H100_PCIe", "h100-pcie"),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA GH100", None),
        ("AMD Instinct MI250X/MI250", "mi250x-gcd"),
    ],
)
def test_similar_names_are_not_confused(name, key):
    assert lookup_peaks(name).key == key


def test_family_name_uses_sm_count_then_memory():
    assert lookup_peaks(dev("NVIDIA H100", sm_count=114)).key == "h100-pcie"
    assert lookup_peaks(dev("NVIDIA H100", sm_count=132, memory_gb=79.1)).key == "h100-sxm"
    assert lookup_peaks(dev("NVIDIA H100", sm_count=132, memory_gb=93.1)).key == "h100-nvl"
    assert lookup_peaks(dev("NVIDIA H100")).key == "h100-sxm"
    assert lookup_peaks(dev("NVIDIA A100", sm_count=108, memory_gb=39.4)).key == "a100-sxm-40gb"
    assert lookup_peaks(dev("NVIDIA A100", sm_count=108, memory_gb=79.2)).key == "a100-sxm-80gb"


def test_exact_variant_name_beats_sm_count():
    # The name names the variant: the SM count only breaks ties between variants of a bare family name.
    assert lookup_peaks(dev("NVIDIA H100 PCIe", sm_count=132)).key == "h100-pcie"


def test_sm_count_comes_from_the_trace_when_present():
    p = lookup_peaks(dev("NVIDIA A100-SXM4-40GB MIG 1g.5gb", sm_count=14))
    assert p.key == "a100-sxm-40gb" and p.sm_count == 14
    assert "MIG" in p.source
    assert lookup_peaks(dev("NVIDIA A100-SXM4-40GB")).sm_count == 108


# --------------------------------------------------------------------------------------------
# the table as a whole


def test_all_entries():
    entries = all_entries()
    keys = [e.key for e in entries]
    assert len(keys) == len(set(keys))
    for needed in (
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200-sxm",
        "h200-nvl",
        "a100-sxm-40gb",
        "a100-sxm-80gb",
        "a100-pcie-40gb",
        "a100-pcie-80gb",
        "l4",
        "l40s",
        "l40",
        "a10",
        "a10g",
        "rtx-4090",
        "rtx-3090",
        "b200",
        "v100-sxm2",
        "v100-pcie",
        "t4",
    ):
        assert needed in keys
    for e in entries:
        assert e.known and e.source and e.references and e.sm_count and e.sm_count > 0
        assert e.hbm_bytes_per_s and 1e11 < e.hbm_bytes_per_s < 2e13
        assert set(e.flops_per_s) <= set(DTYPE_KEYS) and "fp32" in e.flops_per_s
        assert all(1e12 < v < 1e16 for v in e.flops_per_s.values())
        f = e.flops_per_s
        # Dense tensor rates: fp8 >= bf16 >= tf32, and the 16-bit tensor rate beats the CUDA-core fp32 rate.
        if "bf16" in f:
            assert f["bf16"] > f["fp32"]
            assert f.get("tf32", 0) <= f["bf16"] <= f.get("fp8", f["bf16"])
        assert lookup_peaks(e.gpu).key == e.key  # display names resolve back to their own entry


def test_all_entries_returns_copies():
    first = all_entries()
    first[0].flops_per_s.clear()
    first[0].references.append("x")
    assert all_entries()[0].flops_per_s and "x" not in all_entries()[0].references


def test_module_needs_no_pandas_or_torch():
    code = (
        "import sys; import gpuadvisor.device.peaks as p; p.lookup_peaks('NVIDIA H200'); "
        "bad = [m for m in ('pandas', 'numpy', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------
# dtypes


@pytest.mark.parametrize(
    ("dtype", "key"),
    [
        ("float", "fp32"),
        ("float32", "fp32"),
        ("torch.float32", "fp32"),
        ("c10::complex<float>", "fp32"),
        ("double", "fp64"),
        ("torch.float64", "fp64"),
        ("c10::BFloat16", "bf16"),
        ("bfloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("c10::Half", "fp16"),
        ("half", "fp16"),
        ("float16", "fp16"),
        ("c10::complex<c10::Half>", "fp16"),
        ("c10::Float8_e4m3fn", "fp8"),
        ("c10::Float8_e5m2", "fp8"),
        ("torch.float8_e4m3fnuz", "fp8"),
        ("unsigned char", "int8"),
        ("signed char", "int8"),
        ("int8", "int8"),
        ("c10::qint8", "int8"),
        ("tf32", "tf32"),
        ("FP32", "fp32"),
        ("long int", None),
        ("int", None),
        ("bool", None),
        ("Scalar", None),
        ("", None),
        (None, None),
    ],
)
def test_dtype_key(dtype, key):
    assert dtype_key(dtype) == key


def test_peak_flops_and_ridge_point():
    p = lookup_peaks("NVIDIA H100 80GB HBM3")
    assert peak_flops(p, "c10::Float8_e4m3fn") == pytest.approx(1979e12)
    assert peak_flops(p, "unsigned char") == pytest.approx(1979e12)
    assert peak_flops(p, "double") == pytest.approx(34e12)
    assert peak_flops(p, "long int") is None
    assert ridge_point(p, "float") == pytest.approx(67e12 / 3.35e12)
    assert ridge_point(p, "long int") is None


# --------------------------------------------------------------------------------------------
# --peaks override files


def test_toml_override_over_table_entry(tmp_path):
    f = tmp_path / "h200.toml"
    f.write_text('source = "calibrated"\nhbm_tb_per_s = 4.24\n\n[tflops]\nbf16 = 786\n')
    p = lookup_peaks(dev("NVIDIA H200", sm_count=132), override=f)
    assert p.known and p.key == "h200-sxm" and p.gpu == "NVIDIA H200 SXM 141GB"
    assert p.hbm_bytes_per_s == pytest.approx(4.24e12)
    assert p.flops_per_s["bf16"] == pytest.approx(786e12)
    assert p.flops_per_s["fp8"] == pytest.approx(1979e12)  # not overridden: still the datasheet figure
    assert p.source.startswith("calibrated (override file ") and str(f) in p.source and "H200 datasheet" in p.source
    assert p.sm_count == 132
    assert ridge_point(p, "c10::BFloat16") == pytest.approx(786 / 4.24)


def test_json_override_defines_unknown_gpu(tmp_path):
    f = tmp_path / "artemis.json"
    f.write_text(
        json.dumps(
            {
                "gpu": "ARTEMIS prototype",
                "hbm_bytes_per_s": 2.5e12,
                "flops_per_s": {"bf16": 500e12, "fp32": 50e12},
                "host_link_gb_per_s": 25,
                "references": ["https://example.com/artemis"],
            }
        )
    )
    p = lookup_peaks(dev("ARTEMIS", sm_count=96), override=str(f))
    assert p.known and p.key is None and p.gpu == "ARTEMIS prototype"
    assert p.source == f"override file {f}"
    assert p.hbm_bytes_per_s == pytest.approx(2.5e12)
    assert p.flops_per_s == pytest.approx({"fp32": 50e12, "bf16": 500e12})
    assert p.host_link_bytes_per_s == pytest.approx(25e9)
    assert p.sm_count == 96 and p.references == ["https://example.com/artemis"]
    assert ridge_point(p, "bfloat16") == pytest.approx(200.0)


def test_json_content_without_suffix_and_mixed_tables(tmp_path):
    f = tmp_path / "peaks"
    f.write_text('{"hbm_tb_per_s": 1, "tflops": {"fp16": 100}, "flops_per_s": {"fp32": 1e13}}')
    p = lookup_peaks(None, override=f)
    assert p.known and p.gpu == "unknown"
    assert p.flops_per_s == pytest.approx({"fp32": 1e13, "fp16": 1e14})


def test_override_naming_a_table_gpu_uses_its_entry(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('gpu = "NVIDIA H100 PCIe"\n[tflops]\nbf16 = 600\n')
    p = lookup_peaks(None, override=f)
    assert p.key == "h100-pcie" and p.gpu == "NVIDIA H100 PCIe" and p.sm_count == 114
    assert p.flops_per_s["bf16"] == pytest.approx(600e12)
    assert p.hbm_bytes_per_s == pytest.approx(2.0e12)


def test_override_with_only_a_name_leaves_unknown_gpu_unknown(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('gpu = "Mystery"\n')
    p = lookup_peaks(dev("ARTEMIS"), override=f)
    assert not p.known and p.gpu == "Mystery" and p.flops_per_s == {}


@pytest.mark.parametrize(
    ("filename", "content", "needle"),
    [
        ("bad.toml", "hbm_tb_per_s = = 4\n", "invalid TOML"),
        ("bad.json", '{"hbm_tb_per_s": 4,,}', "not valid JSON"),
        ("neg.toml", "hbm_tb_per_s = -4.8\n", "hbm_tb_per_s"),
        ("zero.toml", "[tflops]\nbf16 = 0\n", "tflops.bf16"),
        ("str.toml", '[flops_per_s]\nfp32 = "fast"\n', "flops_per_s.fp32"),
        ("bool.json", '{"hbm_bytes_per_s": true}', "hbm_bytes_per_s"),
        ("nan.json", '{"tflops": {"fp16": NaN}}', "tflops.fp16"),
        ("inf.json", '{"host_link_gb_per_s": Infinity}', "host_link_gb_per_s"),
        ("dtype.toml", "[tflops]\nbf17 = 100\n", "tflops.bf17"),
        ("float64.toml", "[tflops]\nfloat64 = 100\n", "tflops.float64"),
        ("key.toml", "hbm_tbps = 4\n", "hbm_tbps"),
        ("both.toml", "hbm_tb_per_s = 4\nhbm_bytes_per_s = 4e12\n", "hbm_bytes_per_s or hbm_tb_per_s"),
        ("dup.toml", "[tflops]\nbf16 = 1\n[flops_per_s]\nbf16 = 1e12\n", "bf16"),
        ("table.toml", "tflops = 5\n", "tflops"),
        ("list.json", "[1, 2]", "top level"),
        ("sms.toml", "sm_count = 1.5\n", "sm_count"),
        ("gpu.toml", "gpu = 3\n", "gpu"),
        ("refs.toml", "references = 'https://x'\n", "references"),
        ("multi.json", '{"hbm_tb_per_s": "4.8\\nTB/s"}', "hbm_tb_per_s"),
    ],
)
def test_bad_override_files(tmp_path, filename, content, needle):
    f = tmp_path / filename
    f.write_text(content)
    with pytest.raises(BadInputError) as err:
        lookup_peaks(dev("NVIDIA H200"), override=f)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(f) in msg and needle in msg
    assert err.value.exit_code == EXIT_BAD_INPUT


def test_missing_and_unreadable_override(tmp_path):
    with pytest.raises(BadInputError, match="no such file") as err:
        lookup_peaks(None, override=tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(err.value)
    with pytest.raises(BadInputError, match="a directory, not a regular file"):
        read_peaks_file(tmp_path)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(BadInputError, match="not UTF-8"):
        read_peaks_file(binary)


def test_toml_without_a_toml_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs_mod, "_toml_module", lambda: None)
    f = tmp_path / "p.toml"
    f.write_text("hbm_tb_per_s = 4\n")
    with pytest.raises(BadInputError, match="tomli"):
        read_peaks_file(f)
    j = tmp_path / "p.json"
    j.write_text('{"hbm_tb_per_s": 4}')
    assert read_peaks_file(j).hbm_bytes_per_s == pytest.approx(4e12)
