"""The contract every fix follows (DESIGN.md, "Fixes").

A fix is an object with an ``id`` (``graphs``, ``fusion``, ``fp8``, ...), a ``title``, a ``numerics``
policy and two methods:

``check(workload) -> Refusal | None``
    Decide, without changing anything, whether the fix can run on this workload. A refusal carries
    the reason (one line, naming the user's source line where there is one) and what would make the
    fix applicable.

``apply(workload) -> Applied``
    Return a *new* workload with the fix in place. The workload passed in is never modified: module
    swaps work on a deep copy of the model, CUDA graphs wrap the step. ``Applied.changes`` lists what
    changed in words a user can check ("17 RMSNorm modules -> Triton rmsnorm"); ``Applied.skipped``
    lists the places the fix looked at and left alone, each with the reason.

The registry (``gpuadvisor.fixes.registry``) runs the fixes in a fixed order (module swaps before the
CUDA graph that captures them), runs the numerics guard (``gpuadvisor.fixes.numerics``) after each one
and rolls a fix back when the guard fails. Torch is imported lazily by the fixes, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# How the numerics guard judges a fix (DESIGN.md, "Fixes"):
#   "model": whole-model output against an fp32 copy of the original; the patched run's error may be at
#            most 2x the original low-precision run's own error (fp32 models: relative L2 <= 1e-4).
#   "fp8":   signal-to-quantization-noise ratio of the patched output against the original, >= 25 dB.
#   "bf16":  a float32 model run under bf16 autocast: each output and state write against the original's, within a
#            multiple of how far the original moves when its weights and inputs are rounded to bf16.
#   "tf32":  a float32 step with TF32 matmuls: the same, against the original with its matmul operands rounded to TF32.
NumericsPolicy = Literal["model", "fp8", "bf16", "tf32"]

Status = Literal["applied", "refused", "rolled_back", "failed"]


@dataclass
class Refusal:
    """Why a fix does not apply, and what would make it apply."""

    reason: str  # one line, e.g. "host sync: .item() at model.py:41 (aten::_local_scalar_dense)"
    suggestion: str | None = None  # e.g. "keep the value on the GPU (torch.where) or move .item() out of the step"
    details: list[str] = field(default_factory=list)  # every blocking finding, one line each (reason has the first)


class NothingToApply(Exception):  # noqa: N818 - a result, not an error
    """Raised by ``apply()`` when, having looked at the step, the fix finds nothing it would change for the
    better (every candidate left alone, with reasons): the registry reports the refusal it carries."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.reason)
        self.refusal = refusal


@dataclass
class Applied:
    """A patched workload and an account of what the fix did."""

    workload: Any  # gpuadvisor.workload.Workload
    changes: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # [{"target": "layers.0.w1", "reason": "..."}]
    # What the fix measured or chose, for the report (compile: the mode picked, each mode's time, compile seconds,
    # graph breaks); plain JSON values only.
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class FixOutcome:
    """One fix's line in the report's ``fixes`` list."""

    fix_id: str
    title: str
    status: Status
    reason: str | None = None  # refused / rolled_back / failed: why, one line
    suggestion: str | None = None
    changes: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    numerics: dict[str, Any] | None = None  # gpuadvisor.fixes.numerics.NumericsResult.to_dict()
    predicted_saving_us: float | None = None  # from the findings that recommend this fix (filled by apply)
    details: list[str] = field(default_factory=list)  # refused: every blocking finding, one line each
    facts: dict[str, Any] = field(default_factory=dict)  # Applied.facts of an applied fix
    # failed: the exception's full traceback, for --debug only; not part of the report (to_dict leaves it out).
    debug_traceback: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix_id": self.fix_id,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "suggestion": self.suggestion,
            "changes": list(self.changes),
            "skipped": [dict(item) for item in self.skipped],
            "numerics": self.numerics,
            "predicted_saving_us": self.predicted_saving_us,
            "details": list(self.details),
            "facts": dict(self.facts),
        }


class Fix:
    """Base class for fixes; subclasses set ``id``, ``title``, ``numerics`` and implement both methods."""

    id: str = ""
    title: str = ""
    numerics: NumericsPolicy = "model"

    def check(self, workload: Any) -> Refusal | None:  # pragma: no cover - interface
        raise NotImplementedError

    def apply(self, workload: Any) -> Applied:  # pragma: no cover - interface
        raise NotImplementedError
