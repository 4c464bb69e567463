"""The progress display of the commands that run a model (``profile``, ``apply``): one rich progress line per
phase on stderr, or nothing when it is off (stderr is not a terminal).

Every phase boundary also checks for a Ctrl-C whose KeyboardInterrupt something swallowed
(:func:`gpuadvisor.interrupt.raise_if_interrupted`), so the run stops at the next phase at the latest.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from gpuadvisor.interrupt import raise_if_interrupted


class ProgressDisplay(AbstractContextManager):
    """``with ProgressDisplay(enabled) as display: display.phase("timing", 30); display.advance() …``.

    ``on_phase(description)`` is told each phase (a rank tells the launching process what it is doing)."""

    def __init__(self, enabled: bool, on_phase: Callable[[str], None] | None = None):
        self._progress = None
        self._task = None
        self._total: int | None = None
        self._on_phase = on_phase
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )

    def __enter__(self) -> ProgressDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if self._progress is not None:
            if exc_type is None:
                self._finish()
            self._progress.stop()

    def phase(self, description: str, total: int | None = None) -> None:
        """Start the phase ``description`` of ``total`` steps (None: no count)."""
        raise_if_interrupted()
        if self._on_phase is not None:
            self._on_phase(description)
        if self._progress is None:
            return
        self._finish()
        self._task = self._progress.add_task(description, total=total)
        self._total = total

    def advance(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)

    def describe(self, description: str) -> None:
        """A new description for the current phase's line."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=description)

    def _finish(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self._total or 1, completed=self._total or 1)
