"""Per-kernel scan: resolve the block shape, interpret the kernel twice with different runtime samples, and turn
each shared-memory access into a verdict (clean, conflict or unknown), a degree and a verified fix.

Degree = wavefronts / ideal wavefronts, averaged over every warp instruction the interpretation executed
(all warps of one block, every loop iteration up to the cap) -- the same ratio Nsight Compute gives as
``l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum`` / instructions / ideal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuadvisor.scan.interpret import Interpreter, KernelContext, Parser, Site, WorkBudget
from gpuadvisor.scan.source import CudaUnit, Kernel, Preprocessed, Token, find_kernels, preprocess

# The block shape when neither a hint, --block-dim nor __launch_bounds__ gives one: 256 threads, the most
# common choice for 1-D kernels; a kernel that reads threadIdx.y gets 32 x 8 (a warp per row of a tile).
DEFAULT_BLOCK_1D = (256, 1, 1)
DEFAULT_BLOCK_2D = (32, 8, 1)
DEFAULT_BLOCK_3D = (32, 4, 2)
# Two sets of runtime samples: scalar arguments, blockIdx/gridDim and template parameters take the first value
# in run A and the second in run B; an access whose degree differs between the runs depends on them.
SAMPLE_A = {"param": 4096, "template": 32, "blockIdx": (0, 0, 0), "gridDim": (64, 64, 64)}
SAMPLE_B = {"param": 4099, "template": 48, "blockIdx": (3, 5, 7), "gridDim": (67, 71, 73)}
CONFLICT_EPSILON = 1e-9


@dataclass
class KernelResult:
    path: str
    name: str
    line: int
    block_dim: tuple
    block_dim_source: str
    accesses: list = field(default_factory=list)  # dicts, see report.ACCESS_KEYS
    notes: list = field(default_factory=list)
    not_interpreted: str | None = None  # why the kernel was not interpreted at all (the file's budget was spent)


def parse_block_dim(text: str) -> tuple[int, int, int]:
    """ "32,8" or "256" or "32x8x1" -> (x, y, z); ValueError when it is not 1-3 positive integers <= 1024 threads."""
    parts = [p for p in re.split(r"[,xX ]+", text.strip()) if p]
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"block dim '{text}' is not 1 to 3 positive integers such as 32,8")
    dims = [int(p) for p in parts] + [1] * (3 - len(parts))
    if dims[0] * dims[1] * dims[2] > 1024:
        raise ValueError(f"block dim '{text}' has {dims[0] * dims[1] * dims[2]} threads; CUDA allows 1024")
    return dims[0], dims[1], dims[2]


def resolve_block_dim(kernel: Kernel, override: tuple | None, read_body: bool = True) -> tuple[tuple, str]:
    """The block shape to model and where it came from (``read_body`` False: without looking for threadIdx.y in
    the body, for a kernel that is not interpreted)."""
    hint = kernel.hints.get("blockDim") or kernel.hints.get("blockdim") or kernel.hints.get("block_dim")
    if hint:
        try:
            return parse_block_dim(hint), "the kernel's `// gpuadvisor: blockDim=` hint"
        except ValueError:
            pass
    if override is not None:
        return override, "--block-dim"
    if not read_body and not kernel.launch_bounds:
        return DEFAULT_BLOCK_1D, "not resolved (the kernel was not interpreted)"
    uses = " ".join(t.text for t in kernel.load_body())
    uses_z = "threadIdx . z" in uses
    uses_y = "threadIdx . y" in uses or "blockDim . y" in uses
    if kernel.launch_bounds:
        n = kernel.launch_bounds
        if uses_y or uses_z:
            return (32, max(1, n // 32), 1), f"__launch_bounds__({n}), shape assumed 32 x {max(1, n // 32)}"
        return (n, 1, 1), f"__launch_bounds__({n})"
    if uses_z:
        return DEFAULT_BLOCK_3D, "assumed (no hint): give `// gpuadvisor: blockDim=X,Y,Z` or --block-dim"
    if uses_y:
        return DEFAULT_BLOCK_2D, "assumed (no hint): give `// gpuadvisor: blockDim=X,Y` or --block-dim"
    return DEFAULT_BLOCK_1D, "assumed (no hint): give `// gpuadvisor: blockDim=X` or --block-dim"


def _file_statement_tokens(pre: Preprocessed, kernels: list[Kernel]) -> list[Token]:
    """File-scope ``const``/``constexpr`` integer declarations and ``__shared__`` arrays, as one token list."""
    out: list[Token] = []
    statement: list[Token] = []
    depth = 0
    for token in pre.tokens:
        text = token.text
        if depth:  # inside a function or a block: only the braces matter (most tokens of a file are here)
            if text == "{":
                depth += 1
            elif text == "}":
                depth -= 1
            continue
        if text == "{":
            depth += 1
            statement = []
            continue
        if text == "}":
            depth -= 1
            statement = []
            continue
        if token.text == ";":
            texts = [t.text for t in statement]
            if "=" in texts and ("const" in texts or "constexpr" in texts):
                head = texts[: texts.index("=")]
                if "(" not in head and "[" not in head:
                    out.extend(statement + [Token(";", "op", token.line)])
            elif "__shared__" in texts and "(" not in texts:
                start = texts.index("__shared__")
                while start > 0 and texts[start - 1] in ("extern", "static"):
                    start -= 1
                out.extend(statement[start:] + [Token(";", "op", token.line)])
            statement = []
            continue
        statement.append(token)
    return out


def scan_unit(
    unit: CudaUnit, block_dim_override: tuple | None, budget: WorkBudget | None = None
) -> tuple[list[KernelResult], list[str]]:
    """Scan one piece of CUDA text, spending at most ``budget`` (the file's: one per file, shared by the pieces
    of a Python file; a new one when None). Raises SourceSkipped for text the scan cannot read."""
    pre = preprocess(unit.text, unit.line_offset)
    kernels, _ = find_kernels(pre)
    file_tokens = _file_statement_tokens(pre, kernels)
    budget = budget if budget is not None else WorkBudget()
    results = []
    for kernel in kernels:
        if budget.spent:  # not even parsed: a file of 15,000 kernels costs its budget, not 15,000 parses
            block_dim, source = resolve_block_dim(kernel, block_dim_override, read_body=False)
            result = KernelResult(unit.path, kernel.name, kernel.line, block_dim, source)
            budget.spent_reason = budget.spent_reason or budget.stop_reason()
            result.not_interpreted = f"not interpreted: {budget.spent_reason}"
            results.append(result)
            continue
        results.append(scan_kernel(unit.path, kernel, file_tokens, block_dim_override, budget))
    return results, list(pre.notes)


def scan_kernel(
    path: str,
    kernel: Kernel,
    file_tokens: list[Token],
    override: tuple | None,
    budget: WorkBudget | None = None,
) -> KernelResult:
    block_dim, source = resolve_block_dim(kernel, override)
    result = KernelResult(path, kernel.name, kernel.line, block_dim, source)
    kernel_budget = (budget if budget is not None else WorkBudget()).for_kernel()
    tokens = file_tokens + list(kernel.load_body())
    parser = Parser(tokens)
    file_statements = []
    while parser.i < len(file_tokens):
        file_statements.append(parser.statement())
    body = parser.statements()
    body_words = {t.text for t in kernel.body}
    constants = {}
    for key, value in kernel.hints.items():
        if key.lower() not in ("blockdim", "block_dim") and re.fullmatch(r"-?\d+", value):
            constants[key] = int(value)
    runs = []
    for sample in (SAMPLE_A, SAMPLE_B):
        samples = {}
        for axis, index in (("x", 0), ("y", 1), ("z", 2)):
            samples[f"blockIdx.{axis}"] = sample["blockIdx"][index]
            samples[f"gridDim.{axis}"] = sample["gridDim"][index]
        for name, pointer in kernel.params:
            if not pointer:
                samples[name] = sample["param"]
        for name in kernel.template_params:
            samples[name] = sample["template"]
        ctx = KernelContext(
            kernel.params, kernel.template_params, block_dim, samples, constants, file_statements, tokens
        )
        interpreter = Interpreter(body, ctx, kernel_budget)
        interpreter.run()
        runs.append(interpreter)
        if interpreter.cut_short:  # the second run would find nothing the first did not
            break
    kernel_budget.close()
    if budget is not None and kernel_budget.spent_reason and not budget.spent_reason and budget.spent:
        budget.spent_reason = kernel_budget.spent_reason
    cut_short = next((run.cut_short for run in runs if run.cut_short), None)
    first = runs[0]
    second = runs[1] if len(runs) > 1 else None
    sampled = [n for n, p in kernel.params if not p and n in body_words and n not in constants]
    sampled += [n for n in kernel.template_params if n in body_words and n not in constants]
    sampled += [f"{v}.{a}" for v in ("blockIdx", "gridDim") for a in "xyz" if v in body_words]
    result.notes.extend(first.notes)
    arrays_with_fix = _fixes(first.sites)
    for key, site in sorted(first.sites.items(), key=lambda item: (item[1].line, item[0])):
        unknown = list(site.unknown)
        if cut_short:
            unknown.append(f"interpretation cut short ({cut_short}): not every warp and iteration was modeled")
            result.accesses.append(_access_dict(path, kernel.name, site, unknown, block_dim, source, arrays_with_fix))
            continue
        other = second.sites.get(key)
        if other is None or other.degree != site.degree or other.worst_degree != site.worst_degree:
            names = ", ".join(dict.fromkeys(sampled)) or "values known only at run time"
            a = f"{site.degree:.1f}" if site.degree is not None else "?"
            b = f"{other.degree:.1f}" if other is not None and other.degree is not None else "?"
            unknown.append(f"depends on runtime values ({names}): {a}-way with one choice, {b}-way with another")
        result.accesses.append(_access_dict(path, kernel.name, site, unknown, block_dim, source, arrays_with_fix))
    return result


def _fixes(sites: dict) -> dict[str, tuple[str, float]]:
    """Per array with a conflict: the fix ("pad" or "swizzle") that leaves the lowest worst degree over every
    access to that array in the interpretation, and that degree; only fixes that lower it are kept."""
    by_array: dict[str, list] = {}
    for site in sites.values():
        by_array.setdefault(site.array, []).append(site)
    fixes = {}
    for array, entries in by_array.items():
        worst_now = max((s.degree or 0.0) for s in entries)
        if worst_now <= 1 + CONFLICT_EPSILON:
            continue
        best = None
        for fix, attribute in (("pad", "pad_wavefronts"), ("swizzle", "swizzle_wavefronts")):
            after = [(getattr(s, attribute), s.ideal) for s in entries if s.ideal]
            if not after or any(wavefronts is None for wavefronts, _ in after):
                continue
            worst_after = max(wavefronts / ideal for wavefronts, ideal in after)
            if worst_after < worst_now - CONFLICT_EPSILON and (best is None or worst_after < best[1]):
                best = (fix, worst_after)
        if best is not None:
            fixes[array] = best
    return fixes


def _access_dict(path, kernel, site: Site, unknown, block_dim, source, fixes) -> dict:
    degree = site.degree
    verdict = "unknown" if unknown or degree is None else ("conflict" if degree > 1 + CONFLICT_EPSILON else "clean")
    note = None
    if site.guard_unknown and verdict == "conflict":
        note = "under a condition the scan cannot evaluate: modeled with every lane active (an upper bound)"
    fix, fix_degree = None, None
    if verdict == "conflict":
        fix, fix_degree = _fix_text(site, fixes.get(site.array))
    return {
        "file": path,
        "line": site.line,
        "kernel": kernel,
        "array": site.array,
        "access": site.text,
        "kind": site.kind,
        "width_bytes": site.width_bytes,
        "verdict": verdict,
        "degree": None if verdict == "unknown" else round(degree, 2),
        "worst_degree": None if verdict == "unknown" else round(site.worst_degree, 2),
        "wavefronts_per_instruction": None if verdict == "unknown" else round(site.wavefronts / site.instructions, 3),
        "ideal_wavefronts_per_instruction": None if verdict == "unknown" else round(site.ideal / site.instructions, 3),
        "warp_instructions_modeled": site.instructions,
        "wavefronts_modeled": site.wavefronts,
        "ideal_wavefronts_modeled": site.ideal,
        "reason": "; ".join(unknown) if verdict == "unknown" else None,
        "note": note,
        "block_dim": list(block_dim),
        "block_dim_source": source,
        "fix": fix,
        "degree_after_fix": fix_degree,
    }


def _fix_text(site: Site, fix: tuple | None) -> tuple[str, float | None]:
    """The fix as code (the padded declaration, the padded 1-D index, or the swizzled subscript) and the worst
    degree left on this array's accesses after it."""
    if fix is None:
        return (
            "no pad or XOR swizzle of this array lowers the conflict in the model: change which thread reads "
            "which element (consecutive lanes on consecutive 4-byte words)",
            None,
        )
    kind, degree_after = fix
    width = site.width_bytes or 4
    per_row = 128 // width
    pad = max(1, 4 // width)
    dims = site.array_dims
    name = site.array
    left = "" if degree_after <= 1 + CONFLICT_EPSILON else f" (leaves {degree_after:.3g}-way)"

    def shape(values: list) -> str:
        return "".join(f"[{d if d is not None else ''}]" for d in values)

    if kind == "pad" and len(dims) >= 2:
        padded = dims[:-1] + [dims[-1] + pad]
        return (
            f"__shared__ {site.type_name} {name}{shape(padded)};  // was {name}{shape(dims)}: {pad} element(s) "
            f"of padding per row{left}",
            round(degree_after, 2),
        )
    if kind == "pad":
        step = f"{pad} * (i / {per_row})" if pad > 1 else f"i / {per_row}"
        size = f"{dims[0]} + {dims[0]} / {per_row * pad}" if pad == 1 and dims and dims[0] is not None else "..."
        if pad == 1:
            size = f"{dims[0]} + {dims[0]} / {per_row}" if dims and dims[0] is not None else f"n + n / {per_row}"
        return (
            f"{name}[i + {step}] on every access to {name}, declared {name}[{size}]: padding every "
            f"{per_row * width} bytes{left}",
            round(degree_after, 2),
        )
    return (
        f"{name}[r][c ^ (r % {per_row})] on every access to {name}, loads and stores alike (an XOR swizzle of "
        f"the column by the row; same size){left}",
        round(degree_after, 2),
    )


def kernel_summary(result: KernelResult) -> dict:
    """Per kernel and per kind (load/store): verdict, degree, wavefronts and ideal per instruction -- the figures
    to hold against Nsight Compute's kernel totals."""
    summary = {
        "file": result.path,
        "kernel": result.name,
        "line": result.line,
        "block_dim": list(result.block_dim),
        "block_dim_source": result.block_dim_source,
    }
    if result.not_interpreted:
        for kind in ("load", "store"):
            summary[kind] = {"verdict": "unknown", "degree": None, "reason": result.not_interpreted}
        return summary
    for kind in ("load", "store"):
        sites = [a for a in result.accesses if a["kind"] == kind]
        if not sites:
            summary[kind] = None
            continue
        if any(a["verdict"] == "unknown" for a in sites):
            reasons = [a["reason"] for a in sites if a["reason"]]
            summary[kind] = {"verdict": "unknown", "degree": None, "reason": reasons[0]}
            continue
        instructions = sum(a["warp_instructions_modeled"] for a in sites)
        wavefronts = sum(a["wavefronts_modeled"] for a in sites)
        ideal = sum(a["ideal_wavefronts_modeled"] for a in sites)
        degree = wavefronts / ideal if ideal else None
        summary[kind] = {
            "verdict": "conflict" if degree and degree > 1 + CONFLICT_EPSILON else "clean",
            "degree": round(degree, 2) if degree else None,
            "wavefronts_per_instruction": round(wavefronts / instructions, 3) if instructions else None,
            "ideal_wavefronts_per_instruction": round(ideal / instructions, 3) if instructions else None,
        }
    return summary


__all__ = ["KernelResult", "kernel_summary", "parse_block_dim", "scan_unit", "find_kernels"]
