"""One output path: every command ends in one :func:`emit` of its result, in the ``--format`` it was given.

A command declares its :class:`View`: how its result reads on a terminal (rich), as Markdown, as JSON and as one
self-contained HTML page (:mod:`gpuadvisor.report.html`). A
format the command has no view for is refused with exit 2, naming the ones it has (:meth:`View.check`, before
the command does its work). JSON always goes through one encoder (:func:`gpuadvisor.report.json.to_json`: indented,
one trailing newline, ``null`` for NaN and infinities, never ``NaN``); Markdown and HTML end with exactly one
newline;
the terminal view prints through :func:`terminal_console`, whose tables fit the console's width without cutting
a word or a number (:func:`gpuadvisor.report.layout.fit_table`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuadvisor.errors import BadInputError

FORMATS = ("terminal", "json", "markdown", "html")


def _plain(result: Any) -> Any:
    return result


@dataclass(frozen=True)
class View:
    """How one command's result is shown. ``terminal(result, console)`` prints it with rich; ``markdown(result)``
    returns Markdown text (None: the command has no Markdown form); ``json(result)`` returns the JSON document's
    value (None: no JSON form); ``html(result)`` returns a whole HTML document (None, the default: no HTML form)."""

    command: str
    terminal: Callable[[Any, Any], None]
    markdown: Callable[[Any], str] | None = None
    json: Callable[[Any], Any] | None = _plain
    html: Callable[[Any], str] | None = None

    @property
    def formats(self) -> tuple[str, ...]:
        present = {
            "terminal": True,
            "json": self.json is not None,
            "markdown": self.markdown is not None,
            "html": self.html is not None,
        }
        return tuple(name for name in FORMATS if present[name])

    def check(self, output_format: Any) -> str:
        """The format's name; a format this command does not show is bad usage (exit 2) naming the ones it has."""
        name = str(getattr(output_format, "value", output_format)).strip().lower()
        if name not in self.formats:
            known = self.formats
            use = known[0] if len(known) == 1 else f"{', '.join(known[:-1])} or {known[-1]}"
            raise BadInputError(f"{self.command} --format {name}: not supported by {self.command}; use {use}")
        return name


def emit(result: Any, view: View, output_format: Any, console: Any = None) -> None:
    """Print ``result`` on stdout as ``output_format`` (one of ``view.formats``)."""
    name = view.check(output_format)
    if name == "json":
        from gpuadvisor.report.json import to_json

        write_stdout(to_json(view.json(result)))
    elif name == "markdown":
        write_stdout(view.markdown(result).rstrip("\n") + "\n")
    elif name == "html":
        write_stdout(view.html(result).rstrip("\n") + "\n")
    else:
        view.terminal(result, console if console is not None else terminal_console())


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def terminal_console(stderr: bool = False):
    """The rich console of every terminal view: no highlighting or soft wrapping, tables fitted to its width,
    and a reader that goes away (``| head``) ends the command quietly with exit 0."""
    from rich.console import Console

    class FittingConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            from rich.table import Table

            from gpuadvisor.report.layout import fit_table

            objects = tuple(fit_table(o, self) if isinstance(o, Table) else o for o in objects)
            super().print(*objects, **kwargs)

    console = FittingConsole(stderr=stderr, highlight=False, soft_wrap=False)
    console.on_broken_pipe = on_broken_pipe  # rich's own handler exits 1, which here means "findings"
    return console


def on_broken_pipe() -> None:
    """The reader of stdout went away (``| head``): not an error. Exit 0 without a second failure at exit."""
    quiet_stdout()
    raise SystemExit(0)


def quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
