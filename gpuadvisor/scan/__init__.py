"""Static shared-memory bank-conflict scan of CUDA C++ sources (``gpuadvisor scan``).

``source`` reads files (``.cu``/``.cuh``, and CUDA strings embedded in Python), strips comments, expands
``#define`` macros and finds each ``__global__`` kernel; ``interpret`` runs the kernel's integer index
arithmetic for every warp of one block, the 32 lanes in lockstep, and records each shared-memory access's
byte address per lane; ``banks`` turns one warp's addresses into wavefronts (the unit Nsight Compute
counts); ``report`` renders the findings. Nothing here imports torch, numpy or pandas.
"""

from __future__ import annotations

from gpuadvisor.scan.report import scan_paths

__all__ = ["scan_paths"]
