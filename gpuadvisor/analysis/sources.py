"""The exact source line of a call, from the frame the profiler recorded.

``torch.profiler`` with ``with_stack=True`` records Python frames as ``file.py(LINE): function``, where
LINE is the line the function starts on (its ``def``, or its first decorator), not the line that made
the call. To name the line that did the work (``loss.item()``, ``features.to(DEVICE)``), this module
reads the file, finds that function with :mod:`ast` and returns the calls in its body that match what
the trace says happened: ``.item()`` for ``aten::_local_scalar_dense``, ``.to(`` / ``.cuda(`` /
``.copy_(`` for a host-to-device copy, ``.cpu()`` / ``.tolist()`` / ``.numpy()`` for a device-to-host
copy. When the file is not there (a trace from another machine), does not hold that function at that
line any more (edited since), or the function makes no matching call, the def line is the answer.

Files are read relative to the current folder (or as absolute paths), once per process.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# What a kind of event looks like in source: tiers of (method names, builtin function names). The first
# tier with a match in the function wins, so a specific call (``.cpu()``) beats a general one (``.to(``).
_KINDS: dict[str, tuple[tuple[frozenset[str], frozenset[str]], ...]] = {
    # aten::_local_scalar_dense / aten::item: .item(), or float(t) / int(t) / bool(t) on a tensor.
    "item": (
        (frozenset({"item"}), frozenset()),
        (frozenset({"tolist"}), frozenset({"float", "int", "bool"})),
    ),
    "host_to_device": ((frozenset({"to", "cuda", "copy_"}), frozenset()),),
    "device_to_host": (
        (frozenset({"cpu", "tolist", "numpy"}), frozenset()),
        (frozenset({"to", "copy_"}), frozenset()),
    ),
    # A copy whose direction the caller does not know (a host sync under aten::copy_).
    "copy": ((frozenset({"to", "cuda", "copy_", "cpu", "tolist", "numpy"}), frozenset()),),
    # Operators whose output size depends on the data: the host waits to learn it.
    "data_dependent": (
        (frozenset({"nonzero", "masked_select", "unique", "repeat_interleave", "argwhere"}), frozenset()),
    ),
}

# Operator name (as in the trace) -> the kind of call that issues it.
OP_KINDS = {
    "aten::_local_scalar_dense": "item",
    "aten::item": "item",
    "aten::copy_": "copy",
    "aten::to": "copy",
    "aten::_to_copy": "copy",
    "aten::nonzero": "data_dependent",
    "aten::masked_select": "data_dependent",
    "aten::unique": "data_dependent",
    "aten::_unique2": "data_dependent",
    "aten::repeat_interleave": "data_dependent",
}

# Memcpy direction (as in the trace's transfer rows) -> the kind of call that issues it.
DIRECTION_KINDS = {"HtoD": "host_to_device", "DtoH": "device_to_host"}

# Longest call text quoted after a line number; longer ones keep their start and end.
MAX_CALL_CHARS = 60
# At most this many call sites are named for one frame; more are summarised as "and N more".
MAX_SITES = 3

_LOCATION_RE = re.compile(r"^(?P<file>.+):(?P<line>\d+) \((?P<function>.*)\)$")


@dataclass(frozen=True)
class CallSite:
    """One call in a function's body: its line and its source text (``loss.item()``)."""

    line: int
    text: str


def kind_for_op(op: str | None) -> str | None:
    """The kind of call behind an operator (``aten::_local_scalar_dense`` -> ``"item"``), or None."""
    return OP_KINDS.get(op or "")


def call_sites(file: str, def_line: int, function: str, kind: str) -> list[CallSite]:
    """The calls of ``kind`` in the body of ``function`` defined at ``def_line`` of ``file``, in source order.

    Calls inside nested functions, lambdas and classes are not the function's own (they run in their
    own frames) and are left out. Empty when the file cannot be read or parsed, has no function of that
    name starting at that line, or the function makes no such call.
    """
    if kind not in _KINDS:
        return []
    parsed = _parse(file)
    if parsed is None:
        return []
    tree, source = parsed
    node = _function_at(tree, def_line, function)
    if node is None:
        return []
    calls = list(_own_calls(node))
    for methods, builtins in _KINDS[kind]:
        found = [call for call in calls if _matches(call, methods, builtins)]
        # x.cpu().numpy() is one copy: a match inside another match's receiver chain is the same call site.
        chained = {id(node) for call in found for node in ast.walk(call.func) if node is not call}
        found = [call for call in found if id(call) not in chained]
        if found:
            found.sort(key=lambda call: (call.lineno, call.col_offset))
            return [CallSite(call.lineno, _call_text(call, source)) for call in found]
    return []


def resolve_location(location: str | None, kind: str | None, ordinal: int | None = None, total: int | None = None):
    """``"file:DEF (function)"`` -> ``"file:LINE (call text)"`` for the calls of ``kind`` in that function.

    ``ordinal`` and ``total``: this event is the ``ordinal``-th (0-based) of ``total`` events of the same
    kind in one call of the function. When ``total`` equals the number of matching call sites, each event
    is taken to come from the site at the same position (straight-line code runs its calls in source
    order) and only that site is named; otherwise every site is (at most :data:`MAX_SITES`). Without a
    match, or for a location that is not of that form, ``location`` is returned as it is.
    """
    if not location or not kind:
        return location
    match = _LOCATION_RE.match(location)
    if not match:
        return location
    file, function = match["file"], match["function"]
    sites = call_sites(file, int(match["line"]), function, kind)
    if not sites:
        return location
    if ordinal is not None and total is not None and total == len(sites) and 0 <= ordinal < total:
        sites = [sites[ordinal]]
    named = [f"{file}:{site.line} ({site.text})" for site in sites[:MAX_SITES]]
    if len(sites) > MAX_SITES:
        named.append(f"and {len(sites) - MAX_SITES} more in {function}()")
    return ", ".join(named)


def clear_cache() -> None:
    """Forget the files read so far (they are read once per process)."""
    _parse.cache_clear()


@lru_cache(maxsize=128)
def _parse(file: str) -> tuple[ast.Module, str] | None:
    path = Path(file)
    try:
        if not path.is_file():
            return None
        source = path.read_text(encoding="utf-8")
        return ast.parse(source, filename=file), source
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return None


def _function_at(tree: ast.Module, def_line: int, function: str) -> ast.AST | None:
    """The function (or lambda) called ``function`` whose code starts at ``def_line``.

    A frame's line is the code object's first line: the ``def`` line, or the first decorator's line.
    """
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if def_line in (node.lineno, first):
                return node
        elif isinstance(node, ast.Lambda) and function == "<lambda>" and node.lineno == def_line:
            return node
    return None


def _own_calls(function: ast.AST):
    """Every call in ``function``'s body (arguments' defaults and decorators excluded), not in nested scopes."""
    body = function.body if isinstance(function.body, list) else [function.body]
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _matches(call: ast.Call, methods: frozenset[str], builtins: frozenset[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr in methods and not (func.attr == "to" and _dtype_only(call))
    if isinstance(func, ast.Name):
        return func.id in builtins and len(call.args) == 1
    return False


# torch dtypes as written in ``.to(torch.bfloat16)``: a cast on the same device, not a copy between devices.
_DTYPE_NAMES = frozenset(
    "float float32 float64 double half float16 bfloat16 int int8 int16 int32 int64 long short uint8 bool "
    "complex64 complex128 cfloat cdouble float8_e4m3fn float8_e5m2".split()
)


def _dtype_only(call: ast.Call) -> bool:
    """``x.to(torch.float16)``, ``x.to(y.dtype)``, ``x.to(dtype=...)``: a cast that moves no data between devices."""
    if any(keyword.arg in ("device", None) for keyword in call.keywords):
        return False
    if not call.args:
        return any(keyword.arg == "dtype" for keyword in call.keywords)
    if len(call.args) != 1:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.Attribute):
        return arg.attr == "dtype" or (
            arg.attr in _DTYPE_NAMES and isinstance(arg.value, ast.Name) and arg.value.id == "torch"
        )
    return isinstance(arg, ast.Name) and arg.id == "dtype"


def _call_text(call: ast.Call, source: str) -> str:
    text = ast.get_source_segment(source, call) or ""
    text = " ".join(text.split())
    if not text:
        func = call.func
        text = f".{func.attr}()" if isinstance(func, ast.Attribute) else "call"
    if len(text) > MAX_CALL_CHARS:
        keep = MAX_CALL_CHARS - 1
        text = text[: keep - keep // 3] + "…" + text[-(keep // 3) :]
    return text
