"""Reading CUDA C++ for the scan: files, CUDA embedded in Python, comments, macros, tokens and kernels.

No C++ parser: the scan needs only the kernels' bodies and the integer arithmetic of their shared-memory
subscripts, so a tokenizer, a small ``#define`` expander and brace matching do. What the scan does with a
file that is not plain CUDA text (too large, binary, not UTF-8, unbalanced braces, not valid Python) is
one warning line, and the file is skipped.
"""

from __future__ import annotations

import ast
import bisect
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuadvisor.textsafe import escape_control

# A 50 MB .cu file is generated code, not a kernel someone tunes by hand; past this size the scan refuses it
# before reading it (8 MiB of CUDA is about 200,000 lines).
MAX_FILE_BYTES = 8 * 1024 * 1024
CUDA_SUFFIXES = (".cu", ".cuh")
PYTHON_SUFFIXES = (".py",)
# Code past this many characters is tokenized lazily: the function bodies (blocks at file scope that hold no
# __global__) are kept as text and tokenized when a kernel is interpreted, so a file of 36,000 kernels under the
# scan's work budget tokenizes the few it interprets, not 3.2 M tokens (7.8 s of 12 s on a loaded 2-core machine).
LAZY_MIN_CHARS = 512 * 1024
# Macro expansion stops growing a file's tokens past this factor (a macro bomb is refused, not expanded).
MAX_EXPANSION_FACTOR = 8
MAX_MACRO_DEPTH = 16

_HINT_RE = re.compile(r"//\s*gpuadvisor:\s*(.*)")
_STRIP_RE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_DIRECTIVE_RE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_DEFINE_RE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(\(([^)]*)\))?(.*)", re.S)
_TOKEN_RE = re.compile(
    r"\s+|(?P<id>[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)"
    r"|(?P<num>(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[uUlLfF]*)"
    r"|(?P<str>\"\")|(?P<op><<=|>>=|\.\.\.|->|\+\+|--|&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%&|^]=|[-+*/%&|^~!<>=?:;,.()\[\]{}#])"
    r"|(?P<other>.)"
)
# The same tokens for re.findall, leading whitespace absorbed: (whitespace, id, num, str, op, other) per token, no
# Match objects. 8 MiB of CUDA (3.2 M tokens) tokenized in about half the time of a finditer over _TOKEN_RE.
_TOKENS_RE = re.compile(r"(\s*)(?:" + re.sub(r"\(\?P<\w+>", "(", _TOKEN_RE.pattern.removeprefix(r"\s+|")) + ")")
_SPACES_RE = re.compile(r"\s+")


class SourceSkipped(Exception):
    """A file the scan cannot read as CUDA text; the message is the one-line warning."""


@dataclass(slots=True)  # millions of them for a large file: slots make each one cheaper to create and smaller
class Token:
    text: str
    kind: str  # "id", "num", "str", "op", "other"
    line: int


@dataclass(slots=True)
class LazyBody(Token):
    """A block's text kept for later (``preprocess`` of a large file): ``code[start:end]`` of ``source``, whose
    first line is ``line``. Stands in the token list between the block's braces."""

    start: int = 0
    end: int = 0
    source: object = None  # _LazySource

    def tokens(self) -> list[Token]:
        src = self.source
        tokens = tokenize(src.code[self.start : self.end], 1, [0], self.line - 1)
        return expand_macros(tokens, src.macros, src.notes) if src.macros else tokens


@dataclass
class _LazySource:
    code: str
    macros: dict
    notes: list


@dataclass
class Macro:
    name: str
    params: list[str] | None  # None: object-like
    body: list[Token]
    expandable: bool = True  # False: uses # or ## (stringizing, pasting), which the scan does not do


@dataclass
class Kernel:
    """One ``__global__`` function: its name, parameters and body tokens (between the braces)."""

    name: str
    line: int
    params: list[tuple[str, bool]]  # (name, is_pointer_or_reference)
    template_params: list[str]
    body: list[Token]
    launch_bounds: int | None
    hints: dict[str, str] = field(default_factory=dict)
    lazy: LazyBody | None = None  # the body not tokenized yet (a large file): load_body() does it

    def load_body(self) -> list[Token]:
        """The body's tokens, tokenized now if the file was read lazily."""
        if self.lazy is not None:
            self.body, self.lazy = self.lazy.tokens(), None
        return self.body


@dataclass
class SharedDecl:
    """A ``__shared__`` declaration found outside any function (file scope)."""

    tokens: list[Token]


@dataclass
class CudaUnit:
    """A piece of CUDA text and where it came from: a file, or a string inside a Python file."""

    path: str
    text: str
    line_offset: int = 0  # added to line numbers inside ``text`` (embedded strings)
    origin: str = ""  # "load_inline cuda_sources", "cupy.RawKernel", ...


def read_text(path: Path) -> str:
    """The file as text, or :class:`SourceSkipped` with the one-line reason. A regular file only (a FIFO named
    ``k.cu`` or ``/dev/zero`` is refused by its type, never read) of at most :data:`MAX_FILE_BYTES`, counted as it
    is read (:mod:`gpuadvisor.inputs`)."""
    from gpuadvisor.inputs import InputError, read_bytes

    try:
        data = read_bytes(path, "cuda", MAX_FILE_BYTES)
    except InputError as exc:
        reason = str(exc).removeprefix(f"source file {path}: ")
        if reason.startswith("larger than"):
            reason = f"over the {MAX_FILE_BYTES // (1024 * 1024)} MiB limit for a source file"
        raise SourceSkipped(f"{reason}: skipped") from None
    if b"\x00" in data[:65536]:
        raise SourceSkipped("binary file (NUL bytes), not CUDA source: skipped")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceSkipped(f"not UTF-8 text (byte {exc.start}): skipped") from None


def python_units(path: Path, text: str) -> tuple[list[CudaUnit], list[str]]:
    """CUDA strings embedded in a Python file, and notes (Triton kernels, sources that are not literals).

    Recognised: ``load_inline(cuda_sources=...)`` (and ``cpp_sources``), ``cupy.RawKernel(code, name)``,
    ``cupy.RawModule(code=...)``; the code may be a string literal, a list of them, or a module-level name
    bound to one.
    """
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        raise SourceSkipped(f"not valid Python{f' (line {line})' if line else ''}: skipped") from None
    names: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names[node.target.id] = node.value
    units: list[CudaUnit] = []
    notes: list[str] = []
    triton_kernels = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(
                _dotted(d.func if isinstance(d, ast.Call) else d).endswith(("triton.jit", "autotune"))
                for d in node.decorator_list
            ):
                triton_kernels += 1
        if not isinstance(node, ast.Call):
            continue
        func = _dotted(node.func)
        leaf = func.rsplit(".", 1)[-1]
        sources: list[tuple[ast.expr, str]] = []
        if leaf == "load_inline":
            sources = [
                (k.value, f"load_inline {k.arg}") for k in node.keywords if k.arg in ("cuda_sources", "cpp_sources")
            ]
        elif leaf in ("RawKernel", "RawModule"):
            code = [k.value for k in node.keywords if k.arg == "code"]
            if node.args:
                code.insert(0, node.args[0])
            sources = [(c, f"cupy.{leaf}") for c in code[:1]]
        for value, origin in sources:
            for string_node in _string_nodes(value, names):
                if isinstance(string_node, ast.Constant):
                    units.append(CudaUnit(str(path), string_node.value, string_node.lineno - 1, origin))
                else:
                    notes.append(
                        f"{path}:{getattr(string_node, 'lineno', node.lineno)}: {origin} source is not a "
                        "string literal (an f-string or a computed value): not scanned"
                    )
    if triton_kernels:
        notes.append(
            f"{path}: {triton_kernels} Triton kernel(s): Triton manages shared memory itself (the compiler picks "
            "layouts and swizzles), so the scan does not predict their bank conflicts; measure them with "
            "`gpuadvisor ncu`"
        )
    return units, notes


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _string_nodes(value: ast.expr, names: dict[str, ast.expr], depth: int = 0) -> list[ast.expr]:
    if depth > 4:
        return []
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return [value]
    if isinstance(value, (ast.List, ast.Tuple)):
        return [n for item in value.elts for n in _string_nodes(item, names, depth + 1)]
    if isinstance(value, ast.Name) and value.id in names:
        return _string_nodes(names[value.id], names, depth + 1)
    return [value]


# --------------------------------------------------------------------------------------------------------------
# Text -> tokens


@dataclass
class Preprocessed:
    tokens: list[Token]
    macros: dict[str, Macro]
    hints: list[tuple[int, dict[str, str]]]  # (line, {key: value}) from `// gpuadvisor: key=value ...`
    notes: list[str]


def preprocess(text: str, line_offset: int = 0) -> Preprocessed:
    """Strip comments and strings, collect ``#define`` macros and ``// gpuadvisor:`` hints, tokenize and expand.

    Raises :class:`SourceSkipped` when braces do not balance or macro expansion runs away.
    """
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset) + line_offset

    hints = []
    for match in _HINT_RE.finditer(text):
        pairs = dict(re.findall(r"([A-Za-z_]\w*)\s*=\s*([^\s;]+)", match.group(1)))
        if pairs:
            hints.append((line_of(match.start()), pairs))

    def blank(match: re.Match) -> str:
        s = match.group(0)
        if s.startswith('"'):
            return '""' + "\n" * s.count("\n")
        if s.startswith("'"):
            return "0"  # a character literal is an integer
        return " " + "\n" * s.count("\n")

    stripped = _STRIP_RE.sub(blank, text)
    directives: list[tuple[int, str]] = []

    def drop_directive(match: re.Match) -> str:
        directives.append((line_of(match.start()), match.group(0)))
        return "\n" * match.group(0).count("\n")

    code = _DIRECTIVE_RE.sub(drop_directive, stripped)
    macros: dict[str, Macro] = {}
    for line, directive in directives:
        found = _DEFINE_RE.match(directive.strip().replace("\\\n", " "))
        if not found:
            continue
        name, params = found.group(1), found.group(3)
        body = tokenize(found.group(4), line)
        param_list = [p.strip() for p in params.split(",") if p.strip()] if found.group(2) else None
        macros[name] = Macro(name, param_list, body, expandable=not any(t.text == "#" for t in body))
    # In the stripped code a brace can only be a token (strings, character literals and comments are gone).
    opens, closes = code.count("{"), code.count("}")
    if opens != closes:
        raise SourceSkipped(f"unbalanced braces ({opens} '{{' against {closes} '}}'): skipped")
    notes: list[str] = []
    tokens = None
    braces_in_macros = any(t.text in ("{", "}") for m in macros.values() for t in m.body)
    if len(code) >= LAZY_MIN_CHARS and not braces_in_macros:
        tokens = _tokenize_lazily(code, line_offset, _LazySource(code, macros, notes))
    if tokens is None:
        tokens = tokenize(code, 1, [0], line_offset)
    expanded = expand_macros(tokens, macros, notes)
    return Preprocessed(expanded, macros, hints, notes)


_BRACE_RE = re.compile(r"[{}]")


def _tokenize_lazily(code: str, line_offset: int, source: _LazySource) -> list[Token] | None:
    """The tokens of ``code`` with each block that holds no ``__global__`` (a function's body, a struct) kept as
    one :class:`LazyBody` between its braces; blocks that do (``extern "C" { ... }``, a namespace) are read the
    same way inside. The same tokens as :func:`tokenize` once the bodies are loaded. None when the braces close
    before they open (the eager path then reads the file as it always did)."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for match in _BRACE_RE.finditer(code):
        if match.group() == "{":
            stack.append(match.start())
        elif not stack:
            return None
        else:
            pairs[stack.pop()] = match.start()
    opens = sorted(pairs)
    tokens: list[Token] = []

    def emit(start: int, end: int, line: int) -> int:
        """Tokens of code[start:end] (whose first line is ``line``) into ``tokens``; returns the line at ``end``."""
        at = start
        index = bisect.bisect_left(opens, start)
        while index < len(opens) and opens[index] < end:
            open_at = opens[index]
            close_at = pairs[open_at]
            tokens.extend(tokenize(code[at : open_at + 1], 1, [0], line - 1))
            line += code.count("\n", at, open_at + 1)
            if code.find("__global__", open_at, close_at) >= 0:
                line = emit(open_at + 1, close_at, line)
            else:
                tokens.append(LazyBody("{...}", "body", line, open_at + 1, close_at, source))
                line += code.count("\n", open_at + 1, close_at)
            at = close_at
            index = bisect.bisect_left(opens, close_at, index)
        tokens.extend(tokenize(code[at:end], 1, [0], line - 1))
        return line + code.count("\n", at, end)

    emit(0, len(code), 1 + line_offset)
    return tokens


def tokenize(code: str, line: int, line_starts: list[int] | None = None, line_offset: int = 0) -> list[Token]:
    """Tokens of ``code``; with ``line_starts`` (the offsets where lines start) each token gets its own line
    (1 + ``line_offset`` for the first), else all get ``line``. A character no token knows (``other``) keeps no
    control character: it is escaped (:mod:`gpuadvisor.textsafe`), so source text shown later is safe."""
    tokens: list[Token] = []
    append = tokens.append
    per_line = bool(line_starts)
    where = 1 + line_offset if per_line else line
    for space, ident, num, string, op, other in _TOKENS_RE.findall(code):
        if per_line and space and "\n" in space:
            where += space.count("\n")
        if ident:
            if "::" in ident:
                text = _SPACES_RE.sub("", ident)
                append(Token(text, "id", where))
                if per_line:
                    where += ident.count("\n")
            else:
                append(Token(ident, "id", where))
        elif op:
            append(Token(op, "op", where))
        elif num:
            append(Token(num, "num", where))
        elif string:
            append(Token(string, "str", where))
        else:
            append(Token(escape_control(other), "other", where))
    return tokens


def expand_macros(tokens: list[Token], macros: dict[str, Macro], notes: list[str]) -> list[Token]:
    """Expand object-like and function-like macros (no ``#``/``##``), keeping each use's line number."""
    if not macros:
        return tokens
    limit = max(len(tokens) * MAX_EXPANSION_FACTOR, 100_000)
    out: list[Token] = []
    unexpandable: set[str] = set()
    _expand_into(tokens, macros, out, frozenset(), 0, limit, unexpandable)
    for name in sorted(unexpandable):
        notes.append(f"macro {name} uses # or ## (or expands too far): left unexpanded")
    return out


def _expand_into(tokens, macros, out, active, depth, limit, unexpandable) -> None:
    i = 0
    n = len(tokens)
    while i < n:
        token = tokens[i]
        macro = macros.get(token.text) if token.kind == "id" else None
        if macro is None or token.text in active or depth > MAX_MACRO_DEPTH or len(out) > limit:
            if macro is not None and (depth > MAX_MACRO_DEPTH or len(out) > limit):
                unexpandable.add(token.text)
            out.append(token)
            i += 1
            continue
        if not macro.expandable:
            unexpandable.add(macro.name)
            out.append(token)
            i += 1
            continue
        if macro.params is None:
            body = [Token(t.text, t.kind, token.line) for t in macro.body]
            _expand_into(body, macros, out, active | {macro.name}, depth + 1, limit, unexpandable)
            i += 1
            continue
        if i + 1 >= n or tokens[i + 1].text != "(":
            out.append(token)  # a function-like macro's name without arguments is not a use
            i += 1
            continue
        args, end = _macro_args(tokens, i + 1)
        if end < 0:
            out.append(token)
            i += 1
            continue
        mapping = dict(zip(macro.params, args))
        body: list[Token] = []
        for t in macro.body:
            if t.kind == "id" and t.text in mapping:
                body.extend(Token(a.text, a.kind, token.line) for a in mapping[t.text])
            else:
                body.append(Token(t.text, t.kind, token.line))
        _expand_into(body, macros, out, active | {macro.name}, depth + 1, limit, unexpandable)
        i = end + 1


def _macro_args(tokens: list[Token], open_index: int) -> tuple[list[list[Token]], int]:
    args: list[list[Token]] = [[]]
    depth = 0
    for j in range(open_index, len(tokens)):
        text = tokens[j].text
        if text in "([{":
            depth += 1
            if depth == 1:
                continue
        elif text in ")]}":
            depth -= 1
            if depth == 0:
                return ([] if args == [[]] else args), j
        elif text == "," and depth == 1:
            args.append([])
            continue
        args[-1].append(tokens[j])
    return [], -1


# --------------------------------------------------------------------------------------------------------------
# Tokens -> kernels


def matching(tokens: list[Token], open_index: int, texts: list[str] | None = None) -> int:
    """Index of the bracket closing ``tokens[open_index]``, or -1 (``texts``: the tokens' texts, when the caller
    has them: a list of strings is scanned faster than attributes)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    if texts is None:
        texts = [t.text for t in tokens[open_index:]]
        base = open_index
    else:
        base = 0
    opener = texts[open_index - base]
    closer = pairs[opener]
    depth = 0
    for j in range(open_index - base, len(texts)):
        text = texts[j]
        if text == opener:
            depth += 1
        elif text == closer:
            depth -= 1
            if depth == 0:
                return j + base
    return -1


_DECL_PREFIX = {"extern", '""', "static", "inline", "__forceinline__", "__noinline__", "__host__", "__device__"}


def find_kernels(pre: Preprocessed) -> tuple[list[Kernel], list[SharedDecl]]:
    """The ``__global__`` functions with bodies, and the ``__shared__`` declarations at file scope."""
    tokens = pre.tokens
    texts = [t.text for t in tokens]  # searched with list.index: C speed over a file of millions of tokens
    kernels: list[Kernel] = []
    bodies: list[tuple[int, int]] = []
    i = 0
    while i < len(tokens):
        try:
            i = texts.index("__global__", i)
        except ValueError:
            break
        start = i
        template_params = _template_params(tokens, start)
        launch_bounds = None
        j = i + 1
        name_index = -1
        while j < len(tokens) and tokens[j].text not in (";", "{"):
            if tokens[j].text == "__launch_bounds__" and j + 1 < len(tokens) and tokens[j + 1].text == "(":
                close = matching(tokens, j + 1, texts)
                if close > 0 and tokens[j + 2].kind == "num":
                    launch_bounds = _int_literal(tokens[j + 2].text)
                j = close + 1 if close > 0 else j + 1
                continue
            if tokens[j].text == "(" and tokens[j - 1].kind == "id":
                name_index = j - 1
                break
            j += 1
        if name_index < 0:
            i = j + 1
            continue
        close = matching(tokens, name_index + 1, texts)
        if close < 0:
            i = name_index + 1
            continue
        params = _params(tokens[name_index + 2 : close])
        k = close + 1
        while k < len(tokens) and tokens[k].text not in ("{", ";"):
            k += 1
        if k >= len(tokens) or tokens[k].text == ";":
            i = k + 1
            continue
        end = matching(tokens, k, texts)
        if end < 0:
            i = k + 1
            continue
        name = tokens[name_index].text
        line = tokens[name_index].line
        body = tokens[k + 1 : end]
        lazy = body[0] if len(body) == 1 and isinstance(body[0], LazyBody) else None
        kernels.append(
            Kernel(
                name,
                line,
                params,
                template_params,
                [] if lazy is not None else body,
                launch_bounds,
                _hints_for(pre, line, tokens[end].line),
                lazy=lazy,
            )
        )
        bodies.append((start, end))
        i = end + 1
    shared: list[SharedDecl] = []
    depth = 0
    for index, text in enumerate(texts if "__shared__" in texts else ()):
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
        elif text == "__shared__" and depth == 0:
            begin = index
            while begin > 0 and tokens[begin - 1].text in ("extern", '""', "static"):
                begin -= 1
            stop = index
            while stop < len(tokens) and tokens[stop].text != ";":
                stop += 1
            shared.append(SharedDecl(tokens[begin:stop]))
    return kernels, shared


def _template_params(tokens: list[Token], global_index: int) -> list[str]:
    j = global_index - 1
    while j >= 0 and tokens[j].text in _DECL_PREFIX:
        j -= 1
    if j < 0 or tokens[j].text != ">":
        return []
    depth = 0
    k = j
    while k >= 0:
        if tokens[k].text == ">":
            depth += 1
        elif tokens[k].text == "<":
            depth -= 1
            if depth == 0:
                break
        k -= 1
    if k <= 0 or tokens[k - 1].text != "template":
        return []
    names = []
    for piece in _split_commas(tokens[k + 1 : j]):
        words = [t.text for t in piece if t.kind == "id"]
        if "=" in [t.text for t in piece]:
            words = [t.text for t in piece[: [t.text for t in piece].index("=")] if t.kind == "id"]
        if words:
            names.append(words[-1])
    return names


def _params(tokens: list[Token]) -> list[tuple[str, bool]]:
    params = []
    for piece in _split_commas(tokens):
        texts = [t.text for t in piece]
        if "=" in texts:
            piece = piece[: texts.index("=")]
            texts = texts[: len(piece)]
        ids = [t for t in piece if t.kind == "id"]
        if not ids or texts == ["void"]:
            continue
        pointer = any(t in ("*", "&", "[") for t in texts)
        params.append((ids[-1].text, pointer))
    return params


def _split_commas(tokens: list[Token]) -> list[list[Token]]:
    pieces: list[list[Token]] = [[]]
    depth = 0
    for t in tokens:
        if t.text in "([{<":
            depth += 1
        elif t.text in ")]}>":
            depth -= 1
        elif t.text == "," and depth == 0:
            pieces.append([])
            continue
        pieces[-1].append(t)
    return [p for p in pieces if p]


def _hints_for(pre: Preprocessed, first_line: int, last_line: int) -> dict[str, str]:
    """Hints on the kernel's lines or on the 3 lines above its name (``pre.hints`` is in line order: a binary search
    finds the first, so a file of 15,000 kernels and as many hints is not 15,000 x 15,000 comparisons)."""
    merged: dict[str, str] = {}
    hints = pre.hints
    start = bisect.bisect_left(hints, first_line - 3, key=lambda hint: hint[0])
    for line, pairs in hints[start:]:
        if line > last_line:
            break
        if first_line - 3 <= line:
            merged.update(pairs)
    return merged


def _int_literal(text: str) -> int | None:
    text = text.rstrip("uUlL")
    try:
        return int(text, 0) if not re.fullmatch(r"0\d+", text) else int(text, 8)
    except ValueError:
        return None


def parse_int_literal(text: str) -> int | None:
    """An integer literal's value (``0x20``, ``32u``, ``010``), or None for a floating-point literal."""
    if (
        re.search(r"[.eE]", text)
        and not text.lower().startswith("0x")
        or text.lower().endswith("f")
        and not text.lower().startswith("0x")
    ):
        return None
    return _int_literal(text)


def units_of(path: Path) -> tuple[list[CudaUnit], list[str]]:
    """The CUDA pieces in one file: the file itself (.cu/.cuh) or the strings a Python file embeds."""
    text = read_text(path)
    if path.suffix in PYTHON_SUFFIXES:
        return python_units(path, text)
    return [CudaUnit(str(path), text)], []
