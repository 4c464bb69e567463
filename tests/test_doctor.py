"""`gpuadvisor doctor`: every check reports OK or why not, never a traceback; the command exits 0 when the GPU
path is usable and 1 when it is not (no CUDA, no NVML, ...), whatever the optional checks say."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpuadvisor import doctor
from gpuadvisor.doctor import render_checks, run_checks

EXPECTED = [
    "Python",
    "torch",
    "CUDA device",
    "NVIDIA driver",
    "CUDA runtime",
    "triton",
    "CUPTI (profiler GPU activity)",
    "NVML (power, energy)",
    "Nsight Compute (ncu)",
    "calibration",
]


@pytest.fixture(scope="module")
def checks() -> list[dict]:
    return run_checks()


def test_every_check_has_name_ok_and_a_one_line_detail(checks):
    assert [c["name"] for c in checks] == EXPECTED
    for check in checks:
        assert set(check) == {"name", "ok", "detail"}
        assert isinstance(check["ok"], bool)
        assert check["detail"] and "\n" not in check["detail"] and "Traceback" not in check["detail"]


def test_python_check_passes(checks):
    assert checks[0]["ok"] is True


def test_no_cuda_gives_reasons(checks):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    by_name = {c["name"]: c for c in checks}
    assert by_name["torch"]["ok"] is True
    assert by_name["CUDA device"]["ok"] is False and "not available" in by_name["CUDA device"]["detail"]
    assert by_name["CUPTI (profiler GPU activity)"]["ok"] is False
    assert "no CUDA GPU" in by_name["CUPTI (profiler GPU activity)"]["detail"]
    assert by_name["calibration"]["ok"] is False


def test_a_check_that_raises_becomes_a_failed_check(monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(doctor, "_CHECKS", (("broken", broken), ("Python", doctor._check_python)))
    result = run_checks()
    assert result[0] == {"name": "broken", "ok": False, "detail": "check failed: RuntimeError: boom second line"}
    assert result[1]["ok"] is True


def test_missing_ncu_is_reported(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    ok, detail = doctor._check_ncu(doctor._Context())
    assert ok is False and "not on PATH" in detail


def test_render_one_line_per_check():
    console = Console(record=True, width=200, force_terminal=False)
    render_checks(
        [
            {"name": "Python", "ok": True, "detail": "3.12.3"},
            {"name": "CUDA device", "ok": False, "detail": "not available [no GPU]"},
        ],
        console,
    )
    lines = console.export_text().splitlines()
    assert lines[0].startswith("✓ Python") and lines[0].endswith("3.12.3")
    assert lines[1].startswith("✗ CUDA device") and lines[1].endswith("not available [no GPU]")


def test_doctor_cli_exit_code_says_whether_the_gpu_path_is_usable(cli):
    """Issue 16: doctor exited 0 at "3 of 10 OK". On a machine without CUDA (this one) it exits 1."""
    done = cli("doctor")
    assert "Traceback" not in done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line[:1] in ("✓", "✗")]
    assert len(lines) == len(EXPECTED)
    failed = [line for line in lines if line.startswith("✗") and any(name in line for name in doctor.GPU_PATH_CHECKS)]
    if failed:
        assert done.returncode == 1, done.stdout
        assert "the GPU path is not usable" in done.stdout
    else:
        assert done.returncode == 0, done.stdout
        assert "the GPU path is usable (exit 0)" in done.stdout


def test_doctor_exits_1_without_cuda(cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    done = cli("doctor")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the GPU path is not usable: CUDA device" in done.stdout


def _checks(failed: set[str]) -> list[dict]:
    return [{"name": name, "ok": name not in failed, "detail": "x"} for name in EXPECTED]


def test_only_the_gpu_path_decides_the_exit_code():
    assert set(doctor.GPU_PATH_CHECKS) <= set(EXPECTED)
    optional = {"triton", "Nsight Compute (ncu)", "calibration"}
    assert doctor.gpu_path_missing(_checks(optional)) == []  # no ncu, no triton, no calibration: still usable
    assert doctor.gpu_path_missing(_checks({"NVML (power, energy)"})) == ["NVML (power, energy)"]
    assert doctor.gpu_path_missing(_checks({"CUDA device", "calibration"})) == ["CUDA device"]


def test_doctor_cli_exit_0_when_the_gpu_path_is_usable(monkeypatch):
    from typer.testing import CliRunner

    from gpuadvisor.cli import app

    monkeypatch.setattr(doctor, "run_checks", lambda: _checks({"Nsight Compute (ncu)", "calibration"}))
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 0
    monkeypatch.setattr(doctor, "run_checks", lambda: _checks({"NVML (power, energy)"}))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1 and "not usable: NVML (power, energy) failed" in result.output


def test_doctor_help_says_what_the_exit_code_means(cli):
    done = cli("doctor", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "Exit codes: 0 the GPU path is usable" in text and "1 one of those failed" in text
