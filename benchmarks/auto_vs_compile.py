"""``apply --fix auto`` against every torch.compile mode, per suite model, from runs already made.

    python3 benchmarks/auto_vs_compile.py                      # the committed runs -> auto_vs_compile.json
    python3 benchmarks/auto_vs_compile.py --runs A.json,B.json --search real_models_auto.json --out X.json

Nothing is measured here: this reads the results of ``benchmarks/real_models.py`` runs and puts, per model,
every pair "auto's step vs one compile mode's step, timed in the same process" side by side, with the worst
ratio and the modes that have no such pair (and why). Two kinds of pair:

- ``benchmark``: a ``real_models.py`` run (``--runs``; with ``--auto-from`` or a plain run) that timed the auto
  variant (the fixes ``apply --fix auto`` kept, re-applied with the guard on; for a decode model without an
  auto variant, the ``fusion_graphs`` variant when auto kept exactly fusion and graphs) and a compile mode in
  one child process: each against the same eager variant, round-robin, CUDA events, medians. Only the models
  a file's own command measured count (an entry whose ``command`` is the file's).
- ``search``: ``apply --fix auto``'s own run (``--search``, an ``--auto-only`` results file). When auto kept
  compile alone: its final interleaved after median against the compile fix's mode-selection timing of each
  mode (brief blocks after each mode's warm-up, not interleaved with that final timing, so noisier than a
  benchmark's pairs). Otherwise: the kept stack's search timing against the ``compile`` candidate's (compile
  of the original model alone, in the mode it chose), both from the search's interleaved timing.

The verdict per model is the worst benchmark ratio (the search pairs are listed beside it); ``modes_missing``
names each of default, reduce-overhead and max-autotune that no benchmark pair covers, with the reason each run
that tried it gave (a per-model time limit reached while that mode compiled) or "not run". A benchmark pair counts
only when the stack it timed is the search's kept one: after a new search keeps another stack, the pairs of runs
that re-applied the earlier choice are listed as ``earlier_choice_pairs`` and judge nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuadvisor.outputs import write_atomic  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = [
    *sorted((RESULTS / "auto_vs_compile").glob("real_models_*.json")),
    RESULTS / "real_models_decode.json",
]
DEFAULT_SEARCH = RESULTS / "real_models_auto.json"
DEFAULT_OUT = RESULTS / "auto_vs_compile.json"
MODES = ("default", "reduce-overhead", "max-autotune")
BOUND = 1.02  # issue: auto at most 1.02x the best compile mode's time in the same run


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"{path}: not a readable results file ({type(error).__name__}: {error})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise SystemExit(f"{path}: not a real_models.py results file (no models list)")
    return doc


def benchmark_pairs(path: Path, auto_fixes: dict[str, list[str]]) -> tuple[list[dict], dict[str, dict]]:
    """The (model, mode) pairs a real_models.py file's own run timed, and per model what it says of the modes
    it did not finish."""
    doc = _load(path)
    pairs: list[dict] = []
    unfinished: dict[str, dict] = {}
    for entry in doc["models"]:
        if not isinstance(entry, dict) or entry.get("command") != doc.get("command"):
            continue  # kept from the --base file, not measured by this file's command
        name = entry.get("name")
        variant, auto_us = "auto", entry.get("auto_us")
        if entry.get("auto_skipped") or auto_us is None:
            if auto_fixes.get(name) == ["fusion", "graphs"] and entry.get("fusion_graphs_us") is not None:
                variant, auto_us = "fusion_graphs", entry["fusion_graphs_us"]
            else:
                auto_us = None
        compile_us = entry.get("compile") or {}
        for mode, us in compile_us.items():
            if isinstance(us, (int, float)) and isinstance(auto_us, (int, float)):
                pairs.append(
                    {
                        "model": name,
                        "mode": mode,
                        "kind": "benchmark",
                        "file": _relative(path),
                        "date": entry.get("date"),
                        "gpu": doc.get("gpu"),
                        "auto_variant": variant,
                        "auto_fixes": entry.get("auto_fixes_timed") or auto_fixes.get(name),
                        "auto_us": auto_us,
                        "compile_us": us,
                        "compile_s": (entry.get("compile_s") or {}).get(mode),
                        "ratio": auto_us / us,
                    }
                )
            elif isinstance(us, dict):
                unfinished.setdefault(name, {}).setdefault(mode, []).append(f"{us.get('error')} ({_relative(path)})")
        stage = str(entry.get("stage") or "")
        if entry.get("error") and stage.startswith("compile "):
            mode = stage.split(" ", 1)[1]
            unfinished.setdefault(name, {}).setdefault(mode, []).append(
                f"{entry['error']} ({_relative(path)}, {entry.get('date')})"
            )
    return pairs, unfinished


def search_pairs(doc: dict[str, Any]) -> list[dict]:
    """apply --fix auto's own run: its final after median against each compile timing of its search."""
    pairs = []
    for entry in doc.get("models") or []:
        if not isinstance(entry, dict) or entry.get("apply_report_auto_us") is None:
            continue
        auto_us = entry["apply_report_auto_us"]
        base = {"model": entry.get("name"), "kind": "search", "date": entry.get("date"), "auto_us": auto_us}
        base["auto_fixes"] = entry.get("auto_fixes")
        if entry.get("auto_fixes") == ["compile"]:  # compile alone kept: each mode its selection timed
            modes = ((entry.get("auto_facts") or {}).get("compile") or {}).get("modes") or {}
            for mode, row in modes.items():
                if isinstance(row, dict) and isinstance(row.get("step_us"), (int, float)):
                    pairs.append(
                        {
                            **base,
                            "mode": mode,
                            "compile_us": row["step_us"],
                            "compile_s": row.get("compile_s"),
                            "timing": "the compile fix's mode selection",
                            "ratio": auto_us / row["step_us"],
                        }
                    )
            continue
        # otherwise compile inside the stack is not torch.compile of the user's model: compile alone is
        rows = entry.get("auto_search") or []
        kept = [r for r in rows if r.get("status") == "kept" and isinstance(r.get("step_us"), (int, float))]
        if kept:
            for row in rows:
                if row.get("applied") == ["compile"] and isinstance(row.get("step_us"), (int, float)):
                    pairs.append(
                        {
                            **base,
                            "auto_us": kept[0]["step_us"],
                            "mode": "the compile candidate's own choice",
                            "compile_us": row["step_us"],
                            "timing": "the search's candidate timing (the kept stack's and compile alone's)",
                            "ratio": kept[0]["step_us"] / row["step_us"],
                        }
                    )
    return pairs


def summarise(runs: list[Path], search: Path) -> dict[str, Any]:
    search_doc = _load(search)
    auto_fixes = {m.get("name"): m.get("auto_fixes") for m in search_doc["models"] if isinstance(m, dict)}
    kinds = {m.get("name"): m.get("kind") for m in search_doc["models"] if isinstance(m, dict)}
    bench: list[dict] = []
    unfinished: dict[str, dict] = {}
    for path in runs:
        pairs, missing = benchmark_pairs(path, auto_fixes)
        bench += pairs
        for name, modes in missing.items():
            for mode, attempts in modes.items():
                unfinished.setdefault(name, {}).setdefault(mode, []).extend(attempts)
    searched = search_pairs(search_doc)
    models = []
    for name in auto_fixes:
        # Pairs that timed another stack than the search's kept one (an earlier search's choice, re-applied by a
        # run made before the search changed) stay on record but judge nothing.
        own = [p for p in bench if p["model"] == name and p["auto_fixes"] == auto_fixes[name]]
        earlier = [p for p in bench if p["model"] == name and p["auto_fixes"] != auto_fixes[name]]
        for pair in earlier:
            unfinished.setdefault(name, {}).setdefault(pair["mode"], []).append(
                f"timed only beside an earlier auto choice ({', '.join(pair['auto_fixes'] or [])}; {pair['file']})"
            )
        covered = {p["mode"] for p in own}
        worst = max(own, key=lambda p: p["ratio"]) if own else None
        models.append(
            {
                "model": name,
                "kind": kinds.get(name),
                "auto_fixes": auto_fixes[name],
                "benchmark_pairs": own,
                "earlier_choice_pairs": earlier,
                "search_pairs": [p for p in searched if p["model"] == name],
                "worst_benchmark_ratio": worst["ratio"] if worst else None,
                "worst_benchmark_mode": worst["mode"] if worst else None,
                "within_bound": (worst["ratio"] <= BOUND) if worst else None,
                "modes_measured": sorted(covered),
                "modes_missing": {
                    mode: (unfinished.get(name) or {}).get(mode) or ["not run"] for mode in MODES if mode not in covered
                },
            }
        )
    return {
        "what": "apply --fix auto's step time over each torch.compile mode's, timed in the same process",
        "bound": f"auto / compile <= {BOUND} for the best mode",
        "runs": [_relative(p) for p in runs],
        "search": _relative(search),
        "method": __doc__.split("\n\n", 2)[2].strip(),
        "models": models,
    }


def _missing_cell(mode: str, attempts: list[str]) -> str:
    """A missing mode for the table: its name, the per-model limits it was still compiling at, and whether it was
    timed only beside an earlier auto choice."""
    limits = [m.group(1) for a in attempts if (m := re.search(r"after the ([0-9.]+) s per-model limit", a))]
    why = []
    if limits:
        seconds = " and ".join(f"{x:.0f}" for x in sorted(float(x) for x in limits))
        why.append(f"run killed while it compiled, at a per-model limit of {seconds} s")
    earlier = sorted({m.group(1) for a in attempts if (m := re.search(r"earlier auto choice \(([^;]+);", a))})
    if earlier:
        why.append(f"timed only beside the earlier choice {' / '.join(earlier)}")
    return f"{mode} ({'; '.join(why)})" if why else mode


def _gpu_tag(gpu: str | None) -> str:
    """``, H100`` for a pair timed on an H100 (the table's runs are the H200's unless a cell says so)."""
    return ", H100" if isinstance(gpu, str) and "H100" in gpu else ""


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "| model | auto fixes | auto / default | auto / reduce-overhead | auto / max-autotune | worst | not measured "
        "| in auto's own search |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in doc["models"]:
        cells = []
        for mode in MODES:
            pairs = [p for p in row["benchmark_pairs"] if p["mode"] == mode]
            cells.append(
                ", ".join(
                    f"{p['ratio']:.3f} ({p['auto_us']:,.0f} / {p['compile_us']:,.0f}{_gpu_tag(p.get('gpu'))})"
                    for p in pairs
                )
                or "-"
            )
        worst = row["worst_benchmark_ratio"]
        missing = ", ".join(_missing_cell(mode, why) for mode, why in row["modes_missing"].items()) or "none"
        searched = "; ".join(
            f"{p['ratio']:.3f} vs {'compile alone' if p['mode'].startswith('the compile') else p['mode']}"
            for p in row["search_pairs"]
        )
        lines.append(
            f"| {row['model']} | {', '.join(row['auto_fixes'] or []) or 'none'} | "
            + " | ".join(cells)
            + f" | {'-' if worst is None else f'{worst:.3f}'} | {missing} | {searched or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", help="comma-separated real_models.py results files (default: the committed ones)")
    parser.add_argument("--search", type=Path, default=DEFAULT_SEARCH, help="an --auto-only results file")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    runs = [Path(p) for p in args.runs.split(",") if p.strip()] if args.runs else DEFAULT_RUNS
    doc = summarise(runs, args.search)
    write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    if args.markdown is not None:
        write_atomic(args.markdown, table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
