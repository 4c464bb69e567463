"""Which findings a fix addresses, and the saving they predict together.

``apply`` and the ``--fix auto`` search predict a fix's saving from the findings of the before side: a
finding counts when its own fix id is among the fixes applied, when a fix addresses its rule beyond the
finding's own advice (bf16 autocast also moves GA301's fp32 GEMMs onto the tensor cores), and, for GA102's
under-filled kernels, only the part in the kernel families the fix rewrites (torch.compile writes its own
elementwise, normalization, reduction and copy kernels, sized for the GPU; it leaves cuBLAS and cuDNN GEMMs
and convolutions as they are). Pure functions over report dicts: no torch here.
"""

from __future__ import annotations

from typing import Any

# Findings a fix addresses beyond those that name it: bf16 autocast moves fp32 GEMMs that run on the CUDA cores
# (GA301, whose own advice is TF32) onto the tensor cores as well.
ALSO_ADDRESSES = {"bf16": ("GA301",)}

# Kernel families whose kernels torch.compile (Inductor) generates itself, so the grid-size waste that GA102
# measures in them goes with the eager kernels. GEMMs, convolutions and attention stay library calls.
COMPILE_GENERATED_FAMILIES = frozenset({"elementwise", "normalization", "reduction", "copy"})
# Rules whose saving is split by family in evidence["saving_by_family_us"].
_BY_FAMILY_RULES = {"compile": ("GA102",)}


def fix_covers(fix_id: str, facts: dict[str, Any] | None = None) -> set[str]:
    """The findings' fix ids a fix addresses: itself, and for ``compile`` what torch.compile does on its own
    (fuses elementwise chains, rewrites attention to SDPA, pads misaligned GEMMs; Inductor's layout
    optimisation runs convolutions in channels_last; in a CUDA-graph mode, removes launch gaps)."""
    covered = {fix_id}
    if fix_id == "compile":
        covered |= {"fusion", "sdpa", "channels_last"}
        if (facts or {}).get("mode") in ("reduce-overhead", "max-autotune"):
            covered.add("graphs")
    return covered


def addressed_saving(finding: dict[str, Any], fix_ids: set[str]) -> float:
    """The part of a finding's estimated saving (µs per step) that ``fix_ids`` address: all of it when its fix
    id or rule is addressed, the generated families' part of a by-family saving, else 0."""
    saving = finding.get("estimated_saving_us_per_step")
    if not isinstance(saving, (int, float)) or saving <= 0:
        return 0.0
    rules = set().union(*(ALSO_ADDRESSES.get(fix_id, ()) for fix_id in fix_ids)) if fix_ids else set()
    if finding.get("fix_id") in fix_ids or finding.get("rule_id") in rules:
        return float(saving)
    by_family = (finding.get("evidence") or {}).get("saving_by_family_us")
    if "compile" in fix_ids and finding.get("rule_id") in _BY_FAMILY_RULES["compile"] and isinstance(by_family, dict):
        part = sum(
            float(v)
            for fam, v in by_family.items()
            if fam in COMPILE_GENERATED_FAMILIES and isinstance(v, (int, float))
        )
        return min(max(part, 0.0), float(saving))
    return 0.0


def combined_saving(findings: list[dict[str, Any]], fix_ids: set[str], step_us: float | None) -> float | None:
    """The saving of the findings ``fix_ids`` address, combined as independent shares of the step:
    ``step x (1 - prod(1 - saving_i / step))`` (two findings of 60% and 50% save 80%, not 110%)."""
    if not step_us:
        return None
    remaining = 1.0
    for finding in findings:
        saving = addressed_saving(finding, fix_ids)
        if saving > 0:
            remaining *= 1.0 - min(saving / float(step_us), 1.0)
    return round(float(step_us) * (1.0 - remaining), 1)
