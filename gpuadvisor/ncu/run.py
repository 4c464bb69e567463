"""Profile a model.py under Nsight Compute (or import an ncu CSV), build the shared-memory report, render it.

The command line ``gpuadvisor ncu model.py`` runs::

    ncu --clock-control none --target-processes all --profile-from-start off --csv --print-units base
        --metrics <counters.METRICS> --launch-count N --log-file <tmp>/ncu.csv
        python -m gpuadvisor.ncu.child model.py --warmup W --steps S

``--clock-control none`` leaves the GPU's clocks as they are (ncu otherwise locks them to base clocks, and the
durations would not be the ones the workload sees). The raw CSV is kept beside the report (``--out``), and
``gpuadvisor ncu --import ncu.csv`` analyses such a file on any machine.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuadvisor import __version__
from gpuadvisor.errors import BadInputError, UserCodeError
from gpuadvisor.ncu.counters import METRICS, kernel_table, load_csv, parse_csv, short_name
from gpuadvisor.textsafe import escape_control

# Nsight Compute replays each kernel several times to collect counters (about 0.1-1 s per launch); a decode step
# launches hundreds of kernels, so the run stops after this many profiled launches unless told otherwise.
DEFAULT_LAUNCH_COUNT = 200
NCU_TIMEOUT_S = 1800


def ncu_command(
    model: Path,
    log_file: Path,
    *,
    warmup: int,
    steps: int,
    launch_count: int,
    kernel_regex: str | None,
    entry: str | None,
    metrics: list[str] | None = None,
) -> list[str]:
    """The ncu command line (module docstring); ``metrics``: other counters than the shared-memory ones
    (benchmarks/ncu_classes.py collects the Speed-of-Light figures with it)."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise BadInputError(
            "ncu (Nsight Compute) is not on PATH: install Nsight Compute or add its folder to PATH, "
            "or analyze an existing export with `gpuadvisor ncu --import FILE.csv`"
        )
    command = [
        ncu,
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--csv",
        "--print-units",
        "base",
        "--metrics",
        ",".join(metrics if metrics is not None else METRICS.values()),
        "--launch-count",
        str(launch_count),
        "--log-file",
        str(log_file),
    ]
    if kernel_regex:
        command += ["--kernel-name", f"regex:{kernel_regex}"]
    command += [
        sys.executable,
        "-m",
        "gpuadvisor.ncu.child",
        str(model),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    if entry:
        command += ["--entry", entry]
    return command


def profile_model(
    model: Path,
    *,
    warmup: int = 1,
    steps: int = 2,
    launch_count: int = DEFAULT_LAUNCH_COUNT,
    kernel_regex: str | None = None,
    entry: str | None = None,
) -> tuple[list[dict], str, list[str]]:
    """Run the model under ncu; return (launches, raw CSV text, command)."""
    if not model.is_file():
        raise BadInputError(f"{model}: no such file")
    with tempfile.TemporaryDirectory(prefix="gpuadvisor-ncu-") as tmp:
        log_file = Path(tmp) / "ncu.csv"
        command = ncu_command(
            model,
            log_file,
            warmup=warmup,
            steps=steps,
            launch_count=launch_count,
            kernel_regex=kernel_regex,
            entry=entry,
        )
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        done = _run_in_own_group(command, env)
        text = log_file.read_text(encoding="utf-8", errors="replace") if log_file.exists() else ""
        if not any(line.startswith('"') for line in text.splitlines()):
            text = done.stdout  # an ncu that ignores --log-file for CSV prints it on stdout
        child_errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        if done.returncode != 0 and not any(line.startswith('"') for line in text.splitlines()):
            if child_errors:
                message = child_errors[-1].removeprefix("error:").strip()
                raise (UserCodeError if done.returncode == 3 else BadInputError)(message)
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise BadInputError(f"ncu exited {done.returncode}: {tail or 'no output'}")
        if not any(line.startswith('"') for line in text.splitlines()):
            tail = " ".join(" ".join(text.splitlines()[-2:]).split())
            raise BadInputError(
                f"ncu profiled no kernels ({tail or 'no output'}); does the model launch CUDA kernels "
                "through torch or cupy?"
            )
    return parse_csv(text, "ncu output"), text, command


def build_report(
    table: list[dict[str, Any]],
    *,
    source: str,
    steps: int | None,
    rules_dir: Path | None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    from gpuadvisor.rules.engine import load_rules

    report: dict[str, Any] = {
        "tool": {"name": "gpuadvisor", "version": __version__},
        "command": "ncu",
        "source": escape_control(source),  # a path: shown, so no control characters (as the kernel names)
        "ncu_command": command,
        "steps": steps,
        "metrics": dict(METRICS),
        "kernels": table,
        "findings": [],
    }
    measured = {"kernels": table, "steps": steps}
    for rule in load_rules(rules_dir):
        if rule.detector == "bank_conflicts_measured":
            from gpuadvisor.ncu.counters import bank_conflicts_measured

            report["findings"].extend(dataclasses.asdict(f) for f in bank_conflicts_measured(measured, rule))
    return report


def import_report(path: Path, rules_dir: Path | None) -> dict[str, Any]:
    return build_report(load_csv(path), source=str(path), steps=None, rules_dir=rules_dir)


def model_report(
    model: Path,
    *,
    warmup: int,
    steps: int,
    launch_count: int,
    kernel_regex: str | None,
    entry: str | None,
    rules_dir: Path | None,
) -> tuple[dict[str, Any], str]:
    launches, raw, command = profile_model(
        model, warmup=warmup, steps=steps, launch_count=launch_count, kernel_regex=kernel_regex, entry=entry
    )
    report = build_report(kernel_table(launches), source=str(model), steps=steps, rules_dir=rules_dir, command=command)
    return report, raw


def _count(value: Any, digits: int = 0) -> str:
    """A counter as text; a missing one (a value no float holds, read as null) as a dash."""
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(row: dict, op: str) -> str:
    value = row.get(f"{op}_excess_ratio")
    return "—" if value is None else f"{value:.2f}x"


def render_markdown(report: dict[str, Any], top: int = 20) -> str:
    lines = [f"# gpuadvisor ncu: {report['source']}", ""]
    if report.get("ncu_command"):
        lines += ["```", " ".join(report["ncu_command"]), "```", ""]
    lines += [
        "| kernel | launches | µs | % time | ld inst | ld wavefronts/inst | ld conflicts | ld excess | "
        "st inst | st wavefronts/inst | st excess |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["kernels"][:top]:
        name = short_name(row["kernel"]).replace("`", "'").replace("|", "\\|")
        lines.append(
            f"| `{name}` | {row['launches']} | {_count(row['duration_us'], 1)} | "
            f"{row['time_share_pct']} | {_count(row.get('ld_instructions', 0))} | "
            f"{row.get('ld_wavefronts_per_instruction') or '—'} | {_count(row.get('ld_bank_conflicts', 0))} | "
            f"{_ratio(row, 'ld')} | {_count(row.get('st_instructions', 0))} | "
            f"{row.get('st_wavefronts_per_instruction') or '—'} | {_ratio(row, 'st')} |"
        )
    lines += ["", "## Findings", ""]
    if not report["findings"]:
        lines.append("No kernel's shared wavefronts exceed the ideal by GA502's threshold.")
    for finding in report["findings"]:
        lines.append(f"- **{finding['rule_id']}** ({finding['severity']}): {finding['message']}")
    return "\n".join(lines) + "\n"


def render_terminal(report: dict[str, Any], console, top: int = 10) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(
        f"[bold]gpuadvisor {__version__} ncu[/bold]  {escape(report['source'])} · {len(report['kernels'])} "
        "kernel(s) profiled"
    )
    table = Table(title="Shared memory per kernel (summed over profiled launches)", title_justify="left")
    for column in (
        "kernel",
        "launches",
        "µs",
        "% time",
        "ld inst",
        "ld wf/inst",
        "ld excess",
        "st inst",
        "st wf/inst",
        "st excess",
    ):
        table.add_column(column, overflow="fold", justify="left" if column == "kernel" else "right")
    for row in report["kernels"][:top]:
        table.add_row(
            escape(short_name(row["kernel"], 48)),
            str(row["launches"]),
            _count(row["duration_us"], 1),
            f"{row['time_share_pct']}",
            _count(row.get("ld_instructions", 0)),
            f"{row.get('ld_wavefronts_per_instruction') or '—'}",
            _ratio(row, "ld"),
            _count(row.get("st_instructions", 0)),
            f"{row.get('st_wavefronts_per_instruction') or '—'}",
            _ratio(row, "st"),
        )
    console.print(table)
    if not report["findings"]:
        console.print("No kernel's shared wavefronts exceed the ideal by GA502's threshold.")
    for finding in report["findings"]:
        console.print(f"[bold]{finding['rule_id']}[/bold] {escape(finding['message'])}")


def _run_in_own_group(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ncu in a process group of its own; on a timeout or Ctrl-C kill the whole group, so the Python
    process ncu launched (``--target-processes all``) does not go on holding the GPU."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=NCU_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise BadInputError(f"ncu did not finish within {NCU_TIMEOUT_S} s (use --launch-count or --kernel)") from None
    except BaseException:  # Ctrl-C: nothing of the profiled run stays behind
        _kill_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    process.wait()
