"""Per-GPU peak rates for the roofline: memory bandwidth, FLOP/s per dtype, host link.

The table holds vendor datasheet figures, never measured ones (a ``calibrate`` run or a ``--peaks``
file provides those: :func:`lookup_peaks` puts a calibration over the table, and a ``--peaks`` file over
both). Conventions, for every entry:

- ``flops_per_s`` keys are ``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8`` (ops/s for
  int8). Tensor-core figures (tf32, bf16, fp16, fp8, int8) are DENSE rates: half the "with sparsity"
  (2:4 structured sparsity) numbers that datasheets print. ``fp32`` and ``fp64`` are the CUDA-core
  (vector, non-tensor) rates; the FP64 tensor-core rate of A100/H100/H200 is twice the ``fp64`` figure.
  On GeForce parts and the A10G the fp16/bf16/fp8 figures are the ones with FP32 accumulate (what
  PyTorch matmuls use), half the FP16-accumulate rate. A key is absent where the part has no such
  path (V100 has no bf16/tf32/fp8 tensor cores, A100 has no fp8) or the datasheet gives no figure.
- ``hbm_bytes_per_s`` is the device-memory bandwidth (HBM or GDDR), decimal units (1 TB/s = 1e12 B/s).
- ``host_link_bytes_per_s`` is one direction of the host link (PCIe, or NVLink-C2C on Grace Hopper):
  half the bidirectional figure datasheets print. It bounds pinned host<->device copies.

Matching a trace's ``deviceProperties`` name: the name is normalized (lower case; dashes, underscores
and slashes become spaces; vendor words "NVIDIA", "Tesla", "GeForce", "AMD", "Instinct" dropped; "80G"
and "80 GB" become "80gb") and tested against each entry's token patterns. A name that names one
variant exactly ("NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB") resolves to it; a name that only names
the family ("NVIDIA H100") picks the variant whose SM count, then memory size, agrees with the trace's
DeviceInfo, else the family's first (most common) variant.

Dtype names accepted by :func:`peak_flops` and :func:`ridge_point` (see :func:`dtype_key`):

====== ====================================================================================
key    names (case-insensitive; "torch." and "c10::" prefixes ignored)
====== ====================================================================================
fp64   double, float64, fp64, f64, complex<double>, complex128, cdouble
fp32   float, float32, fp32, f32, single, complex<float>, complex64, cfloat
tf32   tf32, tensorfloat32, tensorfloat-32 (only when asked for explicitly: a "float" matmul
       runs at the tf32 rate only when TF32 is enabled, which the trace does not record)
bf16   bfloat16, bf16
fp16   half, float16, fp16, f16, complex<half>, complex32, chalf
fp8    float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu (any
       float8_*), fp8, e4m3, e5m2
int8   int8, uint8, signed char, unsigned char, char, qint8, quint8, i8, u8
====== ====================================================================================

Complex dtypes map to the rate of their real component. Anything else (long int, bool, Scalar, ...)
has no roof: the functions return None.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.errors import BadInputError

if TYPE_CHECKING:
    from gpuadvisor.trace.model import DeviceInfo

__all__ = [
    "DTYPE_ALIASES",
    "DTYPE_KEYS",
    "DevicePeaks",
    "PeaksOverride",
    "all_entries",
    "apply_calibration",
    "dtype_key",
    "lookup_peaks",
    "peak_flops",
    "read_peaks_file",
    "ridge_point",
]

DTYPE_KEYS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

_TERA = 1e12
_GIGA = 1e9
_MAX_PEAKS_FILE_BYTES = 1 << 20


@dataclass
class DevicePeaks:
    """Peak rates of one GPU, with where they come from."""

    gpu: str
    known: bool
    source: str
    hbm_bytes_per_s: float | None = None
    flops_per_s: dict[str, float] = field(default_factory=dict)
    host_link_bytes_per_s: float | None = None
    sm_count: int | None = None
    references: list[str] = field(default_factory=list)
    key: str | None = None  # the table entry's id ("h200-sxm", ...); None when no entry applies


# --------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class _Entry:
    key: str
    gpu: str
    family: str  # token pattern naming the family ("h100"): fallback when no variant pattern matches
    match: tuple[tuple[str, ...], ...]  # any group matches when all its token patterns are present
    sm_count: int | None
    memory_gb: float | None  # nominal, to tell variants apart by DeviceInfo.total_memory_bytes
    hbm_tb_per_s: float
    host_link_gb_per_s: float | None
    tflops: dict[str, float]
    source: str
    references: tuple[str, ...]
    exclude: tuple[str, ...] = ()


_PCIE3 = 16.0  # PCIe Gen3 x16: 32 GB/s bidirectional
_PCIE4 = 32.0  # PCIe Gen4 x16: 64 GB/s bidirectional
_PCIE5 = 64.0  # PCIe Gen5 x16: 128 GB/s bidirectional
_NVLINK_C2C = 450.0  # NVLink-C2C: 900 GB/s bidirectional

_TENSOR_CORE_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H100_PAGE = "https://www.nvidia.com/en-us/data-center/h100/"
_H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
_GH200_PAGE = "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
_A100_DATASHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_HGX_PAGE = "https://www.nvidia.com/en-us/data-center/hgx/"
_V100_DATASHEET = (
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_ADA_WHITEPAPER = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_GA102_WHITEPAPER = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"

_HOPPER_SXM = {"fp64": 34.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0, "int8": 1979.0}
_HOPPER_NVL = {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5, "int8": 1670.5}
_A100 = {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0}

_TABLE: tuple[_Entry, ...] = (
    # Hopper. The H100 family's first entry (SXM) is the default for a bare "H100".
    _Entry(
        key="h100-sxm",
        gpu="NVIDIA H100 SXM5 80GB",
        family="h100",
        match=(("h100", "hbm3"), ("h100", r"sxm\d?")),
        exclude=("pcie", "nvl"),
        sm_count=132,
        memory_gb=80,
        hbm_tb_per_s=3.35,
        host_link_gb_per_s=_PCIE5,
        tflops=dict(_HOPPER_SXM),
        source="NVIDIA H100 datasheet, SXM (dense)",
        references=(_TENSOR_CORE_DATASHEET, _H100_PAGE),
    ),
    _Entry(
        key="h100-pcie",
        gpu="NVIDIA H100 PCIe 80GB",
        family="h100",
        match=(("h100", "pcie"),),
        exclude=("nvl",),
        sm_count=114,
        memory_gb=80,
        hbm_tb_per_s=2.0,
        host_link_gb_per_s=_PCIE5,
        tflops={"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "int8": 1513.0},
        source="NVIDIA H100 datasheet, PCIe (dense)",
        references=(_TENSOR_CORE_DATASHEET, _H100_PAGE),
    ),
    _Entry(
        key="h100-nvl",
        gpu="NVIDIA H100 NVL 94GB",
        family="h100",
        match=(("h100", "nvl"),),
        sm_count=132,
        memory_gb=94,
        hbm_tb_per_s=3.9,
        host_link_gb_per_s=_PCIE5,
        tflops=dict(_HOPPER_NVL),
        source="NVIDIA H100 datasheet, NVL, per GPU (dense)",
        references=(_TENSOR_CORE_DATASHEET, _H100_PAGE),
    ),
    _Entry(
        key="h200-sxm",
        gpu="NVIDIA H200 SXM 141GB",
        family="h200",
        match=(("h200",),),
        exclude=("nvl", "pcie"),
        sm_count=132,
        memory_gb=141,
        hbm_tb_per_s=4.8,
        host_link_gb_per_s=_PCIE5,
        tflops=dict(_HOPPER_SXM),
        source="NVIDIA H200 datasheet, SXM (dense)",
        references=(_H200_PAGE,),
    ),
    _Entry(
        key="h200-nvl",
        gpu="NVIDIA H200 NVL 141GB",
        family="h200",
        match=(("h200", "nvl"),),
        sm_count=132,
        memory_gb=141,
        hbm_tb_per_s=4.8,
        host_link_gb_per_s=_PCIE5,
        tflops=dict(_HOPPER_NVL),
        source="NVIDIA H200 datasheet, NVL (dense)",
        references=(_H200_PAGE,),
    ),
    _Entry(
        key="gh200",
        gpu="NVIDIA GH200 (96GB HBM3)",
        family="gh200",
        match=(("gh200", "480gb"), ("gh200", "96gb"), ("gh200", "hbm3")),
        sm_count=132,
        memory_gb=96,
        hbm_tb_per_s=4.0,
        host_link_gb_per_s=_NVLINK_C2C,
        tflops=dict(_HOPPER_SXM),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3 (dense)",
        references=(_GH200_PAGE,),
    ),
    _Entry(
        key="gh200-hbm3e",
        gpu="NVIDIA GH200 (144GB HBM3e)",
        family="gh200",
        match=(("gh200", "hbm3e"), ("gh200", "144gb")),
        sm_count=132,
        memory_gb=144,
        hbm_tb_per_s=4.9,
        host_link_gb_per_s=_NVLINK_C2C,
        tflops=dict(_HOPPER_SXM),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, HBM3e (dense)",
        references=(_GH200_PAGE,),
    ),
    # Blackwell
    _Entry(
        key="b200",
        gpu="NVIDIA B200 (HGX)",
        family="b200",
        match=(("b200",),),
        sm_count=148,
        memory_gb=180,
        hbm_tb_per_s=7.7,
        host_link_gb_per_s=_PCIE5,
        tflops={
            "fp64": 37.0,
            "fp32": 75.0,
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
            "int8": 4500.0,
        },
        source="NVIDIA HGX B200 specifications, per GPU (dense)",
        references=(_HGX_PAGE,),
    ),
    # Ampere data center. "A100-PG509-200" is the 40 GB SXM4 board.
    _Entry(
        key="a100-sxm-80gb",
        gpu="NVIDIA A100 SXM4 80GB",
        family="a100",
        match=(("a100", r"sxm\d?", "80gb"),),
        sm_count=108,
        memory_gb=80,
        hbm_tb_per_s=2.039,
        host_link_gb_per_s=_PCIE4,
        tflops=dict(_A100),
        source="NVIDIA A100 datasheet, 80GB SXM (dense)",
        references=(_A100_DATASHEET,),
    ),
    _Entry(
        key="a100-sxm-40gb",
        gpu="NVIDIA A100 SXM4 40GB",
        family="a100",
        match=(("a100", r"sxm\d?", "40gb"), ("a100", "pg509", "200")),
        sm_count=108,
        memory_gb=40,
        hbm_tb_per_s=1.555,
        host_link_gb_per_s=_PCIE4,
        tflops=dict(_A100),
        source="NVIDIA A100 datasheet, 40GB SXM (dense)",
        references=(_A100_DATASHEET,),
    ),
    _Entry(
        key="a100-pcie-80gb",
        gpu="NVIDIA A100 PCIe 80GB",
        family="a100",
        match=(("a100", "pcie", "80gb"),),
        sm_count=108,
        memory_gb=80,
        hbm_tb_per_s=1.935,
        host_link_gb_per_s=_PCIE4,
        tflops=dict(_A100),
        source="NVIDIA A100 datasheet, 80GB PCIe (dense)",
        references=(_A100_DATASHEET,),
    ),
    _Entry(
        key="a100-pcie-40gb",
        gpu="NVIDIA A100 PCIe 40GB",
        family="a100",
        match=(("a100", "pcie", "40gb"),),
        sm_count=108,
        memory_gb=40,
        hbm_tb_per_s=1.555,
        host_link_gb_per_s=_PCIE4,
        tflops=dict(_A100),
        source="NVIDIA A100 datasheet, 40GB PCIe (dense)",
        references=(_A100_DATASHEET,),
    ),
    _Entry(
        key="a10",
        gpu="NVIDIA A10",
        family="a10",
        match=(("a10",),),
        sm_count=72,
        memory_gb=24,
        hbm_tb_per_s=0.600,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0, "int8": 250.0},
        source="NVIDIA A10 datasheet (dense)",
        references=("https://www.nvidia.com/en-us/data-center/products/a10-gpu/",),
    ),
    _Entry(
        key="a10g",
        gpu="NVIDIA A10G",
        family="a10g",
        match=(("a10g",),),
        sm_count=80,
        memory_gb=24,
        hbm_tb_per_s=0.600,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0, "int8": 140.0},
        source="AWS A10G (no NVIDIA datasheet): third-party A10 vs A10G comparison, AWS G5 page (dense)",
        references=(
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
            "https://aws.amazon.com/ec2/instance-types/g5/",
        ),
    ),
    # Ada data center
    _Entry(
        key="l40s",
        gpu="NVIDIA L40S",
        family="l40s",
        match=(("l40s",),),
        sm_count=142,
        memory_gb=48,
        hbm_tb_per_s=0.864,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "int8": 733.0},
        source="NVIDIA L40S datasheet (dense)",
        references=("https://www.nvidia.com/en-us/data-center/l40s/",),
    ),
    _Entry(
        key="l40",
        gpu="NVIDIA L40",
        family="l40",
        match=(("l40",),),
        sm_count=142,
        memory_gb=48,
        hbm_tb_per_s=0.864,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0, "int8": 362.0},
        source="NVIDIA L40 datasheet (dense)",
        references=("https://www.nvidia.com/en-us/data-center/l40/",),
    ),
    _Entry(
        key="l4",
        gpu="NVIDIA L4",
        family="l4",
        match=(("l4",),),
        sm_count=58,
        memory_gb=24,
        hbm_tb_per_s=0.300,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "int8": 242.5},
        source="NVIDIA L4 datasheet (dense)",
        references=("https://www.nvidia.com/en-us/data-center/l4/",),
    ),
    # GeForce: fp16/bf16/fp8 with FP32 accumulate
    _Entry(
        key="rtx-4090",
        gpu="NVIDIA GeForce RTX 4090",
        family="rtx 4090",
        match=(("rtx 4090",),),
        exclude=("d", "laptop", "mobile"),
        sm_count=128,
        memory_gb=24,
        hbm_tb_per_s=1.008,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "int8": 660.6},
        source="NVIDIA Ada GPU architecture whitepaper, RTX 4090 (dense, FP32 accumulate)",
        references=(_ADA_WHITEPAPER,),
    ),
    _Entry(
        key="rtx-3090",
        gpu="NVIDIA GeForce RTX 3090",
        family="rtx 3090",
        match=(("rtx 3090",),),
        exclude=("ti", "laptop", "mobile"),
        sm_count=82,
        memory_gb=24,
        hbm_tb_per_s=0.936,
        host_link_gb_per_s=_PCIE4,
        tflops={"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0, "int8": 284.0},
        source="NVIDIA GA102 architecture whitepaper, RTX 3090 (dense, FP32 accumulate)",
        references=(_GA102_WHITEPAPER,),
    ),
    # Volta and Turing: fp16 is the tensor-core rate (FP32 accumulate); no bf16/tf32/fp8.
    _Entry(
        key="v100-sxm2",
        gpu="NVIDIA V100 SXM2",
        family="v100",
        match=(("v100", r"sxm\d?"),),
        sm_count=80,
        memory_gb=None,
        hbm_tb_per_s=0.900,
        host_link_gb_per_s=_PCIE3,
        tflops={"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
        source="NVIDIA V100 datasheet, SXM2",
        references=(_V100_DATASHEET,),
    ),
    _Entry(
        key="v100-pcie",
        gpu="NVIDIA V100 PCIe",
        family="v100",
        match=(("v100", "pcie"),),
        sm_count=80,
        memory_gb=None,
        hbm_tb_per_s=0.900,
        host_link_gb_per_s=_PCIE3,
        tflops={"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
        source="NVIDIA V100 datasheet, PCIe",
        references=(_V100_DATASHEET,),
    ),
    _Entry(
        key="v100s-pcie",
        gpu="NVIDIA V100S PCIe",
        family="v100s",
        match=(("v100s",),),
        sm_count=80,
        memory_gb=32,
        hbm_tb_per_s=1.134,
        host_link_gb_per_s=_PCIE3,
        tflops={"fp64": 8.2, "fp32": 16.4, "fp16": 130.0},
        source="NVIDIA V100 datasheet, V100S PCIe",
        references=(_V100_DATASHEET,),
    ),
    _Entry(
        key="t4",
        gpu="NVIDIA T4",
        family="t4",
        match=(("t4",),),
        sm_count=40,
        memory_gb=16,
        hbm_tb_per_s=0.320,
        host_link_gb_per_s=_PCIE3,
        tflops={"fp32": 8.1, "fp16": 65.0, "int8": 130.0},
        source="NVIDIA T4 datasheet",
        references=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
        ),
    ),
    # AMD. PyTorch sees each MI250X GCD as its own device: that entry holds half the package figures.
    _Entry(
        key="mi300x",
        gpu="AMD Instinct MI300X",
        family="mi300x",
        match=(("mi300x",),),
        sm_count=304,
        memory_gb=192,
        hbm_tb_per_s=5.3,
        host_link_gb_per_s=_PCIE5,
        tflops={
            "fp64": 81.7,
            "fp32": 163.4,
            "tf32": 653.7,
            "bf16": 1307.4,
            "fp16": 1307.4,
            "fp8": 2614.9,
            "int8": 2614.9,
        },
        source="AMD Instinct MI300X datasheet (dense)",
        references=("https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",),
    ),
    _Entry(
        key="mi250x-gcd",
        gpu="AMD Instinct MI250X (one GCD)",
        family="mi250x",
        match=(("mi250x",),),
        sm_count=110,
        memory_gb=64,
        hbm_tb_per_s=1.6384,
        host_link_gb_per_s=None,
        tflops={"fp64": 23.95, "fp32": 23.95, "bf16": 191.5, "fp16": 191.5, "int8": 191.5},
        source="AMD Instinct MI250X datasheet, per GCD (half the package figures)",
        references=("https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",),
    ),
)


# --------------------------------------------------------------------------------------------
# name matching


_VENDOR_WORDS = re.compile(r"\b(?:nvidia|tesla|geforce|amd|instinct)\b")
_MEMORY_SIZE = re.compile(r"\b(\d+)\s*g(?:i?b)?\b")
_UNKNOWN_NAMES = {"", "unknown", "unknown gpu"}


def _normalize(name: str) -> str:
    s = name.lower()
    s = re.sub(r"[-_/(),]+", " ", s)
    s = _VENDOR_WORDS.sub(" ", s)
    s = _MEMORY_SIZE.sub(r"\1gb", s)
    return " ".join(s.split())


_TOKEN_CACHE: dict[str, re.Pattern[str]] = {}


def _has(norm: str, token: str) -> bool:
    pat = _TOKEN_CACHE.get(token)
    if pat is None:
        pat = re.compile(rf"(?<![a-z0-9])(?:{token})(?![a-z0-9])")
        _TOKEN_CACHE[token] = pat
    return pat.search(norm) is not None


def _variant_matches(entry: _Entry, norm: str) -> bool:
    if any(_has(norm, tok) for tok in entry.exclude):
        return False
    return any(all(_has(norm, tok) for tok in group) for group in entry.match)


def _pick(candidates: list[_Entry], sm_count: int | None, memory_bytes: int | None) -> _Entry:
    """Among variants of one name, the one the SM count, then the memory size, agrees with."""
    if sm_count:
        same_sms = [e for e in candidates if e.sm_count == sm_count]
        if same_sms:
            candidates = same_sms
    if len(candidates) > 1 and memory_bytes and memory_bytes > 0:
        sized = [e for e in candidates if e.memory_gb]
        if sized:
            # totalGlobalMem is a little under the nominal size (GiB vs GB, reserved memory): nearest wins.
            gib = memory_bytes / (1 << 30)
            best = min(abs(math.log(gib / e.memory_gb)) for e in sized)
            candidates = [e for e in sized if abs(math.log(gib / e.memory_gb)) <= best + 1e-9]
    return candidates[0]


def _resolve(name: str, sm_count: int | None = None, memory_bytes: int | None = None) -> _Entry | None:
    norm = _normalize(name)
    if not norm:
        return None
    variants = [e for e in _TABLE if _variant_matches(e, norm)]
    if len(variants) == 1:
        return variants[0]
    if not variants:
        variants = [e for e in _TABLE if _has(norm, e.family) and not any(_has(norm, t) for t in e.exclude)]
    if not variants:
        return None
    return _pick(variants, sm_count, memory_bytes)


def _peaks_of(entry: _Entry, sm_count: int | None = None) -> DevicePeaks:
    return DevicePeaks(
        gpu=entry.gpu,
        known=True,
        source=entry.source,
        hbm_bytes_per_s=entry.hbm_tb_per_s * _TERA,
        flops_per_s={k: entry.tflops[k] * _TERA for k in DTYPE_KEYS if k in entry.tflops},
        host_link_bytes_per_s=None if entry.host_link_gb_per_s is None else entry.host_link_gb_per_s * _GIGA,
        sm_count=sm_count or entry.sm_count,
        references=list(entry.references),
        key=entry.key,
    )


def all_entries() -> list[DevicePeaks]:
    """Every table entry (fresh copies), in table order."""
    return [_peaks_of(e) for e in _TABLE]


# --------------------------------------------------------------------------------------------
# override files


@dataclass
class PeaksOverride:
    """The validated contents of a ``--peaks`` file, rates in base units (B/s, FLOP/s)."""

    path: Path
    gpu: str | None = None
    source: str | None = None
    hbm_bytes_per_s: float | None = None
    flops_per_s: dict[str, float] = field(default_factory=dict)
    host_link_bytes_per_s: float | None = None
    sm_count: int | None = None
    references: list[str] = field(default_factory=list)

    @property
    def has_rates(self) -> bool:
        return self.hbm_bytes_per_s is not None or bool(self.flops_per_s)


_OVERRIDE_KEYS = (
    "gpu",
    "source",
    "hbm_bytes_per_s",
    "hbm_tb_per_s",
    "flops_per_s",
    "tflops",
    "host_link_bytes_per_s",
    "host_link_gb_per_s",
    "sm_count",
    "references",
)


def _parse_document(path: Path, text: str) -> Any:
    """The peaks document, decoded with the guards of :mod:`gpuadvisor.inputs` (nesting at most 200 deep,
    integers within 64 bits): every problem is one line naming the file."""
    from gpuadvisor.inputs import decode_json, decode_toml

    suffix = path.suffix.lower()
    as_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    where = f"peaks file {path}"
    if as_json:
        return decode_json(text, where, allow_nan=True)  # NaN and Infinity: _positive names the key
    return decode_toml(text, where)


def _positive(path: Path, key: str, value: Any, scale: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise BadInputError(f"peaks file {path}: {key} must be a number, got {shown}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise BadInputError(f"peaks file {path}: {key} must be a positive finite number, got {value}")
    return number * scale


def _rate(path: Path, doc: dict[str, Any], raw_key: str, scaled_key: str, scale: float) -> float | None:
    if raw_key in doc and scaled_key in doc:
        raise BadInputError(f"peaks file {path}: give {raw_key} or {scaled_key}, not both")
    if raw_key in doc:
        return _positive(path, raw_key, doc[raw_key])
    if scaled_key in doc:
        return _positive(path, scaled_key, doc[scaled_key], scale)
    return None


def read_peaks_file(path: str | Path) -> PeaksOverride:
    """Read and validate a ``--peaks`` file (TOML, or JSON by suffix or content).

    Keys: ``gpu`` and ``source`` (strings, optional); ``hbm_bytes_per_s`` or ``hbm_tb_per_s``;
    a ``[flops_per_s]`` table (FLOP/s) and/or a ``[tflops]`` table (TFLOP/s), keyed by ``fp64``,
    ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8``; ``host_link_bytes_per_s`` or
    ``host_link_gb_per_s``; ``sm_count``; ``references`` (list of strings). Any problem raises
    :class:`BadInputError` with a one-line message naming the file and the key.
    """
    from gpuadvisor.inputs import read_text
    from gpuadvisor.textsafe import escape_control

    p = Path(path)
    text = read_text(p, "peaks", _MAX_PEAKS_FILE_BYTES)  # a regular file, bounded: one line for any problem
    doc = _parse_document(p, text)
    if not isinstance(doc, dict):
        raise BadInputError(f"peaks file {p}: the top level must be a table/object of keys")
    for key in doc:
        if key not in _OVERRIDE_KEYS:
            raise BadInputError(f"peaks file {p}: unknown key '{key}' (known keys: {', '.join(_OVERRIDE_KEYS)})")

    out = PeaksOverride(path=p)
    for key in ("gpu", "source"):
        if key in doc:
            if not isinstance(doc[key], str) or not doc[key].strip():
                raise BadInputError(f"peaks file {p}: {key} must be a non-empty string")
            setattr(out, key, escape_control(doc[key].strip()))  # shown in every report: no control characters
    out.hbm_bytes_per_s = _rate(p, doc, "hbm_bytes_per_s", "hbm_tb_per_s", _TERA)
    out.host_link_bytes_per_s = _rate(p, doc, "host_link_bytes_per_s", "host_link_gb_per_s", _GIGA)

    for table_key, scale in (("flops_per_s", 1.0), ("tflops", _TERA)):
        if table_key not in doc:
            continue
        table = doc[table_key]
        if not isinstance(table, dict):
            raise BadInputError(f"peaks file {p}: {table_key} must be a table of dtype = number")
        for dtype, value in table.items():
            if dtype not in DTYPE_KEYS:
                raise BadInputError(
                    f"peaks file {p}: unknown dtype '{table_key}.{dtype}' (use {', '.join(DTYPE_KEYS)})"
                )
            if dtype in out.flops_per_s:
                raise BadInputError(f"peaks file {p}: {dtype} is given in both flops_per_s and tflops")
            out.flops_per_s[dtype] = _positive(p, f"{table_key}.{dtype}", value, scale)

    if "sm_count" in doc:
        sms = doc["sm_count"]
        if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
            raise BadInputError(f"peaks file {p}: sm_count must be a positive integer, got {sms}")
        out.sm_count = sms
    if "references" in doc:
        refs = doc["references"]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise BadInputError(f"peaks file {p}: references must be a list of strings")
        out.references = [escape_control(r) for r in refs]
    return out


# --------------------------------------------------------------------------------------------
# lookup


def _device_fields(device: DeviceInfo | str | None) -> tuple[str | None, int | None, int | None]:
    if device is None:
        return None, None, None
    if isinstance(device, str):
        return device, None, None
    return (
        getattr(device, "name", None),
        getattr(device, "sm_count", None) or None,
        getattr(device, "total_memory_bytes", None) or None,
    )


def lookup_peaks(
    device: DeviceInfo | str | None,
    override: str | Path | None = None,
    calibration: Mapping[str, Any] | None = None,
) -> DevicePeaks:
    """The peak rates for a trace's GPU (a DeviceInfo, or a deviceProperties name).

    Without a table entry the result has ``known=False`` and no rates. ``calibration`` is a result of
    ``gpuadvisor calibrate`` (see :func:`apply_calibration`): its measured rates replace the table's.
    ``override`` names a ``--peaks`` file (see :func:`read_peaks_file`): its values replace the table's
    and the calibration's; for a GPU the table lacks they define it (then ``known=True``). When the file
    names a ``gpu`` the table knows, that entry is the base the file's values go over.
    ``sm_count`` comes from the DeviceInfo when it has one.
    """
    name, sm_count, memory_bytes = _device_fields(device)
    entry = None
    if name is not None and name.strip().lower() not in _UNKNOWN_NAMES:
        entry = _resolve(name, sm_count, memory_bytes)

    if entry is not None:
        peaks = _peaks_of(entry, sm_count)
        if "mig" in _normalize(name or "").split():
            peaks.source += "; full-GPU figures, the trace ran on a MIG slice"
    else:
        shown = name.strip() if name and name.strip() else "unknown"
        peaks = DevicePeaks(gpu=shown, known=False, source=f"no entry for '{shown}'", sm_count=sm_count)

    if calibration is not None:
        peaks = apply_calibration(peaks, calibration)
    if override is None:
        return peaks
    return _apply_override(peaks, read_peaks_file(override), sm_count)


def _measured_rate(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def apply_calibration(peaks: DevicePeaks, calibration: Mapping[str, Any]) -> DevicePeaks:
    """``peaks`` with the rates a ``gpuadvisor calibrate`` result measured put over them.

    Measured keys: ``hbm_bytes_per_s`` (device copy, bytes read + written), ``flops_per_s`` per dtype
    (GEMM 8192³), and the host link from ``host_to_device_bytes_per_s`` / ``device_to_host_bytes_per_s``
    (the faster direction: a roof bounds both). Rates the calibration lacks (fp64, int8, a skipped fp8)
    stay the table's, and ``source`` says so. A calibration without a valid rate changes nothing.
    """
    hbm = _measured_rate(calibration.get("hbm_bytes_per_s"))
    links = [_measured_rate(calibration.get(k)) for k in ("host_to_device_bytes_per_s", "device_to_host_bytes_per_s")]
    link = max((r for r in links if r is not None), default=None)
    raw_flops = calibration.get("flops_per_s")
    raw_flops = raw_flops if isinstance(raw_flops, Mapping) else {}
    measured_flops = {k: _measured_rate(v) for k, v in raw_flops.items() if k in DTYPE_KEYS}
    measured_flops = {k: v for k, v in measured_flops.items() if v is not None}
    if hbm is None and link is None and not measured_flops:
        return peaks

    flops = dict(peaks.flops_per_s)
    flops.update(measured_flops)
    date = str(calibration.get("date") or "")[:10] or "undated"
    source = f"calibrated on this GPU ({date})"
    if peaks.known:
        from_table = [k for k in DTYPE_KEYS if k in peaks.flops_per_s and k not in measured_flops]
        if hbm is None and peaks.hbm_bytes_per_s is not None:
            from_table.insert(0, "memory bandwidth")
        if from_table:
            source += f"; {', '.join(from_table)} from {peaks.source}"
    gpu = peaks.gpu if peaks.known else str(calibration.get("gpu") or peaks.gpu)
    sms = calibration.get("sm_count")
    return DevicePeaks(
        gpu=gpu,
        known=True,
        source=source,
        hbm_bytes_per_s=hbm if hbm is not None else peaks.hbm_bytes_per_s,
        flops_per_s={k: flops[k] for k in DTYPE_KEYS if k in flops},
        host_link_bytes_per_s=link if link is not None else peaks.host_link_bytes_per_s,
        sm_count=peaks.sm_count or (sms if isinstance(sms, int) and not isinstance(sms, bool) and sms > 0 else None),
        references=list(peaks.references),
        key=peaks.key,
    )


def _apply_override(base: DevicePeaks, ov: PeaksOverride, device_sms: int | None) -> DevicePeaks:
    if ov.gpu is not None:
        named = _resolve(ov.gpu)
        if named is not None and named.key != base.key:
            # The file describes another GPU than the table matched for the trace: its entry is the base.
            if base.known:
                device_sms = None
            base = _peaks_of(named, ov.sm_count or device_sms)
    label = f"override file {ov.path}"
    if ov.source:
        label = f"{ov.source} ({label})"
    flops = dict(base.flops_per_s)
    flops.update(ov.flops_per_s)
    return DevicePeaks(
        gpu=ov.gpu or base.gpu,
        known=base.known or ov.has_rates,
        source=f"{label}, over {base.source}" if base.known else label,
        hbm_bytes_per_s=ov.hbm_bytes_per_s if ov.hbm_bytes_per_s is not None else base.hbm_bytes_per_s,
        flops_per_s={k: flops[k] for k in DTYPE_KEYS if k in flops},
        host_link_bytes_per_s=(
            ov.host_link_bytes_per_s if ov.host_link_bytes_per_s is not None else base.host_link_bytes_per_s
        ),
        sm_count=ov.sm_count or device_sms or base.sm_count,
        references=base.references + [r for r in ov.references if r not in base.references],
        key=base.key,
    )


# --------------------------------------------------------------------------------------------
# dtypes and roofs


DTYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "fp64": ("double", "float64", "fp64", "f64", "complex<double>", "complex128", "cdouble"),
    "fp32": ("float", "float32", "fp32", "f32", "single", "complex<float>", "complex64", "cfloat"),
    "tf32": ("tf32", "tensorfloat32", "tensorfloat-32"),
    "bf16": ("bfloat16", "bf16"),
    "fp16": ("half", "float16", "fp16", "f16", "complex<half>", "complex32", "chalf"),
    "fp8": ("fp8", "e4m3", "e5m2"),  # and every float8_* name
    "int8": ("int8", "uint8", "signed char", "unsigned char", "char", "qint8", "quint8", "i8", "u8"),
}
_DTYPE_NAMES = {name: key for key, names in DTYPE_ALIASES.items() for name in names}


def dtype_key(dtype: str | None) -> str | None:
    """The table key ("bf16", ...) for a dtype name from a trace or from torch, or None (module docstring)."""
    if not dtype:
        return None
    s = " ".join(str(dtype).strip().lower().split())
    for prefix in ("torch.", "c10::"):
        if s.startswith(prefix):
            s = s[len(prefix) :]
    s = s.replace("c10::", "")
    if s.startswith("float8") or s.startswith("fp8"):
        return "fp8"
    return _DTYPE_NAMES.get(s)


def peak_flops(peaks: DevicePeaks, dtype: str) -> float | None:
    """Peak FLOP/s (ops/s for int8) of ``dtype`` on this GPU; None for a dtype without a roof here."""
    key = dtype_key(dtype)
    if key is None:
        return None
    return peaks.flops_per_s.get(key)


def ridge_point(peaks: DevicePeaks, dtype: str) -> float | None:
    """Arithmetic intensity (FLOP/byte) where the dtype's compute roof meets the memory roof."""
    flops = peak_flops(peaks, dtype)
    if flops is None or not peaks.hbm_bytes_per_s:
        return None
    return flops / peaks.hbm_bytes_per_s
