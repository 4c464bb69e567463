"""Several ranks of one profile: the torchrun environment, the process group, and the launcher.

Two ways to profile N ranks (docs/distributed.md says more):

- ``gpuadvisor profile --nproc N model.py``: the launching process (the parent) runs
  ``python -m torch.distributed.run --standalone --nproc-per-node N -m gpuadvisor.distributed_child ...``
  (:func:`run_ranks`), waits for every rank to exit, then merges the ranks' outputs. The parent outlives a
  rank that crashes, so it can name the rank and the cause, and it alone owns the output folder: a failure
  or Ctrl-C leaves nothing behind whatever state the ranks died in. This is the robust way.
- ``torchrun --nproc-per-node N -m gpuadvisor profile model.py``: every rank runs the CLI; the torchrun
  environment (RANK, WORLD_SIZE, LOCAL_RANK: :func:`rank_environment`) makes it a rank, rank 0 merges
  after a barrier. Failure handling there is best effort: torchrun, not gpuadvisor, stops the other ranks.

Each rank sets its CUDA device from LOCAL_RANK before the user's ``build()``, and initializes the default
process group after it when ``build()`` did not (:func:`ensure_process_group`: nccl with CUDA, gloo
without). gpuadvisor's own barriers and messages go through a separate gloo group
(:func:`coordination_group`), so they put no kernel on the GPU and never sit in the user's NCCL streams.

The control folder (``.ranks`` inside the staging folder) holds what the ranks tell the parent:
``rank{r}.pid``, ``rank{r}.phase`` (the phase now running) and, after a failure, ``rank{r}.error.json``
({rank, exit_code, message, time}). It is removed before the output is published.

Torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuadvisor.errors import BadInputError, GpuAdvisorError, UserCodeError

# NVLink multicast (NVLS, used by NCCL and by torch's symmetric memory / NVSHMEM) can take the host's GPUs out
# of service on the machines gpuadvisor is profiled on, so every rank runs with it off. setdefault: a user who
# sets one of them on purpose keeps their value. Multicast only speeds up large collectives on NVSwitch
# systems; the profile measures the job without it.
NVLINK_MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
CONTROL_DIR = ".ranks"
CHILD_MODULE = "gpuadvisor.distributed_child"
# How often the parent looks at the ranks (phase, exit); torchrun's own monitor runs at the same interval.
POLL_INTERVAL_S = 0.1
# After SIGTERM, torchrun stops the ranks (SIGTERM, then SIGKILL after its own 30 s); the parent waits this
# long for that before it kills torchrun's process group and any rank still alive itself.
STOP_GRACE_S = 10.0
_ERROR_SUFFIX = ".error.json"


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a torchrun job (from its environment)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def rank_environment(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The torchrun variables of this process (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), or None when
    RANK or WORLD_SIZE is unset. A value that is not a valid number is a BadInputError."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    values = {}
    for name, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "RANK"), ("LOCAL_WORLD_SIZE", None)):
        raw = environ.get(name)
        if raw is None:
            raw = environ.get(default) if default else None
        if raw is None and name == "LOCAL_WORLD_SIZE":
            raw = environ["WORLD_SIZE"]
        try:
            values[name] = int(str(raw).strip())
        except (TypeError, ValueError):
            raise BadInputError(f"environment: {name}={raw!r} is not a number (set by torchrun)") from None
    info = RankInfo(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"])
    if info.world_size < 1 or not 0 <= info.rank < info.world_size or info.local_rank < 0:
        raise BadInputError(f"environment: RANK={info.rank}, WORLD_SIZE={info.world_size} do not fit together")
    return info


def turn_off_nvlink_multicast(environ: MutableMapping[str, str] | None = None) -> None:
    """setdefault :data:`NVLINK_MULTICAST_OFF` in ``environ`` (os.environ by default); see the constant's comment.
    In a rank this must run before NCCL starts (before the process group, and before ``build()``)."""
    environ = os.environ if environ is None else environ
    for name, value in NVLINK_MULTICAST_OFF.items():
        environ.setdefault(name, value)


def check_nproc(nproc: int, cuda: bool, gpus: int) -> None:
    """--nproc must be >= 1 and, on a CUDA machine, at most the number of GPUs (one GPU per rank)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise BadInputError(f"--nproc must be an int >= 1, got {nproc!r}")
    if cuda and nproc > gpus:
        raise BadInputError(
            f"--nproc {nproc} is more than the {gpus} CUDA GPU(s) this process sees (one GPU per rank; "
            "CUDA_VISIBLE_DEVICES limits them)"
        )


def select_device(info: RankInfo) -> bool:
    """Make GPU LOCAL_RANK the current CUDA device (before ``build()``, so that ``device="cuda"`` means this
    rank's GPU); returns whether CUDA is available."""
    import torch

    if not torch.cuda.is_available():
        return False
    count = torch.cuda.device_count()
    if info.local_rank >= count:
        raise BadInputError(f"LOCAL_RANK {info.local_rank} but this process sees only {count} CUDA GPU(s)")
    torch.cuda.set_device(info.local_rank)
    return True


def ensure_process_group(cuda: bool) -> str:
    """Initialize the default process group from the torchrun environment unless the user's code already did
    (nccl with CUDA, gloo without). Returns the backend in use."""
    import torch.distributed as dist

    if not dist.is_available():
        raise BadInputError("this torch build has no torch.distributed")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return str(dist.get_backend())


def coordination_group():
    """A gloo group of all ranks for gpuadvisor's barriers and messages (the default group when it is gloo)."""
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def barrier(group) -> None:
    """Wait for every rank. A rank that died meanwhile makes this one fail with a UserCodeError saying so
    (the launcher reports the rank that failed first, not this consequence)."""
    import torch.distributed as dist

    try:
        dist.barrier(group=group)
    except RuntimeError as error:  # DistBackendError and gloo's "Connection closed by peer" are RuntimeErrors
        text = " ".join(str(error).split())[:200]
        raise UserCodeError(f"another rank stopped while this one waited for it ({text})") from error


def max_over_ranks(value: int, group) -> int:
    """The largest of every rank's ``value`` (gloo all-reduce on the CPU)."""
    import torch
    import torch.distributed as dist

    box = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX, group=group)
    return int(box.item())


def broadcast_text(text: str | None, group) -> str:
    """Rank 0's ``text`` on every rank."""
    import torch.distributed as dist

    box = [text]
    dist.broadcast_object_list(box, src=0, group=group)
    return str(box[0])


# --- rank side: control files -------------------------------------------------------------------


def write_control(control_dir: Path | None, rank: int, kind: str, text: str) -> None:
    """``rank{r}.{kind}`` in the control folder, written whole (temporary name, then rename); never raises."""
    if control_dir is None:
        return
    target = Path(control_dir) / f"rank{rank}.{kind}"
    temp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, target)
    except OSError:
        pass


def write_error(control_dir: Path | None, rank: int, exit_code: int, message: str) -> None:
    """Record why this rank failed, with the time, for the parent (:func:`first_failure`)."""
    record = {"rank": rank, "exit_code": exit_code, "message": message, "time": time.time()}
    write_control(control_dir, rank, "error.json", json.dumps(record))


def watch_parent(interval_s: float = 0.5) -> None:
    """Exit this process (code 143) when its parent goes away: a rank must not outlive a torchrun that was
    killed. A daemon thread; it can act while the main thread sits inside a collective."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(143)

    threading.Thread(target=watch, name="gpuadvisor-parent-watch", daemon=True).start()


# --- parent side: the launcher ------------------------------------------------------------------


def torchrun_command(nproc: int, child_args: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m gpuadvisor.distributed_child ARGS``.

    --standalone: one host, a rendezvous on a free local port; --monitor-interval 0.1: torchrun notices a
    failed rank within 0.1 s (older torch versions defaulted to 5 s).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--monitor-interval={POLL_INTERVAL_S}",
        "-m",
        CHILD_MODULE,
        *child_args,
    ]


def rank_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of torchrun and its ranks: ours, NVLink multicast off, and this gpuadvisor importable."""
    env = dict(os.environ if base is None else base)
    turn_off_nvlink_multicast(env)
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    return env


def run_ranks(
    nproc: int,
    child_args: list[str],
    control_dir: Path,
    *,
    log_path: Path | None,
    on_poll: Callable[[], None] | None = None,
) -> int:
    """Run the ranks under torchrun and wait for them; returns torchrun's exit code.

    torchrun's output (and the ranks') goes to ``log_path``, or through to this terminal when it is None.
    torchrun runs in a session of its own, so a Ctrl-C reaches only this process; this process then stops
    torchrun and every rank (:func:`stop_ranks`) and re-raises. Any other exception does the same.
    """
    command = torchrun_command(nproc, child_args)
    log = open(log_path, "wb") if log_path is not None else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            command,
            env=rank_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            start_new_session=True,
            preexec_fn=_terminate_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
    except BaseException:
        if log is not None:
            log.close()
        raise
    try:
        while True:
            try:
                return proc.wait(timeout=POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                if on_poll is not None:
                    on_poll()
    except BaseException:
        stop_ranks(proc, control_dir)
        raise
    finally:
        if log is not None:
            log.close()


def _terminate_with_parent() -> None:
    """In torchrun's process, before it starts: SIGTERM it (so it stops its ranks) when this process dies,
    even by SIGKILL (Linux PR_SET_PDEATHSIG). Best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - no prctl: Ctrl-C handling still stops the ranks
        pass


def stop_ranks(proc: subprocess.Popen, control_dir: Path, grace_s: float = STOP_GRACE_S) -> None:
    """Stop torchrun (SIGTERM: it stops its ranks), then after ``grace_s`` kill what is left: torchrun's
    process group and each rank that wrote a pid file and still runs (each rank is in a session of its own)."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    for pid in rank_pids(control_dir):
        if _is_rank_process(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def rank_pids(control_dir: Path) -> list[int]:
    pids = []
    for path in Path(control_dir).glob("rank*.pid"):
        try:
            pids.append(int(path.read_text().strip()))
        except (OSError, ValueError):
            continue
    return pids


def _is_rank_process(pid: int) -> bool:
    """Whether ``pid`` is alive and still one of our ranks (a recycled pid is left alone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return CHILD_MODULE.encode() in handle.read()
    except OSError:  # gone, or alive but unknowable: do not kill a process that may not be ours
        return False


def current_phase(control_dir: Path, rank: int = 0) -> str | None:
    try:
        return (Path(control_dir) / f"rank{rank}.phase").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


# One failure in torchrun's summary: "  rank      : 1 (local_rank: 1)" then "  exitcode  : -6 (pid: 123)".
_SUMMARY_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)
# What a rank says when a peer went away under it: gpuadvisor's barrier, gloo's and NCCL's transports.
_LOST_PEER = re.compile(
    r"another rank stopped|Connection (?:closed|reset) by peer|Broken pipe|remote process exited", re.IGNORECASE
)


def first_failure(control_dir: Path, returncode: int, log_path: Path | None) -> GpuAdvisorError:
    """The error to report after torchrun exited with ``returncode`` != 0: the rank that failed first, with its
    cause and its exit code. That is the earliest ``rank{r}.error.json`` (the others fail after it, when its
    connections close), unless a rank died without a word (a signal in torchrun's failure summary: a native
    crash, the OOM killer) and every error written only says that a peer went away: then it is that rank."""
    records = []
    for path in Path(control_dir).glob(f"rank*{_ERROR_SUFFIX}"):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("rank"), int)]
    text = ""
    if log_path is not None:
        try:
            text = Path(log_path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
    # (rank, exit code) as the summary lists them: the other failures, then its root cause.
    failures = [(int(rank), int(code)) for rank, code in _SUMMARY_FAILURE.findall(text)]
    recorded = {r["rank"] for r in records}
    silent = [(rank, code) for rank, code in failures if code < 0 and rank not in recorded]
    consequences = all(_LOST_PEER.search(str(r.get("message") or "")) for r in records)
    if records and not (silent and consequences):
        first = min(records, key=lambda r: (float(r.get("time") or 0), r["rank"]))
        message = f"rank {first['rank']}: {first.get('message') or 'failed'}"
        code = first.get("exit_code")
        if code == BadInputError.exit_code:
            return BadInputError(message)
        error = UserCodeError(message)
        if isinstance(code, int) and code not in (0, UserCodeError.exit_code):
            error.exit_code = code  # e.g. 70: an internal error in that rank
        return error
    if silent:
        rank, code = failures[-1] if failures[-1] in silent else silent[0]
        how = f"was killed by signal {_signal_name(-code)}{_crash_site(text)}"
    elif failures:
        rank, code = failures[-1]
        how = f"exited with code {code}"
    else:
        rank, how = None, f"failed (torchrun exited with code {returncode})"
    who = "a rank" if rank is None else f"rank {rank}"
    return UserCodeError(f"{who} {how} without reporting an error (rerun with --debug to see the ranks' output)")


# faulthandler's report of a native crash (gpuadvisor.crash): the crashing thread's stack, innermost frame first.
_CRASH_FRAME = re.compile(r"^Current thread [^\n]*\n\s*File \"([^\"]*)\", line (\d+) in (\S+)", re.MULTILINE)


def _crash_site(text: str) -> str:
    """`` in FILE:LINE (FUNCTION)``: where the first native crash in the ranks' output happened; "" when the
    output has no faulthandler report."""
    frame = _CRASH_FRAME.search(text)
    if frame is None:
        return ""
    return f" in {Path(frame.group(1)).name}:{frame.group(2)} ({frame.group(3)})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def read_rank_reports(staging: Path, world_size: int) -> dict[int, dict[str, Any]]:
    """Each rank's ``rank{r}/report.json``; a missing one is an error naming the rank."""
    reports = {}
    for rank in range(world_size):
        path = Path(staging) / f"rank{rank}" / "report.json"
        try:
            reports[rank] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UserCodeError(f"rank {rank}: exited without writing its report ({error})") from error
    return reports
