"""``gpuadvisor.optimize``: the fixes of ``gpuadvisor apply``, from Python, on a model you already have.

::

    import gpuadvisor
    model = gpuadvisor.optimize(model, example_inputs, fixes=["fusion", "graphs"])
    logits = model(*inputs)        # like the model; with graphs, the output is overwritten by the next call

The same registry, order, numerics guard and rollback as ``apply`` (``gpuadvisor.fixes.registry``). A fix
that is refused, rolled back or fails leaves the model as it was at that stage: the returned callable still
works, and ``optimize`` warns once with the reasons (``strict=True`` raises BadInputError instead).
``opt.fixes`` holds the outcomes and ``opt.report()`` says them in words. ``keep_lines(fix_ids)`` gives the
two lines that keep the fixes ``apply`` found good.

This module imports no torch at import time (the fixes import it when they run).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpuadvisor.errors import BadInputError
from gpuadvisor.fixes.base import FixOutcome
from gpuadvisor.fixes.registry import apply_fixes, fix_order, resolve_fix_ids
from gpuadvisor.workload import Workload, batch_inputs, default_step, make_step_fn


class OptimizedModel:
    """The optimized callable ``optimize`` returns: ``opt(*inputs)`` runs the patched step.

    Attributes: ``fixes`` (one FixOutcome per requested fix), ``workload`` (the final patched Workload),
    ``model`` (the patched model; with graphs, the model the graph reads).
    """

    def __init__(self, workload: Workload, fixes: list[FixOutcome], *, batch: bool = False):
        self.workload = workload
        self.fixes = fixes
        self.model = workload.model
        self.batch = batch  # the example inputs were a dict of keyword inputs: opt(batch) or opt(**batch)

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.batch:
            if (kwargs and inputs) or len(inputs) > 1 or (inputs and not isinstance(inputs[0], dict)):
                raise TypeError("pass the batch as one dict, opt(batch), or as keywords, opt(**batch)")
            return self.workload.step(self.workload.model, (inputs[0] if inputs else kwargs,))
        if kwargs:
            if self.workload.step is not default_step:
                raise TypeError(
                    "pass the inputs positionally, as in example_inputs (the optimized step takes no keywords)"
                )
            return self.workload.model(*inputs, **kwargs)
        return self.workload.step(self.workload.model, inputs)

    def report(self) -> str:
        """The outcome of each fix in words, one block per fix."""
        lines = []
        for outcome in self.fixes:
            lines.append(f"{outcome.fix_id}: {outcome.status}" + (f" - {outcome.reason}" if outcome.reason else ""))
            lines += [f"  {change}" for change in outcome.changes]
            if outcome.numerics:
                lines.append(f"  numerics: {outcome.numerics.get('detail')}")
            if outcome.suggestion and outcome.status != "applied":
                lines.append(f"  suggestion: {outcome.suggestion}")
        return "\n".join(lines) if lines else "no fixes requested"

    def __repr__(self) -> str:
        applied = [outcome.fix_id for outcome in self.fixes if outcome.status == "applied"]
        return f"OptimizedModel(applied={applied}, model={type(self.model).__name__})"


def optimize(
    model: Any,
    example_inputs: Sequence[Any],
    fixes: Iterable[str] | str = ("graphs",),
    *,
    step: Callable[[Any, tuple], Any] | None = None,
    guard: bool = True,
    strict: bool = False,
) -> OptimizedModel:
    """Apply ``fixes`` to ``model`` (run on ``example_inputs``) and return the optimized callable.

    ``fixes``: fix ids (``"graphs"``, ``"fusion"``, ``"fp8"``) or one comma-separated string; they run in the
    registry's order whatever the order given. ``step(model, inputs)``: what one call does (default
    ``model(*inputs)``). ``example_inputs`` may be a dict of keyword inputs (a batch): ``step(model, batch)``
    then takes the dict (default ``model(**batch)``), and the result is called as ``opt(batch)`` or
    ``opt(**batch)``. ``guard``: run the numerics guard after each fix. ``strict``: raise BadInputError
    when a requested fix is not applied, instead of warning and falling back.
    """
    text = fixes if isinstance(fixes, str) else ",".join(fixes)
    if any(item.strip().lower() == "auto" for item in text.split(",")):
        raise BadInputError("fixes='auto' needs a profile's findings; name the fixes, e.g. fixes=['graphs']")
    fix_ids = resolve_fix_ids(text, [], api=True)
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    batch = batch_inputs(example_inputs, step, "gpuadvisor.optimize")
    if batch is not None:  # (batch,) inside; the step takes the dict (default: model(**batch))
        example_inputs, step = batch
    elif not isinstance(example_inputs, tuple):
        raise BadInputError(
            f"example_inputs must be a tuple of the model's positional inputs or a dict of keyword inputs, got"
            f" {type(example_inputs).__name__} (write (x,) for a single input)"
        )
    step = step or default_step
    label = f"<optimize {type(model).__name__}>"
    workload = Workload(
        path=label,
        model=model,
        inputs=example_inputs,
        step_fn=make_step_fn(step, model, example_inputs, label),
        tokens_per_step=None,
        name=type(model).__name__,
        step=step,
    )
    final, outcomes = apply_fixes(workload, fix_ids, guard=guard)
    not_applied = [outcome for outcome in outcomes if outcome.status != "applied"]
    if not_applied:
        reasons = "; ".join(f"{outcome.fix_id} {outcome.status}: {outcome.reason}" for outcome in not_applied)
        if strict:
            raise BadInputError(f"gpuadvisor.optimize: {reasons}")
        warnings.warn(f"gpuadvisor.optimize: {reasons} (running without it)", RuntimeWarning, stacklevel=2)
    return OptimizedModel(final, outcomes, batch=batch is not None)


def keep_lines(fix_ids: Iterable[str], *, with_step: bool = False) -> list[str]:
    """The two lines a user pastes after building the model to keep these fixes (in run order).

    ``with_step``: the workload file defines its own ``step(model, inputs)``, which is what was measured, so
    the line passes it on (otherwise ``optimize`` would patch ``model(*inputs)``)."""
    wanted = set(fix_ids)
    ordered = [fix_id for fix_id in fix_order() if fix_id in wanted]
    listed = ", ".join(f'"{fix_id}"' for fix_id in ordered)
    step = ", step=step" if with_step else ""
    return ["import gpuadvisor", f"model = gpuadvisor.optimize(model, example_inputs, fixes=[{listed}]{step})"]
