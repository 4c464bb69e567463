"""Fixes that ``gpuadvisor apply`` and ``gpuadvisor.optimize`` put in place, each checked by the numerics guard.

``base`` (the contract: Fix, Refusal, Applied, FixOutcome), ``registry`` (ids, order, the apply loop with
rollback), ``numerics`` (the guard), ``safety`` (what a CUDA graph cannot capture, found by running the step
under a dispatch mode), ``graphs``, ``fusion``, ``fp8`` (the fixes). Torch is imported inside functions.
"""
