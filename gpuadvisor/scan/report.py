"""``gpuadvisor scan``: walk the paths, scan every CUDA unit, build the result dict, GA501 findings, render.

The result (``--format json``, ``scan.json``) is a dict:

``tool``       {name, version}
``command``    "scan"
``files``      [{path, kernels, status "scanned" | "skipped", reason}]
``accesses``   [{file, line, kernel, array, access, kind "load"|"store", width_bytes, verdict
               "conflict"|"clean"|"unknown", degree, worst_degree, wavefronts_per_instruction,
               ideal_wavefronts_per_instruction, warp_instructions_modeled, wavefronts_modeled,
               ideal_wavefronts_modeled, reason, note, block_dim [x, y, z], block_dim_source, fix,
               degree_after_fix}]
``kernels``    [{file, kernel, line, block_dim, block_dim_source, load, store}] (see analyze.kernel_summary)
``findings``   GA501 findings (rule_id, title, severity, message, evidence, fix, ...)
``warnings``   [str]: files skipped, macros left unexpanded
``notes``      [str]: Triton kernels, loops capped, statements not modeled
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from gpuadvisor import __version__
from gpuadvisor.errors import BadInputError
from gpuadvisor.scan.analyze import kernel_summary, scan_unit
from gpuadvisor.scan.interpret import WorkBudget
from gpuadvisor.scan.source import CUDA_SUFFIXES, PYTHON_SUFFIXES, SourceSkipped, units_of
from gpuadvisor.textsafe import escape_control

SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", "build", "dist"}
VERDICT_ORDER = {"conflict": 0, "unknown": 1, "clean": 2}


def collect_files(paths: list[Path]) -> list[Path]:
    """Files to scan: each file given, and the .cu/.cuh/.py files under each folder (sorted, hidden folders
    and build outputs skipped). A path that does not exist is bad input (exit 2)."""
    files: list[Path] = []
    for path in paths:
        try:
            exists, is_dir = path.exists(), path.is_dir()
        except OSError as exc:  # a name too long, a path through a file
            raise BadInputError(f"{path}: {exc.strerror or exc}") from None
        if not exists:
            raise BadInputError(f"{path}: no such file or directory")
        if is_dir:
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                files.extend(Path(root) / n for n in sorted(names) if n.endswith(CUDA_SUFFIXES + PYTHON_SUFFIXES))
        else:
            files.append(path)
    return list(dict.fromkeys(files))


def scan_paths(paths: list[Path], block_dim: tuple | None = None, rules_dir: Path | None = None) -> dict[str, Any]:
    """Scan files and folders; raises BadInputError when a path is missing or nothing could be scanned (one line:
    the first file's reason and how many others were skipped)."""
    files = collect_files(paths)
    if not files:
        raise BadInputError(f"no .cu, .cuh or .py files under {', '.join(str(p) for p in paths)}")
    file_rows, accesses, kernels, warnings, notes = [], [], [], [], []
    for path in files:
        try:
            units, unit_notes = units_of(path)
            notes.extend(unit_notes)
            count = 0
            budget = WorkBudget()  # one per file, shared by its kernels (interpret.py, "Work is bounded")
            not_interpreted = 0
            for unit in units:
                unit.path = escape_control(unit.path)
                results, pre_notes = scan_unit(unit, block_dim, budget)
                for note in pre_notes:
                    warnings.append(f"{path}: {note}; accesses that use it are reported unknown")
                for result in results:
                    count += 1
                    accesses.extend(result.accesses)
                    kernels.append(kernel_summary(result))
                    notes.extend(f"{path}: {result.name}: {n}" for n in result.notes)
                    not_interpreted += result.not_interpreted is not None
            if budget.spent_reason:
                cut = f"; {not_interpreted} of {count} kernel(s) not interpreted" if not_interpreted else ""
                warnings.append(f"{path}: {budget.spent_reason}{cut}: what was cut short is reported unknown")
            file_rows.append({"path": str(path), "kernels": count, "status": "scanned", "reason": None})
        except SourceSkipped as exc:
            warnings.append(f"{path}: {exc}")
            file_rows.append({"path": str(path), "kernels": 0, "status": "skipped", "reason": str(exc)})
        except RecursionError:
            reason = "nesting too deep to scan: skipped"
            warnings.append(f"{path}: {reason}")
            file_rows.append({"path": str(path), "kernels": 0, "status": "skipped", "reason": reason})
    result = {
        "tool": {"name": "gpuadvisor", "version": __version__},
        "command": "scan",
        "files": file_rows,
        "accesses": accesses,
        "kernels": kernels,
        "findings": [],
        "warnings": warnings,
        "notes": list(dict.fromkeys(notes)),
    }
    # Paths and reasons come from the file system and the files: no control character is shown (the accesses'
    # file names and source text are escaped where they are read: units' paths below, tokens in source.py).
    for key in ("warnings", "notes"):
        result[key] = [escape_control(text) for text in result[key]]
    for row in file_rows:
        row["path"] = escape_control(row["path"])
        row["reason"] = escape_control(row["reason"]) if row["reason"] else None
    skipped = [row for row in file_rows if row["status"] != "scanned"]
    if len(skipped) == len(file_rows):  # one line says it all: which file, why, and how many more
        first = skipped[0]
        more = f" (and {len(skipped) - 1} more file(s) skipped)" if len(skipped) > 1 else ""
        raise BadInputError(f"no file could be scanned: {first['path']}: {first['reason']}{more}")
    from gpuadvisor.rules.engine import load_rules

    rules = [r for r in load_rules(rules_dir) if r.detector == "bank_conflicts_static"]
    for rule in rules:
        result["findings"].extend(dataclasses.asdict(f) for f in bank_conflicts_static(result, rule))
    return result


def bank_conflicts_static(scan: dict, rule) -> list:
    """GA501: one finding per access the model predicts at ``min_degree``-way or worse."""
    from gpuadvisor.rules.engine import make_finding

    findings = []
    for access in scan["accesses"]:
        if access["verdict"] != "conflict" or access["degree"] < rule.threshold("min_degree"):
            continue
        where = f"{access['file']}:{access['line']}"
        message = (
            f"{where} in {access['kernel']}: {access['access']} ({access['kind']}, {access['width_bytes']}-byte "
            f"elements) is predicted {access['degree']:g}-way bank-conflicted: "
            f"{access['wavefronts_per_instruction']:g} wavefronts per warp instruction where "
            f"{access['ideal_wavefronts_per_instruction']:g} would do "
            f"(block {'x'.join(map(str, access['block_dim']))}, {access['block_dim_source']}). Fix: {access['fix']}."
        )
        evidence = {
            "file": access["file"],
            "line": access["line"],
            "kernel": access["kernel"],
            "array": access["array"],
            "access": access["access"],
            "kind": access["kind"],
            "width_bytes": access["width_bytes"],
            "predicted_degree": access["degree"],
            "worst_degree": access["worst_degree"],
            "wavefronts_per_instruction": access["wavefronts_per_instruction"],
            "ideal_wavefronts_per_instruction": access["ideal_wavefronts_per_instruction"],
            "block_dim": "x".join(map(str, access["block_dim"])),
            "degree_after_fix": access["degree_after_fix"],
            "saving": "not estimated statically: measure with `gpuadvisor ncu` (GA502)",
        }
        findings.append(make_finding(rule, None, message, evidence, 0.0, fix=access["fix"]))
    return findings


def exit_code(scan: dict) -> int:
    """0 when at least one file was scanned; BadInputError (2) when every file was skipped."""
    if not any(f["status"] == "scanned" for f in scan["files"]):
        raise BadInputError(f"no file could be scanned ({len(scan['files'])} skipped; see the warnings above)")
    return 0


# --------------------------------------------------------------------------------------------------------------
# Rendering


def _fmt_degree(access: dict) -> str:
    if access["verdict"] == "unknown":
        return "?"
    return f"{access['degree']:g}-way"


def _sorted_accesses(scan: dict) -> list[dict]:
    return sorted(scan["accesses"], key=lambda a: (VERDICT_ORDER[a["verdict"]], a["file"], a["line"]))


def render_markdown(scan: dict) -> str:
    lines = ["# gpuadvisor scan: shared-memory bank conflicts", ""]
    scanned = sum(1 for f in scan["files"] if f["status"] == "scanned")
    counts = {v: sum(1 for a in scan["accesses"] if a["verdict"] == v) for v in VERDICT_ORDER}
    lines.append(
        f"{scanned} file(s) scanned, {len(scan['kernels'])} kernel(s), {len(scan['accesses'])} shared-memory "
        f"access(es): {counts['conflict']} conflict, {counts['unknown']} unknown, {counts['clean']} clean."
    )
    lines += [
        "",
        "| where | kernel | access | kind | bytes | verdict | degree | fix / reason |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a in _sorted_accesses(scan):
        detail = a["fix"] if a["verdict"] == "conflict" else (a["reason"] or "")
        cells = [
            f"{a['file']}:{a['line']}",
            a["kernel"],
            f"`{a['access']}`",
            a["kind"],
            str(a["width_bytes"] or "?"),
            a["verdict"],
            _fmt_degree(a),
            detail,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if scan["findings"]:
        lines += ["", "## Findings", ""]
        for f in scan["findings"]:
            lines.append(f"- **{f['rule_id']}** ({f['severity']}): {f['message']}")
    for title, key in (("Warnings", "warnings"), ("Notes", "notes")):
        if scan[key]:
            lines += ["", f"## {title}", ""] + [f"- {n}" for n in scan[key]]
    return "\n".join(lines) + "\n"


def render_terminal(scan: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    scanned = sum(1 for f in scan["files"] if f["status"] == "scanned")
    counts = {v: sum(1 for a in scan["accesses"] if a["verdict"] == v) for v in VERDICT_ORDER}
    console.print(
        f"[bold]gpuadvisor {__version__} scan[/bold]  {scanned} file(s) · {len(scan['kernels'])} kernel(s) · "
        f"{len(scan['accesses'])} shared-memory access(es): {counts['conflict']} conflict, "
        f"{counts['unknown']} unknown, {counts['clean']} clean"
    )
    if scan["accesses"]:
        table = Table(title="Shared-memory accesses", title_justify="left")
        for column in ("where", "kernel", "access", "verdict", "degree"):
            table.add_column(column, overflow="fold")
        for a in _sorted_accesses(scan):
            where = f"{Path(a['file']).name}:{a['line']}"
            access = f"{a['kind']} {a['access']} ({a['width_bytes'] or '?'} B)"
            table.add_row(escape(where), escape(a["kernel"]), escape(access), a["verdict"], _fmt_degree(a))
        console.print(table)
    for a in _sorted_accesses(scan):
        if a["verdict"] == "conflict":
            console.print(
                f"[bold]{escape(a['file'])}:{a['line']}[/bold] {escape(a['kernel'])}: {escape(a['access'])} — "
                f"{a['degree']:g}-way ({a['wavefronts_per_instruction']:g} wavefronts per instruction, "
                f"ideal {a['ideal_wavefronts_per_instruction']:g}); block {'x'.join(map(str, a['block_dim']))} from "
                f"{escape(a['block_dim_source'])}",
                markup=True,
            )
            console.print(f"  fix: {a['fix']}", markup=False)
            if a["note"]:
                console.print(f"  note: {a['note']}", markup=False)
        elif a["verdict"] == "unknown":
            console.print(
                f"[bold]{escape(a['file'])}:{a['line']}[/bold] {escape(a['kernel'])}: {escape(a['access'])} — "
                f"unknown: {escape(a['reason'] or '')}",
                markup=True,
            )
    for note in scan["notes"]:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def to_json(scan: dict) -> str:
    return json.dumps(scan, indent=2) + "\n"


def write_files_atomic(folder: Path, files: dict[str, str]) -> None:
    """``--out`` of scan and ncu: every file or none, through :func:`gpuadvisor.outputs.write_files` (temporary
    files removed and the folders it made taken down after an error, a full disk or Ctrl-C). An OSError before
    anything is written (a folder name over 255 bytes) is one line too."""
    from gpuadvisor.outputs import write_files

    try:
        write_files(Path(folder), files)
    except OSError as exc:
        raise BadInputError(f"cannot write to --out {folder}: {exc.strerror or exc}") from None
