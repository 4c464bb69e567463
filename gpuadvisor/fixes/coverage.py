"""Which findings a fix addresses, and the saving they predict together.

``apply`` and the ``--fix auto`` search predict a fix's saving from the findings of the before side: a
finding counts when its own fix id is among the fixes applied, when a fix addresses its rule beyond the
finding's own advice (bf16 autocast also moves GA301's fp32 GEMMs onto the tensor cores), and, for GA102's
under-filled kernels, only the part in the kernel families the fix rewrites (torch.compile writes its own
elementwise, normalization, reduction and copy kernels, sized for the GPU; it leaves cuBLAS and cuDNN GEMMs
and convolutions as they are). Pure functions over report dicts: no torch here.

How the addressed savings combine (``combined_saving``): by the part of the step each is made of (the finding's
``saving_from``). A step is GPU idle time plus kernel time, and the kernels are either ones torch.compile
(Inductor) or the fusion fix writes (elementwise, normalization, reduction, copy: GA201's chains, GA203's layout
conversions, GA102's part in those families) or library ones it calls (cuBLAS/cuDNN GEMMs and convolutions,
attention: GA202, GA301, GA302, GA303). Savings in different parts come out of different time, so they add;
savings in the same part overlap, and combine as independent shares of the step,
``step x (1 - prod(1 - saving_i / step))``, as all findings did before; a finding whose saving is the step as a
whole (``saving_from`` "step", e.g. GA204's host loop), or that does not say, is such a share of what the parts
leave. Why: GA101's own estimate is the timed step minus GPU busy (plus the graph's per-kernel cost), so a fix
that also shortens the kernels saves on top of it, and bf16 on the convolutions, channels_last on the NHWC
copies and fused BatchNorm chains shorten different kernels; multiplying them as shares of one step predicted
41% for channels_last+bf16+compile on timm's ResNet-50 training step, which measured 62% on the H200.

And one saving no single finding states: a chain that is fused under bf16 autocast (``fusion`` and ``bf16``
addressed together, as torch.compile with bf16 does) reads and writes bf16 activations, so the fused kernel's
traffic, which GA201 takes as its largest member's in float32, halves too: GA302's own basis for memory-bound
kernels under bf16 (``FUSED_BF16_BYTES``). The optimizer's update stays float32 under autocast: where GA204 or
GA205 measured the optimizer's kernel time, that part of the chains is left out.

Host-bound steps: GA203's, GA301's and GA302's savings on a timed step are capped by the host's time per step (an eager
step cannot go under it; rules/detectors_model.py ``host_capped_saving``), so channels_last or bf16 alone may
save little on a step whose host is as slow as its GPU. Beside compile or graphs (``HOST_FREE_FIXES``) the
host's time goes, and their GPU saving (``evidence["gpu_saving_us"]``) counts in full.
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
# Kernel findings whose saving is in the kernels torch.compile or the fusion fix writes (GA201: chains of
# elementwise and normalization kernels; GA203: NCHW<->NHWC copies); GA102's claimed part is in those families.
GENERATED_KERNEL_RULES = frozenset({"GA201", "GA203", *_BY_FAMILY_RULES["compile"]})
# Fixes after which the step no longer pays the host's time per step: a CUDA graph replays the launches, and
# torch.compile's code launches fewer, larger kernels (in its CUDA-graph modes none). Savings a detector capped
# by the host (GA203, GA301, GA302: evidence["gpu_saving_us"]) count in full beside them.
HOST_FREE_FIXES = frozenset({"compile", "graphs"})
# The parts of a step a saving can come from (a finding's saving_from): GPU idle time, and kernel time.
IDLE_SAVINGS = frozenset({"launch_idle", "sync_idle"})
# bf16 halves the bytes a fused memory-bound chain moves (GA302's basis for memory-bound kernels, "bytes halve").
FUSED_BF16_BYTES = 0.5
PREDICTED_BASIS = (
    "the savings of the findings the applied fixes address, by the part of the step they come from: GPU idle time,"
    " the kernels torch.compile or the fusion fix writes, library kernels; parts add, savings within a part (and"
    " step-wide ones) combine as independent shares of the step, step x (1 - product of (1 - saving / step));"
    " a chain fused under bf16 autocast moves half its bytes; beside compile or graphs a kernel saving that the"
    " eager step's host time capped counts in full"
)


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
    gpu_saving = (finding.get("evidence") or {}).get("gpu_saving_us")
    if HOST_FREE_FIXES & fix_ids and isinstance(gpu_saving, (int, float)):
        # The finding's saving was capped by the eager step's host time; with compile or graphs in the stack
        # the host's time goes, and the GPU's saving is what the fix brings.
        saving = max(float(saving or 0.0), float(gpu_saving))
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


def saving_part(finding: dict[str, Any]) -> str:
    """The part of the step a finding's saving comes from: "idle" (GA101's launch gaps, GA401's sync waits),
    "generated" (kernels torch.compile or fusion writes), "library" (GEMMs, convolutions, attention), or "step"
    (the step as a whole, or not said: an older report's finding)."""
    source = finding.get("saving_from")
    if source in IDLE_SAVINGS:
        return "idle"
    if source == "kernels":
        return "generated" if finding.get("rule_id") in GENERATED_KERNEL_RULES else "library"
    return "step"


def fused_bf16_saving(finding: dict[str, Any], fix_ids: set[str], findings: list[dict[str, Any]]) -> float:
    """What bf16 saves on top of fusing GA201's chains when both are addressed: the fused chains' time
    (the chains' time minus GA201's saving) x ``FUSED_BF16_BYTES``, less the optimizer's kernels (float32 under
    autocast; GA204's or GA205's region_gpu_us_per_step where one fired). 0 for any other finding or stack."""
    if finding.get("rule_id") != "GA201" or not {"fusion", "bf16"} <= fix_ids:
        return 0.0
    saving = addressed_saving(finding, fix_ids)
    chains = (finding.get("evidence") or {}).get("chain_us_per_step")
    if saving <= 0 or not isinstance(chains, (int, float)):
        return 0.0
    optimizer = sum(
        float(value)
        for other in findings
        if other.get("rule_id") in ("GA204", "GA205")
        and isinstance(value := (other.get("evidence") or {}).get("region_gpu_us_per_step"), (int, float))
    )
    return FUSED_BF16_BYTES * max(float(chains) - saving - optimizer, 0.0)


def combined_saving(findings: list[dict[str, Any]], fix_ids: set[str], step_us: float | None) -> float | None:
    """The saving of the findings ``fix_ids`` address (module docstring): per part of the step (``saving_part``)
    the savings combine as independent shares of the step, ``step x (1 - prod(1 - saving_i / step))`` (two
    findings of 60% and 50% save 80%, not 110%); the parts add; step-wide savings are shares of what remains;
    never more than the step."""
    if not step_us:
        return None
    step = float(step_us)
    remaining: dict[str, float] = {}
    for finding in findings:
        saving = addressed_saving(finding, fix_ids)
        if saving <= 0:
            continue
        saving += fused_bf16_saving(finding, fix_ids, findings)
        part = saving_part(finding)
        remaining[part] = remaining.get(part, 1.0) * (1.0 - min(saving / step, 1.0))
    parts = min(sum(1.0 - left for part, left in remaining.items() if part != "step"), 1.0)
    total = 1.0 - (1.0 - parts) * remaining.get("step", 1.0)
    return round(step * total, 1)


def predicted_from_report(report: dict[str, Any]) -> float | None:
    """An apply report's predicted saving (µs) recomputed with ``combined_saving`` from what it holds: the
    applied fixes (with their facts, e.g. compile's mode), the before side's findings and step time. None when
    nothing was applied or the before side has no step time."""
    before = report.get("before") or {}
    applied = [row for row in report.get("fixes") or [] if row.get("status") == "applied"]
    if not applied:
        return None
    covered = set().union(*(fix_covers(row["fix_id"], row.get("facts")) for row in applied))
    return combined_saving(before.get("findings") or [], covered, before.get("step_time_us"))
