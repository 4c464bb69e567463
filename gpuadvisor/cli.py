"""The `gpuadvisor` command line: one small function per command; errors map to exit codes here.

Exit codes: 0 success; 1 `--fail-on` matched (or a gate regression); 2 bad input or usage;
3 the user's own code failed; 130 interrupted (Ctrl-C); 143 terminated (SIGTERM), cleaned up the same way.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from gpuadvisor import __version__
from gpuadvisor.errors import EXIT_FINDINGS, BadInputError, GpuAdvisorError

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in gpuadvisor, not in the input

app = typer.Typer(
    name="gpuadvisor",
    help=(
        "Why is my GPU step slow? gpuadvisor reads a PyTorch profiler trace, classifies every kernel by roofline "
        "(compute, memory, latency or launch bound), finds launch gaps, host syncs and pageable copies, and ranks "
        "the findings by the time they cost."
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEFAULT_SAMPLE = "llama_decode"
_DEBUG = False


class OutputFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    markdown = "markdown"
    html = "html"


class TerminalOrJson(str, Enum):
    """The formats of a command without a Markdown form (calibrate)."""

    terminal = "terminal"
    json = "json"


class Severity(str, Enum):
    high = "high"
    medium = "medium"
    low = "low"
    info = "info"


# Options shared by several commands: one definition each, the same name and help everywhere.
FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format", "-f", help="terminal (rich tables), json, markdown or html (one self-contained page), to stdout."
    ),
]
PeaksOption = Annotated[
    Path | None, typer.Option("--peaks", help="TOML/JSON file with this GPU's peaks (overrides the table).")
]
RulesOption = Annotated[
    Path | None, typer.Option("--rules", help="Folder of extra rule files; same ids override built-ins.")
]
TopKernelsOption = Annotated[int, typer.Option("--top", min=1, help="Kernels to show in the terminal.")]
FailOnOption = Annotated[
    Severity | None, typer.Option("--fail-on", help="Exit 1 when a finding of this severity or worse exists.")
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuadvisor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")] = False,
) -> None:
    global _DEBUG
    _DEBUG = debug


def _sample_path(name: str) -> Path:
    from gpuadvisor.sample_data import sample_names, sample_path

    path = sample_path(name)
    if path is None:
        known = ", ".join(sample_names()) or "none found (this install has no gpuadvisor/samples/)"
        raise BadInputError(f"no bundled sample '{name}' (available: {known})")
    return path


def _console(stderr: bool = False):
    from gpuadvisor.emit import terminal_console

    return terminal_console(stderr=stderr)


@app.command()
def analyze(
    trace: Annotated[
        Path | None,
        typer.Argument(
            help="A Kineto trace from torch.profiler (.json or .json.gz), or a folder of per-rank traces. "
            f"Leave it out to analyze the bundled '{DEFAULT_SAMPLE}' sample.",
            show_default=False,
        ),
    ] = None,
    sample: Annotated[
        str | None,
        typer.Option(
            "--sample", help="Analyze a bundled sample trace: llama_decode, add_rmsnorm, gemm, input_pipeline."
        ),
    ] = None,
    output_format: FormatOption = OutputFormat.terminal,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Also write report.json, report.md and report.html into this folder."),
    ] = None,
    peaks: PeaksOption = None,
    rules: RulesOption = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Which rank to analyze in a multi-rank folder.")] = None,
    top: TopKernelsOption = 10,
    fail_on: FailOnOption = None,
) -> None:
    """Analyze a profiler trace: roofline class per kernel, step time breakdown, ranked findings.

    Examples:

      gpuadvisor analyze                        # the bundled LLM decode sample

      gpuadvisor analyze trace.json.gz --out report/     # report.html: roofline, timeline, findings

      gpuadvisor analyze traces/ --rank 1 --format json > rank1.json
    """
    from gpuadvisor.pipeline import analyze_path
    from gpuadvisor.views import report_view

    view = report_view("analyze", top)
    view.check(output_format)
    if trace is not None and sample is not None:
        raise BadInputError("give a trace path or --sample, not both")
    path = trace if trace is not None else _sample_path(sample or DEFAULT_SAMPLE)
    if not path.exists():  # before the trace reader (and pandas) is imported: a typo answers at once
        raise BadInputError(f"{path}: no such file or directory")
    status_console = _console(stderr=True)
    with status_console.status(f"Analyzing {path} …", spinner="dots") if sys.stderr.isatty() else _nullcontext():
        report = analyze_path(path, peaks_file=peaks, rules_dir=rules, rank=rank)
    if out is not None:
        from gpuadvisor.report.write import write_reports

        write_reports(report, out)
    _emit(report, view, output_format)
    if out is not None and output_format is OutputFormat.terminal:
        _console().print(f"[dim]wrote {out / 'report.json'}, {out / 'report.md'} and {out / 'report.html'}[/dim]")
    _check_fail_on(report, fail_on)


@app.command()
def profile(
    model: Annotated[
        Path,
        typer.Argument(help="A model.py file: build() returns (model, example_inputs); optional step(model, inputs)."),
    ],
    entry: Annotated[
        str | None, typer.Option("--entry", help="Another build function: 'build_small' or 'pkg.module:function'.")
    ] = None,
    warmup: Annotated[
        int,
        typer.Option(
            "--warmup", min=0, help="Untimed steps first (compilation, autotuning); on a GPU at least 3 s of steps."
        ),
    ] = 5,
    steps: Annotated[
        int,
        typer.Option("--steps", min=1, help="Steps timed with CUDA events, no profiler (at least; see --min-time)."),
    ] = 30,
    min_time: Annotated[
        float,
        typer.Option(
            "--min-time",
            min=0,
            max=600,
            metavar="SECONDS",
            help="On a GPU, time more than --steps steps when they take less than this many seconds, so a "
            "short stretch of host or clock noise cannot decide the median (0: exactly --steps).",
        ),
    ] = 5.0,
    profile_steps: Annotated[int, typer.Option("--profile-steps", min=1, help="Steps recorded by the profiler.")] = 3,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (default: gpuadvisor-out/<model name>): trace.json.gz, "
            "report.json, report.md, report.html, nvml.csv.",
        ),
    ] = None,
    output_format: FormatOption = OutputFormat.terminal,
    peaks: PeaksOption = None,
    rules: RulesOption = None,
    nvml: Annotated[bool, typer.Option("--nvml/--no-nvml", help="Sample clocks, power and energy with NVML.")] = True,
    memory: Annotated[
        bool,
        typer.Option(
            "--memory",
            help="Also take a memory snapshot over 3 extra untimed steps (CUDA): bytes by category (parameters, "
            "gradients, optimizer state, activations, caches), the largest allocation sites, fragmentation.",
        ),
    ] = False,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Run N ranks under torchrun (one GPU each; gloo on the CPU) and compare them: rank<N>/ folders "
            "plus a merged report with a per-rank table.",
        ),
    ] = None,
    top: TopKernelsOption = 10,
    fail_on: FailOnOption = None,
) -> None:
    """Run a model under the profiler and NVML: honest step times, roofline classes, ranked findings.

    Three phases: warm-up; timing without the profiler (CUDA events per step, NVML sampling clocks,
    power and energy); a few profiled steps with shapes, FLOPs and Python stacks. Without CUDA the
    model runs on the CPU and the report says which GPU analyses were skipped.

    Memory (CUDA): the caching allocator's peaks over the timed steps (allocated, reserved, reserved minus
    allocated, retries, OOMs, headroom) and, for a decode workload (KIND = "decode", a cache in the inputs or
    KV-cache buffers in the model), the KV cache's bytes per token and the tokens and sequences that fit;
    --memory adds a snapshot summary over a few extra untimed steps (skipped, with a note, without CUDA).

    Several ranks (docs/distributed.md): --nproc N launches N ranks under torchrun; each runs the same
    phases in lockstep and writes rank<r>/ (trace, report); the merged report compares the ranks
    (timed vs trace step, GPU busy, communication, exposed communication, straggler). Running
    `torchrun --nproc-per-node N -m gpuadvisor profile model.py` does the same, rank 0 merging.
    A rank that fails: one line naming it, exit 3; Ctrl-C stops every rank (exit 130); nothing is written.

    Examples:

      gpuadvisor profile examples/llama_decode.py --out runs/decode --memory

      gpuadvisor profile --nproc 2 examples/ddp_train.py --out runs/ddp
    """
    from gpuadvisor.profile import run_profile
    from gpuadvisor.views import report_view

    view = report_view("profile", top)
    view.check(output_format)
    report = run_profile(
        model,
        entry=entry,
        warmup=warmup,
        timed_steps=steps,
        profiled_steps=profile_steps,
        min_time_s=min_time,
        out_dir=out,
        peaks_file=peaks,
        rules_dir=rules,
        nvml=nvml,
        progress=sys.stderr.isatty(),
        nproc=nproc,
        show_rank_output=_DEBUG,
        memory=memory,
    )
    if report is None:  # a rank other than 0 under torchrun: rank 0 prints the merged report
        return
    _emit(report, view, output_format)
    _check_fail_on(report, fail_on)


@app.command("apply")
def apply_fixes(
    model: Annotated[
        Path,
        typer.Argument(help="A model.py file: build() returns (model, example_inputs); optional step(model, inputs)."),
    ],
    fix: Annotated[
        str,
        typer.Option(
            "--fix",
            help="Fix ids, comma-separated: sdpa, channels_last, bf16, tf32, fused_optimizer, fusion, fp8, "
            "compile, graphs; or 'auto': a measured search over stacks built from the findings (and compile), "
            "keeping the fastest that passes the numerics guard.",
            show_default=False,
        ),
    ],
    entry: Annotated[
        str | None, typer.Option("--entry", help="Another build function: 'build_small' or 'pkg.module:function'.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (default: gpuadvisor-out/<model name>-apply): report.json, report.md, report.html, "
            "before_trace.json.gz, after_trace.json.gz.",
        ),
    ] = None,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, help="Untimed steps first, before and again after the fixes.")
    ] = 5,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed steps per side and round (CUDA events).")] = 20,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Interleaved rounds; each times one block of before and of after. From 6 rounds the "
            "report adds a paired speedup (median of per-round ratios); for a host-bound step on a shared host, "
            "many short rounds (--rounds 60 --steps 2) pair the sides closely in time.",
        ),
    ] = 5,
    profile_steps: Annotated[int, typer.Option("--profile-steps", min=1, help="Steps recorded by the profiler.")] = 3,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Exit 2, writing nothing, when a requested fix is refused or rolled back (auto: when the search"
            " keeps nothing).",
        ),
    ] = False,
    profile_after: Annotated[
        bool,
        typer.Option("--profile-after/--no-profile-after", help="Profile the patched step for the per-kernel diff."),
    ] = True,
    budget: Annotated[
        float,
        typer.Option(
            "--budget",
            min=0,
            metavar="SECONDS",
            help="--fix auto: no new candidate starts after this many seconds of searching (the first stack and "
            "compile alone always run).",
        ),
    ] = 120.0,
    output_format: FormatOption = OutputFormat.terminal,
    peaks: PeaksOption = None,
    rules: RulesOption = None,
) -> None:
    """Apply fixes to a model, check its numbers, re-measure, and report before against after.

    The fixes (run in this order; each checks first and refuses, with the reason, where it cannot help):

    \b
      sdpa: transformers models on the eager attention path switched to
        scaled_dot_product_attention for each step.
      channels_last: convolution models and 4-D inputs in channels_last.
      bf16: the step under torch.autocast(bfloat16), judged against the
        model's own bf16 noise.
      tf32: float32 matmuls on the tensor cores in TF32 while the step runs
        (CUDA, Ampere or newer), judged against the model's own TF32 rounding.
      fused_optimizer: optimizers running one parameter at a time switched to
        fused or foreach.
      fusion: swap modules for fused Triton kernels (RMSNorm, residual add + RMSNorm, SwiGLU,
        decode-shape linear and attention); pays inside a CUDA graph, so use it with graphs.
      fp8: float8 weights with per-row scales for linears called with at most 16 rows
        (decode), on compute capability 8.9 or newer; each layer left alone is listed.
      compile: torch.compile of the step's modules, the mode (default, reduce-overhead) chosen
        by measurement; compile time and graph breaks in the report.
      graphs: capture the whole step in one CUDA graph and replay it; refused, with the source
        line, for host syncs (.item()), CPU tensors, changing shapes, or no CUDA.

    --fix auto on a GPU is a search: the stacks the findings suggest, and torch.compile, are each
    applied and guarded, timed against the original, and the fastest is kept (--budget bounds it);
    the report lists every candidate with its time and why it lost.

    After each fix a numerics guard compares the patched model with the original on fresh inputs
    (against the model's own precision noise: at most 2x the original's error vs an fp32 reference;
    fp8: SQNR >= 25 dB; NaN/Inf parity always); a fix that fails it is rolled back. Before and after
    are then timed in the same process, in interleaved rounds, and the speedup is reported with a 95%
    bootstrap confidence interval, beside the savings the findings predicted. The report ends with the
    two lines that keep the fixes in your own code. docs/apply.md says more.

    Exit codes: 0 done (refused fixes are reported, not errors); 2 bad input, or --strict and a
    requested fix was refused or rolled back (nothing is written); 3 your model's code raised;
    130 interrupted, 143 terminated by SIGTERM (nothing is written).

    Examples:

      gpuadvisor apply examples/llama_decode.py --fix graphs

      gpuadvisor apply model.py --fix auto --out runs/fixed

      gpuadvisor apply model.py --fix fusion,graphs --strict --format json > fixed.json
    """
    from gpuadvisor.apply import run_apply
    from gpuadvisor.views import apply_view

    view = apply_view()
    view.check(output_format)
    report = run_apply(
        model,
        fix,
        entry=entry,
        out_dir=out,
        warmup=warmup,
        steps=steps,
        rounds=rounds,
        profiled_steps=profile_steps,
        strict=strict,
        rules=rules,
        peaks_file=peaks,
        progress=sys.stderr.isatty(),
        profile_after=profile_after,
        budget_s=budget,
    )
    _emit(report, view, output_format)


@app.command()
def calibrate(
    force: Annotated[bool, typer.Option("--force", help="Measure again even if this GPU has cached roofs.")] = False,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="terminal or json.")] = (
        TerminalOrJson.terminal
    ),
) -> None:
    """Measure this GPU's roofs (copy bandwidth, GEMM rate per dtype) in under a minute and cache them.

    profile and analyze use the cached roofs for this GPU and driver instead of the datasheet table.
    """
    from gpuadvisor.device.calibrate import run_calibration
    from gpuadvisor.views import calibrate_view

    view = calibrate_view()
    view.check(output_format)
    result = run_calibration(force=force, progress=sys.stderr.isatty())
    _emit(result, view, output_format)


@app.command()
def doctor() -> None:
    """Check what profiling needs: GPU, driver, CUDA, torch, triton, CUPTI, NVML, Nsight Compute.

    Exit codes: 0 the GPU path is usable (Python, torch with CUDA, a CUDA device, the NVIDIA driver, the CUDA
    runtime, CUPTI and NVML all OK); 1 one of those failed, so profile and apply would run on the CPU or without
    GPU activity or power and energy. triton, Nsight Compute (ncu) and a calibration are optional: they are
    listed, but do not change the exit code.
    """
    from gpuadvisor.doctor import gpu_path_missing, run_checks
    from gpuadvisor.views import doctor_view

    checks = run_checks()
    _emit(checks, doctor_view(), "terminal")
    if gpu_path_missing(checks):
        raise typer.Exit(EXIT_FINDINGS)


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="The base report.json (from profile or analyze), e.g. main's.")],
    current: Annotated[Path, typer.Argument(help="The current report.json, e.g. the pull request's.")],
    output_format: FormatOption = OutputFormat.terminal,
    junit_xml: Annotated[
        Path | None, typer.Option("--junit-xml", help="Also write JUnit XML here: one test case per metric.")
    ] = None,
    html_file: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write the comparison as one HTML page here: verdicts and both sides' samples."
        ),
    ] = None,
    threshold_pct: Annotated[
        float | None,
        typer.Option("--threshold-pct", min=0, help="Ratio threshold in % for every timed, memory and energy metric."),
    ] = None,
    alpha: Annotated[
        float | None, typer.Option("--alpha", min=0, max=1, help="Significance level of the Mann–Whitney test.")
    ] = None,
    top: Annotated[int | None, typer.Option("--top", min=0, help="Kernels compared, from each report's top.")] = None,
    allow_env_drift: Annotated[
        bool, typer.Option("--allow-env-drift", help="Compare runs from different GPUs, drivers, CUDA, torch, clocks.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on an inconclusive verdict too.")] = False,
) -> None:
    """Gate CI on two reports: regression (exit 1), pass or inconclusive (exit 0), not comparable (exit 2).

    Step times are tested with a one-sided Mann–Whitney U test on the samples AND a ratio threshold AND
    an absolute floor; counters compare exactly. Thresholds come from [tool.gpuadvisor.compare] in the
    nearest pyproject.toml (from the current folder upwards), then from the flags. Markdown is appended
    to $GITHUB_STEP_SUMMARY when it is set.

    Example:

      gpuadvisor compare main/report.json pr/report.json --junit-xml gate.xml --html gate.html
    """
    from gpuadvisor import gate
    from gpuadvisor.views import compare_view

    compare_view().check(output_format)
    reports = gate.load_reports(base, current)  # samples as arrays: 10 M a side stay under 1 GB
    view = compare_view(reports)
    config = gate.find_config(Path.cwd())
    settings, _ = gate.load_settings(config, {"--threshold-pct": threshold_pct, "--alpha": alpha, "--top": top})
    result = gate.compare_reports(*reports, settings, allow_env_drift=allow_env_drift, labels=(str(base), str(current)))
    result["config"] = str(config) if config else None
    if junit_xml is not None:
        _write_text(junit_xml, gate.render_junit_xml(result, strict), "--junit-xml")
    if html_file is not None:
        from gpuadvisor.views import compare_html

        _write_text(html_file, compare_html(result, reports), "--html")
    _append_step_summary(gate.render_markdown(result))
    _emit(result, view, output_format)
    code = gate.exit_code(result, strict)
    if code != 0:
        _error_line(gate.summary_line(result, strict))
    raise typer.Exit(code)


@app.command()
def diff(
    base: Annotated[Path, typer.Argument(help="The base Kineto trace (.json or .json.gz).")],
    current: Annotated[Path, typer.Argument(help="The current Kineto trace.")],
    output_format: FormatOption = OutputFormat.terminal,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows per table, largest change first.")] = 15,
    rank: Annotated[int | None, typer.Option("--rank", help="Which rank of a multi-rank folder to compare.")] = None,
) -> None:
    """What changed between two traces: kernels, copies and CPU operators added, removed, slower or faster,
    by total time per step (per trace when either lacks ProfilerStep annotations), largest change first.

    Example:

      gpuadvisor diff main/trace.json.gz pr/trace.json.gz --top 10
    """
    from gpuadvisor.views import diff_view

    view = diff_view()
    view.check(output_format)
    for path in (base, current):
        if not path.exists():  # before pandas is imported: a typo answers at once
            raise BadInputError(f"{path}: no such file or directory")
    from gpuadvisor import diff as trace_diff

    result = trace_diff.diff_paths(base, current, rank=rank, top=top)
    _emit(result, view, output_format)


def _write_text(path: Path, text: str, option: str) -> None:
    from gpuadvisor.outputs import write_atomic

    try:
        write_atomic(path, text)
    except OSError as exc:
        raise BadInputError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def _write_files(out: Path, files: dict) -> None:
    """``--out`` of scan and ncu: every file or none (gpuadvisor.outputs); a dict or list is written as JSON with
    the one encoder, text as it is."""
    from gpuadvisor.outputs import write_files
    from gpuadvisor.report.json import to_json

    write_files(out, {name: value if isinstance(value, str) else to_json(value) for name, value in files.items()})


def _append_step_summary(markdown: str) -> None:
    """Append to the file GitHub Actions names in $GITHUB_STEP_SUMMARY; a failure there only warns."""
    import os

    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        from gpuadvisor.inputs import open_append  # a regular file only: a FIFO there must not hang the gate

        with open_append(path) as handle:
            handle.write(markdown + "\n")
    except OSError as exc:
        _error_line(f"warning: cannot append to $GITHUB_STEP_SUMMARY {path}: {exc.strerror or exc}")


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _emit(result, view, output_format) -> None:
    """The one output of every command: ``result`` on stdout in ``output_format`` (gpuadvisor.emit)."""
    from gpuadvisor.emit import emit

    emit(result, view, output_format, _console())


def _check_fail_on(report: dict, fail_on: Severity | None) -> None:
    if fail_on is None:
        return
    from gpuadvisor.rules.engine import SEVERITY_RANK

    limit = SEVERITY_RANK[fail_on.value]
    hits = [f for f in report.get("findings", []) if SEVERITY_RANK.get(f["severity"], 9) <= limit]
    if hits:
        _error_line(f"--fail-on {fail_on.value}: {len(hits)} finding(s) at or above it")
        raise typer.Exit(EXIT_FINDINGS)


@app.command("rules")
def list_rules(
    rules: RulesOption = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="terminal, json or markdown (the README's rule table).")
    ] = OutputFormat.terminal,
) -> None:
    """List the rules: id, severity, category, the `apply` fix that addresses it, and its title."""
    from gpuadvisor.rules.engine import load_rules
    from gpuadvisor.views import rules_view

    view = rules_view()
    view.check(output_format)
    _emit(load_rules(rules), view, output_format)


@app.command()
def explain(
    rule_id: Annotated[str, typer.Argument(help="A rule id (GA101) or name (launch-bound).")],
    rules: RulesOption = None,
) -> None:
    """Explain a rule: what it detects, why it costs time, an example, and the fix."""
    from gpuadvisor.rules.engine import find_rule, load_rules
    from gpuadvisor.views import explain_view

    _emit(find_rule(rule_id, load_rules(rules)), explain_view(), "terminal")


@app.command()
def scan(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="CUDA sources (.cu, .cuh), Python files with CUDA in load_inline/cupy.RawKernel strings, or folders.",
            show_default=False,
        ),
    ],
    output_format: FormatOption = OutputFormat.terminal,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Also write scan.json, scan.md and report.html into this folder."),
    ] = None,
    block_dim: Annotated[
        str | None,
        typer.Option(
            "--block-dim", help="Block shape X[,Y[,Z]] for kernels without a `// gpuadvisor: blockDim=` hint."
        ),
    ] = None,
    rules: RulesOption = None,
    fail_on: FailOnOption = None,
) -> None:
    """Predict shared-memory bank conflicts in CUDA C++ sources (rule GA501), line by line, with the fix.

    Each kernel's shared-memory subscripts are interpreted for every warp of one block; an access is
    clean, an n-way conflict (with a padding or XOR-swizzle fix checked the same way), or unknown with
    the reason. A file that cannot be read as CUDA (over 8 MiB, binary, not UTF-8, unbalanced braces) gives
    one warning line and is skipped; the exit code is 0 when at least one file was scanned, 2 when none
    could be or a path does not exist.

    Examples:

      gpuadvisor scan src/kernels/

      gpuadvisor scan transpose.cu --block-dim 32,8 --format json
    """
    from gpuadvisor.scan import report as scan_report
    from gpuadvisor.scan.analyze import parse_block_dim
    from gpuadvisor.views import scan_view

    view = scan_view()
    view.check(output_format)
    try:
        shape = parse_block_dim(block_dim) if block_dim is not None else None
    except ValueError as exc:
        raise BadInputError(f"--block-dim: {exc}") from None
    result = scan_report.scan_paths(list(paths), block_dim=shape, rules_dir=rules)
    for warning in result["warnings"]:
        _error_line(f"warning: {warning}")
    scan_report.exit_code(result)
    if out is not None:
        from gpuadvisor.report.html import render_html

        files = {
            "scan.json": result,
            "scan.md": scan_report.render_markdown(result),
            "report.html": render_html(result),
        }
        _write_files(out, files)
    _emit(result, view, output_format)
    _check_fail_on(result, fail_on)


@app.command()
def ncu(
    model: Annotated[
        Path | None,
        typer.Argument(
            help="A model.py (build() and optional step()) to run under Nsight Compute.", show_default=False
        ),
    ] = None,
    import_csv: Annotated[
        Path | None, typer.Option("--import", help="Analyze an existing `ncu --csv` export instead of running a model.")
    ] = None,
    entry: Annotated[
        str | None, typer.Option("--entry", help="Another build function: 'build_small' or 'pkg.module:function'.")
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Steps run before profiling starts.")] = 1,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Steps profiled by Nsight Compute.")] = 2,
    launch_count: Annotated[
        int, typer.Option("--launch-count", min=1, help="Stop after profiling this many kernel launches.")
    ] = 200,
    kernel: Annotated[
        str | None, typer.Option("--kernel", help="Profile only kernels whose name matches this regex.")
    ] = None,
    output_format: FormatOption = OutputFormat.terminal,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Also write ncu.json, ncu.md and (for a model) the raw ncu.csv here."),
    ] = None,
    rules: RulesOption = None,
    top: TopKernelsOption = 10,
    fail_on: FailOnOption = None,
) -> None:
    """Measure shared-memory bank conflicts with Nsight Compute (rule GA502): per kernel, shared load and store
    instructions, wavefronts, bank conflicts and time, with `ncu --clock-control none`.

    Examples:

      gpuadvisor ncu model.py --out runs/ncu

      gpuadvisor ncu --import ncu_export.csv --format markdown
    """
    from gpuadvisor.ncu import run as ncu_run
    from gpuadvisor.views import ncu_view

    view = ncu_view(top)
    view.check(output_format)
    if (model is None) == (import_csv is None):
        raise BadInputError("give a model.py or --import FILE.csv (one of them)")
    raw = None
    if import_csv is not None:
        report = ncu_run.import_report(import_csv, rules)
    else:
        report, raw = ncu_run.model_report(
            model,
            warmup=warmup,
            steps=steps,
            launch_count=launch_count,
            kernel_regex=kernel,
            entry=entry,
            rules_dir=rules,
        )
    if out is not None:
        files = {"ncu.json": report, "ncu.md": ncu_run.render_markdown(report, top)}
        if raw is not None:
            files["ncu.csv"] = raw
        _write_files(out, files)
    _emit(report, view, output_format)
    _check_fail_on(report, fail_on)


def main() -> None:
    """Entry point: run the app, mapping errors to one line and an exit code."""
    try:
        # Inside the try: a Ctrl-C while the handlers are being installed is still one line and exit 130.
        from gpuadvisor import interrupt
        from gpuadvisor.crash import report_native_crashes

        interrupt.install()
        report_native_crashes()
        code = app(standalone_mode=False)
    except GpuAdvisorError as exc:
        if _DEBUG:
            raise
        _error_line(f"error: {exc}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        exit_interrupted()
    except BrokenPipeError:
        from gpuadvisor.emit import on_broken_pipe

        on_broken_pipe()
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        exit_interrupted()
    except SystemExit:
        raise
    except OSError as exc:  # the system refused I/O (stdout on /dev/full, a full disk, a name over 255 bytes): exit 2
        if _DEBUG:
            raise
        from gpuadvisor.emit import quiet_stdout
        from gpuadvisor.inputs import os_error_message

        quiet_stdout()  # drop what could not be written, so that the interpreter's last flush does not fail again
        _error_line(f"error: {os_error_message(exc)}")
        sys.exit(BadInputError.exit_code)
    except Exception as exc:  # noqa: BLE001 - the CLI must not print a traceback without --debug
        # Usage errors (unknown option, bad value, missing argument) come from the click that typer
        # bundles or depends on, depending on its version: recognise them by their interface.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            # One line, as every other error: the message and where the help is (click's own form is three).
            message = exc.format_message() if callable(getattr(exc, "format_message", None)) else str(exc)
            ctx = getattr(exc, "ctx", None)
            where = f" (see '{ctx.command_path} --help')" if getattr(ctx, "command_path", None) else ""
            _error_line(f"error: {' '.join(str(message).split())}{where}")
            sys.exit(exc.exit_code)
        if _DEBUG:
            raise
        from gpuadvisor.workload import safe_text

        _error_line(
            f"error: internal error ({type(exc).__name__}: {safe_text(exc)}); rerun with --debug for the traceback"
        )
        sys.exit(EXIT_INTERNAL)
    if code == 130:  # typer turns Ctrl-C inside a command into a quiet exit 130
        exit_interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def exit_interrupted() -> NoReturn:
    """After Ctrl-C or SIGTERM (everything already cleaned up): one line, exit 130 (SIGINT) or 143 (SIGTERM).
    The line says "nothing was written" only when this command wrote no file; otherwise it names what it wrote.

    Not through sys.exit: a KeyboardInterrupt that passed through Python code run by PyRun_String (torch's C++
    import runs some) sets CPython's "unhandled Ctrl-C" flag, and the interpreter then kills itself with SIGINT
    as it exits (status -2, not 130) whatever sys.exit said; its exit would also wait for non-daemon threads.
    """
    import os

    from gpuadvisor import interrupt, outputs

    written = outputs.written()
    if written:
        shown = ", ".join(str(p) for p in written[:3]) + (", …" if len(written) > 3 else "")
        _error_line(f"interrupted: wrote {shown} before the interruption; nothing else was written")
    else:
        _error_line("interrupted: nothing was written")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(interrupt.exit_status())


def _error_line(message: str) -> None:
    """Print exactly one line on stderr (no wrapping, no markup)."""
    sys.stderr.write(" ".join(message.split()) + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    main()
