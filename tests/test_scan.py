"""`gpuadvisor scan`: the bank model from first principles, the corpus against Nsight Compute's measured ground
truth (benchmarks/results/bank_conflicts_ncu.csv), embedded CUDA, and hostile input through the CLI."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gpuadvisor.scan.analyze import kernel_summary, scan_unit
from gpuadvisor.scan.banks import warp_wavefronts
from gpuadvisor.scan.report import scan_paths
from gpuadvisor.scan.source import CudaUnit

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "scan_corpus"
MEASURED_CSV = REPO / "benchmarks" / "results" / "bank_conflicts_ncu.csv"
# A measured degree above this is a conflict: conflict-free kernels read 1.0 and the mildest corpus conflict 2.0.
MEASURED_CONFLICT_DEGREE = 1.2

# kernel -> (load degree, store degree), derived by hand from 32 banks of 4 bytes, half-warp phases for 8-byte and
# quarter-warp phases for 16-byte accesses (the comments in tests/scan_corpus/bank_conflicts.cu say why);
# None: the access is beyond the model (the scan must say unknown).
EXPECTED = {
    "transpose_naive_32x32": (32.0, 1.0),
    "transpose_padded_32x33": (1.0, 1.0),
    "transpose_swizzled_32x32": (1.0, 1.0),
    "broadcast_float": (1.0, 1.0),
    "stride2_float": (2.0, 1.0),
    "stride4_float": (4.0, 1.0),
    "stride32_float": (32.0, 1.0),
    "double_contiguous": (1.0, 1.0),
    "double_stride2": (2.0, 1.0),
    "u16_contiguous": (1.0, 1.0),
    "u16_stride32": (16.0, 1.0),
    "float4_contiguous": (1.0, 1.0),
    "float4_stride2": (2.0, 1.0),
    "reduce_sequential": (1.0, 1.0),
    # 256 threads: s = 1 is 2-way on 4 warps, s = 2 4-way on 2, then 8, 8, 8, 4, 2, 1 lanes' worth on one warp:
    # (4*2 + 2*4 + 8 + 8 + 8 + 4 + 2 + 1) / 12 = 3.92 per load, and sdata[0] at the end: 95 / 25 = 3.8.
    "reduce_interleaved": (3.8, 2.75),
    "dynamic_extern_stride2": (2.0, 1.0),
    "tile16_column": (8.0, 1.0),
    "data_dependent_index": (None, 1.0),
}


@pytest.fixture(scope="module")
def corpus_scan() -> dict:
    return scan_paths([CORPUS])


@pytest.fixture(scope="module")
def summaries(corpus_scan) -> dict:
    return {k["kernel"]: k for k in corpus_scan["kernels"]}


# --- the bank model -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addresses, width, expected",
    [
        ([4 * lane for lane in range(32)], 4, (1, 1)),  # contiguous floats
        ([0] * 32, 4, (1, 1)),  # broadcast
        ([128 * lane for lane in range(32)], 4, (32, 1)),  # a column of float[32][32]
        ([132 * lane for lane in range(32)], 4, (1, 1)),  # a column of float[32][33]
        ([8 * lane for lane in range(32)], 8, (2, 2)),  # contiguous doubles: two half-warps
        ([16 * lane for lane in range(32)], 8, (4, 2)),  # doubles at stride 2
        ([16 * lane for lane in range(32)], 16, (4, 4)),  # contiguous float4: four quarter-warps
        ([2 * lane for lane in range(32)], 2, (1, 1)),  # contiguous halves share words
        ([64 * lane for lane in range(32)], 2, (16, 1)),  # halves at stride 32: banks 0 and 16
    ],
)
def test_warp_wavefronts(addresses, width, expected):
    assert warp_wavefronts(addresses, (1 << 32) - 1, width) == expected


def test_inactive_lanes_take_no_wavefronts():
    column = [128 * lane for lane in range(32)]
    assert warp_wavefronts(column, 0b1111, 4) == (4, 1)
    assert warp_wavefronts([16 * lane for lane in range(32)], 0xFF, 16) == (1, 1)  # one quarter-warp active


# --- the corpus -----------------------------------------------------------------------------------------------


def test_corpus_has_the_patterns_and_a_block_size_per_kernel():
    text = (CORPUS / "bank_conflicts.cu").read_text()
    names = re.findall(r'extern "C" __global__ void (\w+)\(', text)
    assert len(names) >= 14 and set(names) == set(EXPECTED)
    hinted = re.findall(r"// gpuadvisor: blockDim=[\d,]+.*\n\s*extern \"C\" __global__ void (\w+)", text)
    assert hinted == names


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_corpus_predictions_match_first_principles(summaries, kernel):
    load, store = EXPECTED[kernel]
    summary = summaries[kernel]
    assert summary["block_dim_source"].startswith("the kernel's")
    if load is None:
        assert summary["load"]["verdict"] == "unknown"
        assert "data-dependent" in summary["load"]["reason"]
    else:
        assert summary["load"]["degree"] == pytest.approx(load, abs=0.05)
        assert summary["load"]["verdict"] == ("conflict" if load > 1 else "clean")
    assert summary["store"]["degree"] == pytest.approx(store, abs=0.05)


def test_no_clean_verdict_without_a_model(corpus_scan):
    for access in corpus_scan["accesses"]:
        if access["verdict"] == "clean":
            assert access["reason"] is None and access["degree"] == 1.0
        if access["verdict"] == "unknown":
            assert access["reason"] and access["degree"] is None


def test_fixes_are_checked_against_the_same_warps(corpus_scan):
    by_kernel = {(a["kernel"], a["kind"]): a for a in corpus_scan["accesses"] if a["verdict"] == "conflict"}
    naive = by_kernel[("transpose_naive_32x32", "load")]
    assert naive["fix"].startswith("__shared__ float tile[32][33];")
    assert naive["degree_after_fix"] == 1.0
    stride = by_kernel[("stride2_float", "load")]
    assert stride["fix"].startswith("s[i + i / 32]") and stride["degree_after_fix"] == 1.0
    halves = by_kernel[("u16_stride32", "load")]
    assert "2 * (i / 64)" in halves["fix"] and halves["degree_after_fix"] == 1.0
    assert any(
        f["rule_id"] == "GA501" and f["evidence"]["kernel"] == "transpose_naive_32x32" for f in corpus_scan["findings"]
    )
    assert not any(f["evidence"]["kernel"] == "transpose_padded_32x33" for f in corpus_scan["findings"])


def _measured() -> dict:
    from gpuadvisor.ncu.counters import load_csv

    return {row["kernel"]: row for row in load_csv(MEASURED_CSV)}


@pytest.mark.skipif(
    not MEASURED_CSV.exists(),
    reason="no measured ground truth yet: run "
    "benchmarks/bank_conflicts_ncu.py on the GPU machine and commit benchmarks/results/",
)
@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_corpus_predictions_match_nsight_compute(summaries, kernel):
    """Conflict or not agrees with the measurement; a predicted degree is within a factor of 2 of the measured
    one (measured: wavefronts / (wavefronts - bank conflicts), the degree over the ideal of the access width)."""
    measured = _measured()[kernel]
    summary = summaries[kernel]
    for kind, op in (("load", "ld"), ("store", "st")):
        predicted = summary[kind]
        if not measured[f"{op}_instructions"]:
            continue
        if predicted["verdict"] == "unknown":
            assert predicted["reason"]
            continue
        degree = measured[f"{op}_wavefronts"] / measured[f"{op}_ideal_wavefronts"]
        measured_conflict = degree > MEASURED_CONFLICT_DEGREE
        assert measured_conflict == (predicted["verdict"] == "conflict"), (kind, degree, predicted)
        if predicted["verdict"] == "conflict":
            assert 0.5 <= predicted["degree"] / degree <= 2.0, (kind, degree, predicted)


# --- embedded CUDA, Triton, hints, the model's limits ------------------------------------------------------------

EMBEDDED = '''
import cupy
from torch.utils.cpp_extension import load_inline

CUDA = r"""
// gpuadvisor: blockDim=32,8
__global__ void column(const float* in, float* out) {
    __shared__ float tile[32][32];
    tile[threadIdx.y][threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x][threadIdx.y];
}
"""
module = load_inline(name="m", cpp_sources="", cuda_sources=[CUDA], functions=["f"])
kernel = cupy.RawKernel(r"""
extern "C" __global__ void strided(float* out) {
    __shared__ float s[1024];
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[4 * threadIdx.x];
}
""", "strided")
'''


def test_cuda_embedded_in_python(tmp_path):
    path = tmp_path / "ext.py"
    path.write_text(EMBEDDED)
    result = scan_paths([path])
    loads = {a["kernel"]: a for a in result["accesses"] if a["kind"] == "load"}
    assert loads["column"]["degree"] == 32.0 and loads["column"]["line"] == 11
    assert loads["strided"]["degree"] == 4.0 and loads["strided"]["line"] == 20
    assert loads["strided"]["block_dim_source"].startswith("assumed")


def test_triton_kernels_are_named_not_guessed(tmp_path):
    path = tmp_path / "tri.py"
    path.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x):\n    pass\n")
    result = scan_paths([path])
    assert result["accesses"] == []
    assert any("Triton manages shared memory itself" in n for n in result["notes"])


def test_beyond_the_model_is_unknown_with_the_reason(tmp_path):
    path = tmp_path / "k.cu"
    path.write_text(
        "// gpuadvisor: blockDim=256\n"
        "__global__ void k(const int* idx, float* out, int ld) {\n"
        "    __shared__ float s[4096];\n"
        "    s[threadIdx.x] = 0;\n"
        "    __syncthreads();\n"
        "    out[0] = s[SWIZZLE(threadIdx.x)];\n"
        "    out[1] = s[threadIdx.x * ld];\n"
        "    out[2] = s[__shfl_sync(0xffffffff, threadIdx.x, 0)];\n"
        "    out[3] = s[threadIdx.x + ld];\n"
        "}\n"
    )
    result = scan_paths([path])
    loads = {a["line"]: a for a in result["accesses"] if a["kind"] == "load"}
    assert loads[6]["verdict"] == "unknown" and "SWIZZLE" in loads[6]["reason"]
    assert loads[7]["verdict"] == "unknown" and "ld" in loads[7]["reason"]  # the degree depends on ld
    assert loads[8]["verdict"] == "unknown" and "__shfl_sync" in loads[8]["reason"]
    assert loads[9]["verdict"] == "clean"  # a warp-uniform offset does not change the banks


def test_macros_templates_and_hints(tmp_path):
    path = tmp_path / "t.cu"
    path.write_text(
        "#define IDX(r, c) ((r) * (W + PAD) + (c))\n"
        "#define W 32\n#define PAD 1\n"
        "constexpr int ROWS = 8;\n"
        "template <int BLOCK>\n"
        "// gpuadvisor: blockDim=32,8 BLOCK=32\n"
        "__global__ void t(float* out) {\n"
        "    __shared__ float tile[W * (W + PAD)];\n"
        "    for (int j = 0; j < W; j += ROWS) tile[IDX(threadIdx.y + j, threadIdx.x)] = 1.0f;\n"
        "    __syncthreads();\n"
        "    out[threadIdx.x] = tile[IDX(threadIdx.x, threadIdx.y)] + tile[threadIdx.x * BLOCK];\n"
        "}\n"
    )
    loads = [a for a in scan_paths([path])["accesses"] if a["kind"] == "load"]
    assert [a["verdict"] for a in loads] == ["clean", "conflict"]
    assert loads[1]["degree"] == 32.0


def test_block_dim_default_is_said(tmp_path):
    result, _ = scan_unit(
        CudaUnit(
            "x.cu", "__global__ void k(float* o) { __shared__ float s[64]; s[threadIdx.y * 32 + threadIdx.x] = 0; }"
        ),
        None,
    )
    summary = kernel_summary(result[0])
    assert summary["block_dim"] == [32, 8, 1] and "assumed" in summary["block_dim_source"]


# --- the CLI: output, exit codes, hostile input ---------------------------------------------------------------


def test_scan_json_output_keys(cli, tmp_path):
    result = cli("scan", CORPUS, "--format", "json", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"tool", "command", "files", "accesses", "kernels", "findings", "warnings", "notes"} <= set(data)
    access = data["accesses"][0]
    assert {
        "file",
        "line",
        "kernel",
        "array",
        "access",
        "kind",
        "width_bytes",
        "verdict",
        "degree",
        "reason",
        "block_dim",
        "block_dim_source",
        "fix",
        "wavefronts_per_instruction",
    } <= set(access)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "scan.json", "scan.md"]
    assert json.loads((tmp_path / "out" / "scan.json").read_text()) == data


def test_scan_terminal_and_fail_on(cli):
    result = cli("scan", CORPUS / "bank_conflicts.cu", "--fail-on", "medium")
    assert result.returncode == 1
    assert "transpose_naive_32x32" in result.stdout and "tile[32][33]" in result.stdout
    assert "Traceback" not in result.stderr


def test_hostile_files_warn_once_each_and_the_rest_is_scanned(cli, tmp_path):
    (tmp_path / "good.cu").write_text((CORPUS / "bank_conflicts.cu").read_text())
    with open(tmp_path / "huge.cu", "wb") as handle:  # 50 MB, refused by its size before it is read
        handle.write(b"__global__ void k() {}\n" * 10)
        handle.truncate(50 * 1024 * 1024)
    (tmp_path / "binary.cu").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "braces.cu").write_text("__global__ void k() { __shared__ float s[32]; { s[0] = 1;\n")
    (tmp_path / "macros.cu").write_text(
        "#define CAT(a, b) a##b\n__global__ void k(float* o) { __shared__ float s[64]; o[0] = s[CAT(thread, Idx).x]; }"
    )
    (tmp_path / "latin1.cuh").write_bytes("// caf\xe9\n".encode("latin-1"))
    (tmp_path / "broken.py").write_text("def f(:\n")
    start = time.perf_counter()
    result = cli("scan", tmp_path, "--format", "json")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warnings = result.stderr.splitlines()
    for name, words in (
        ("huge.cu", "MiB limit"),
        ("binary.cu", "binary"),
        ("braces.cu", "unbalanced braces"),
        ("macros.cu", "CAT"),
        ("latin1.cuh", "UTF-8"),
        ("broken.py", "not valid Python"),
    ):
        lines = [w for w in warnings if name in w]
        assert len(lines) == 1 and lines[0].startswith("warning:") and words in lines[0], (name, warnings)
    assert len(warnings) == 6
    data = json.loads(result.stdout)
    assert {f["path"].rsplit("/", 1)[-1]: f["status"] for f in data["files"]}["good.cu"] == "scanned"
    macro_loads = [a for a in data["accesses"] if a["file"].endswith("macros.cu")]
    assert macro_loads and all(a["verdict"] == "unknown" for a in macro_loads)
    assert elapsed < 30


def test_only_unreadable_files_exit_2(cli, tmp_path):
    with open(tmp_path / "huge.cu", "wb") as handle:
        handle.truncate(50 * 1024 * 1024)
    result = cli("scan", tmp_path / "huge.cu")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines  # one line: why, for which file
    assert "no file could be scanned" in lines[0] and "huge.cu" in lines[0] and "MiB limit" in lines[0]


@pytest.mark.parametrize("case", ["missing", "empty_dir", "bad_block_dim"])
def test_bad_input_exits_2_with_one_line(cli, tmp_path, case):
    if case == "missing":
        args = ["scan", tmp_path / "nosuch.cu"]
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        args = ["scan", tmp_path / "empty"]
    else:
        args = ["scan", CORPUS, "--block-dim", "64,64"]
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr


def test_scan_does_not_import_heavy_modules(python):
    code = (
        "import contextlib, io, json, sys\n"
        "import gpuadvisor.cli as cli\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    for args in (['scan', '--help'], ['scan', {str(CORPUS)!r}, '--format', 'json']):\n"
        "        try:\n"
        "            cli.app(args, prog_name='gpuadvisor', standalone_mode=False)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "heavy = ('torch', 'triton', 'pynvml', 'pandas', 'numpy')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    probe = python("-c", code)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == []
