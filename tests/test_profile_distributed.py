"""`gpuadvisor profile --nproc N` and `torchrun -m gpuadvisor profile`: several ranks, one merged report.

On this CI machine (no GPU) the ranks run on the CPU with gloo: the tests check the launcher (torchrun), the
rank folders, the merged report's per-rank rows, lockstep timing, failures (a rank that raises: one line naming
it, exit 3, nothing left), Ctrl-C (every rank stopped, exit 130, nothing left) and the direct torchrun mode.
The straggler rule (GA702) measures time inside NCCL kernels, which a CPU trace does not have: on the CPU it is
skipped with that reason, and the test that it names the planted straggler needs two CUDA GPUs (marked gpu).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from gpuadvisor.capture import distributed as launcher  # noqa: E402
from gpuadvisor.errors import BadInputError, UserCodeError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DDP_TRAIN = REPO / "examples" / "ddp_train.py"
FAST = ("--warmup", "1", "--steps", "4", "--min-time", "0", "--profile-steps", "2")
STRAGGLER_MS = 40


def run(args: list, env_extra: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python ARGS`` with this checkout first on the path (as conftest's runner, plus ``env_extra``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(NO_COLOR="1", COLUMNS="160", **(env_extra or {}))
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def rank_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# A rank killed by SIGABRT in native code (torch's gloo or Kineto; gpuadvisor raises no signal), as torchrun
# (``exitcode : -6``) and `profile --nproc` ("killed by signal SIGABRT") report it. Seen once in CI (rank 0 of
# the torchrun test, 2026-12-08); not in 40 runs of that command on a loaded machine nor in 60 of gloo's own
# barrier-and-destroy.
NATIVE_ABORT = re.compile(r"exitcode\s*:\s*-6\b|killed by signal SIGABRT")


def run_ranks(root: Path, args_for, env_extra: dict | None = None) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """``run(args_for(root / "out"))``; once more, in a fresh ``root / "again"``, when a rank died of a native
    abort, with the first run's stderr (the rank's Python stack: gpuadvisor.crash) given as a warning. Returns
    the folder the run that counts wrote in, its output folder and its result."""
    out = root / "out"
    result = run(args_for(out), env_extra)
    if result.returncode != 0 and NATIVE_ABORT.search(result.stderr):
        warnings.warn(
            f"a rank aborted in native code; ran once more. Its stderr:\n{result.stderr[-6000:]}", stacklevel=2
        )
        root = root / "again"
        root.mkdir()
        out = root / "out"
        result = run(args_for(out), env_extra)
    return root, out, result


# --- two CPU ranks with a planted straggler -----------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One `profile --nproc 2` of the DDP example on the CPU, rank 1 sleeping STRAGGLER_MS in every step."""
    return run_ranks(
        tmp_path_factory.mktemp("ddp"),
        lambda out: ["-m", "gpuadvisor", "profile", "--nproc", "2", DDP_TRAIN, "--out", out, *FAST, "-f", "json"],
        {"GPUADVISOR_EXAMPLE_STRAGGLER_RANK": "1", "GPUADVISOR_EXAMPLE_STRAGGLER_MS": str(STRAGGLER_MS)},
    )


def test_nproc_writes_rank_folders_and_merged_report(two_ranks):
    root, out, result = two_ranks
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert rank_files(root) == ["out"]  # no staging folder left
    assert rank_files(out) == ["rank0", "rank1", "report.html", "report.json", "report.md"]
    for rank in (0, 1):
        assert rank_files(out / f"rank{rank}") == ["report.html", "report.json", "report.md", "trace.json.gz"]
        own = json.loads((out / f"rank{rank}" / "report.json").read_text())
        assert own["distributed"] == {"rank": rank, "world_size": 2, "local_rank": rank, "backend": "gloo"}
        with gzip.open(out / f"rank{rank}" / "trace.json.gz", "rt") as handle:
            trace = json.load(handle)
        assert trace["distributedInfo"]["rank"] == rank
        assert len({e["name"] for e in trace["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")}) == 2
    report = json.loads((out / "report.json").read_text())
    assert json.loads(result.stdout) == report
    assert report["command"] == "profile" and report["summary"]["world_size"] == 2
    assert report["source"]["ranks"] == [0, 1]
    assert "# gpuadvisor report: profile" in (out / "report.md").read_text()


def test_merged_report_has_one_row_per_rank(two_ranks):
    _, out, _ = two_ranks
    report = json.loads((out / "report.json").read_text())
    ranks = report["ranks"]
    assert ranks["world_size"] == 2 and ranks["backend"] == "gloo"
    rows = ranks["rows"]
    assert [row["rank"] for row in rows] == [0, 1]
    for row in rows:
        own = json.loads((out / row["folder"] / "report.json").read_text())["summary"]
        assert row["timed_step_time_us"] == own["step_time_us"]  # each rank's own timing phase
        assert row["step_time_us"] == own["trace_step_time_us"]  # the trace's profiled steps
        assert row["trace_vs_timed_pct"] == pytest.approx(
            100 * (row["step_time_us"] - row["timed_step_time_us"]) / row["timed_step_time_us"], abs=0.01
        )
    worst = max(abs(row["trace_vs_timed_pct"]) for row in rows)
    assert ranks["timing_agreement"]["max_abs_difference_pct"] == pytest.approx(worst, abs=0.01)
    assert ranks["timing_agreement"]["within_tolerance"] == (worst <= 5.0)
    assert any("agree within 5%" in note or "NOT agree within 5%" in note for note in report["notes"])


def test_ranks_time_in_lockstep(two_ranks):
    """Rank 1 sleeps before its backward pass; rank 0 waits for it in DDP's gradient all-reduce, so rank 0's
    timed steps are at least as long as the sleep too."""
    _, out, _ = two_ranks
    rows = json.loads((out / "report.json").read_text())["ranks"]["rows"]
    for row in rows:
        assert row["timed_step_time_us"] >= STRAGGLER_MS * 1000 * 0.95, row


def test_straggler_rule_is_skipped_on_cpu_with_the_reason(two_ranks):
    _, out, _ = two_ranks
    report = json.loads((out / "report.json").read_text())
    skipped = {s["rule_id"]: s["reason"] for s in report["skipped_rules"]}
    assert "GA702" in skipped and "no GPU communication (NCCL) kernels" in skipped["GA702"]
    assert "GA701" in skipped
    assert report["ranks"]["straggler"] is None


def test_terminal_shows_per_rank_table(two_ranks):
    from rich.console import Console

    from gpuadvisor.report.terminal import render_terminal

    _, out, _ = two_ranks
    report = json.loads((out / "report.json").read_text())
    console = Console(record=True, width=160, color_system=None)
    render_terminal(report, console)
    shown = console.export_text()
    assert "Timed step" in shown and "Trace step" in shown and "Trace vs timed" in shown
    lines = [line for line in shown.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(lines) >= 2


# --- failures -------------------------------------------------------------------------------------

FAILING_MODEL = """
import os
import torch

def build():
    return torch.nn.Linear(8, 8), (torch.randn(4, 8),)

_calls = [0]

def step(model, inputs):
    _calls[0] += 1
    if os.environ["RANK"] == "1" and _calls[0] == 2:
        raise ValueError("planted failure on rank one")
    return model(*inputs)
"""


def test_a_failing_rank_is_named_and_nothing_is_left(tmp_path):
    model = tmp_path / "failing.py"
    model.write_text(FAILING_MODEL)
    out = tmp_path / "out"
    result = run(["-m", "gpuadvisor", "profile", "--nproc", "2", model, "--out", out, *FAST])
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: rank 1: ")
    assert "ValueError: planted failure on rank one" in lines[0]
    assert lines[0].endswith("during timing, step 1 of 4")  # its second step: one warm-up step first
    assert rank_files(tmp_path) == ["failing.py"]  # no output folder, no staging folder


SLOW_MODEL = """
import time
import torch

def build():
    return torch.nn.Linear(8, 8), (torch.randn(4, 8),)

def step(model, inputs):
    time.sleep(0.2)
    return model(*inputs)
"""


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped
    except OSError:
        return False


def test_ctrl_c_stops_every_rank_and_leaves_nothing(tmp_path):
    model = tmp_path / "slow.py"
    model.write_text(SLOW_MODEL)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuadvisor",
            "profile",
            "--nproc",
            "2",
            str(model),
            "--out",
            str(out),
            "--warmup",
            "50",
            "--steps",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            controls = list(tmp_path.glob(".out.*.tmp/.ranks"))
            if controls and all(launcher.current_phase(controls[0], r) == "warm-up" for r in (0, 1)):
                pids = launcher.rank_pids(controls[0])
                break
            time.sleep(0.2)
        assert len(pids) == 2, (proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["interrupted: nothing was written"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_is_running(pid) for pid in pids):
        time.sleep(0.2)
    assert not any(_is_running(pid) for pid in pids)
    assert rank_files(tmp_path) == ["slow.py"]


ABORTING_MODEL = """
import os
import torch

def build():
    return torch.nn.Linear(8, 8), (torch.randn(4, 8),)

calls = 0

def step(model, inputs):
    global calls
    calls += 1
    if os.environ["RANK"] == "1" and calls == 3:
        os.abort()  # as a C++ std::terminate in a library would
    return model(*inputs)
"""


def test_a_rank_that_aborts_is_named_with_where_it_crashed(tmp_path):
    model = tmp_path / "aborting.py"
    model.write_text(ABORTING_MODEL)
    result = run(["-m", "gpuadvisor", "profile", "--nproc", "2", model, "--out", tmp_path / "out", *FAST])
    assert result.returncode == 3, result.stderr
    # rank 0 failed too (its barrier lost rank 1), but the line names the rank that died, and where
    assert result.stderr.strip().splitlines() == [
        "error: rank 1 was killed by signal SIGABRT in aborting.py:14 (step) without reporting an error "
        "(rerun with --debug to see the ranks' output)"
    ]
    assert rank_files(tmp_path) == ["aborting.py"]


def test_nproc_zero_is_a_usage_error(cli, tmp_path):
    result = cli("profile", "--nproc", "0", DDP_TRAIN, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert not (tmp_path / "out").exists()


def test_more_ranks_than_gpus_is_refused_before_launch(tmp_path, monkeypatch):
    from gpuadvisor.profile import run_profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(launcher, "run_ranks", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(BadInputError) as caught:
        run_profile(DDP_TRAIN, nproc=2, out_dir=tmp_path / "out")
    assert str(caught.value) == (
        "--nproc 2 is more than the 1 CUDA GPU(s) this process sees "
        "(one GPU per rank; CUDA_VISIBLE_DEVICES limits them)"
    )
    assert list(tmp_path.iterdir()) == []


# --- torchrun -m gpuadvisor profile -----------------------------------------------------------------


def test_torchrun_runs_the_cli_as_ranks(tmp_path):
    root, out, result = run_ranks(
        tmp_path,
        lambda out: [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "gpuadvisor",
            "profile",
            DDP_TRAIN,
            "--out",
            out,
            *FAST,
            "-f",
            "json",
        ],
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # rank 0 prints the merged report, rank 1 nothing
    assert [row["rank"] for row in report["ranks"]["rows"]] == [0, 1]
    assert report["ranks"]["launcher"].startswith("torchrun --nproc-per-node 2")
    assert rank_files(out) == ["rank0", "rank1", "report.html", "report.json", "report.md"]
    assert rank_files(root) == ["out"]


# --- the parts that need no processes -------------------------------------------------------------


def test_rank_environment():
    assert launcher.rank_environment({}) is None
    info = launcher.rank_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert info == launcher.RankInfo(rank=3, world_size=4, local_rank=1, local_world_size=2)
    assert launcher.rank_environment({"RANK": "1", "WORLD_SIZE": "2"}).local_rank == 1
    with pytest.raises(BadInputError):
        launcher.rank_environment({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(BadInputError):
        launcher.rank_environment({"RANK": "2", "WORLD_SIZE": "2"})


def test_nvlink_multicast_is_off_in_the_ranks_environment():
    env = launcher.rank_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"})
    assert env["NCCL_NVLS_ENABLE"] == "1"  # setdefault: a value the user set stays
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert launcher.rank_env({})["NCCL_NVLS_ENABLE"] == "0"
    assert str(REPO) in env["PYTHONPATH"].split(os.pathsep)


def test_check_nproc():
    launcher.check_nproc(4, cuda=False, gpus=0)  # CPU: gloo ranks, as many as asked
    launcher.check_nproc(2, cuda=True, gpus=2)
    with pytest.raises(BadInputError):
        launcher.check_nproc(3, cuda=True, gpus=2)


def test_torchrun_command():
    command = launcher.torchrun_command(2, ["model.py"])
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in command and "--nproc-per-node=2" in command
    assert command[-3:] == ["-m", "gpuadvisor.distributed_child", "model.py"]


def test_first_failure_names_the_earliest_rank(tmp_path):
    launcher.write_error(tmp_path, 0, 3, "model.py: step() raised RuntimeError: Connection closed by peer")
    time.sleep(0.01)
    launcher.write_error(tmp_path, 1, 3, "model.py: step() raised ValueError: boom")
    (tmp_path / "rank1.error.json").write_text(
        json.dumps({**json.loads((tmp_path / "rank1.error.json").read_text()), "time": 1.0})
    )
    error = launcher.first_failure(tmp_path, 1, None)
    assert isinstance(error, UserCodeError) and str(error) == "rank 1: model.py: step() raised ValueError: boom"


def test_first_failure_from_torchrun_summary(tmp_path):
    log = tmp_path / "torchrun.log"
    log.write_text(
        "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 123)\n"
    )
    error = launcher.first_failure(tmp_path, 1, log)
    assert str(error).startswith("rank 1 was killed by signal SIGKILL") and error.exit_code == 3


def torchrun_summary(folder: Path, root: tuple[int, int], *others: tuple[int, int]) -> Path:
    """A log ending in torchrun's failure summary: the ``others`` (rank, exit code) first, then the root cause."""

    def failure(index: int, rank: int, code: int) -> str:
        return f"[{index}]:\n  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {100 + rank})\n"

    log = folder / "torchrun.log"
    log.write_text(
        "Failures:\n"
        + "".join(failure(i + 1, *other) for i, other in enumerate(others))
        + "Root Cause (first observed failure):\n"
        + failure(0, *root)
    )
    return log


def test_first_failure_names_a_rank_killed_by_a_signal_not_the_rank_it_left_waiting(tmp_path):
    # rank 0 saw rank 1's connection close and wrote its error; rank 1, killed, wrote none: it is the cause
    launcher.write_error(tmp_path, 0, 3, "another rank stopped while this one waited for it (Connection reset)")
    log = torchrun_summary(tmp_path, (1, -6), (0, 3))
    error = launcher.first_failure(tmp_path, 1, log)
    assert str(error).startswith("rank 1 was killed by signal SIGABRT without reporting an error")


def test_first_failure_keeps_a_real_error_over_a_rank_killed_after_it(tmp_path):
    # rank 0 raised; torchrun stopped rank 1, which had to be killed (SIGKILL): rank 0's error is the cause
    launcher.write_error(tmp_path, 0, 3, "model.py: step() raised ValueError: boom")
    log = torchrun_summary(tmp_path, (0, 3), (1, -9))
    assert str(launcher.first_failure(tmp_path, 1, log)) == "rank 0: model.py: step() raised ValueError: boom"


def test_first_failure_reads_the_root_cause_not_the_failures_listed_before_it(tmp_path):
    log = torchrun_summary(tmp_path, (0, -6), (1, 130))  # as torchrun printed it in CI: the SIGTERMed rank first
    assert str(launcher.first_failure(tmp_path, 1, log)).startswith("rank 0 was killed by signal SIGABRT")


def test_first_failure_names_where_a_native_crash_happened(tmp_path):
    log = tmp_path / "torchrun.log"
    log.write_text(
        "Fatal Python error: Aborted\n\nThread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n\n'
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/site-packages/gpuadvisor/capture/profiler.py", line 117 in capture\n'
        '  File "/site-packages/gpuadvisor/profile.py", line 400 in profile_and_report\n\n'
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 9)\n"
    )
    error = launcher.first_failure(tmp_path, 1, log)
    assert str(error).startswith("rank 0 was killed by signal SIGABRT in profiler.py:117 (capture) without")


def test_an_earlier_multi_rank_folder_may_be_replaced(tmp_path):
    from gpuadvisor.profile_ranks import check_ranks_out_dir

    out = tmp_path / "out"
    (out / "rank0").mkdir(parents=True)
    (out / "rank0" / "trace.json.gz").write_bytes(b"")
    (out / "report.json").write_text("{}")
    check_ranks_out_dir(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BadInputError):
        check_ranks_out_dir(out)


# --- on two GPUs ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_straggler_is_named_on_gpus(tmp_path):
    out = tmp_path / "out"
    result = run(
        ["-m", "gpuadvisor", "profile", "--nproc", "2", DDP_TRAIN, "--out", out, "-f", "json"],
        {"GPUADVISOR_EXAMPLE_STRAGGLER_RANK": "1", "GPUADVISOR_EXAMPLE_STRAGGLER_MS": "80"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ranks"]["straggler"] == 1
    ga702 = [f for f in report["findings"] if f["rule_id"] == "GA702"]
    assert ga702 and ga702[0]["evidence"]["straggler_rank"] == 1
