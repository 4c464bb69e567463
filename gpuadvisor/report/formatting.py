"""Numbers and kernel names for people: the one place both the terminal and the Markdown report format them.

Every function takes what a report may hold (a number, ``None``, NaN, a numpy scalar) and returns a
string; a missing or non-finite value becomes :data:`MISSING`.
"""

from __future__ import annotations

import math
import re
from typing import Any

MISSING = "—"

# Above this many microseconds a duration reads better in milliseconds (10 000 µs -> "10.0 ms").
MS_ABOVE_US = 10_000
# Above this many microseconds, seconds (a whole trace taken as one step can last minutes).
S_ABOVE_US = 10_000_000


def as_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (None, NaN, inf, strings, bools all give None)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def format_us(value: Any) -> str:
    """A duration given in µs: ``"0.85 µs"``, ``"12.4 µs"``, ``"1,234 µs"``, ``"12.3 ms"``, ``"3,057 ms"``,
    ``"42.9 s"``."""
    us = as_number(value)
    if us is None:
        return MISSING
    size = abs(us)
    if size > S_ABOVE_US:
        return f"{us / 1e6:,.1f} s"
    if size > MS_ABOVE_US:
        ms = us / 1000
        return f"{ms:,.0f} ms" if size >= 100_000 else f"{ms:.1f} ms"
    if size >= 100 or us == 0:
        return f"{us:,.0f} µs"
    if size >= 10:
        return f"{us:.1f} µs"
    return f"{us:.2f} µs"


def format_pct(value: Any) -> str:
    """A percentage already scaled to 0-100: ``"42.0%"``, ``"<0.1%"`` for tiny non-zero values."""
    pct = as_number(value)
    if pct is None:
        return MISSING
    if 0 < abs(pct) < 0.05:
        return "<0.1%" if pct > 0 else ">-0.1%"
    return f"{pct:.1f}%"


def format_count(value: Any) -> str:
    """A count or a per-step average: ``"12"``, ``"1.5"``, ``"1,234"``, ``"0.25"``."""
    number = as_number(value)
    if number is None:
        return MISSING
    if float(number).is_integer():
        return f"{number:,.0f}"
    if abs(number) >= 100:
        return f"{number:,.0f}"
    if abs(number) >= 1:
        return f"{number:.1f}"
    return f"{number:.2f}"


def _scaled(value: Any, units: tuple[tuple[float, str], ...]) -> str:
    number = as_number(value)
    if number is None:
        return MISSING
    for scale, unit in units:
        if abs(number) >= scale:
            scaled = number / scale
            text = f"{scaled:,.0f}" if abs(scaled) >= 100 else f"{scaled:.1f}" if abs(scaled) >= 10 else f"{scaled:.2f}"
            return f"{text} {unit}"
    return f"{number:.0f} {units[-1][1]}" if units[-1][0] == 1 else f"{number:.3g} {units[-1][1]}"


_BYTES = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B"))
_BYTES_PER_S = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1, "B/s"))
_FLOPS_PER_S = ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s"), (1, "FLOP/s"))
_FLOPS = ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"), (1, "FLOP"))


def format_bytes(value: Any) -> str:
    """A size in bytes, decimal units: ``"512 B"``, ``"4.19 MB"``, ``"1.20 GB"``."""
    return _scaled(value, _BYTES)


def format_bytes_per_s(value: Any) -> str:
    """A bandwidth: ``"4.80 TB/s"``, ``"912 GB/s"``."""
    return _scaled(value, _BYTES_PER_S)


def format_flops_per_s(value: Any) -> str:
    """A compute rate: ``"989 TFLOP/s"``, ``"1.98 PFLOP/s"``."""
    return _scaled(value, _FLOPS_PER_S)


def format_flops(value: Any) -> str:
    """An amount of work: ``"2.15 GFLOP"``."""
    return _scaled(value, _FLOPS)


def format_intensity(value: Any) -> str:
    """Arithmetic intensity in FLOP/byte: ``"0.25"``, ``"12.5"``, ``"1,024"``."""
    number = as_number(value)
    if number is None:
        return MISSING
    if abs(number) >= 100:
        return f"{number:,.0f}"
    if abs(number) >= 1:
        return f"{number:.1f}"
    return f"{number:.2g}"


# --- kernel names -------------------------------------------------------------------------------

KERNEL_NAME_CHARS = 60

# Kernels whose own name says little: the work is named by a template argument.
_ELEMENTWISE_WRAPPERS = {
    "elementwise_kernel",
    "vectorized_elementwise_kernel",
    "unrolled_elementwise_kernel",
    "index_elementwise_kernel",
    "elementwise_kernel_with_index",
    "reduce_kernel",
    "multi_tensor_apply_kernel",
}
_GENERIC_KERNELS = {"Kernel", "Kernel2", "kernel", "device_kernel", "DeviceKernel", "launch_kernel"}
# Template arguments that wrap the informative one (the functor or the ATen kernel function).
_WRAPPER_ARGS = {
    "gpu_kernel_impl",
    "gpu_kernel_impl_nocast",
    "gpu_index_kernel",
    "AUnaryFunctor",
    "BUnaryFunctor",
    "BinaryFunctor",
    "UnaryFunctor",
    "ReduceOp",
    "func_wrapper_t",
    "TensorListMetadata",
    "OpaqueType",
}
_INFORMATIVE_ARG = re.compile(r"Functor|Ops$|Op$|_functor$|kernel|_impl$")
_PRIMITIVES = {
    "void", "bool", "char", "short", "int", "long", "unsigned", "signed", "float", "double", "half",
    "float2", "int2", "c10", "at", "std", "true", "false", "decltype",
}  # fmt: skip
_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|\(anonymous namespace\)")


def _split_cxx(name: str) -> tuple[str, str] | None:
    """Split a demangled C++ name into (name without templates and parameters, first template argument list).

    Returns None when the angle brackets do not balance (the name is not C++ after all).
    """
    base: list[str] = []
    targs_span: list[int] = []  # [start, end) of the first top-level template argument list
    angle = 0
    i = 0
    while i < len(name):
        char = name[i]
        if name.startswith("->", i):  # "->" is not a bracket
            if not angle:
                base.append("->")
            i += 2
            continue
        if char == "<":
            angle += 1
            if angle == 1 and not targs_span:
                targs_span.append(i + 1)
        elif char == ">":
            if angle == 0:
                return None
            angle -= 1
            if angle == 0 and len(targs_span) == 1:
                targs_span.append(i)
        elif char == "(" and angle == 0:
            break  # the parameter list
        elif angle == 0:
            base.append(char)
        i += 1
    if angle:
        return None
    targs = name[targs_span[0] : targs_span[1]] if len(targs_span) == 2 else ""
    return "".join(base).strip(), targs


def _qualified_names(text: str) -> list[str]:
    return re.findall(r"[A-Za-z_][\w]*(?:::[A-Za-z_~][\w]*)*", text)


def _informative_arg(targs: str) -> str | None:
    """The functor or ATen kernel function that names the work inside an elementwise/reduce wrapper."""
    for qualified in _qualified_names(targs):
        leaf = qualified.split("::")[-1]
        if leaf in _WRAPPER_ARGS or leaf in _ELEMENTWISE_WRAPPERS or leaf in _PRIMITIVES:
            continue
        if _INFORMATIVE_ARG.search(leaf):
            return leaf
    # A lambda defined in an ATen function: ``launch_clamp_scalar(at::TensorIteratorBase&, ...)::{lambda()#1}``.
    for match in re.finditer(r"([A-Za-z_]\w*)\(", targs):
        if match.group(1) not in {"lambda", "operator", "decltype"}:
            return match.group(1)
    return None


def _first_type_arg(targs: str) -> str | None:
    """The leaf of the first template argument when it is a class (cutlass::Kernel<X>), else None."""
    names = _qualified_names(targs)
    if not names or not targs.lstrip().startswith(names[0]):
        return None
    leaf = names[0].split("::")[-1]
    return None if leaf in _PRIMITIVES else leaf


def _demangled_short(name: str) -> str | None:
    split = _split_cxx(_ANONYMOUS.sub("", name))
    if split is None:
        return None
    base, targs = split
    base = base.split()[-1] if base.split() else ""  # drop "void " and other return types
    parts = [part for part in base.split("::") if part]
    if not parts:
        return None
    leaf = parts[-1]
    if leaf in _ELEMENTWISE_WRAPPERS:
        inner = _informative_arg(targs)
        return f"{leaf}<{inner}>" if inner else leaf
    if leaf in _GENERIC_KERNELS:
        inner = _first_type_arg(targs)
        if inner:
            return inner
        return "::".join(parts[-2:])
    return leaf


def _read_source_names(mangled: str, start: int) -> tuple[list[str], int]:
    """Read consecutive Itanium <length><identifier> pairs from ``start``; return them and the end index."""
    names: list[str] = []
    i = start
    while i < len(mangled):
        match = re.match(r"(\d+)", mangled[i:])
        if not match:
            break
        length = int(match.group(1))
        begin = i + len(match.group(1))
        identifier = mangled[begin : begin + length]
        if len(identifier) != length or not re.fullmatch(r"[A-Za-z_]\w*", identifier):
            break
        names.append(identifier)
        i = begin + length
    return names, i


def _mangled_function_name(name: str) -> tuple[list[str], int]:
    """The source names of an Itanium-mangled function's (nested) name and where they end; ([], 0) when
    ``name`` is not mangled."""
    if not name.startswith("_Z"):
        return [], 0
    i = 2
    if name.startswith("_ZN"):
        i = 3
        while i < len(name) and name[i] in "rVKRO":  # cv- and ref-qualifiers of a member function
            i += 1
    return _read_source_names(name, i)


def mangled_leaf(name: str) -> str | None:
    """The function's own name (last component, no namespaces or template arguments) of an Itanium-mangled
    name, as a demangler would print it before ``<`` or ``(``: ``_ZN17cutlass__5x_cudnn6KernelINS_...`` ->
    ``Kernel``; None for a name that is not mangled."""
    names, _ = _mangled_function_name(name)
    return names[-1] if names else None


def _mangled_short(name: str) -> str | None:
    """A short name for an Itanium-mangled kernel (``_ZN...``) without a demangler: nested name, then template."""
    names, i = _mangled_function_name(name)
    if not names:
        return None
    leaf = names[-1]
    if leaf in _GENERIC_KERNELS and name[i : i + 1] == "I":
        j = i + 1
        # Skip substitutions (S_, S0_, NS_) and nested-name openers before the first argument's name.
        while j < len(name):
            sub = re.match(r"N|S[0-9A-Z]*_|L", name[j:])
            if not sub:
                break
            j += len(sub.group(0))
        inner, _ = _read_source_names(name, j)
        if inner:
            return inner[-1]
    return leaf


def shorten_middle(text: str, max_chars: int) -> str:
    """Cut the middle out of ``text`` (keeping both ends, where kernel names carry tile sizes and suffixes)."""
    if len(text) <= max_chars:
        return text
    if max_chars < 8:
        return text[: max_chars - 1] + "…"
    tail_len = max(3, max_chars // 4 if max_chars < 48 else max_chars // 3)
    tail = text[-tail_len:]
    cut = tail.find("_")
    back = text.rfind("_", 0, len(text) - tail_len)
    if 0 <= cut < tail_len - 4:  # start the tail at a word boundary when that costs little
        tail = tail[cut + 1 :]
    elif 0 <= back and len(text) - back - 1 <= max_chars // 2 and len(text) - tail_len - back <= tail_len // 2 + 2:
        tail = text[back + 1 :]  # a word cut after its first letters (splitK -> "tK"): take it whole
    head_len = max_chars - 1 - len(tail)
    head = text[:head_len]
    cut = head.rfind("_")
    if cut >= head_len - 8 and cut > head_len // 2:
        head = head[: cut + 1]
    return head + "…" + tail


def short_kernel_name(name: Any, max_chars: int = KERNEL_NAME_CHARS) -> str:
    """A kernel name short enough for a table, keeping the part that says what the kernel does.

    C++ names lose ``void``, namespaces, template arguments and the parameter list
    (``void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>(...)`` ->
    ``CatArrayBatchedCopy``); generic wrappers keep the functor or kernel they wrap
    (``vectorized_elementwise_kernel<CUDAFunctor_add>``, ``cutlass::Kernel2<X>`` -> ``X``);
    mangled names are read without a demangler; names longer than ``max_chars`` lose their middle.
    Library kernel names (``sm90_xmma_gemm_...``, ``ampere_sgemm_128x64_nn``, ``triton_...``) are kept.
    """
    if name is None:
        return MISSING
    from gpuadvisor.textsafe import escape_control

    text = escape_control(" ".join(str(name).split()))
    if not text:
        return MISSING
    short: str | None = None
    if text.startswith("_Z"):
        short = _mangled_short(text)
    elif text.startswith(("Memcpy", "Memset")):
        short = text
    elif "<" in text or "::" in text or "(" in text:
        short = _demangled_short(text)
    short = short or text
    wrapped = re.fullmatch(r"(\w+)<(\w+)>", short)
    if wrapped and len(short) > max_chars:
        # Keep the wrapped functor whole and shorten the wrapper: "vectorized_elem…<CUDAFunctor_add>".
        wrapper, inner = wrapped.groups()
        budget = max_chars - len(inner) - 3
        if budget >= 6:
            return f"{wrapper[:budget]}…<{inner}>"
        return shorten_middle(inner, max_chars)
    return shorten_middle(short, max_chars)
