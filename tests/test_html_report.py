"""report.html (gpuadvisor/report/html.py): one self-contained page per report, checked as HTML and in Chromium.

The unit tests parse the page with the standard library: one roofline mark per kernel row, the findings, the
size bound, nothing fetched from outside, every report string escaped. The command tests check that
``analyze --out``, ``analyze --format html``, ``compare --html`` and ``scan --out`` write the page (profile's is
in test_profile_cpu.py, apply's in test_apply_cli.py). The browser tests open each kind of
report (analyze of a real H200 trace, the committed H200 profile, apply and compare reports) in headless
Chromium (Debian's ``chromium`` package, driven by playwright without a browser download; skipped when
either is missing): no console error, no request that leaves the file, a mark per kernel row, the findings,
and a screenshot. ``GPUADVISOR_UPDATE_SCREENSHOT=1`` also writes the analyze page's screenshot to
docs/report.png, the one the README shows.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuadvisor.report.html import MAX_HTML_BYTES, render_html, report_kind

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
RESULTS = REPO / "benchmarks" / "results"
CHROMIUM = "/usr/bin/chromium"
EVIL = "</script><script>alert(1)</script>"
EVIL_ATTR = '"><img src=x onerror=alert(2)>'


# --- fixtures: one report of each kind --------------------------------------------------------------


def _analyze(path: Path) -> dict:
    """The analyze report of a sample trace (with the timeline strip of its median step: report/build.py)."""
    from gpuadvisor.pipeline import analyze_trace_object
    from gpuadvisor.trace.kineto import load_trace

    report = analyze_trace_object(load_trace(path))
    report["source"]["path"] = str(path.relative_to(REPO))  # as `gpuadvisor analyze` run in the checkout shows it
    return report


@pytest.fixture(scope="module")
def analyze_report() -> dict:
    return _analyze(SAMPLES / "llama_decode.json.gz")


@pytest.fixture(scope="module")
def pipeline_report() -> dict:
    return _analyze(SAMPLES / "input_pipeline.json.gz")


@pytest.fixture(scope="module")
def profile_report() -> dict:
    return json.loads((RESULTS / "profile_input_pipeline" / "report.json").read_text())


@pytest.fixture(scope="module")
def apply_report() -> dict:
    return json.loads((RESULTS / "apply_llama_decode_all" / "report.json").read_text())


@pytest.fixture(scope="module")
def auto_report() -> dict:
    return json.loads((RESULTS / "real_auto_reports" / "hf_llama_decode.report.json").read_text())


@pytest.fixture(scope="module")
def compare_inputs() -> tuple[dict, dict, dict]:
    from gpuadvisor import gate

    base = json.loads((RESULTS / "gate" / "base" / "00.json").read_text())
    current = json.loads((RESULTS / "gate" / "slow10" / "00.json").read_text())
    return gate.compare_reports(base, current, labels=("base/00.json", "slow10/00.json")), base, current


@pytest.fixture(scope="module")
def scan_report() -> dict:
    from gpuadvisor.scan import report as scan

    return json.loads(scan.to_json(scan.scan_paths([REPO / "tests" / "scan_corpus"])))


# --- a small DOM reader ---------------------------------------------------------------------------------


class Page(HTMLParser):
    """Every start tag as (tag, attrs dict), and the page's text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text_parts: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag == "title" and len(self.tags) > 1:
            self._title_of = self.tags[-2][1]  # an SVG mark's <title>: its hover text

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        if tag == "title":
            self._title_of = None

    def handle_data(self, data):
        if getattr(self, "_title_of", None) is not None:
            self._title_of["tip"] = self._title_of.get("tip", "") + data
        self.text_parts.append(data)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def find(self, tag: str, css: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (css is None or css in a.get("class", "").split())]


def _marks(page: Page) -> list[int]:
    return sorted(int(a["data-kernel"]) for a in page.find("circle", "kpoint"))


# --- unit tests on the HTML ---------------------------------------------------------------------------------


def test_kinds_are_told_apart(analyze_report, profile_report, apply_report, compare_inputs, scan_report):
    assert report_kind(analyze_report) == "trace"
    assert report_kind(profile_report) == "trace"
    assert report_kind(apply_report) == "apply"
    assert report_kind(compare_inputs[0]) == "compare"
    assert report_kind(scan_report) == "scan"


@pytest.mark.parametrize("name", ["analyze_report", "pipeline_report", "profile_report", "apply_report"])
def test_one_roofline_mark_per_kernel_row(name, request):
    report = request.getfixturevalue(name)
    page = Page(render_html(report))
    kernels = report["kernels"]
    assert kernels, "the fixture has kernel rows"
    assert _marks(page) == list(range(len(kernels)))
    # Rows with an intensity and an achieved rate are on the chart; the rest in the strip under it.
    placed = [
        i for i, k in enumerate(kernels) if (k.get("intensity") or 0) > 0 and (k.get("achieved_flops_per_s") or 0) > 0
    ]
    assert sorted(int(a["data-kernel"]) for a in page.find("circle", "placed")) == placed
    # The sortable kernels table: a row per kernel row.
    assert len(page.find("table")) >= 1
    assert ' id="kernels-table"' in render_html(report)


@pytest.mark.parametrize("name", ["analyze_report", "apply_report", "auto_report", "scan_report"])
def test_element_ids_are_unique(name, request):
    ids = [a["id"] for _, a in Page(render_html(request.getfixturevalue(name))).tags if "id" in a]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_the_roofline_draws_the_roofs_in_use_and_names_their_source(analyze_report):
    text = render_html(analyze_report)
    page = Page(text)
    # llama_decode runs bf16 GEMMs and fp32 reductions: both compute roofs and the HBM roof, from the datasheet.
    assert "bf16 990 TFLOP/s" in page.text and "fp32 67.0 TFLOP/s" in page.text
    assert "HBM 4.80 TB/s" in page.text
    assert analyze_report["peaks"]["source"] in page.text
    # Hover text of the largest kernel: name, calls, µs per step, % of roof, estimate or not.
    top = analyze_report["kernels"][0]
    tips = [a["tip"] for a in page.find("circle", "kpoint") if a["data-kernel"] == "0"]
    assert len(tips) == 1
    tip = tips[0]
    assert top["name"][:40] in tip
    assert "96 calls" not in tip and "calls: 96 (32 per step)" in tip
    assert "250 µs per step" in tip and "53.2% of roof" in tip and "estimate" in tip


def test_findings_with_evidence_saving_and_fix(analyze_report, pipeline_report):
    for report in (analyze_report, pipeline_report):
        page = Page(render_html(report))
        rules = [a["data-rule"] for a in page.find("div", "finding")]
        assert rules == [f["rule_id"] for f in report["findings"]]
        for finding in report["findings"]:
            assert finding["message"] in page.text
            assert finding["title"] in page.text
            for key in finding["evidence"]:
                assert key in page.text
    page = Page(render_html(analyze_report))
    assert "28.1 ms per step (95.9% of the step)" in page.text
    assert "gpuadvisor apply model.py --fix graphs" in page.text


def test_timeline_strip_has_every_lane_the_step_has(pipeline_report, analyze_report):
    page = Page(render_html(pipeline_report))
    assert page.find("svg") and any(a.get("id") == "timeline-strip" for a in page.find("svg"))
    # input_pipeline: kernels, pageable copies, launch waits and the .item() syncs.
    for lane in ("GPU busy: kernels", "GPU busy: copies", "idle: waiting for launches", "idle: after host syncs"):
        assert lane in page.text
    lanes = {a["data-lane"] for a in page.find("rect", "seg")}
    assert {"kernels", "copies", "idle_launch", "idle_sync"} <= lanes
    # Without the timeline section (reports written before it), the steps still give the bars.
    bare = dict(analyze_report)
    bare.pop("timeline")
    page = Page(render_html(bare))
    assert not any(a.get("id") == "timeline-strip" for a in page.find("svg"))
    assert {a["data-lane"] for a in page.find("rect", "seg")} == {"busy", "idle_launch"}


def test_step_timeline_adds_up_to_the_step_breakdown():
    """The strip's lanes are the step table's figures: idle lanes sum to its idle split, copies to the memcpys."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.analysis.timeline import long_host_calls, step_timeline, sync_calls
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(SAMPLES / "input_pipeline.json.gz")
    analysis = analyze_trace(trace, lookup_peaks(trace.device))
    timeline = step_timeline(analysis.steps, analysis.activities, sync_calls(trace), long_host_calls(trace))
    row = analysis.steps.set_index("step").loc[timeline["step"]]
    assert timeline["step_time_us"] == pytest.approx(row["step_time_us"], abs=0.01)
    for lane, column in (
        ("idle_launch", "idle_launch_us"),
        ("idle_sync", "idle_sync_us"),
        ("idle_other", "idle_other_us"),
    ):
        assert sum(d for _, d in timeline[lane]) == pytest.approx(row[column], abs=0.1 + 0.001 * row[column])
    copies = sum(d for _, d in timeline["copies"])
    index = list(analysis.steps["step"]).index(timeline["step"])
    assert copies == pytest.approx(timeline["copy_us_per_step"][index], abs=0.05)
    assert copies > 9000  # the pageable 67 MB host-to-device copies: ~9.4 ms a step
    for lane in ("kernels", "copies", "idle_launch", "idle_sync", "idle_other"):
        assert all(0 <= s and s + d <= timeline["step_time_us"] + 0.02 for s, d in timeline[lane])
    # The cap keeps the longest intervals and says how many it left out.
    capped = step_timeline(
        analysis.steps, analysis.activities, sync_calls(trace), long_host_calls(trace), max_intervals=5
    )
    assert len(capped["kernels"]) == 5 and capped["omitted"]["kernels"] == len(timeline["kernels"]) - 5
    longest = sorted((d for _, d in timeline["kernels"]), reverse=True)[:5]
    assert sorted((d for _, d in capped["kernels"]), reverse=True) == longest


def test_apply_page_has_both_sides_the_ci_the_diff_and_each_fixs_numerics(apply_report, auto_report):
    text = render_html(apply_report)
    page = Page(text)
    # Before/after samples: one dot per sample.
    dist = text.split('id="apply-steps"', 1)[1].split("</svg>", 1)[0]
    assert dist.count('class="dot"') == len(apply_report["before"]["samples_us"]) + len(
        apply_report["after"]["samples_us"]
    )
    assert "25.9x" in page.text and "25.2x – 28x (95.0% CI)" in page.text
    for fix in apply_report["fixes"]:
        assert fix["fix_id"] in page.text
        assert fix["numerics"]["detail"] in page.text
    assert "sqnr_db 30.8 (bound 25)" in page.text
    assert "Kernels gone after the fixes (10)" in page.text and "Kernels new after the fixes (6)" in page.text
    assert _marks(page) == list(range(len(apply_report["kernels"])))
    # An auto run: the search's candidates, and the findings before the fixes.
    page = Page(render_html(auto_report))
    assert "Search" in page.text and "winner" in page.text and "slower" in page.text
    assert [a["data-rule"] for a in page.find("div", "finding")] == [
        f["rule_id"] for f in auto_report["before"]["findings"]
    ]


def test_compare_page_has_each_verdict_and_both_sides_samples(compare_inputs):
    result, base, current = compare_inputs
    text = render_html(result, base_report=base, current_report=current)
    page = Page(text)
    assert [a["data-verdict"] for a in page.find("div", "verdict")] == [result["verdict"]]
    metrics = [a["data-metric"] for a in page.find("div", "metric")]
    assert metrics == [m["key"] for m in result["metrics"]]
    step = text.split('data-metric="step_time"', 1)[1].split("</svg>", 1)[0]
    assert step.count('class="dot"') == len(base["summary"]["samples_us"]) + len(current["summary"]["samples_us"])
    for m in result["metrics"]:
        assert m["reason"] in page.text
    # Without the two reports: the verdicts, and a note saying what the distributions need.
    page = Page(render_html(result))
    assert "Sample distributions need the two reports" in page.text


def test_scan_page(scan_report):
    page = Page(render_html(scan_report))
    assert len(page.find("div", "finding")) == len(scan_report["findings"])
    assert "transpose_naive_32x32" in page.text


def _evil_report(report: dict) -> dict:
    evil = copy.deepcopy(report)
    evil["kernels"][0]["name"] = EVIL
    evil["kernels"][1]["name"] = EVIL_ATTR
    evil["kernels"][1]["dtype"] = EVIL_ATTR
    evil["findings"][0]["message"] = f"kernel {EVIL} is slow"
    evil["findings"][0]["evidence"][EVIL_ATTR] = EVIL
    evil["source"]["path"] = EVIL_ATTR
    evil["notes"] = [EVIL]
    evil["peaks"]["source"] = EVIL
    return evil


def test_untrusted_strings_are_inert(analyze_report, compare_inputs):
    text = render_html(_evil_report(analyze_report))
    assert EVIL not in text and EVIL_ATTR not in text
    assert "<img" not in text and "alert(1)</script>" not in text
    assert text.count("<script>") == 1  # only the page's own, static script
    page = Page(text)
    assert EVIL in page.text  # shown as the characters it is
    assert any(a["tip"].startswith(EVIL) for a in page.find("circle", "kpoint"))
    result, base, current = compare_inputs
    evil_result = copy.deepcopy(result)
    evil_result["metrics"][0]["name"] = EVIL
    evil_result["base"]["label"] = EVIL_ATTR
    text = render_html(evil_result, base_report=base, current_report=current)
    assert EVIL not in text and EVIL_ATTR not in text


# Any attribute that makes a browser fetch, unless it points inside the page (#...) or is inline (data:).
_URL_ATTR = re.compile(r"""\b(?:src|href|action|poster|srcset|xlink:href)\s*=\s*["']?(?![\"'#]|data:)""", re.I)


@pytest.mark.parametrize("name", ["analyze_report", "profile_report", "apply_report", "auto_report", "scan_report"])
def test_nothing_is_fetched_from_outside(name, request):
    text = render_html(request.getfixturevalue(name))
    assert 'src="http' not in text and "src='http" not in text
    assert not _URL_ATTR.search(text), _URL_ATTR.search(text)
    assert "@import" not in text and "url(http" not in text and '<link rel="stylesheet"' not in text
    assert len(text.encode()) <= MAX_HTML_BYTES


def test_size_bound_holds_for_a_large_report(analyze_report):
    """A report far larger than any command writes (1,000 kernel rows with 2 kB names, a strip of 1,500
    intervals a lane, 100k samples) still renders under the 5 MB bound."""
    big = copy.deepcopy(analyze_report)
    row = big["kernels"][0]
    big["kernels"] = [dict(row, name=f"kernel_{i}_" + "x" * 2000, us_per_step=1 + i) for i in range(1000)]
    strip = big["timeline"]
    for lane in ("kernels", "idle_launch", "idle_sync", "idle_other", "copies"):
        strip[lane] = [[i * 10.0, 5.0] for i in range(1500)]
    strip["step_time_us"] = 15000.0
    big["summary"]["samples_us"] = [1000.0 + i % 97 for i in range(100_000)]
    text = render_html(big)
    assert len(text.encode()) <= MAX_HTML_BYTES
    assert _marks(Page(text)) == list(range(1000))


def test_a_report_too_large_is_cut_to_fit_and_says_so(analyze_report):
    """1,000 rows of 6 kB names would make a 7 MB page: the page keeps the largest rows that fit, one mark each."""
    big = copy.deepcopy(analyze_report)
    row = big["kernels"][0]
    big["kernels"] = [dict(row, name=f"k{i}_" + "x" * 6000, us_per_step=1000 - i) for i in range(1000)]
    text = render_html(big)
    assert len(text.encode()) <= MAX_HTML_BYTES
    page = Page(text)
    shown = _marks(page)
    assert 10 < len(shown) < 1000 and shown == list(range(len(shown)))
    assert f"report.html shows the first {len(shown)} kernel rows of 1000" in page.text


def test_committed_reports_render_small(analyze_report, profile_report, apply_report, compare_inputs):
    result, base, current = compare_inputs
    sizes = {
        "analyze": len(render_html(analyze_report).encode()),
        "profile": len(render_html(profile_report).encode()),
        "apply": len(render_html(apply_report).encode()),
        "compare": len(render_html(result, base_report=base, current_report=current).encode()),
    }
    # Measured 2026-12-02: analyze 194 kB (the strip of 436 kernels and gaps), profile 82, apply 71, compare 28.
    assert all(size < 400_000 for size in sizes.values()), sizes


def test_memory_section_shows_what_capture_memory_summarises(profile_report):
    """The memory section renders capture/memory.py's three summaries as profile would attach them."""
    from gpuadvisor.capture import memory

    stats = {
        "allocated_bytes.all.peak": 2_051_764_736,
        "reserved_bytes.all.peak": 2_908_749_824,
        "num_alloc_retries": 2,
    }
    report = copy.deepcopy(profile_report)
    report["memory"] = {
        "allocator": memory.allocator_summary(stats, 150_109_880_320),
        "snapshot": {
            "segments": 3,
            "reserved_bytes": 3 << 30,
            "free_bytes": 1 << 30,
            "largest_free_block_bytes": 1 << 28,
            "external_fragmentation_pct": 75.0,
            "peak_bytes": 2 << 30,
            "bytes_by_category": {"parameters": 1 << 30, memory.CATEGORY_ACTIVATIONS: 1 << 29},
            "top_sites": [{"site": f"model.py:12 ({EVIL})", "bytes": 1 << 29, "count": 4}],
        },
        "kv_cache": memory.kv_cache_capacity(65_536, 147_201_130_496, 1024, itemsize=2, mean_tokens=300),
    }
    text = render_html(report)
    page = Page(text)
    for label in (
        "reserved − allocated at the peak",
        "857 MB",
        "29.5%",
        "allocation retries",
        "Bytes by category",
        "activations and temporaries",
        "Largest allocation sites",
        "KV cache capacity",
        "2,193",
        "4,386",
    ):
        assert label in page.text, label
    assert EVIL not in text and f"model.py:12 ({EVIL})" in page.text


def test_a_report_with_nothing_in_it_renders():
    for report in (
        {},
        {"command": "profile", "summary": {}, "kernels": [], "findings": []},
        {"verdict": "pass", "metrics": []},
    ):
        text = render_html(report)
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


def test_reports_carry_the_timeline_of_their_median_step(analyze_report):
    """build_report's ``timeline`` is step_timeline of the analysis (the renderer's strip reads it)."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.analysis.timeline import long_host_calls, step_timeline, sync_calls
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.report.json import to_plain
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(SAMPLES / "llama_decode.json.gz")
    analysis = analyze_trace(trace, lookup_peaks(trace.device))
    assert analyze_report["timeline"] == to_plain(
        step_timeline(analysis.steps, analysis.activities, sync_calls(trace), long_host_calls(trace))
    )
    assert analyze_report["timeline"]["kernels"] and 'id="timeline-strip"' in render_html(analyze_report)


# --- the commands write it ----------------------------------------------------------------------------------


def _page_checks(text: str, report: dict) -> Page:
    """A whole document, with one roofline mark per kernel row of ``report`` and its findings."""
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n"), (text[:40], text[-40:])
    page = Page(text)
    if report_kind(report) in ("trace", "apply"):
        assert _marks(page) == list(range(len(report["kernels"])))
    findings = [f["rule_id"] for f in report.get("findings") or []]
    assert [a.get("data-rule") for a in page.find("div", "finding")][: len(findings)] == findings
    return page


def test_analyze_out_writes_report_html(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("analyze", "--sample", "input_pipeline", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "report.html" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.html").read_text(encoding="utf-8")
    page = _page_checks(text, report)
    assert report["kernels"] and report["findings"] and report["timeline"]
    assert page.find("svg", "chart") and 'id="timeline-strip"' in text
    assert text == render_html(report).rstrip("\n") + "\n"  # the page of the report written beside it
    assert (out / "report.html").stat().st_mode & 0o777 == (out / "report.json").stat().st_mode & 0o777


def test_analyze_format_html_prints_the_page(cli):
    result = cli("analyze", "--sample", "llama_decode", "--format", "html")
    assert result.returncode == 0, result.stderr
    report = json.loads(cli("analyze", "--sample", "llama_decode", "--format", "json").stdout)
    _page_checks(result.stdout, report)
    assert len(report["kernels"]) > 1


def test_compare_html_writes_the_page_and_format_html_prints_it(cli, tmp_path):
    base, current = RESULTS / "gate" / "base" / "00.json", RESULTS / "gate" / "slow10" / "00.json"
    target = tmp_path / "gate.html"
    result = cli("compare", base, current, "--html", target, "--format", "json")
    assert result.returncode == 1, result.stderr  # slow10 is a regression: the page is written all the same
    verdict = json.loads(result.stdout)
    text = target.read_text(encoding="utf-8")
    page = _page_checks(text, verdict)
    assert [a["data-verdict"] for a in page.find("div", "verdict")] == [verdict["verdict"]]
    assert [a["data-metric"] for a in page.find("div", "metric")] == [m["key"] for m in verdict["metrics"]]
    # Both sides' step samples are drawn (gate holds them as arrays; the page gets them as lists).
    step = text.split('data-metric="step_time"', 1)[1].split("</svg>", 1)[0]
    samples = [json.loads(p.read_text())["summary"]["samples_us"] for p in (base, current)]
    assert step.count('class="dot"') == sum(len(s) for s in samples)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.html"]  # no temporary file left
    printed = cli("compare", base, current, "--format", "html")
    assert printed.returncode == 1 and printed.stdout.startswith("<!DOCTYPE html>")
    assert 'data-metric="step_time"' in printed.stdout


def test_scan_out_writes_report_html(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("scan", REPO / "tests" / "scan_corpus", "--out", out, "--format", "json")
    assert result.returncode == 0, result.stderr
    scan = json.loads((out / "scan.json").read_text())
    text = (out / "report.html").read_text(encoding="utf-8")
    _page_checks(text, scan)
    assert "transpose_naive_32x32" in Page(text).text
    printed = cli("scan", REPO / "tests" / "scan_corpus", "--format", "html")
    assert printed.returncode == 0 and printed.stdout == text


@pytest.mark.parametrize(
    ("args", "known"),
    [
        (["rules"], "terminal, json or markdown"),
        (["diff", SAMPLES / "gemm.json.gz", SAMPLES / "gemm.json.gz"], "terminal, json or markdown"),
    ],
)
def test_a_command_without_html_refuses_it_naming_its_formats(cli, args, known):
    result = cli(*args, "--format", "html")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert f"--format html: not supported by {args[0]}; use {known}" in result.stderr


# --- the browser ----------------------------------------------------------------------------------------


def _playwright():
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        pytest.skip("no chromium (Debian package `chromium`): the browser tests skip")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _playwright()
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    with sync_playwright() as p:
        # As root Chromium needs --no-sandbox; the rest keep it from calling home (updates, sync, field trials).
        b = p.chromium.launch(
            executable_path=executable,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


def _open(browser, path: Path):
    """Open ``path``; returns (page, problems) where problems lists console errors, page errors, dialogs and
    every request for anything but the file itself (those are aborted)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    url = path.resolve().as_uri()

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            problems.append(f"request: {r.request.url}")
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def dialog(d):
        problems.append(f"dialog: {d.message}")
        d.dismiss()

    page.on("dialog", dialog)
    page.goto(url, wait_until="load")
    page.wait_for_timeout(100)
    return page, problems


def _check_in_browser(browser, tmp_path: Path, name: str, text: str, report: dict) -> Path:
    path = tmp_path / f"{name}.html"
    path.write_text(text, encoding="utf-8")
    page, problems = _open(browser, path)
    try:
        assert problems == []
        kernels = report.get("kernels") or [] if report_kind(report) in ("trace", "apply") else []
        indices = page.eval_on_selector_all("circle.kpoint", "els => els.map(e => +e.dataset.kernel)")
        assert sorted(indices) == list(range(len(kernels)))
        findings = page.eval_on_selector_all("div.finding", "els => els.map(e => e.dataset.rule)")
        expected = [f["rule_id"] for f in report.get("findings") or []]
        if report.get("command") == "apply":
            expected += [f["rule_id"] for f in (report.get("before") or {}).get("findings") or []]
        assert findings == expected
        # The script replaced the native <title> tooltips with its own box.
        if kernels:
            assert page.eval_on_selector_all("circle.kpoint title", "els => els.length") == 0
            page.dispatch_event("circle.kpoint[data-kernel='0']", "mouseover")
            assert page.locator("#tip").is_visible()
            assert page.locator("#tip").text_content().startswith(str(kernels[0]["name"])[:30])
        shot = tmp_path / f"{name}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000
        return shot
    finally:
        page.context.close()


@pytest.mark.slow
def test_analyze_page_in_chromium(browser, tmp_path, analyze_report, pipeline_report):
    _check_in_browser(browser, tmp_path, "analyze", render_html(analyze_report), analyze_report)
    # The README's picture: the input pipeline sample has every class, copies, syncs and four findings.
    _check_in_browser(browser, tmp_path, "pipeline", render_html(pipeline_report), pipeline_report)
    if os.environ.get("GPUADVISOR_UPDATE_SCREENSHOT"):
        page, problems = _open(browser, tmp_path / "pipeline.html")
        try:
            page.set_viewport_size({"width": 1280, "height": 2000})
            page.screenshot(path=str(REPO / "docs" / "report.png"))
        finally:
            page.context.close()
        assert problems == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["profile_report", "apply_report", "auto_report", "scan_report"])
def test_each_kind_of_report_in_chromium(browser, tmp_path, name, request):
    report = request.getfixturevalue(name)
    _check_in_browser(browser, tmp_path, name, render_html(report), report)


@pytest.mark.slow
def test_compare_page_in_chromium(browser, tmp_path, compare_inputs):
    result, base, current = compare_inputs
    path = tmp_path / "compare.html"
    path.write_text(render_html(result, base_report=base, current_report=current), encoding="utf-8")
    page, problems = _open(browser, path)
    try:
        assert problems == []
        assert page.locator("div.verdict").get_attribute("data-verdict") == result["verdict"]
        assert page.locator("div.metric").count() == len(result["metrics"])
        dots = page.locator("div.metric[data-metric='step_time'] circle.dot").count()
        assert dots == len(base["summary"]["samples_us"]) + len(current["summary"]["samples_us"])
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    finally:
        page.context.close()


@pytest.mark.slow
def test_kernels_table_sorts(browser, tmp_path, analyze_report):
    path = tmp_path / "sort.html"
    path.write_text(render_html(analyze_report), encoding="utf-8")
    page, problems = _open(browser, path)
    try:
        column = "#kernels-table tbody tr td:nth-child(6)"  # time/step
        page.click("#kernels-table th:nth-child(6)")
        ascending = [float(v) for v in page.eval_on_selector_all(column, "els => els.map(e => e.dataset.sort)")]
        assert ascending == sorted(ascending) and ascending[0] < ascending[-1]
        page.click("#kernels-table th:nth-child(6)")
        descending = [float(v) for v in page.eval_on_selector_all(column, "els => els.map(e => e.dataset.sort)")]
        assert descending == sorted(ascending, reverse=True)
        page.click("#kernels-table th:nth-child(2)")  # by name, as text
        names = page.eval_on_selector_all(
            "#kernels-table tbody tr td:nth-child(2)", "els => els.map(e => e.dataset.sort)"
        )
        assert names == sorted(names, key=str.lower)
        assert problems == []
    finally:
        page.context.close()


@pytest.mark.slow
def test_a_script_in_a_kernel_name_does_not_run(browser, tmp_path, analyze_report):
    evil = _evil_report(analyze_report)
    path = tmp_path / "evil.html"
    path.write_text(render_html(evil), encoding="utf-8")
    page, problems = _open(browser, path)
    try:
        assert problems == []  # no alert dialog, no request for the <img src=x>
        assert page.locator("img").count() == 0
        assert page.locator("script").count() == 1
        titles = page.eval_on_selector_all("#kernels-table td.name", "els => els.map(e => e.title)")
        assert EVIL in titles and EVIL_ATTR in titles
        assert page.eval_on_selector("circle.kpoint[data-kernel='0']", "e => e.dataset.tip").startswith(EVIL)
    finally:
        page.context.close()


# The pages written on the H200 and committed (issue: one profile, one apply and one compare page), opened as
# they are: no console error, nothing fetched, a roofline mark per kernel row of the report beside them.
COMMITTED_PAGES = [
    "profile_llama_memory",
    "apply_hf_llama_decode_fusion_graphs",
    "apply_hf_resnet_train_auto",
    "profile_variable_batches",
    # `gpuadvisor analyze sample_traces/NAME.json.gz --out benchmarks/results/sample_reports/NAME`
    "sample_reports/gemm",
    "sample_reports/add_rmsnorm",
    "sample_reports/input_pipeline",
    "sample_reports/llama_decode",
]


@pytest.mark.slow
@pytest.mark.parametrize("folder", COMMITTED_PAGES)
def test_committed_h200_pages_open_clean(browser, tmp_path, folder):
    page_path = RESULTS / folder / "report.html"
    assert page_path.stat().st_size <= MAX_HTML_BYTES
    report = json.loads((RESULTS / folder / "report.json").read_text())
    assert report["env"]["gpu_name"] == "NVIDIA H200"
    _check_in_browser(browser, tmp_path, folder.replace("/", "_"), page_path.read_text(encoding="utf-8"), report)


@pytest.mark.slow
def test_committed_compare_page_opens_clean(browser):
    page, problems = _open(browser, RESULTS / "gate" / "compare_base_slow10.html")
    try:
        assert problems == []
        assert page.locator("div.verdict").get_attribute("data-verdict") == "regression"
        assert page.locator("div.metric").count() >= 1
    finally:
        page.context.close()
