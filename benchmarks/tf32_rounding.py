"""How this GPU rounds float32 operands to TF32: to nearest, or by dropping the low 13 mantissa bits.

The ``tf32`` fix's numerics policy (gpuadvisor/fixes/numerics.py, ``tf32_rounding``) judges a TF32 step against
the original with its matmul operands rounded to nearest. Were the tensor cores to truncate instead, the
products would be biased by about -2^-11 relative, and a tensor that sums many of them (a BatchNorm running
variance) would drift where the emulation says it should not. This measures it: cuBLAS matmuls and cuDNN
convolutions with TF32 allowed, against float64 products of operands rounded either way.

Usage (GPU): ``python3 benchmarks/tf32_rounding.py --out benchmarks/results/tf32_rounding_h100.json``
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def truncated(tensor):
    import torch

    return (tensor.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def main() -> int:
    import torch
    import torch.nn.functional as F

    from gpuadvisor.fixes.numerics import round_to_tf32
    from gpuadvisor.fixes.tf32 import tf32_allowed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = []

    def judge(name, got, nearest, truncation, exact):
        def rel(a, b):
            return float((a.double() - b).norm() / b.norm())

        row = {
            "op": name,
            "rel_l2_vs_nearest_emulation": rel(got, nearest),
            "rel_l2_vs_truncation_emulation": rel(got, truncation),
            "rel_l2_vs_float64": rel(got, exact),
            "mean_bias_vs_float64": float(((got.double() - exact) * exact).sum() / (exact * exact).sum()),
            "nearest_emulation_bias": float(((nearest - exact) * exact).sum() / (exact * exact).sum()),
            "truncation_emulation_bias": float(((truncation - exact) * exact).sum() / (exact * exact).sum()),
        }
        row["closer_to"] = (
            "nearest" if row["rel_l2_vs_nearest_emulation"] < row["rel_l2_vs_truncation_emulation"] else "truncation"
        )
        rows.append(row)
        print(json.dumps(row))

    # Positive operands: every product has the same sign, so a truncation's bias adds up instead of cancelling.
    for m, n, k in ((4096, 4096, 4096), (512, 3072, 768)):
        a = torch.rand(m, k, device="cuda") + 0.5
        b = torch.rand(k, n, device="cuda") + 0.5
        with tf32_allowed():
            got = a @ b
        torch.cuda.synchronize()
        judge(
            f"matmul {m}x{k} @ {k}x{n}",
            got,
            round_to_tf32(a).double() @ round_to_tf32(b).double(),
            truncated(a).double() @ truncated(b).double(),
            a.double() @ b.double(),
        )
    x = torch.rand(16, 64, 56, 56, device="cuda") + 0.5
    w = torch.rand(64, 64, 3, 3, device="cuda") + 0.5
    with tf32_allowed():
        got = F.conv2d(x, w, padding=1)
    judge(
        "conv2d 16x64x56x56, 64x64x3x3",
        got,
        F.conv2d(round_to_tf32(x).double(), round_to_tf32(w).double(), padding=1),
        F.conv2d(truncated(x).double(), truncated(w).double(), padding=1),
        F.conv2d(x.double(), w.double(), padding=1),
    )
    result = {
        "command": " ".join(["python3", *sys.argv]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "what": "float32 operands in [0.5, 1.5) with TF32 allowed, against float64 products of the operands"
        " rounded to TF32 to nearest and by truncation; bias = projection of the error onto the exact result",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
