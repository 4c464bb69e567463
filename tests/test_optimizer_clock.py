"""optimizer.step()'s host time in the timed steps (capture/timing.py) and GA204's saving derived from it."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from gpuadvisor.capture.timing import time_steps  # noqa: E402
from gpuadvisor.rules.detectors_model import optimizer_loop_timed  # noqa: E402
from gpuadvisor.rules.engine import load_rules, retime_saving  # noqa: E402


def _train_step(sleep_in_optimizer_s: float):
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if sleep_in_optimizer_s:
        optimizer.register_step_pre_hook(lambda *a: time.sleep(sleep_in_optimizer_s))
    x = torch.randn(4, 8)

    def run(i):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        time.sleep(0.002)  # host time outside the optimizer

    return run


def test_optimizer_time_is_measured_per_step_and_excludes_the_rest():
    times = time_steps(_train_step(0.005), 5, cuda=False)
    assert len(times.optimizer_step_us) == 5
    # Each optimizer.step() sleeps 5 ms inside the hooks' window; the 2 ms outside it is not counted.
    assert 4_500 <= times.optimizer_step_median_us <= 20_000
    assert times.optimizer_step_median_us < times.median_us - 1_500


def test_no_optimizer_no_figure_and_hooks_removed():
    times = time_steps(lambda i: torch.ones(3).sum(), 3, cuda=False)
    assert times.optimizer_step_median_us is None
    # The hooks are gone after the phase: an optimizer stepped now is not timed by anyone.
    from torch.optim import optimizer as optim_module

    assert not optim_module._global_optimizer_pre_hooks
    assert not optim_module._global_optimizer_post_hooks


def test_hooks_removed_when_the_step_raises():
    from torch.optim import optimizer as optim_module

    run = _train_step(0.0)

    def failing(i):
        run(i)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        time_steps(failing, 2, cuda=False)
    assert not optim_module._global_optimizer_pre_hooks


def _finding():
    return {
        "rule_id": "GA204",
        "message": "m",
        "estimated_saving_us_per_step": 33_000.0,
        "evidence": {
            "region_us_per_step": 34_000.0,
            "fused_estimate_us": 940.0,
            "basis": "the optimizer.step() region's host wall time minus a fused update: 7 x 4-byte elements",
        },
    }


def test_measured_optimizer_time_replaces_the_scaled_profiled_region():
    rule = next(r for r in load_rules() if r.id == "GA204")
    finding = _finding()
    # Profiled 97 ms step, timed 53.6 ms; the hooks measured 9.3 ms in optimizer.step().
    saving = retime_saving(finding, rule, 53_600.0, 97_000.0, {"optimizer_step_host_us": 9_300.0})
    assert saving == pytest.approx(9_300.0 - 940.0)
    assert finding["evidence"]["region_timed_us_per_step"] == pytest.approx(9_300.0)
    assert finding["evidence"]["basis"].startswith("optimizer.step()'s host time in the timed steps (9,300 µs")
    assert finding["evidence"]["basis"].endswith("7 x 4-byte elements")
    # Without the measurement: the profiled region scaled by timed / profiled step, as before.
    scaled, _ = optimizer_loop_timed(_finding(), rule, 53_600.0, 97_000.0, {})
    assert scaled == pytest.approx(34_000.0 * 53_600.0 / 97_000.0 - 940.0)


# GA205: a foreach update against the timed step -----------------------------------------------------------------


def _foreach_finding():
    # BERT-base's foreach AdamW as the H200 trace gives it (tests/test_real_traces.py pins these from the trace).
    return {
        "rule_id": "GA205",
        "message": "m",
        "estimated_saving_us_per_step": 9_567.0,
        "evidence": {
            "region_us_per_step": 14_718.0,
            "host_share_saved": 0.65,
            "optimizer_host_saving_us": 9_567.0,
            "optimizer_gpu_saving_us": 1_500.0,
            "gpu_busy_us": 8_795.0,
        },
    }


def test_a_host_bound_step_saves_the_hooks_measured_host_share():
    """BERT's eager step syncs once (the padding-mask check), so its host time is the timed step; the hooks
    measured optimizer.step() at 5,763 µs (an H200 apply run): 0.65 of it goes."""
    rule = next(r for r in load_rules() if r.id == "GA205")
    finding = _foreach_finding()
    timed = {"optimizer_step_host_us": 5_763.0, "gpu_busy_us": 8_771.0, "host_syncs_per_step": 1.0}
    saving = retime_saving(finding, rule, 55_044.0, 116_600.0, timed)
    assert saving == pytest.approx(0.65 * 5_763.0)
    assert finding["evidence"]["optimizer_host_saving_timed_us"] == pytest.approx(0.65 * 5_763.0, abs=0.1)
    assert "the host's own time is not separable" in finding["evidence"]["host_bound_basis"]


def test_a_gpu_bound_step_saves_the_gpu_part_and_the_host_part_only_where_it_binds():
    rule = next(r for r in load_rules() if r.id == "GA205")
    # The host enqueues in 6 ms what the GPU runs in 20 ms: only the GPU's 1.5 ms goes.
    timed = {"optimizer_step_host_us": 3_000.0, "gpu_busy_us": 20_000.0, "host_enqueue_us": 6_000.0}
    assert retime_saving(_foreach_finding(), rule, 20_500.0, 60_000.0, timed) == pytest.approx(1_500.0)
    # Host 10 ms, GPU 9.5 ms: the host loses 1.95 ms and the GPU 1.5 ms, so the step ends at max(8.05, 8.0).
    timed = {"optimizer_step_host_us": 3_000.0, "gpu_busy_us": 9_500.0, "host_enqueue_us": 10_000.0}
    assert retime_saving(_foreach_finding(), rule, 10_000.0, 30_000.0, timed) == pytest.approx(10_000.0 - 8_050.0)
    # No hooks: the profiled region scaled by timed / profiled step.
    timed = {"gpu_busy_us": 8_795.0, "host_syncs_per_step": 1.0}
    scaled = retime_saving(_foreach_finding(), rule, 40_000.0, 116_600.0, timed)
    assert scaled == pytest.approx(0.65 * 14_718.0 * 40_000.0 / 116_600.0)
