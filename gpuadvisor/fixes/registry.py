"""The fix registry: which fixes exist, in which order they run, and the loop that applies them safely.

Fixes are registered by id as ``"module:Class"`` and imported only when used, so that ``import
gpuadvisor.fixes.registry`` needs no torch and a fix whose module is missing fails alone (status
"failed"), not the whole ``apply``. ``register_fix`` adds fixes at run time (tests plant a fix that breaks
the numerics this way).

Order: module swaps first, the CUDA graph last, because the graph captures whatever modules the model has
when it is captured (``FIX_ORDER``). Fixes registered later run after the built-in module swaps and before
``graphs``, in the order they were registered.

``apply_fixes`` runs each requested fix on the workload the previous fixes produced:

1. ``check()``: a refusal becomes a "refused" outcome and nothing changes;
2. ``apply()`` on the current (already patched) workload;
3. the numerics guard (``gpuadvisor.fixes.numerics``) of the patched workload against the ORIGINAL workload,
   with the fix's policy, or fp8's once an fp8 stage is in (the loosest applied so far); a failure becomes
   "rolled_back" (the previous stage is kept) with the numbers;
4. an exception inside any of these becomes "failed" with a one-line reason and the previous stage is kept;
   the full traceback is stored on the outcome (``debug_traceback``, for ``--debug``) and logged at DEBUG.

The original workload object and its model are never modified by the loop: fixes work on copies or wrap
the step, and the guard runs the original on a copy of its model.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from gpuadvisor.errors import BadInputError, GpuAdvisorError
from gpuadvisor.fixes.base import Fix, FixOutcome, NothingToApply

logger = logging.getLogger(__name__)

# Model-wide switches first (attention implementation, memory layout, autocast, TF32, optimizer implementation), then
# module swaps (fusion, fp8), then what compiles or captures the result (torch.compile, the CUDA graph).
FIX_ORDER = ("sdpa", "channels_last", "bf16", "tf32", "fused_optimizer", "fusion", "fp8", "compile", "graphs")

_REGISTRY: dict[str, str | Fix] = {
    "sdpa": "gpuadvisor.fixes.sdpa:SdpaFix",
    "channels_last": "gpuadvisor.fixes.layout:ChannelsLastFix",
    "bf16": "gpuadvisor.fixes.autocast:Bf16Fix",
    "tf32": "gpuadvisor.fixes.tf32:Tf32Fix",
    "fused_optimizer": "gpuadvisor.fixes.optimizers:FusedOptimizerFix",
    "fusion": "gpuadvisor.fixes.fusion:FusionFix",
    "fp8": "gpuadvisor.fixes.fp8:Fp8Fix",
    "compile": "gpuadvisor.fixes.compile:CompileFix",
    "graphs": "gpuadvisor.fixes.graphs:GraphsFix",
}
# A stage is judged by the loosest policy applied so far: once fp8 weights (or bf16 autocast) are in, a CUDA graph
# or torch.compile of that model is held to that policy's bound, not to the original's own precision.
LOOSEST_FIRST = ("fp8", "bf16", "tf32", "model")
_EXTRA_ORDER: list[str] = []  # ids registered with register_fix, in registration order

# progress(fix_id, stage): stage is "check", "apply", "numerics" or the final status ("applied", "refused", ...).
Progress = Callable[[str, str], None]


class FixUnavailableError(GpuAdvisorError):
    """A registered fix whose module or class cannot be imported (e.g. its optional dependency is missing)."""


def register_fix(fix: Fix | str, fix_id: str | None = None) -> None:
    """Register a fix instance, or a ``"module:Class"`` path under ``fix_id``; an existing id is replaced."""
    if isinstance(fix, str):
        if not fix_id:
            raise ValueError("register_fix('module:Class') needs fix_id")
        key = fix_id
    else:
        key = fix_id or fix.id
        if not key:
            raise ValueError(f"{type(fix).__name__} has no id")
    _REGISTRY[key] = fix
    if key not in FIX_ORDER and key not in _EXTRA_ORDER:
        _EXTRA_ORDER.append(key)


def unregister_fix(fix_id: str) -> None:
    """Remove a fix added with ``register_fix`` (the built-in ids cannot be removed)."""
    if fix_id in FIX_ORDER:
        raise ValueError(f"{fix_id!r} is a built-in fix")
    _REGISTRY.pop(fix_id, None)
    if fix_id in _EXTRA_ORDER:
        _EXTRA_ORDER.remove(fix_id)


def fix_order() -> list[str]:
    """Every known fix id in the order ``apply_fixes`` runs them (extras before ``graphs``)."""
    return [*FIX_ORDER[:-1], *_EXTRA_ORDER, FIX_ORDER[-1]]


def known_fix_ids() -> list[str]:
    return fix_order()


def load_fix(fix_id: str) -> Fix:
    """The fix registered under ``fix_id``: BadInputError for an unknown id, FixUnavailableError if it cannot load."""
    entry = _REGISTRY.get(fix_id)
    if entry is None:
        raise BadInputError(f"unknown fix {fix_id!r}; known fixes: {', '.join(known_fix_ids())}")
    if not isinstance(entry, str):
        return entry
    module_name, _, class_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise FixUnavailableError(f"fix {fix_id!r}: cannot import {module_name} ({error})") from error
    fix_class = getattr(module, class_name, None)
    if fix_class is None:
        raise FixUnavailableError(f"fix {fix_id!r}: {module_name} has no class {class_name}")
    return fix_class()


def resolve_fix_ids(text: str, recommended: Iterable[str] = (), *, api: bool = False) -> list[str]:
    """Parse ``--fix``: ``"graphs,fusion"`` or ``"auto"`` (the fixes the findings recommend) into ids in run order.

    ``recommended`` holds the ``fix_id`` of each finding; ids the registry does not know are ignored there
    (a rule may name a fix that is not built yet). An unknown id typed by the user, or an empty list, is a
    BadInputError listing the known ids. ``auto`` with no recommended fix gives an empty list (nothing to do).
    ``api``: the text comes from ``optimize(fixes=...)``, which takes no ``auto``: the messages say ``fixes``.
    """
    known = known_fix_ids()
    items = [item.strip().lower() for item in (text or "").split(",") if item.strip()]
    if not items:
        if api:
            raise BadInputError(f"fixes: no fix named; expected a list of fix ids: {', '.join(known)}")
        raise BadInputError(f"--fix: no fix named; expected auto or a comma-separated list of: {', '.join(known)}")
    wanted: set[str] = set()
    for item in items:
        if item == "auto" and not api:
            wanted.update(fix_id for fix_id in recommended if fix_id in known)
        elif item in known:
            wanted.add(item)
        elif api:
            raise BadInputError(f"fixes: unknown fix {item!r}; known fixes: {', '.join(known)}")
        else:
            raise BadInputError(f"--fix: unknown fix {item!r}; known fixes: {', '.join(known)} (or auto)")
    return [fix_id for fix_id in known if fix_id in wanted]


def apply_fixes(
    workload: Any, fix_ids: Iterable[str], *, guard: bool = True, progress: Progress | None = None
) -> tuple[Any, list[FixOutcome]]:
    """Apply the fixes in run order; return the final workload and one outcome per fix (see the module docstring).

    ``guard=False`` skips the numerics guard (the outcome's ``numerics`` stays None). An unknown id raises
    BadInputError before anything runs.
    """
    from gpuadvisor.fixes.numerics import check_numerics

    order = fix_order()
    requested = list(dict.fromkeys(fix_ids))
    for fix_id in requested:
        if fix_id not in _REGISTRY:
            raise BadInputError(f"unknown fix {fix_id!r}; known fixes: {', '.join(known_fix_ids())}")
    requested.sort(key=order.index)

    def report(fix_id: str, stage: str) -> None:
        if progress is not None:
            progress(fix_id, stage)

    current = workload
    outcomes: list[FixOutcome] = []
    # Each stage is judged against the original by the loosest policy applied so far: once fp8 weights are in,
    # a CUDA graph of that model is held to fp8's SQNR bound, not to bf16's own rounding noise. A precision-
    # keeping fix (compile, graphs, fusion) that fails that is judged once more against the stack it joins
    # (_against_the_stack).
    applied_policies: set[str] = set()
    for fix_id in requested:
        outcome = FixOutcome(fix_id=fix_id, title=fix_id, status="failed")
        stage = "load"
        try:
            fix = load_fix(fix_id)
            outcome.title = fix.title or fix_id
            stage = "check"
            report(fix_id, stage)
            refusal = fix.check(current)
            if refusal is not None:
                outcome.status = "refused"
                outcome.reason = refusal.reason
                outcome.suggestion = refusal.suggestion
                outcome.details = list(getattr(refusal, "details", []) or [])
            else:
                stage = "apply"
                report(fix_id, stage)
                applied = fix.apply(current)
                outcome.changes = list(applied.changes)
                outcome.skipped = [dict(item) for item in applied.skipped]
                outcome.facts = dict(applied.facts)
                passed = True
                if guard:
                    stage = "numerics"
                    report(fix_id, stage)
                    policies = applied_policies | {fix.numerics}
                    policy = next((p for p in LOOSEST_FIRST if p in policies), fix.numerics)
                    result = check_numerics(workload, applied.workload, policy)
                    if not result.passed and policy != fix.numerics and fix.numerics == "model":
                        result = _against_the_stack(result, current, applied.workload, policy)
                    outcome.numerics = result.to_dict()
                    passed = result.passed
                    if not passed:
                        outcome.status = "rolled_back"
                        outcome.reason = f"numerics guard failed: {result.detail}"
                if passed:
                    outcome.status = "applied"
                    current = applied.workload
                    applied_policies.add(fix.numerics)
        except NothingToApply as nothing:  # apply() looked and found nothing worth changing: a refusal
            outcome.status = "refused"
            outcome.reason = nothing.refusal.reason
            outcome.suggestion = nothing.refusal.suggestion
            outcome.details = list(nothing.refusal.details)
            outcome.changes, outcome.skipped = [], []
        except Exception as error:  # a fix must never take the whole apply down, nor show a traceback
            outcome.status = "failed"
            outcome.reason = _one_line(stage, error)
            outcome.debug_traceback = traceback.format_exc()
            logger.debug("fix %s failed during %s:\n%s", fix_id, stage, outcome.debug_traceback)
        report(fix_id, outcome.status)
        outcomes.append(outcome)
    return current, outcomes


def _one_line(stage: str, error: BaseException) -> str:
    from gpuadvisor.workload import describe_error

    what = {
        "load": "could not be loaded",
        "check": "raised while checking",
        "apply": "raised while applying",
        "numerics": "numerics guard could not run",
    }[stage]
    text = str(error) if isinstance(error, GpuAdvisorError) else describe_error(error)
    return f"{what}: {text}"


def _against_the_stack(first: Any, stack: Any, patched: Any, policy: str) -> Any:
    """A precision-keeping fix (policy ``model``) on top of fixes that changed precision (bf16, fp8), which
    failed against the original under their policy: judge it against the already guarded stack it joins, by its
    own policy (at most 2x, 4x on a TF32 GPU, the stack's own error against a float64 copy). Passing that bounds
    its error against the original by the stack's accepted error plus its own allowance (the triangle
    inequality): the same order as the precision policy's bound, without charging the new fix for a cancelling
    sum whose relative error the stack's rounding had already moved (torch.compile on a bf16 ResNet step:
    7.39e-3 against a 7.37e-3 bound on the classifier's bias gradient). A wrong fix fails both judgements."""
    import dataclasses

    from gpuadvisor.fixes.numerics import check_numerics

    second = check_numerics(stack, patched, "model")
    if not second.passed:
        return first
    return dataclasses.replace(
        second,
        detail=f"against the original ({policy} policy) it missed: {first.detail}; against the guarded stack it "
        f"joins, by its own policy, it passed: {second.detail}",
    )
