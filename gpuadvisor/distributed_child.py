"""One rank of ``gpuadvisor profile --nproc N``: ``python -m gpuadvisor.distributed_child MODEL --staging DIR ...``.

torchrun starts N of these (:func:`gpuadvisor.capture.distributed.run_ranks`). Each profiles its rank
(:func:`gpuadvisor.profile_ranks.profile_rank`) into ``DIR/rank{r}/`` and exits; the launching process merges.
A rank that fails writes ``DIR/.ranks/rank{r}.error.json`` (its one-line error, exit code and the time) so
that the launcher can name the rank that failed first, then exits with the code the CLI would use. Not meant
to be run by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuadvisor.errors import GpuAdvisorError

EXIT_INTERNAL = 70  # as the CLI's: a bug in gpuadvisor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpuadvisor.distributed_child", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--staging", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--entry")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=None)
    parser.add_argument("--peaks")
    parser.add_argument("--rules")
    parser.add_argument("--no-nvml", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from gpuadvisor.capture import distributed as ranks

    info = ranks.rank_environment()
    if info is None:
        sys.stderr.write("error: run by `gpuadvisor profile --nproc N` (torchrun sets RANK and WORLD_SIZE)\n")
        sys.exit(2)
    ranks.watch_parent()  # never outlive torchrun
    from gpuadvisor.crash import report_native_crashes

    report_native_crashes()  # a native crash names where it happened (gpuadvisor.crash)
    staging = Path(args.staging)
    control = staging / ranks.CONTROL_DIR
    ranks.write_control(control, info.rank, "pid", str(os.getpid()))
    code = 0
    try:
        from gpuadvisor.profile_ranks import RankOptions, profile_rank
        from gpuadvisor.rules.engine import load_rules

        options = RankOptions(
            model_path=Path(args.model),
            entry=args.entry,
            warmup=args.warmup,
            timed_steps=args.steps,
            profiled_steps=args.profile_steps,
            out_dir=Path(args.out),
            peaks_file=Path(args.peaks) if args.peaks else None,
            rules_dir=Path(args.rules) if args.rules else None,
            nvml=not args.no_nvml,
            **({} if args.min_time is None else {"min_time_s": args.min_time}),
        )
        profile_rank(options, info, load_rules(options.rules_dir), lambda group: staging, control_dir=control)
    except GpuAdvisorError as error:
        ranks.write_error(control, info.rank, error.exit_code, str(error))
        sys.stderr.write(f"rank {info.rank}: error: {error}\n")
        code = error.exit_code
    except KeyboardInterrupt:
        code = 130
    except BaseException as error:  # noqa: BLE001 - reported to the launcher as one line
        message = f"internal error ({type(error).__name__}: {' '.join(str(error).split())[:300]})"
        ranks.write_error(control, info.rank, EXIT_INTERNAL, message)
        import traceback

        traceback.print_exc()
        code = EXIT_INTERNAL
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # No interpreter shutdown: with a peer gone, tearing down NCCL or gloo can hang; everything this rank
    # writes is already on disk.
    os._exit(code)


if __name__ == "__main__":
    main()
