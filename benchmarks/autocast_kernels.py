"""What bf16 autocast does to each group of a conv net's kernels: per-step kernel time by group, float32 against
bf16, from profiled traces (the measurement behind GA302's BatchNorm-net terms, rules/GA302-*.toml).

    python3 benchmarks/autocast_kernels.py --out benchmarks/results/ga302_autocast_kernels.json \\
        b64_nchw=DIR/b64.bf16/before_trace.json.gz:DIR/b64.bf16/after_trace.json.gz ...

Each pair ``NAME=FP32_TRACE:BF16_TRACE`` is the same step without and with ``apply --fix bf16`` (the traces an
``apply`` run keeps). Per trace: every kernel of the profiled steps (the analyzer's kernel table, so the steps
and the families are the ones the rules see), grouped as ``conv`` (GEMM and convolution families), ``batchnorm``
(normalization kernels of a batch norm: cuDNN's or PyTorch's), ``elementwise`` (the elementwise family, the
optimizer's multi-tensor kernels excepted), ``layout`` (cuDNN's NCHW<->NHWC conversions), ``cast`` (the
bf16/direct copy kernels), ``optimizer`` and ``other``; µs per step and kernels per step. Per pair: bf16 / fp32
time per group, and the GPU's saving (fp32 - bf16 kernel time) next to GA302's estimate on the fp32 trace.
No GPU needed: it reads the traces.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("conv", "batchnorm", "elementwise", "layout", "cast", "optimizer", "other")


def group_of(name: str, family: str) -> str:
    low = name.lower()
    if re.search(r"nchwtonhwc|nhwctonchw", low):
        return "layout"
    if family == "normalization" and re.search(r"\bbn_(?:fw|bw)|batchnorm|batch_norm", low):
        return "batchnorm"
    if family in ("gemm", "convolution"):
        return "conv"
    if re.search(r"multi_tensor|foreach", low):
        return "optimizer"
    if re.search(r"bfloat16_copy|direct_copy", low):
        return "cast"
    if family == "elementwise":
        return "elementwise"
    return "other"


def kernel_groups(path: Path) -> dict:
    """{group: {us_per_step, kernels_per_step}} over the profiled steps of one trace, and GA302's estimate."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.rules.detectors_model import _kernels_in_steps
    from gpuadvisor.rules.engine import load_rules, run_rules
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(path)
    analysis = analyze_trace(trace, lookup_peaks(trace.device, None))
    k, _ = _kernels_in_steps(analysis)
    steps = analysis.n_steps
    out = {g: {"us_per_step": 0.0, "kernels_per_step": 0.0} for g in GROUPS}
    for name, family, dur in zip(k["name"], k["family"], k["dur_us"]):
        g = out[group_of(str(name), str(family))]
        g["us_per_step"] += float(dur) / steps
        g["kernels_per_step"] += 1.0 / steps
    for g in out.values():
        g["us_per_step"] = round(g["us_per_step"], 1)
        g["kernels_per_step"] = round(g["kernels_per_step"], 1)
    findings, _ = run_rules(analysis, [r for r in load_rules() if r.id == "GA302"])
    ga302 = {"evidence": findings[0].evidence} if findings else None
    return {
        "gpu": trace.device.name if trace.device else None,
        "trace": str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path),
        "steps": steps,
        "kernel_us_per_step": round(sum(g["us_per_step"] for g in out.values()), 1),
        "groups": out,
        "ga302_gpu_saving_us": (ga302 or {}).get("evidence", {}).get("gpu_saving_us"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="NAME=FP32_TRACE:BF16_TRACE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = {
        "gpu": None,  # the traces' own GPU (their deviceProperties), set below
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 benchmarks/autocast_kernels.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "method": __doc__.split("\n\n")[2].strip(),
        "pairs": {},
    }
    for item in args.pairs:
        name, _, paths = item.partition("=")
        fp32_path, _, bf16_path = paths.partition(":")
        fp32, bf16 = kernel_groups(Path(fp32_path)), kernel_groups(Path(bf16_path))
        gpus = {fp32["gpu"], bf16["gpu"], *([result["gpu"]] if result["gpu"] else [])}
        result["gpu"] = " / ".join(sorted(g or "unknown" for g in gpus))
        ratio = {
            g: round(bf16["groups"][g]["us_per_step"] / fp32["groups"][g]["us_per_step"], 3)
            for g in GROUPS
            if fp32["groups"][g]["us_per_step"] > 0
        }
        saving = round(fp32["kernel_us_per_step"] - bf16["kernel_us_per_step"], 1)
        estimate = fp32["ga302_gpu_saving_us"]
        result["pairs"][name] = {
            "fp32": fp32,
            "bf16": bf16,
            "bf16_over_fp32": ratio,
            "kernel_saving_us": saving,
            "ga302_estimate_us": estimate,
            "estimate_over_saving": round(estimate / saving, 3) if estimate and saving else None,
        }
        print(f"{name:12s} saving {saving:9,.0f} µs  GA302 {estimate or 0:9,.0f} µs  ratios {ratio}")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
