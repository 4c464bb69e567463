"""A lockstep interpreter for a kernel's integer index arithmetic: every warp of one block, 32 lanes at a time.

Values are Python ints (the same in every lane: constants, ``blockDim``, loop counters that do not depend on
the thread), lists of 32 ints (one per lane: anything derived from ``threadIdx``), pointers into a shared
array, or :class:`Unknown` with the reason the scan cannot follow it (a value read from memory, a call it does
not know, a macro it could not expand). ``if``/``for``/``while`` run under a lane mask, as the hardware runs
them; loops stop after :data:`MAX_LOOP_ITERATIONS`. Every shared-memory load and store records its per-lane
byte addresses, which :mod:`gpuadvisor.scan.banks` turns into wavefronts.

Runtime values the source cannot give (scalar kernel arguments, ``blockIdx``, ``gridDim``, template
parameters) are *sampled*: the kernel is interpreted twice with different sample values, and an access whose
conflict degree changes between the two is reported as unknown ("depends on runtime values"), never as clean.

Work is bounded per kernel and per file (:class:`WorkBudget`): every statement executed and every expression
evaluated costs a unit, a shared-memory access :data:`RECORD_COST` units; a kernel may spend
:data:`KERNEL_WORK_UNITS` (both sample runs together), a file :data:`FILE_WORK_UNITS` over all its kernels, and
:data:`FILE_TIME_BUDGET_S` of wall-clock time as a backstop. An interpretation cut short reports its accesses as
unknown, with the reason; a kernel reached after the file's budget is spent is not interpreted (unknown too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuadvisor.scan.banks import WARP_SIZE, warp_wavefronts
from gpuadvisor.scan.source import Token, parse_int_literal

FULL_MASK = (1 << WARP_SIZE) - 1
# Loops run at most this many iterations per warp: the patterns the scan models repeat with a period of at
# most 32 (the bank count), and a tree reduction over 1024 threads takes 10 steps.
MAX_LOOP_ITERATIONS = 64
# A loop whose condition the scan cannot evaluate runs this many times (enough to see its update step).
UNKNOWN_TRIP_ITERATIONS = 2
# The work budget (module docstring), in units: one per statement executed and per expression evaluated, and
# RECORD_COST per shared-memory access recorded (its wavefronts are counted for the access and for both fixes).
# Measured on a loaded 2-core machine: a unit costs ~3 us (a 200-byte kernel of three nested 32-trip loops, one
# shared access each: 72 units and 0.22 ms per inner statement), so a kernel's budget is ~1.2 s there and a file's
# ~3 s; every kernel of tests/scan_corpus/ takes under 10,000 units for both runs (at most 328 statements a run).
RECORD_COST = 25
KERNEL_WORK_UNITS = 400_000
FILE_WORK_UNITS = 1_000_000
FILE_TIME_BUDGET_S = 4.0


class WorkBudget:
    """Interpretation work left to one file (or one kernel of it: :meth:`for_kernel`), in units, and its
    wall-clock deadline. ``spent_reason`` says why the work stopped once it has."""

    def __init__(self, units: int = FILE_WORK_UNITS, seconds: float = FILE_TIME_BUDGET_S, parent=None):
        self.left = units
        self.units = units
        self.deadline = time.monotonic() + seconds if parent is None else parent.deadline
        self.parent = parent
        self.spent_reason: str | None = None

    def for_kernel(self) -> WorkBudget:
        """A kernel's share: at most KERNEL_WORK_UNITS of what the file has left; :meth:`close` gives back the
        unspent part."""
        return WorkBudget(min(KERNEL_WORK_UNITS, max(self.left, 0)), parent=self)

    def close(self) -> None:
        if self.parent is not None:
            self.parent.left -= self.units - max(self.left, 0)
            self.units = max(self.left, 0)

    @property
    def spent(self) -> bool:
        return self.left <= 0 or time.monotonic() > self.deadline

    def stop_reason(self) -> str:
        """Why the work stopped now: the kernel's units, the file's units, or the file's time."""
        if time.monotonic() > self.deadline:
            return f"the file's scan time budget ({FILE_TIME_BUDGET_S:g} s) ran out"
        if self.parent is not None and self.units < KERNEL_WORK_UNITS:
            return f"the file's scan work budget ({FILE_WORK_UNITS:,} units) ran out"
        return f"the kernel's scan work budget ({KERNEL_WORK_UNITS:,} units) ran out"


TYPE_SIZES = {
    "bool": 1,
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "__nv_fp8_e4m3": 1,
    "__nv_fp8_e5m2": 1,
    "short": 2,
    "unsigned short": 2,
    "short int": 2,
    "int16_t": 2,
    "uint16_t": 2,
    "half": 2,
    "__half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
    "char2": 2,
    "uchar2": 2,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "signed": 4,
    "signed int": 4,
    "float": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "half2": 4,
    "__half2": 4,
    "__nv_bfloat162": 4,
    "nv_bfloat162": 4,
    "short2": 4,
    "ushort2": 4,
    "char4": 4,
    "uchar4": 4,
    "long": 8,
    "unsigned long": 8,
    "long long": 8,
    "unsigned long long": 8,
    "long int": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "size_t": 8,
    "ptrdiff_t": 8,
    "double": 8,
    "float2": 8,
    "int2": 8,
    "uint2": 8,
    "short4": 8,
    "ushort4": 8,
    "long2": 16,
    "float4": 16,
    "int4": 16,
    "uint4": 16,
    "double2": 16,
    "longlong2": 16,
    "ulonglong2": 16,
}
COMPONENT_SIZES = {
    "float2": 4,
    "int2": 4,
    "uint2": 4,
    "float4": 4,
    "int4": 4,
    "uint4": 4,
    "double2": 8,
    "longlong2": 8,
    "ulonglong2": 8,
    "half2": 2,
    "__half2": 2,
    "__nv_bfloat162": 2,
    "nv_bfloat162": 2,
    "short2": 2,
    "ushort2": 2,
    "short4": 2,
    "ushort4": 2,
    "char2": 1,
    "uchar2": 1,
    "char4": 1,
    "uchar4": 1,
    "long2": 8,
}
COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}
QUALIFIERS = {
    "const",
    "constexpr",
    "volatile",
    "static",
    "register",
    "__restrict__",
    "restrict",
    "__shared__",
    "extern",
    "auto",
    "typename",
    "struct",
    "__align__",
    "alignas",
    "inline",
    "__device__",
    "__forceinline__",
    "mutable",
}
TYPE_WORDS = set(TYPE_SIZES) | {"void", "signed", "unsigned", "long", "short", "int", "char", "dim3", "uint"}
# Integer builtins the interpreter evaluates; any other call is beyond the model.
INT_FUNCTIONS = {"min", "max", "umin", "umax", "__mul24", "__umul24", "std::min", "std::max", "abs"}
CASTS = {"reinterpret_cast", "static_cast", "const_cast"}
BUILTIN_VECTORS = {"threadIdx", "blockIdx", "blockDim", "gridDim"}


class Unknown:
    """A value the scan cannot follow, and why."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


class Opaque:
    """A value that is not an integer the scan tracks (a global pointer, a float); using it is fine, indexing
    shared memory with it is not."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what


@dataclass
class SharedArray:
    name: str
    type_name: str
    elem_size: int | None
    dims: list  # ints, or None for an extern array's unknown extent; Unknown when a dimension cannot be evaluated
    line: int
    extern: bool


@dataclass
class Ptr:
    """A pointer into a shared array: a byte offset (int or per-lane list), the pointee size and the array dims
    below the pointee (a 2-D array decays to a pointer to rows). ``subs`` keeps the subscripts when the
    pointer came from indexing the declared array directly (the pad and swizzle checks need them)."""

    array: SharedArray
    offset: object
    elem_size: int | None
    type_name: str
    inner: tuple = ()
    subs: tuple | None = ()


@dataclass
class LValue:
    array: SharedArray
    offset: object
    width: int | None
    type_name: str
    subs: tuple | None


@dataclass
class Node:
    kind: str
    args: tuple
    pos: int
    end: int


@dataclass
class Site:
    """One shared-memory access in the source (a load or a store) and its totals over the interpreted warps."""

    kind: str  # "load" | "store"
    line: int
    text: str
    array: str
    width_bytes: int | None = None
    instructions: int = 0
    wavefronts: int = 0
    ideal: int = 0
    worst_degree: float = 0.0
    unknown: list = field(default_factory=list)
    guard_unknown: bool = False
    pad_wavefronts: int | None = 0
    swizzle_wavefronts: int | None = 0
    array_dims: list = field(default_factory=list)
    type_name: str = ""

    @property
    def degree(self) -> float | None:
        return self.wavefronts / self.ideal if self.ideal else None


class _Stop(Exception):
    pass


# --------------------------------------------------------------------------------------------------------------
# Parsing: tokens -> statement and expression nodes

_BINARY = {
    "||": 3,
    "&&": 4,
    "|": 5,
    "^": 6,
    "&": 7,
    "==": 8,
    "!=": 8,
    "<": 9,
    ">": 9,
    "<=": 9,
    ">=": 9,
    "<<": 10,
    ">>": 10,
    "+": 11,
    "-": 11,
    "*": 12,
    "/": 12,
    "%": 12,
}
_ASSIGN = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="}


class Parser:
    """Recursive descent over a kernel body; anything it cannot parse becomes an ``opaque`` statement."""

    def __init__(self, tokens: list[Token], type_names: set[str] | None = None):
        self.t = tokens
        self.i = 0
        self.type_names = TYPE_WORDS | (type_names or set())

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.t[j].text if j < len(self.t) else ""

    def kind(self, k: int = 0) -> str:
        j = self.i + k
        return self.t[j].kind if j < len(self.t) else ""

    def take(self, text: str | None = None) -> Token:
        if self.i >= len(self.t):
            raise SyntaxError("unexpected end")
        tok = self.t[self.i]
        if text is not None and tok.text != text:
            raise SyntaxError(f"expected {text!r}, got {tok.text!r}")
        self.i += 1
        return tok

    def statements(self) -> list[Node]:
        out = []
        while self.i < len(self.t):
            out.append(self.statement())
        return out

    def statement(self) -> Node:
        start = self.i
        try:
            return self._statement()
        except (SyntaxError, IndexError, RecursionError):
            self.i = start
            return self._skip_statement(start)

    def _skip_statement(self, start: int) -> Node:
        depth = 0
        while self.i < len(self.t):
            text = self.t[self.i].text
            self.i += 1
            if text in "([{":
                depth += 1
            elif text in ")]}":
                depth -= 1
                if depth <= 0 and text == "}":
                    break
            elif text == ";" and depth <= 0:
                break
        if self.i == start:
            self.i += 1
        return Node("opaque", ("a statement the scan cannot parse",), start, self.i)

    def _statement(self) -> Node:
        start = self.i
        text = self.peek()
        if text == "{":
            self.take("{")
            body = []
            while self.peek() != "}":
                if self.i >= len(self.t):
                    raise SyntaxError("unclosed block")
                body.append(self.statement())
            self.take("}")
            return Node("block", (body,), start, self.i)
        if text == ";":
            self.take()
            return Node("empty", (), start, self.i)
        if text == "if":
            self.take()
            if self.peek() == "constexpr":
                self.take()
            self.take("(")
            cond = self.expression()
            self.take(")")
            then = self.statement()
            other = None
            if self.peek() == "else":
                self.take()
                other = self.statement()
            return Node("if", (cond, then, other), start, self.i)
        if text == "for":
            self.take()
            self.take("(")
            init = None if self.peek() == ";" else self._simple_statement()
            if init is None:
                self.take(";")
            cond = None if self.peek() == ";" else self.expression()
            self.take(";")
            update = None if self.peek() == ")" else self.expression()
            self.take(")")
            body = self.statement()
            return Node("for", (init, cond, update, body), start, self.i)
        if text == "while":
            self.take()
            self.take("(")
            cond = self.expression()
            self.take(")")
            return Node("while", (cond, self.statement()), start, self.i)
        if text == "do":
            self.take()
            body = self.statement()
            self.take("while")
            self.take("(")
            cond = self.expression()
            self.take(")")
            self.take(";")
            return Node("do", (body, cond), start, self.i)
        if text in ("return", "break", "continue"):
            self.take()
            while self.peek() != ";":
                self.take()
            self.take(";")
            return Node(text, (), start, self.i)
        if text == "switch":
            self.take()
            self.take("(")
            self.expression()
            self.take(")")
            body = self.statement()
            return Node("opaque", ("a switch statement (its cases run as one block)", body), start, self.i)
        if text in ("case", "default"):
            while self.peek() != ":":
                self.take()
            self.take(":")
            return Node("empty", (), start, self.i)
        if text in ("asm", "__asm__", "__asm"):
            self._skip_statement(start)
            return Node("opaque", ("inline PTX (asm): shared accesses inside it are not modeled",), start, self.i)
        return self._simple_statement()

    def _simple_statement(self) -> Node:
        start = self.i
        if self._looks_like_declaration():
            node = self.declaration()
        else:
            node = Node("expr", (self.expression(),), start, self.i)
        self.take(";")
        return node

    def _looks_like_declaration(self) -> bool:
        first = self.peek()
        if first in QUALIFIERS or first in self.type_names:
            return not (self.peek(1) == "(" and first not in QUALIFIERS and first in TYPE_SIZES)
        if self.kind() == "id":
            second = self.peek(1)
            if self.kind(1) == "id":
                return True
            if second in ("*", "&") and self.kind(2) == "id" and self.peek(3) in ("=", ";", "[", ","):
                return True
            if second == "<" and first.split("::")[-1] not in INT_FUNCTIONS:
                return self._template_type_declaration()
        return False

    def _template_type_declaration(self) -> bool:
        depth = 0
        j = self.i + 1
        while j < len(self.t):
            text = self.t[j].text
            if text == "<":
                depth += 1
            elif text == ">":
                depth -= 1
                if depth == 0:
                    return j + 1 < len(self.t) and self.t[j + 1].kind == "id"
            elif text in (";", "{", "}", "(", ")"):
                return False
            j += 1
        return False

    def parse_type(self) -> tuple[str, set[str]]:
        """Consume qualifiers and a type name; return (type name, qualifiers seen)."""
        quals: set[str] = set()
        words: list[str] = []
        while self.i < len(self.t):
            text = self.peek()
            if text in ("__align__", "alignas"):
                self.take()
                self._skip_parens()
                continue
            if text in QUALIFIERS:
                quals.add(text)
                self.take()
                continue
            if text in ("unsigned", "signed", "long", "short", "int", "char") or (not words and self.kind() == "id"):
                words.append(self.take().text)
                if self.peek() == "<":  # a template type: Foo<int, 4>
                    self._skip_angles()
                continue
            break
        return " ".join(words) or "int", quals

    def _skip_parens(self) -> None:
        if self.peek() != "(":
            return
        depth = 0
        while self.i < len(self.t):
            text = self.take().text
            depth += text == "("
            depth -= text == ")"
            if depth == 0:
                return

    def _skip_angles(self) -> None:
        depth = 0
        while self.i < len(self.t):
            text = self.take().text
            depth += text == "<"
            depth -= text == ">"
            depth -= 2 * (text == ">>")
            if depth <= 0:
                return

    def declaration(self) -> Node:
        start = self.i
        type_name, quals = self.parse_type()
        declarators = []
        while True:
            pointer = False
            while self.peek() in ("*", "&", "__restrict__", "const"):
                pointer = pointer or self.peek() in ("*", "&")
                self.take()
            name = self.take().text
            dims = []
            while self.peek() == "[":
                self.take("[")
                dims.append(None if self.peek() == "]" else self.expression())
                self.take("]")
            init = None
            if self.peek() == "=":
                self.take()
                if self.peek() == "{":
                    self._skip_braces()
                    init = Node("opaque_value", ("an initializer list",), self.i, self.i)
                else:
                    init = self.assignment()
            elif self.peek() == "(":  # constructor syntax: dim3 b(32, 8)
                self._skip_parens()
                init = Node("opaque_value", ("a constructor call",), self.i, self.i)
            elif self.peek() == "{":
                self._skip_braces()
                init = Node("opaque_value", ("an initializer list",), self.i, self.i)
            declarators.append((name, pointer, dims, init))
            if self.peek() != ",":
                break
            self.take(",")
        return Node("decl", (type_name, quals, declarators), start, self.i)

    def _skip_braces(self) -> None:
        depth = 0
        while self.i < len(self.t):
            text = self.take().text
            depth += text == "{"
            depth -= text == "}"
            if depth == 0:
                return

    # expressions
    def expression(self) -> Node:
        start = self.i
        node = self.assignment()
        while self.peek() == ",":
            self.take()
            right = self.assignment()
            node = Node("comma", (node, right), start, self.i)
        return node

    def assignment(self) -> Node:
        start = self.i
        left = self.conditional()
        if self.peek() in _ASSIGN:
            op = self.take().text
            right = self.assignment()
            return Node("assign", (op, left, right), start, self.i)
        return left

    def conditional(self) -> Node:
        start = self.i
        cond = self.binary(0)
        if self.peek() == "?":
            self.take()
            a = self.assignment()
            self.take(":")
            b = self.assignment()
            return Node("cond", (cond, a, b), start, self.i)
        return cond

    def binary(self, min_prec: int) -> Node:
        start = self.i
        left = self.unary()
        while True:
            op = self.peek()
            prec = _BINARY.get(op)
            if prec is None or prec <= min_prec or self.kind() != "op":
                return left
            self.take()
            right = self.binary(prec)
            left = Node("binary", (op, left, right), start, self.i)

    def unary(self) -> Node:
        start = self.i
        text = self.peek()
        if text in ("-", "+", "!", "~", "*", "&") and self.kind() == "op":
            self.take()
            return Node("unary", (text, self.unary()), start, self.i)
        if text in ("++", "--"):
            self.take()
            return Node("preinc", (text, self.unary()), start, self.i)
        if text == "sizeof":
            self.take()
            if self.peek() == "(" and (self.peek(1) in self.type_names or self.peek(1) in QUALIFIERS):
                self.take("(")
                type_name, _ = self.parse_type()
                pointer = False
                while self.peek() == "*":
                    pointer = True
                    self.take()
                self.take(")")
                return Node("sizeof", (8 if pointer else TYPE_SIZES.get(type_name),), start, self.i)
            operand = self.unary()
            return Node("sizeof_expr", (operand,), start, self.i)
        if text == "(" and self._is_cast():
            self.take("(")
            type_name, _ = self.parse_type()
            pointers = 0
            while self.peek() in ("*", "&"):
                pointers += self.peek() == "*"
                self.take()
            self.take(")")
            return Node("cast", (type_name, pointers, self.unary()), start, self.i)
        return self.postfix()

    def _is_cast(self) -> bool:
        j = self.i + 1
        saw_type = False
        while j < len(self.t):
            text = self.t[j].text
            if text in QUALIFIERS or text in self.type_names:
                saw_type = True
            elif self.t[j].kind == "id" and not saw_type and j + 1 < len(self.t) and self.t[j + 1].text == "*":
                saw_type = True
            elif text in ("*", "&") and saw_type:
                pass
            elif text == ")":
                return saw_type
            else:
                return False
            j += 1
        return False

    def postfix(self) -> Node:
        start = self.i
        node = self.primary()
        while True:
            text = self.peek()
            if text == "[":
                self.take()
                index = self.expression()
                self.take("]")
                node = Node("index", (node, index), start, self.i)
            elif text == "(":
                self.take()
                args = []
                while self.peek() != ")":
                    args.append(self.assignment())
                    if self.peek() == ",":
                        self.take()
                self.take(")")
                node = Node("call", (node, args), start, self.i)
            elif text in (".", "->"):
                self.take()
                node = Node("member", (node, self.take().text, text), start, self.i)
            elif text in ("++", "--"):
                self.take()
                node = Node("postinc", (text, node), start, self.i)
            else:
                return node

    def primary(self) -> Node:
        start = self.i
        tok = self.take()
        if tok.kind == "num":
            return Node("num", (parse_int_literal(tok.text),), start, self.i)
        if tok.text == "(":
            node = self.expression()
            self.take(")")
            return node
        if tok.text in CASTS and self.peek() == "<":
            self.take("<")
            type_name, _ = self.parse_type()
            pointers = 0
            while self.peek() in ("*", "&"):
                pointers += self.peek() == "*"
                self.take()
            self.take(">")
            self.take("(")
            operand = self.expression()
            self.take(")")
            return Node("cast", (type_name, pointers, operand), start, self.i)
        if tok.kind == "id":
            if self.peek() == "<" and tok.text.split("::")[-1] in INT_FUNCTIONS:
                self._skip_angles()
            return Node("id", (tok.text,), start, self.i)
        if tok.text == '""':
            return Node("opaque_value", ("a string",), start, self.i)
        raise SyntaxError(f"unexpected {tok.text!r}")


# --------------------------------------------------------------------------------------------------------------
# Values


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("/", "%"):
        if b == 0:
            raise ZeroDivisionError
        q = _c_div(a, b)
        return q if op == "/" else a - b * q
    if op == "<<":
        return a << b if 0 <= b < 64 else 0
    if op == ">>":
        return a >> b if 0 <= b < 64 else 0
    if op == "&":
        return a & b
    if op == "|":
        return a | b
    if op == "^":
        return a ^ b
    if op == "<":
        return int(a < b)
    if op == ">":
        return int(a > b)
    if op == "<=":
        return int(a <= b)
    if op == ">=":
        return int(a >= b)
    if op == "==":
        return int(a == b)
    if op == "!=":
        return int(a != b)
    if op == "&&":
        return int(bool(a) and bool(b))
    if op == "||":
        return int(bool(a) or bool(b))
    raise ValueError(op)


def _is_int(v) -> bool:
    return isinstance(v, (int, list))


def lanes(v) -> list[int]:
    return v if isinstance(v, list) else [v] * WARP_SIZE


def binop(op: str, a, b):
    if isinstance(a, Unknown):
        return a
    if isinstance(b, Unknown):
        return b
    if not (_is_int(a) and _is_int(b)):
        what = a if isinstance(a, Opaque) else b
        return Unknown(f"uses {what.what}" if isinstance(what, Opaque) else "pointer arithmetic beyond the model")
    try:
        if isinstance(a, int) and isinstance(b, int):
            return _apply(op, a, b)
        return [_apply(op, x, y) for x, y in zip(lanes(a), lanes(b))]
    except ZeroDivisionError:
        return Unknown("a division by zero for some lane")


def truth_mask(v, mask: int) -> int | None:
    if isinstance(v, int):
        return mask if v else 0
    if isinstance(v, list):
        bits = 0
        for lane, x in enumerate(v):
            if x:
                bits |= 1 << lane
        return bits & mask
    return None


def _uniformize(v):
    if isinstance(v, list) and all(x == v[0] for x in v):
        return v[0]
    return v


# --------------------------------------------------------------------------------------------------------------
# The interpreter


@dataclass
class KernelContext:
    """What one interpretation of a kernel needs besides its body."""

    params: list  # (name, is_pointer)
    template_params: list
    block_dim: tuple
    samples: dict  # name -> int for blockIdx.x/y/z, gridDim.x/y/z, scalar params, template params
    constants: dict  # hint values and the like: name -> int
    file_statements: list  # file-scope declarations (constants and __shared__ arrays), as parsed nodes
    tokens: list


class Interpreter:
    """Interprets a parsed kernel body for each warp of one block and collects :class:`Site` totals."""

    def __init__(self, body: list[Node], ctx: KernelContext, budget: WorkBudget | None = None):
        self.body = body
        self.ctx = ctx
        self.budget = budget if budget is not None else WorkBudget(KERNEL_WORK_UNITS)
        self.cut_short: str | None = None  # why the interpretation stopped before every warp was modeled
        self.sites: dict[tuple, Site] = {}
        self.notes: list[str] = []
        self.steps = 0
        self.arrays: dict[str, SharedArray] = {}
        self.env: dict = {}
        self.alive = FULL_MASK
        self.loops: list[dict] = []
        self.guard_unknown = 0

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def run(self) -> None:
        bx, by, bz = self.ctx.block_dim
        threads = bx * by * bz
        warps = (threads + WARP_SIZE - 1) // WARP_SIZE
        try:
            for warp in range(warps):
                linear = [warp * WARP_SIZE + lane for lane in range(WARP_SIZE)]
                active = 0
                for lane, tid in enumerate(linear):
                    if tid < threads:
                        active |= 1 << lane
                env: dict = {
                    "threadIdx.x": _uniformize([t % bx for t in linear]),
                    "threadIdx.y": _uniformize([(t // bx) % by for t in linear]),
                    "threadIdx.z": _uniformize([t // (bx * by) for t in linear]),
                    "blockDim.x": bx,
                    "blockDim.y": by,
                    "blockDim.z": bz,
                    "warpSize": WARP_SIZE,
                }
                env.update(self.ctx.samples)
                for name, pointer in self.ctx.params:
                    if pointer:
                        env[name] = Opaque(f"the pointer argument '{name}'")
                    elif name not in env:
                        env[name] = Unknown(f"the argument '{name}'")
                env.update(self.ctx.constants)
                self.env = env
                self.alive = active
                self.loops = []
                self.guard_unknown = 0
                for stmt in self.ctx.file_statements:
                    self.exec(stmt, active)
                for stmt in self.body:
                    self.exec(stmt, active)
        except _Stop:
            self.cut_short = self.budget.spent_reason or self.budget.stop_reason()
            self.budget.spent_reason = self.cut_short
            self.note(f"interpretation cut short after {self.steps:,} statements: {self.cut_short}")

    # statements
    def mask(self, mask: int) -> int:
        m = mask & self.alive
        for frame in self.loops:
            m &= ~(frame["broken"] | frame["continued"])
        return m

    def exec(self, node: Node, mask: int) -> None:
        self.steps += 1
        budget = self.budget
        budget.left -= 1
        if budget.left <= 0 or (not self.steps & 1023 and time.monotonic() > budget.deadline):
            raise _Stop
        m = self.mask(mask)
        if not m:
            return
        kind = node.kind
        if kind == "block":
            for stmt in node.args[0]:
                self.exec(stmt, m)
        elif kind == "expr":
            self.rv(node.args[0], m)
        elif kind == "decl":
            self.declare(node, m)
        elif kind == "if":
            cond, then, other = node.args
            value = self.rv(cond, m)
            taken = truth_mask(value, m)
            if taken is None:
                self.guard_unknown += 1
                self.exec(then, m)
                if other is not None:
                    self.exec(other, m)
                self.guard_unknown -= 1
            else:
                if taken:
                    self.exec(then, taken)
                if other is not None and m & ~taken:
                    self.exec(other, m & ~taken)
        elif kind == "for":
            init, cond, update, body = node.args
            if init is not None:
                self.exec(init, m)
            self.loop(cond, body, update, m)
        elif kind == "while":
            cond, body = node.args
            self.loop(cond, body, None, m)
        elif kind == "do":
            body, cond = node.args
            self.loop(cond, body, None, m, check_first=False)
        elif kind == "return":
            self.alive &= ~m
        elif kind == "break":
            if self.loops:
                self.loops[-1]["broken"] |= m
        elif kind == "continue":
            if self.loops:
                self.loops[-1]["continued"] |= m
        elif kind == "opaque":
            self.note(f"line {self.ctx.tokens[node.pos].line}: {node.args[0]}")
            if len(node.args) > 1:
                self.exec(node.args[1], m)

    def loop(self, cond, body, update, mask: int, check_first: bool = True) -> None:
        frame = {"broken": 0, "continued": 0}
        self.loops.append(frame)
        m = mask
        try:
            for iteration in range(MAX_LOOP_ITERATIONS + 1):
                m &= self.alive & ~frame["broken"]
                if iteration == MAX_LOOP_ITERATIONS:
                    if m:
                        self.note(
                            f"line {self.ctx.tokens[body.pos].line}: loop modeled for its first "
                            f"{MAX_LOOP_ITERATIONS} iterations"
                        )
                    break
                if cond is not None and (check_first or iteration > 0):
                    taken = truth_mask(self.rv(cond, m), m)
                    if taken is None:
                        if iteration >= UNKNOWN_TRIP_ITERATIONS:
                            self.note(
                                f"line {self.ctx.tokens[body.pos].line}: loop condition not modeled; "
                                f"{UNKNOWN_TRIP_ITERATIONS} iterations interpreted"
                            )
                            break
                    else:
                        m = taken
                if not m:
                    break
                frame["continued"] = 0
                self.exec(body, m)
                frame["continued"] = 0
                if update is not None:
                    self.rv(update, m & self.alive & ~frame["broken"])
        finally:
            self.loops.pop()

    def declare(self, node: Node, mask: int) -> None:
        type_name, quals, declarators = node.args
        for name, pointer, dims, init in declarators:
            if "__shared__" in quals:
                self.arrays[name] = self.shared_array(name, type_name, dims, "extern" in quals, node)
                self.env.pop(name, None)
                continue
            if dims:  # a local (register) array: its elements are data
                self.env[name] = Opaque(f"the local array '{name}'")
                continue
            if init is None:
                self.env[name] = Unknown(f"'{name}' is declared without a value")
                continue
            value = self.rv(init, mask)
            if isinstance(value, Ptr) and not pointer and type_name != "auto":
                value = Unknown(f"'{name}' holds a pointer converted to an integer")
            self.assign_var(name, value, mask)

    def shared_array(self, name: str, type_name: str, dims, extern: bool, node: Node) -> SharedArray:
        evaluated = []
        for d in dims:
            if d is None:
                evaluated.append(None)
                continue
            value = self.rv(d, FULL_MASK)
            evaluated.append(value if isinstance(value, int) else Unknown("a dimension the scan cannot evaluate"))
        line = self.ctx.tokens[node.pos].line if node.pos < len(self.ctx.tokens) else 0
        return SharedArray(name, type_name, TYPE_SIZES.get(type_name), evaluated or [None], line, extern)

    def assign_var(self, name: str, value, mask: int) -> None:
        old = self.env.get(name)
        full = mask == self.alive or mask == FULL_MASK
        if full or old is None or not (_is_int(old) and _is_int(value)):
            self.env[name] = value
            return
        self.env[name] = _uniformize(
            [n if (mask >> lane) & 1 else o for lane, (n, o) in enumerate(zip(lanes(value), lanes(old)))]
        )

    # expressions
    def rv(self, node: Node, mask: int):
        value = self.ev(node, mask)
        if isinstance(value, LValue):
            self.record(node, "load", value, mask)
            return Unknown(f"a value read from shared memory '{value.array.name}'")
        return value

    def ev(self, node: Node, mask: int):  # noqa: C901 - one branch per node kind reads best
        self.budget.left -= 1
        kind = node.kind
        args = node.args
        if kind == "num":
            return args[0] if args[0] is not None else Opaque("a floating-point value")
        if kind == "id":
            return self.lookup(args[0])
        if kind == "member":
            base, name, _ = args
            if base.kind == "id" and base.args[0] in BUILTIN_VECTORS:
                return self.lookup(f"{base.args[0]}.{name}")
            target = self.ev(base, mask)
            if isinstance(target, LValue):
                return self.member(target, name)
            if isinstance(target, (Unknown, Opaque)):
                return target
            return Unknown(f"member '.{name}' of a value the scan does not track")
        if kind == "index":
            base = self.ev(args[0], mask)
            index = self.rv(args[1], mask)
            if isinstance(base, LValue):  # a vector element used as an array (rare): treat as data
                self.record(args[0], "load", base, mask)
                return Unknown(f"a value read from shared memory '{base.array.name}'")
            if isinstance(base, Ptr):
                return self.subscript(base, index)
            if isinstance(base, Unknown):
                return base
            what = base.what if isinstance(base, Opaque) else "memory the scan does not track"
            return Unknown(f"data-dependent: a value loaded from {what}")
        if kind == "unary":
            op, operand = args
            if op == "&":
                target = self.ev(operand, mask)
                if isinstance(target, LValue):
                    return Ptr(target.array, target.offset, target.width, target.type_name, (), target.subs)
                if isinstance(target, Ptr):
                    return target
                return Opaque("an address")
            if op == "*":
                target = self.rv(operand, mask)
                if isinstance(target, Ptr):
                    return self.deref(target)
                if isinstance(target, Unknown):
                    return target
                return Unknown("data-dependent: a value loaded through a pointer")
            value = self.rv(operand, mask)
            if op == "-":
                return binop("-", 0, value)
            if op == "+":
                return value
            if op == "!":
                return binop("==", value, 0)
            if op == "~":
                return binop("^", value, -1)
        if kind == "binary":
            op, left, right = args
            a = self.rv(left, mask)
            b = self.rv(right, mask)
            if isinstance(a, Ptr) and op in ("+", "-") and _is_int(b):
                return self.advance(a, b if op == "+" else binop("-", 0, b))
            if isinstance(b, Ptr) and op == "+" and _is_int(a):
                return self.advance(b, a)
            return binop(op, a, b)
        if kind == "cond":
            cond, a, b = args
            c = self.rv(cond, mask)
            taken = truth_mask(c, mask)
            if taken is None:
                return c if isinstance(c, Unknown) else Unknown("a condition the scan cannot evaluate")
            va = self.rv(a, taken) if taken else None
            vb = self.rv(b, mask & ~taken) if mask & ~taken else None
            if va is None:
                return vb
            if vb is None:
                return va
            if _is_int(va) and _is_int(vb):
                return _uniformize(
                    [x if (taken >> lane) & 1 else y for lane, (x, y) in enumerate(zip(lanes(va), lanes(vb)))]
                )
            return va if isinstance(va, Unknown) else vb
        if kind == "assign":
            return self.assign(args, mask, node)
        if kind in ("preinc", "postinc"):
            op, target = args
            return self.assign(
                ("+=" if op == "++" else "-=", target, Node("num", (1,), node.pos, node.pos)),
                mask,
                node,
                post=kind == "postinc",
            )
        if kind == "comma":
            self.rv(args[0], mask)
            return self.rv(args[1], mask)
        if kind == "cast":
            type_name, pointers, operand = args
            value = self.rv(operand, mask)
            if pointers:
                if isinstance(value, Ptr):
                    return Ptr(value.array, value.offset, TYPE_SIZES.get(type_name), type_name, (), None)
                return value if isinstance(value, Unknown) else Opaque("a pointer")
            if type_name in ("float", "double", "half", "__half") and _is_int(value):
                return Opaque("a floating-point value")
            return value
        if kind == "call":
            return self.call(args[0], args[1], mask)
        if kind == "sizeof":
            return args[0] if args[0] is not None else Unknown("sizeof of a type the scan does not know")
        if kind == "sizeof_expr":
            return Unknown("sizeof of an expression")
        if kind == "opaque_value":
            return Opaque(args[0])
        return Unknown(f"a '{kind}' expression")

    def lookup(self, name: str):
        if name in self.arrays:
            array = self.arrays[name]
            if array.elem_size is None:
                return Unknown(f"'{name}' has element type '{array.type_name}' of unknown size")
            if any(isinstance(d, Unknown) for d in array.dims):
                return Unknown(f"the layout of '{name}' (a dimension the scan cannot evaluate)")
            inner = tuple(array.dims[1:])
            if any(d is None for d in inner):
                return Unknown(f"the layout of '{name}'")
            return Ptr(array, 0, array.elem_size, array.type_name, inner, ())
        if name in self.env:
            return self.env[name]
        if name in ("true", "false"):
            return int(name == "true")
        if name in ("nullptr", "NULL"):
            return Opaque("a null pointer")
        return Unknown(f"'{name}' (a macro, constant or variable defined outside this file?)")

    def subscript(self, base: Ptr, index):
        if not _is_int(index):
            if not isinstance(index, Unknown):
                index = Unknown("an index that is not an integer the scan tracks")
            if base.inner:
                return Ptr(base.array, index, base.elem_size, base.type_name, base.inner[1:], None)
            return LValue(base.array, index, base.elem_size, base.type_name, None)
        stride = base.elem_size
        for d in base.inner:
            stride *= d
        offset = binop("+", base.offset, binop("*", index, stride))
        subs = None if base.subs is None else base.subs + (index,)
        if base.inner:
            return Ptr(base.array, offset, base.elem_size, base.type_name, base.inner[1:], subs)
        return LValue(base.array, offset, base.elem_size, base.type_name, subs)

    def deref(self, ptr: Ptr):
        if ptr.inner:
            return Ptr(ptr.array, ptr.offset, ptr.elem_size, ptr.type_name, ptr.inner[1:], None)
        return LValue(ptr.array, ptr.offset, ptr.elem_size, ptr.type_name, None)

    def advance(self, ptr: Ptr, count):
        stride = ptr.elem_size or 0
        for d in ptr.inner:
            stride *= d
        return Ptr(
            ptr.array, binop("+", ptr.offset, binop("*", count, stride)), ptr.elem_size, ptr.type_name, ptr.inner, None
        )

    def member(self, target: LValue, name: str):
        component = COMPONENT_SIZES.get(target.type_name)
        if component is None or name not in COMPONENTS:
            return LValue(target.array, target.offset, None, f"{target.type_name}.{name}", None)
        offset = binop("+", target.offset, COMPONENTS[name] * component)
        return LValue(target.array, offset, component, "component", None)

    def assign(self, args, mask: int, node: Node, post: bool = False):
        op, target_node, value_node = args
        value = self.rv(value_node, mask)
        target = self.ev(target_node, mask) if target_node.kind != "id" else None
        if isinstance(target, LValue):
            if op != "=":
                self.record(target_node, "load", target, mask)
            self.record(target_node, "store", target, mask)
            return Unknown(f"a value stored to shared memory '{target.array.name}'")
        if target_node.kind == "id":
            name = target_node.args[0]
            old = self.lookup(name)
            new = (
                value
                if op == "="
                else (
                    self.advance(old, value if op == "+=" else binop("-", 0, value))
                    if isinstance(old, Ptr) and op in ("+=", "-=")
                    else binop(op[:-1], old, value)
                )
            )
            self.assign_var(name, new, mask)
            return old if post else new
        return Unknown("an assignment the scan does not follow")

    def call(self, func: Node, args: list, mask: int):
        name = func.args[0] if func.kind == "id" else ""
        values = [self.rv(a, mask) for a in args]
        short = name.split("::")[-1]
        if short in ("min", "umin", "max", "umax") and len(values) == 2:
            a, b = values
            if _is_int(a) and _is_int(b):
                pick = min if short in ("min", "umin") else max
                return (
                    _uniformize([pick(x, y) for x, y in zip(lanes(a), lanes(b))])
                    if isinstance(a, list) or isinstance(b, list)
                    else pick(a, b)
                )
            return a if isinstance(a, Unknown) else (b if isinstance(b, Unknown) else Unknown("min/max of data"))
        if short in ("__mul24", "__umul24") and len(values) == 2:
            return binop("*", values[0], values[1])
        if short == "abs" and len(values) == 1 and _is_int(values[0]):
            return _uniformize([abs(x) for x in lanes(values[0])])
        if short in ("int", "unsigned", "uint32_t", "int32_t", "size_t") and len(values) == 1:
            return values[0]
        if name.startswith("__syncthreads") or name in ("__syncwarp", "__threadfence_block", "__threadfence"):
            return 0
        return Unknown(f"a call to {name or 'a function'}() (beyond the model)")

    # recording
    def record(self, node: Node, kind: str, target: LValue, mask: int) -> None:
        active = mask & self.alive
        if not active:
            return
        self.budget.left -= RECORD_COST
        key = (node.pos, kind)
        site = self.sites.get(key)
        if site is None:
            text = _source_text(self.ctx.tokens, node.pos, node.end)
            line = self.ctx.tokens[node.pos].line if node.pos < len(self.ctx.tokens) else 0
            site = self.sites[key] = Site(kind, line, text, target.array.name)
            site.array_dims = [d if isinstance(d, int) else None for d in target.array.dims]
            site.type_name = target.array.type_name
        if self.guard_unknown:
            site.guard_unknown = True
        if isinstance(target.offset, Unknown):
            if target.offset.reason not in site.unknown:
                site.unknown.append(target.offset.reason)
            return
        if target.width is None:
            reason = f"an element of type '{target.type_name}' whose size the scan does not know"
            if reason not in site.unknown:
                site.unknown.append(reason)
            return
        if not _is_int(target.offset):
            site.unknown.append("an address the scan cannot evaluate")
            return
        addresses = lanes(target.offset)
        wavefronts, ideal = warp_wavefronts(addresses, active, target.width)
        site.width_bytes = target.width
        site.instructions += 1
        site.wavefronts += wavefronts
        site.ideal += ideal
        if ideal:
            site.worst_degree = max(site.worst_degree, wavefronts / ideal)
        self._record_fixes(site, target, active)

    def _record_fixes(self, site: Site, target: LValue, active: int) -> None:
        array = target.array
        dims = array.dims
        subs = target.subs
        size = target.width
        if (
            subs is None
            or len(subs) != len(dims)
            or size != array.elem_size
            or any(not isinstance(d, int) for d in dims[1:])
        ):
            site.pad_wavefronts = None
            site.swizzle_wavefronts = None
            return
        per_row = 128 // size if size <= 128 else 1
        pad = max(1, 4 // size)  # a 4-byte word at least: padding a 2-byte row by one element shifts half a bank
        sub_lanes = [lanes(s) for s in subs]
        if len(dims) == 1:
            linear = sub_lanes[0]
            padded = [e + pad * (e // per_row) for e in linear]
            swizzled = None
        else:
            inner = dims[1:]
            padded_inner = inner[:-1] + [inner[-1] + pad]

            def linearize(dims_below, values_by_dim):
                out = [0] * WARP_SIZE
                for dim_index, values in enumerate(values_by_dim):
                    scale = 1
                    for d in dims_below[dim_index:]:
                        scale *= d
                    out = [o + v * scale for o, v in zip(out, values)]
                return out

            padded = linearize(padded_inner, sub_lanes)
            last = inner[-1]
            if last % per_row == 0:
                rows = sub_lanes[-2]
                cols = [c ^ (r % per_row) for c, r in zip(sub_lanes[-1], rows)]
                swizzled = linearize(inner, sub_lanes[:-1] + [cols])
            else:
                swizzled = None
        if site.pad_wavefronts is not None:
            site.pad_wavefronts += warp_wavefronts([e * size for e in padded], active, size)[0]
        if swizzled is None or site.swizzle_wavefronts is None:
            site.swizzle_wavefronts = None
        else:
            site.swizzle_wavefronts += warp_wavefronts([e * size for e in swizzled], active, size)[0]


def _source_text(tokens: list[Token], start: int, end: int) -> str:
    out = ""
    previous = None
    for tok in tokens[start:end]:
        if previous is not None and previous.kind in ("id", "num") and tok.kind in ("id", "num"):
            out += " "
        elif (
            previous is not None
            and (tok.text in _BINARY or previous.text in _BINARY)
            and tok.text not in "[]()"
            and previous.text not in "[]()"
        ):
            out += " "
        out += tok.text
        previous = tok
    return out[:120]
