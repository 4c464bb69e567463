"""Terminal output at 80 columns, as a CI log or a pipe gets it (COLUMNS=80, stdout not a terminal): no line is
wider, two different kernels never print the same name, and no cell is cut or wrapped inside a word or a number
(`analyze`, `rules`, `scan`, `ncu`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadvisor.report.formatting import format_pct, format_us
from gpuadvisor.report.sections import distinct_short_names

REPO = Path(__file__).resolve().parents[1]
WIDTH = 80
SCAN_CORPUS = REPO / "tests" / "scan_corpus" / "bank_conflicts.cu"
NCU_CSV = REPO / "benchmarks" / "results" / "bank_conflicts_ncu.csv"


def run80(*args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(NO_COLOR="1", COLUMNS=str(WIDTH))
    result = subprocess.run(
        [sys.executable, "-m", "gpuadvisor", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode in (0, 1), result.stderr
    return result


def assert_fits(text: str) -> list[str]:
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, too_wide[:3]
    return lines


def words(text: str) -> set[str]:
    """Every whitespace-separated word of the output, box-drawing lines taken as spaces."""
    return set(re.sub(r"[│┃┆┊║|]", " ", text).split())


def kernel_rows(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("Top kernels")) + 3  # title, header, rule
    rows = []
    for line in lines[start:]:
        if not line.strip() or "kernels listed" in line:
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("sample", ["llama_decode", "gemm", "add_rmsnorm", "input_pipeline"])
def test_analyze_at_80_columns_keeps_names_apart_and_numbers_whole(sample):
    report = json.loads(run80("analyze", "--sample", sample, "--format", "json").stdout)
    lines = assert_fits(run80("analyze", "--sample", sample, "--top", "15").stdout)
    rows = kernel_rows(lines)
    kernels = sorted(report["kernels"], key=lambda k: -k["total_us"])[: len(rows)]
    assert rows and len(rows) == len(kernels)
    names = [row.split("  ")[0].strip() for row in rows]
    assert len(set(names)) == len(names), names  # different kernels, different names
    for row, kernel in zip(rows, kernels):
        cells = row.split()
        assert format_pct(kernel["pct_of_gpu_time"]) in cells, (row, kernel["pct_of_gpu_time"])
        assert format_us(kernel["us_per_step"]) in row, (row, kernel["us_per_step"])
    assert "…" not in "".join(re.findall(r"[\d,.]+…", "\n".join(lines[len(lines) // 2 :])))


def test_names_that_shorten_alike_keep_the_part_that_tells_them_apart():
    nvjet = [
        "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT",
        "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT",
        "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT",
        "nvjet_sm90_tst_128x8_64x6_2x1_v_bz_TNT",
    ]
    for width in range(12, 48):
        shown = distinct_short_names(nvjet, width)
        assert len(set(shown)) == len(shown), (width, shown)
        assert all(len(name) <= width for name in shown), (width, shown)
    for width in (24, 28, 33, 40):  # 33: the kernel column at 80 columns
        shown = distinct_short_names(nvjet, width)
        assert any("splitK" in name for name in shown), (width, shown)
        assert any("256x8" in name for name in shown) and any("128x8" in name for name in shown), (width, shown)


def test_every_sample_kernel_gets_its_own_name_at_any_width():
    from gpuadvisor.pipeline import analyze_path

    for path in sorted((REPO / "sample_traces").glob("*.json.gz")):
        names = [k["name"] for k in analyze_path(path)["kernels"]]
        for width in (16, 20, 24, 33, 40, 60):
            shown = distinct_short_names(names, width)
            assert len(set(shown)) == len(set(names)), (path.name, width)


def test_rules_at_80_columns_wrap_between_words():
    from gpuadvisor.rules.engine import load_rules

    out = run80("rules").stdout
    assert_fits(out)
    seen = words(out)
    for rule in load_rules():
        assert rule.id in seen and rule.name in seen, rule.id
        missing = [word for word in rule.title.split() if word not in seen]
        assert not missing, (rule.id, missing)


def test_scan_at_80_columns_keeps_every_cell_whole():
    scan = json.loads(run80("scan", SCAN_CORPUS, "--format", "json").stdout)
    out = run80("scan", SCAN_CORPUS).stdout
    assert_fits(out)
    seen = words(out)
    for access in scan["accesses"]:
        assert f"{Path(access['file']).name}:{access['line']}" in seen, access["line"]
        assert access["kernel"] in seen
        assert all(word in seen for word in access["access"].split()), access["access"]


def test_ncu_at_80_columns_keeps_every_number_whole():
    if not NCU_CSV.is_file():
        pytest.skip("no committed Nsight Compute export")
    report = json.loads(run80("ncu", "--import", NCU_CSV, "--format", "json").stdout)
    out = run80("ncu", "--import", NCU_CSV).stdout
    assert_fits(out)
    seen = words(out)
    for row in report["kernels"][:10]:
        assert f"{row['duration_us']:,.1f}" in seen, row["duration_us"]
        assert f"{row.get('ld_instructions', 0):,.0f}" in seen
        assert f"{row.get('st_instructions', 0):,.0f}" in seen
