"""Building an apply report in-process from timed sides, without a GPU or a model: the pieces of
``gpuadvisor.apply`` that turn per-block step times into the report (shared by the apply tests)."""

from __future__ import annotations

from pathlib import Path


def summarize(side, sampler=None, phase=None):
    """The side's run facts as apply builds them (model.py, one profiled step), and its timed summary set."""
    from gpuadvisor.report.profiled import RunFacts, timed_summary

    facts = RunFacts(
        model_path=Path("model.py"),
        out_dir=Path("out"),
        times=side.step_times(),
        tokens_per_step=None,
        nvml_summary=side.nvml_summary(sampler, phase),
        nvml_reason="",
        memory=side.memory(True),
        profiled_steps=1,
    )
    side.summary = timed_summary(facts)
    return facts


def apply_report(measured, *, steps: int, rounds: int, side_reports=None, fix: str = "graphs"):
    """The report ``apply --fix FIX`` writes for these measured sides when no fix applied (CUDA timing)."""
    from gpuadvisor.apply import build_apply_report

    return build_apply_report(
        model_path=Path("model.py"),
        out_dir=Path("out"),
        fix_text=fix,
        fix_ids=[fix],
        outcomes=[],
        applied_ids=[],
        measured=measured,
        side_reports=side_reports or {"before": None, "after": None},
        env={},
        cuda=True,
        nvml_reason="",
        graph_replay=None,
        steps=steps,
        rounds=rounds,
        auto=False,
    )
