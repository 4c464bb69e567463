"""Untrusted text made safe to print: control characters shown as escapes, never sent to a terminal as they are.

Kernel names come from traces and Nsight Compute exports, rule titles and texts from ``--rules`` files, source
lines from the files ``scan`` reads: all of it written by someone else. A kernel name holding
``ESC ] 0 ; … BEL ESC [ 2 J`` sets the terminal's window title and clears the screen when printed byte for byte
(and lands in ``report.md``, where a later ``cat`` does the same). :func:`escape_control` turns every such
character into a visible escape (``\\x1b``, ``\\x07``, ``\\u202e``), so the text reads the same and does nothing.

What is escaped: C0 controls (U+0000–U+001F, newline and tab included unless ``keep_newlines``), DEL (U+007F),
C1 controls (U+0080–U+009F: a terminal takes U+009B as CSI, like ``ESC [``), the bidirectional overrides and
isolates that reorder what is displayed ("Trojan Source": U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069)
and the line and paragraph separators U+2028, U+2029. Everything else, other non-ASCII text included, is kept.
The escape is for display and is not reversible (a backslash already in the text is left as it is).

Where it is applied (the rule: once, where the untrusted string enters gpuadvisor, so that every renderer after
it, terminal, Markdown, HTML, JSON and JUnit alike, holds the safe form):

- trace names (kernels, copies, CPU operators, annotations), as :mod:`gpuadvisor.trace.kineto` and
  :mod:`gpuadvisor.trace.columns` build the tables;
- rule titles, names, docs and references, as :mod:`gpuadvisor.rules.engine` loads a rule file;
- kernel names of an Nsight Compute CSV, as :mod:`gpuadvisor.ncu.counters` reads it;
- source text, kernel and array names, as :mod:`gpuadvisor.scan` builds its result;
- file paths a command prints (the paths of ``scan``, ``diff``, ``compare``): :func:`escape_control` on the
  ``str`` of the path.

So JSON output carries the escaped form too (``"evil\\\\x1b]0;…"``), not the raw control character: one name per
kernel everywhere, the same in ``report.json`` as in ``report.md``, and a consumer that prints a report's
names to a terminal is safe as well. Text gpuadvisor writes itself (its own messages) is not passed through.
"""

from __future__ import annotations

import re

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_CONTROL_RE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")
_CONTROL_KEEP_LINES_RE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI_AND_SEPARATORS}]")


def _escape(match: re.Match) -> str:
    char = match.group(0)
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_control(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character (module docstring) written as a visible escape.

    ``keep_newlines`` keeps ``\\n`` and ``\\t`` as they are, for multi-line text (a rule's doc paragraphs, an
    example); single-line cells (names, titles, table cells) escape them too. Text without control characters
    is returned as it is (the same object), so calling this on every name costs one regex search each.
    """
    if not isinstance(text, str):
        text = str(text)
    pattern = _CONTROL_KEEP_LINES_RE if keep_newlines else _CONTROL_RE
    if pattern.search(text) is None:
        return text
    if keep_newlines:
        text = text.replace("\r\n", "\n")
    return pattern.sub(_escape, text)


def has_control(text: str) -> bool:
    """Whether ``text`` holds any character :func:`escape_control` would escape (newline and tab included)."""
    return _CONTROL_RE.search(text) is not None


def escape_names(names: list) -> list:
    """:func:`escape_control` on every string of a list (other values kept): for tables of distinct names."""
    search = _CONTROL_RE.search
    return [escape_control(n) if isinstance(n, str) and search(n) is not None else n for n in names]


__all__ = ["escape_control", "escape_names", "has_control"]
