"""The :class:`~gpuadvisor.emit.View` of every command: which formats it shows and the renderer of each. The
renderers are imported when a result is shown, so that declaring a view (and refusing a bad ``--format``)
imports nothing heavy."""

from __future__ import annotations

from typing import Any

from gpuadvisor.emit import View


def _html(result: dict[str, Any]) -> str:
    """Any report as one HTML page (:func:`gpuadvisor.report.html.render_html` tells the kinds apart)."""
    from gpuadvisor.report.html import render_html

    return render_html(result)


def report_view(command: str, top: int) -> View:
    """``analyze`` and ``profile``: a report (:mod:`gpuadvisor.report.json`)."""

    def terminal(report: dict[str, Any], console: Any) -> None:
        from gpuadvisor.report.terminal import render_terminal

        render_terminal(report, console, top=top)

    def markdown(report: dict[str, Any]) -> str:
        from gpuadvisor.report.markdown import render_markdown

        return render_markdown(report)

    return View(command, terminal, markdown, html=_html)


def apply_view() -> View:
    def terminal(report: dict[str, Any], console: Any) -> None:
        from gpuadvisor.report.apply_sections import render_apply_terminal

        render_apply_terminal(report, console)

    def markdown(report: dict[str, Any]) -> str:
        from gpuadvisor.report.apply_sections import render_apply_markdown

        return render_apply_markdown(report)

    return View("apply", terminal, markdown, html=_html)


def compare_view(reports: tuple[dict[str, Any], dict[str, Any]] | None = None) -> View:
    """``compare``: a ``gate.compare_reports`` result; ``reports`` (base, current), when given, put both sides'
    step samples on the HTML page."""

    def terminal(result: dict[str, Any], console: Any) -> None:
        from gpuadvisor import gate

        gate.render_terminal(result, console)

    def markdown(result: dict[str, Any]) -> str:
        from gpuadvisor import gate

        return gate.render_markdown(result)

    def html(result: dict[str, Any]) -> str:
        return compare_html(result, reports)

    return View("compare", terminal, markdown, html=html)


def compare_html(result: dict[str, Any], reports: tuple[dict[str, Any], dict[str, Any]] | None = None) -> str:
    """The compare page, with the sample distributions of ``reports`` (base, current) when given. ``gate`` holds
    each side's samples as an array; the page reads lists."""
    from gpuadvisor.report.html import render_html

    def with_list_samples(report: dict[str, Any]) -> dict[str, Any]:
        summary = report.get("summary")
        samples = summary.get("samples_us") if isinstance(summary, dict) else None
        if samples is None or isinstance(samples, list) or not hasattr(samples, "tolist"):
            return report
        return {**report, "summary": {**summary, "samples_us": samples.tolist()}}

    base, current = (with_list_samples(r) for r in reports) if reports else (None, None)
    return render_html(result, base_report=base, current_report=current)


def diff_view() -> View:
    def terminal(result: dict[str, Any], console: Any) -> None:
        from gpuadvisor import diff

        diff.render_terminal(result, console)

    def markdown(result: dict[str, Any]) -> str:
        from gpuadvisor import diff

        return diff.render_markdown(result)

    return View("diff", terminal, markdown)


def rules_view() -> View:
    """``rules``: the loaded rules (a list of :class:`~gpuadvisor.rules.engine.Rule`)."""

    def terminal(rules: list, console: Any) -> None:
        from gpuadvisor.report.rules import render_rules_terminal

        render_rules_terminal(rules, console)

    def markdown(rules: list) -> str:
        from gpuadvisor.report.rules import rules_markdown

        return rules_markdown(rules)

    def json(rules: list) -> Any:
        from gpuadvisor.report.rules import rule_rows

        return rule_rows(rules)

    return View("rules", terminal, markdown, json)


def explain_view() -> View:
    """``explain``: one rule, its documentation as Markdown (rendered by rich on a terminal)."""

    def terminal(rule: Any, console: Any) -> None:
        from rich.markdown import Markdown

        from gpuadvisor.report.rules import explain_markdown

        console.print(Markdown(explain_markdown(rule)))

    def markdown(rule: Any) -> str:
        from gpuadvisor.report.rules import explain_markdown

        return explain_markdown(rule)

    return View("explain", terminal, markdown, json=None)


def calibrate_view() -> View:
    def terminal(result: dict[str, Any], console: Any) -> None:
        from gpuadvisor.device.calibrate import render_calibration

        render_calibration(result, console)

    return View("calibrate", terminal)


def doctor_view() -> View:
    def terminal(checks: list, console: Any) -> None:
        from gpuadvisor.doctor import render_checks

        render_checks(checks, console)

    return View("doctor", terminal, json=None)


def scan_view() -> View:
    def terminal(result: dict[str, Any], console: Any) -> None:
        from gpuadvisor.scan import report as scan_report

        scan_report.render_terminal(result, console)

    def markdown(result: dict[str, Any]) -> str:
        from gpuadvisor.scan import report as scan_report

        return scan_report.render_markdown(result)

    return View("scan", terminal, markdown, html=_html)


def ncu_view(top: int) -> View:
    def terminal(report: dict[str, Any], console: Any) -> None:
        from gpuadvisor.ncu import run as ncu_run

        ncu_run.render_terminal(report, console, top)

    def markdown(report: dict[str, Any]) -> str:
        from gpuadvisor.ncu import run as ncu_run

        return ncu_run.render_markdown(report, top)

    return View("ncu", terminal, markdown)
