"""The numerics guard: does a patched workload still compute what the original computes? (DESIGN.md, "Fixes")

``check_numerics(original, patched, policy)`` makes fresh random inputs from the example inputs, runs the
original and the patched step on the same inputs and compares the outputs:

- fresh inputs: a floating tensor becomes ``randn`` of the same shape, dtype and device, scaled to the
  example's standard deviation when that is non-zero; an integer tensor becomes random integers in
  ``[0, max(example) + 1)``, so token ids and cache positions stay valid; a bool tensor random bools;
  anything else is passed unchanged. Drawn from a CPU generator seeded with ``seed + trial``, so every run
  of the guard sees the same inputs on any device.
- outputs: a tensor, or tuples/lists/dicts/dataclasses of tensors (flattened by path). Floating outputs are
  compared by the policy; other dtypes must match exactly; the structure and shapes must match.
- ``"model"`` policy, for whole-model fixes: a bf16/fp16 model's own output is noisy (a transformers Llama
  under torch.compile differs from eager by 1.8% relative L2 on the H200, DESIGN.md), so a fixed 1e-2 bound
  on the whole output would reject good fixes. Where memory allows, a float32 deep copy of the ORIGINAL model
  runs on the same inputs (floating inputs upcast) as the reference; the patched run's relative L2 to that
  reference may be at most ``max(2 x the original's own relative L2 to it, the fixed bound for the dtype)``.
  Both numbers are reported. Without the reference (fp32 model, not enough memory, or the fp32 copy fails)
  the patched output is compared with the original's against the fixed bound: bf16/fp16 1e-2, fp32 1e-4.
  An fp32 step that fails that bound gets the same judgement against a float64 copy of the original before it
  is rolled back: a correct fix that reorders fp32 math (another memory layout, another convolution algorithm,
  TF32 on the GPU) moves a training step's gradients by more than 1e-4 (channels_last on the small ResNet
  training step of examples/real: 1.5e-4 in a momentum buffer, where the original itself is 4e-5 from float64
  and the channels_last run 7e-5), and is kept when it stays within 2x the original's own error (on a GPU whose
  float32 convolutions and matmuls may run in TF32: 4x, and at least TF32's own rounding, 1e-2, see
  ``TF32_REFERENCE_FACTOR`` and ``TF32_FIXED_REL_L2``).
- ``"fp8"`` policy: signal-to-quantization-noise ratio of the patched output against the original, >= 25 dB.
- ``"bf16"`` policy, for a float32 model run under bf16 autocast: the patched run is judged against the model's
  own bf16 noise, measured, per compared tensor. The ORIGINAL runs twice more on each trial, computing in float32
  with bf16 storage emulated (values rounded to bf16 and back): ``bf16_rounding`` rounds the step's floating
  inputs and the operands and results of the ops autocast lowers (matmuls, convolutions, attention);
  ``bf16_storage`` also rounds every tensor autocast stores in bf16 after them, following autocast's dtype rules
  (BatchNorm, pointwise and residual outputs between bf16 tensors, and their gradients in backward). How far the
  farther of the two moves from the plain original (relative L2 of each output and of each state write: loss,
  gradient, weight update, moments, BatchNorm statistics) is the noise bf16 storage alone costs that tensor. The
  patched run's relative L2 to the original may be at most ``max(BF16_NOISE_FACTOR x that, BF16_FLOOR)``, tensor
  by tensor, with the systematic-scale check of the ``"model"`` policy on top. Why the second emulation: a tensor
  that sums or cancels many bf16-stored terms (BatchNorm over a few values, a bias gradient summed over the batch,
  a momentum update) is off by its terms' rounding relative to the terms' magnitude, which its own rel-L2 does not
  show; ``bf16_rounding`` alone never rounds those terms when they are BatchNorm or pointwise outputs, and a correct
  autocast step then lands many times above it. Why a multiple: autocast accumulates in other orders and other
  kernels than the float32 emulations; see ``BF16_NOISE_FACTOR`` and ``bf16_storage`` for the measurements.
- ``"tf32"`` policy, for a float32 step whose matmuls may run in TF32 (the ``tf32`` fix): the same judgement as
  ``"bf16"``, against one emulation, ``tf32_rounding``: the original computing in float32 with the operands of its
  matmuls, convolutions and attention rounded to TF32's 10-bit mantissa and back, and the gradients flowing into
  them in backward too (TF32 multiplies rounded operands and accumulates and returns float32, so nothing else is
  rounded, not even the step's inputs). The patched run may be at most ``max(TF32_NOISE_FACTOR x that,
  TF32_FLOOR)`` from the original, tensor by tensor (a state write at least ``TF32_STATE_FLOOR``), with the scale
  check on top.
- NaN/Inf parity, always: the patched output must have NaN and +/-Inf exactly where the original has them;
  the errors are computed over the positions finite in both (and in the reference).

Relative L2 and SQNR are computed in float64 on the outputs' device. Over several output tensors the guard
takes the worst one (the largest error, the lowest SQNR), and over trials the worst trial.

Stateful steps (DESIGN.md, "Steps are stateful"): the guard finds the state both workloads can reach
(``gpuadvisor.fixes.state``: parameters, buffers, gradients, optimizer state, tensors inside the input objects
such as a library's cache object), snapshots the original's state S, and for each trial runs the original one
step from S, keeps what it wrote, restores S, loads S into the patched workload's own copy of that state (when
it has one: a fix that captured or swapped on a copy), runs the patched step, and restores both. No run sees
state another run left, and both workloads are left as they were. The comparison covers the outputs and every
slot the original step writes, by what the step wrote into it (after minus before: the cache slot written, the
weights' update, the new BatchNorm statistics, the gradient), so a skipped cache write or optimizer update is
seen however small the update is against the weights. State the original writes that the patched workload
lacks, or state only the patched step writes, fails the guard by name. Every run starts from the same seed
(each trial its own), so a step with dropout or sampling draws the same numbers in both; the original runs
twice on the first trial, and its own run-to-run scatter raises the bound to twice that (stated), or, above
``MAX_RUN_NOISE``, fails the guard: such a step cannot be judged. Unless the scatter is in a few state writes
only (at most ``MAX_SCATTERED_SHARE`` of the compared tensors) and every output agrees: those are left out of
the judgement, by name (a key bias's gradient: rounding noise that a nondeterministic kernel sums in another
order each run).
The float32 reference copies the model and the inputs together (a cache object in the inputs becomes the
copy's own, upcast), and runs after the original and the patched trials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from typing import Any

from gpuadvisor.fixes.base import NumericsPolicy

# Fixed bounds on relative L2 per output dtype (DESIGN.md, "Fixes"): bf16 keeps 8 mantissa bits (unit
# roundoff 2^-8 = 3.9e-3), fp16 11 (4.9e-4); 1e-2 leaves room for a few roundings. fp32: 1e-4.
FIXED_REL_L2 = {"bfloat16": 1e-2, "float16": 1e-2, "float32": 1e-4, "float64": 1e-4}
# A whole-model fix may be up to this many times as far from the fp32 reference as the original is.
REFERENCE_FACTOR = 2.0
# ... and a float32 step on a GPU that runs its float32 convolutions and matmuls in TF32 (cuDNN's default,
# torch.backends.cudnn.allow_tf32) this many times: a fix that makes cuDNN pick other algorithms (channels_last,
# torch.compile) lands at another TF32 error, not at the original's. Measured on the H200 (transformers ResNet-50
# training step, SGD momentum): a BatchNorm weight after the update 1.28e-2 from float64 under channels_last, the
# original 3.67e-3 (3.5x); timm's ResNet-50 3.11e-2 vs 2.72e-2 (1.1x). A wrong fix that scales a weight is caught
# by the systematic-scale check, which keeps REFERENCE_FACTOR.
TF32_REFERENCE_FACTOR = 4.0
# ... and with a floor of TF32's own rounding, which has fp16's 10-bit mantissa (FIXED_REL_L2["float16"]): where
# the original's float32 result came from a full-precision algorithm, a fix that lets cuDNN pick a TF32 one for the
# same layer lands 1e3 times further from float64 than the original (H200, transformers ResNet-50 training step
# under channels_last: a shortcut BatchNorm's running variance 9.28e-4 against the original's 6.26e-7), as the
# user's own torch.backends.cudnn.allow_tf32 permits.
TF32_FIXED_REL_L2 = 1e-2
# A tensor the original computes this far from the float32 reference (relative L2) is rounding noise in 16 bits:
# BERT's key-bias gradients under bf16 autocast (float32: ~1e-8, as softmax ignores a constant shift) came out
# at 5e2 relative to it on the CPU; such tensors are left out of the per-tensor bounds and the scale check.
NOISE_DOMINATED_REL_L2 = 0.1
# fp8 e4m3 has 3 mantissa bits: per-tensor-scaled GEMMs land near 30 dB; 25 dB leaves margin (DESIGN.md).
FP8_MIN_SQNR_DB = 25.0
# "bf16" policy: the patched (autocast) run's rel-L2 to the original may be this many times the rel-L2 of the
# original run with bf16 rounding emulated where autocast rounds (``bf16_rounding``). Measured on the CPU (torch
# 2.13, examples/real small sizes, 2 trials), autocast's logits over the emulation's: ViT 1.1 (4.3e-3 vs 3.7e-3),
# BERT 1.0, GPT-2 1.05; autocast also accumulates in another order, and a training step's gradients vary more
# (ResNet, see the tests). A head weight scaled by 1.05 lands 4.5x (BERT) to 14x (ViT) above the emulation, the
# output scaled by 1.1 9x and more (and the scale check catches both). The multiple applies to the farther of
# the two emulations (``bf16_rounding``, ``bf16_storage``), tensor by tensor; on those models they agree.
BF16_NOISE_FACTOR = 3.0
# A tensor that the emulated rounding leaves (nearly) unmoved (its ops are all float32 ones under autocast too)
# may still see a bf16 input somewhere: bf16's unit roundoff 2^-8 = 3.9e-3 is the least a bf16 run may differ by.
BF16_FLOOR = 2.0**-8
# "tf32" policy: a multiple of the emulation's rel-L2 (``tf32_rounding``), and a floor of TF32's unit roundoff
# 2^-11 (10 mantissa bits, as fp16's). cuBLAS and cuDNN round TF32 operands to nearest as the emulation does
# (H100: benchmarks/results/tf32_h100/tf32_rounding.json), so the order of the sums and which elements the
# rounding happens to move differ from it. Measured on the H100 (torch 2.11), patched over emulated rel-L2: ViT
# logits 0.95 (batch 1). bf16 autocast lands 5.8x the TF32 emulation on the small ViT (CPU), outside the bound.
TF32_NOISE_FACTOR = 3.0
# ... and for what the step writes into its state, at least TF32's fixed bound of the "model" policy
# (``TF32_FIXED_REL_L2``, what a float32 fix on a TF32 GPU may already move a state write by). Why: the
# hardware's TF32 error is not the emulation's where a sum cancels (the tensor cores accumulate in their own
# order and rounding: -2.7e-5 bias on a 4096-long dot product against the emulation's 1e-7). On convnext-tiny's
# AdamW training step (H100) a LayerNorm weight's update moved 3.17x, 2.73x and 6.4x the emulation's rel-L2 in
# three runs (3.8e-3 at most), while the logits and loss stay at the emulation's. A skipped update (rel-L2 1)
# or a 1.1x one still fail; the outputs keep the emulation's bound.
TF32_STATE_FLOOR = TF32_FIXED_REL_L2
TF32_FLOOR = 2.0**-11
# Policies judged against an emulation of their own rounding, tensor by tensor: policy -> (factor, floor, words).
EMULATED = {
    "bf16": (BF16_NOISE_FACTOR, BF16_FLOOR, "bf16"),
    "tf32": (TF32_NOISE_FACTOR, TF32_FLOOR, "TF32"),
}
LOW_PRECISION = ("bfloat16", "float16")


@dataclasses.dataclass
class NumericsResult:
    """The guard's verdict and the numbers behind it."""

    passed: bool
    policy: str
    # "rel_l2_vs_fp32_reference" | "rel_l2_vs_original" | "rel_l2_vs_bf16_rounding" | "rel_l2_vs_tf32_rounding"
    # | "sqnr_db" | "" (nothing compared)
    metric: str
    value: float | None  # the patched run's error (rel-L2) or SQNR (dB); the worst over outputs and trials
    bound: float | None  # rel-L2: at most this; SQNR: at least this
    # "model" with an fp32 reference: the original's own rel-L2 to it; "bf16": the rel-L2 of the original with bf16
    # storage emulated (the farther of bf16_rounding and bf16_storage), for the tensor that came nearest its bound;
    # "tf32": the same with tf32_rounding
    reference_error: float | None
    nan_inf_parity: bool
    detail: str  # one line: how it was judged, and why when it failed
    dtype: str | None  # the (first) floating output's dtype, e.g. "bfloat16"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line for a report: "rel-L2 3.1e-03 vs fp32 (original 2.9e-03, bound 1.0e-02)"."""
        if self.value is None:
            return self.detail
        if self.metric == "sqnr_db":
            return f"SQNR {self.value:.1f} dB (bound >= {self.bound:.0f} dB)"
        if self.metric in ("rel_l2_vs_bf16_rounding", "rel_l2_vs_tf32_rounding"):
            rounded = "bf16" if self.metric == "rel_l2_vs_bf16_rounding" else "TF32"
            return (
                f"rel-L2 {self.value:.2e} vs original ({rounded}-rounded original {self.reference_error:.2e},"
                f" bound {self.bound:.2e})"
            )
        if self.reference_error is not None:
            wide = "fp64" if self.metric == "rel_l2_vs_fp64_reference" else "fp32"
            return (
                f"rel-L2 {self.value:.2e} vs {wide} reference"
                f" (original {self.reference_error:.2e}, bound {self.bound:.2e})"
            )
        return f"rel-L2 {self.value:.2e} vs original (bound {self.bound:.2e})"


# ---------------------------------------------------------------------------------------------------------------
# Metrics on tensors


def relative_l2(test: Any, reference: Any) -> float:
    """||test - reference|| / ||reference|| in float64 on the tensors' device; 0/0 is 0, x/0 is inf."""
    test64, reference64 = test.detach().double(), reference.detach().double()
    noise = (test64 - reference64).norm().item()
    signal = reference64.norm().item()
    if signal == 0.0:
        return 0.0 if noise == 0.0 else math.inf
    return noise / signal


def sqnr_db(test: Any, reference: Any) -> float:
    """10 log10(sum(reference^2) / sum((test - reference)^2)) in float64; inf when they are equal."""
    test64, reference64 = test.detach().double(), reference.detach().double()
    noise = (test64 - reference64).pow(2).sum().item()
    signal = reference64.pow(2).sum().item()
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def nan_inf_parity(test: Any, reference: Any) -> bool:
    """True when ``test`` has NaN, +Inf and -Inf at exactly the positions where ``reference`` has them."""
    import torch

    return bool(
        torch.equal(torch.isnan(test), torch.isnan(reference))
        and torch.equal(torch.isposinf(test), torch.isposinf(reference))
        and torch.equal(torch.isneginf(test), torch.isneginf(reference))
    )


# ---------------------------------------------------------------------------------------------------------------
# Inputs and outputs


def fresh_inputs(example_inputs: Any, seed: int) -> Any:
    """Random inputs shaped like ``example_inputs`` (see the module docstring), the same for the same seed."""
    import torch

    from gpuadvisor.fixes.state import map_tensors

    generator = torch.Generator().manual_seed(seed)

    def make(value: Any) -> Any:  # one tensor: map_tensors walks the containers
        if value.dtype.is_floating_point or value.dtype.is_complex:
            fresh = torch.randn(value.shape, generator=generator, dtype=torch.float32)
            if value.numel() > 1:
                std = value.detach().double().std().item()
                if math.isfinite(std) and std > 0:
                    fresh = fresh * std
            return fresh.to(dtype=value.dtype, device=value.device)
        if value.dtype == torch.bool:
            return torch.randint(0, 2, value.shape, generator=generator).bool().to(value.device)
        high = max(int(value.max().item()) + 1 if value.numel() else 1, 1)
        if 1 < value.numel() <= high and value.unique().numel() == value.numel():
            # Distinct in the example (cache positions written with index_copy_, say): distinct here too,
            # where a repeat would make the step's result depend on write order.
            fresh = torch.randperm(high, generator=generator)[: value.numel()].reshape(value.shape)
        else:
            fresh = torch.randint(0, high, value.shape, generator=generator, dtype=torch.int64)
        return fresh.to(dtype=value.dtype, device=value.device)

    return map_tensors(make, example_inputs)


def flatten_outputs(output: Any, path: str = "output") -> list[tuple[str, Any]]:
    """(path, tensor) pairs of a step's output; Python numbers become 0-dim tensors, None and others are left out.

    Tensors are detached clones: a graphed step overwrites its output on the next replay, and a step may
    return a view of model state that the next step changes.
    """
    import torch

    if isinstance(output, torch.Tensor):
        return [(path, output.detach().clone())]
    if isinstance(output, bool):
        return [(path, torch.tensor(output))]
    if isinstance(output, (int, float)):
        return [(path, torch.tensor(output, dtype=torch.float64 if isinstance(output, float) else torch.int64))]
    if isinstance(output, dict):  # also transformers' ModelOutput (an OrderedDict)
        return [pair for key, value in output.items() for pair in flatten_outputs(value, f"{path}[{key!r}]")]
    if isinstance(output, (tuple, list)):
        return [pair for index, value in enumerate(output) for pair in flatten_outputs(value, f"{path}[{index}]")]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [
            pair
            for item in dataclasses.fields(output)
            for pair in flatten_outputs(getattr(output, item.name), f"{path}.{item.name}")
        ]
    return []


# ---------------------------------------------------------------------------------------------------------------
# The guard


@dataclasses.dataclass
class _Run:
    """What one step wrote: its outputs and, per written state slot, the slot after the step (a clone)."""

    outputs: list[tuple[str, Any]]
    state_after: dict[str, Any]


def check_numerics(
    original: Any, patched: Any, policy: NumericsPolicy, *, trials: int = 2, seed: int = 0
) -> NumericsResult:
    """Compare ``patched`` with ``original`` (both :class:`gpuadvisor.workload.Workload`) under ``policy``.

    Each trial starts both from the same state S (see "Stateful steps" in the module docstring); the state
    of both workloads is as it was when the guard returns. Raises :class:`gpuadvisor.errors.UserCodeError`
    when a step raises on the fresh inputs.
    """
    import torch

    from gpuadvisor.fixes.safety import model_device
    from gpuadvisor.fixes.state import collect_state, describe_paths, same_slot, workload_roots
    from gpuadvisor.workload import make_step_fn

    if policy not in ("model", "fp8", "bf16", "tf32"):
        raise ValueError(f"unknown numerics policy {policy!r} (expected 'model', 'fp8', 'bf16' or 'tf32')")
    trial_inputs = [fresh_inputs(original.inputs, seed + trial) for trial in range(trials)]
    device = model_device(original.model, original.inputs)
    on_cuda = device is not None and device.startswith("cuda")
    cuda_devices = [torch.cuda.current_device()] if on_cuda else []

    original_state = collect_state(workload_roots(original))
    patched_state = collect_state(workload_roots(patched))
    original_ids = {id(slot.get()) for slot in original_state if slot.kind in ("tensor", "item")}
    own_patched = [
        slot.path
        for slot in patched_state
        if not (slot.kind in ("tensor", "item") and id(slot.get()) in original_ids)
        and not (slot.path in original_state and same_slot(original_state[slot.path], slot))
    ]
    start = original_state.snapshot()
    patched_start = patched_state.snapshot(own_patched)
    written: dict[str, None] = {}  # slots the original step writes, in the order first seen
    notes: list[str] = []
    runs_original: list[_Run] = []
    runs_patched: list[_Run] = []
    missing: list[str] = []
    extra_writes: list[str] = []
    noise: tuple[float, str] | None = None
    scattered: dict[str, float] = {}  # state tensors left out: the original's own runs scatter there (_split_noise)
    moved: tuple[str, float] | None = None
    draws_random = False

    drew: list[bool] = []

    def run(workload: Any, inputs: Any, trial: int, label: str) -> Any:
        torch.manual_seed(seed * 1_000 + trial)
        rng_before = _rng_states(on_cuda)
        outputs = flatten_outputs(make_step_fn(workload.step, workload.model, inputs, label)())
        drew.append(_rng_states(on_cuda) != rng_before)
        return outputs

    autocast_dtypes: list[Any] = []
    with torch.random.fork_rng(devices=cuda_devices):
        try:
            for trial, inputs in enumerate(trial_inputs):
                original_state.restore(start, list(written))
                if trial == 0:
                    with autocast_watch() as autocast_dtypes:
                        outputs = run(original, inputs, trial, original.path)
                else:
                    outputs = run(original, inputs, trial, original.path)
                draws_random = draws_random or drew[-1]
                written.update(dict.fromkeys(original_state.changed(start)))
                paths = list(written)
                runs_original.append(_Run(outputs, original_state.snapshot(paths).values))
                if trial == 0:
                    # The same step again from the same state, inputs and seed: how far apart two runs of the
                    # original itself land (non-deterministic kernels, randomness the seed does not reach).
                    original_state.restore(start, paths)
                    again = _Run(run(original, inputs, trial, original.path), original_state.snapshot(paths).values)
                    noise, scattered = _split_noise(_run_noise(runs_original[0], again, start))
                original_state.restore(start, paths)

                if trial == 0:
                    moved = _start_differs(patched_state, patched_start, start, paths)
                    if moved:
                        break
                missing = patched_state.load_from(original_state, start, paths)
                if missing:
                    break
                outputs = run(patched, inputs, trial, patched.path)
                runs_patched.append(_Run(outputs, patched_state.snapshot(paths).values))
                # What the patched step wrote beyond what the original writes: its own slots against its own
                # start, the slots it shares with the original against S.
                extra = [*patched_state.changed(patched_start), *original_state.changed(start)]
                extra_writes = list(dict.fromkeys(path for path in extra if path not in written))
                patched_state.restore(patched_start)
                original_state.restore(start, paths)
                if extra_writes:
                    break
        finally:
            # Everything back, not only what the original writes: a patched step that wrote more (the failure
            # reported below) may have written into state the two share.
            original_state.restore(start)
            patched_state.restore(patched_start)

        if moved:
            return _verdict_without_numbers(
                policy,
                f"the patched workload does not start from the original's state: {moved[0]} differs by rel-L2"
                f" {moved[1]:.2e} before any step (a fix must not change state the step writes)",
            )
        if missing:
            return _verdict_without_numbers(
                policy,
                f"the patched workload has no counterpart (same name, shape and dtype) for state the step writes:"
                f" {describe_paths(missing)}",
            )
        if extra_writes:
            return _verdict_without_numbers(
                policy,
                f"the patched step writes state the original step leaves unchanged: {describe_paths(extra_writes)}",
            )

        dtype = next(
            (t.dtype for run_ in runs_original for _, t in run_.outputs if t.dtype.is_floating_point),
            next(
                (
                    t.dtype
                    for run_ in runs_original
                    for t in run_.state_after.values()
                    if t is not None and t.dtype.is_floating_point
                ),
                None,
            ),
        )
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None
        low = [d for d in autocast_dtypes if str(d).removeprefix("torch.") in LOW_PRECISION]
        if low and dtype_name not in LOW_PRECISION:
            # A float32 model whose step runs under torch.autocast computes its matmuls in 16 bits: its own
            # output is that noisy, so it is judged as a 16-bit model, against a float32 run with autocast off.
            dtype_name = str(low[0]).removeprefix("torch.")
            notes.append(f"the step runs under torch.autocast({dtype_name}): judged as a {dtype_name} step")

        runs_reference = None
        runs_storage = None  # "bf16": the original with bf16 storage where autocast stores bf16 (bf16_storage)
        wide_reference = False
        fixed_verdict: NumericsResult | None = None  # fp32: the fixed-bound verdict an fp64 reference may overturn
        if policy == "model" and dtype_name in LOW_PRECISION:
            if any(path.startswith("step") for path in original_state.slots):
                notes.append(
                    "no fp32 reference: the step uses state outside its model and inputs (a module-level"
                    " optimizer), which a copy would not have; fixed bound used"
                )
            elif not _fits_fp32_copy(original.model, original_state.nbytes()):
                notes.append("no fp32 reference: not enough free memory for a float32 copy; fixed bound used")
            else:
                try:
                    with autocast_watch(disable=True):  # the reference computes in float32 throughout
                        runs_reference = _reference_runs(original, trial_inputs, list(written), seed, run)
                except Exception as error:  # the model may not run in fp32 (a hard-coded dtype): say so, go on
                    from gpuadvisor.workload import describe_error

                    notes.append(
                        f"no fp32 reference: the float32 copy raised {describe_error(error)}; fixed bound used"
                    )
                    runs_reference = None
                finally:
                    _release(on_cuda)
        elif policy == "bf16":
            runs_reference = _emulated_runs(original, original_state, start, trial_inputs, list(written), run)
            runs_storage = _emulated_runs(
                original, original_state, start, trial_inputs, list(written), run, mode=bf16_storage
            )
        elif policy == "tf32":
            runs_reference = _emulated_runs(
                original, original_state, start, trial_inputs, list(written), run, mode=tf32_rounding
            )
        elif (
            policy == "model"
            and dtype_name == "float32"
            and not any(p.startswith("step") for p in original_state.slots)
        ):
            plain = [_entries(a, b, None, start) for a, b in zip(runs_original, runs_patched)]
            first = _judge(policy, plain, False, dtype_name, noise, scattered=scattered)
            if first.value is not None and first.bound is not None and first.value > first.bound:
                fixed_verdict = first
                if _fits_fp32_copy(original.model, 2 * original_state.nbytes()):
                    try:
                        runs_reference = _reference_runs(
                            original, trial_inputs, list(written), seed, run, wide=torch.float64
                        )
                        wide_reference = True
                    except Exception as error:  # a hard-coded dtype: keep the fixed bound, say so
                        from gpuadvisor.workload import describe_error

                        notes.append(f"no fp64 reference: the float64 copy raised {describe_error(error)}")
                    finally:
                        _release(on_cuda)

    entries = [
        _entries(run_original, run_patched, run_reference, start, run_storage)
        for run_original, run_patched, run_reference, run_storage in zip(
            runs_original,
            runs_patched,
            runs_reference or [None] * len(runs_original),
            runs_storage or [None] * len(runs_original),
        )
    ]
    result = _judge(
        policy,
        entries,
        runs_reference is not None and policy == "model",
        dtype_name,
        noise,
        wide_reference,
        TF32_REFERENCE_FACTOR if wide_reference and on_cuda and _tf32_enabled() else REFERENCE_FACTOR,
        TF32_FIXED_REL_L2 if wide_reference and on_cuda and _tf32_enabled() and dtype_name == "float32" else None,
        scattered=scattered,
    )
    if wide_reference and not result.passed and fixed_verdict is not None:
        # The fp64 reference only ever rescues a correct reordering; a fix it does not rescue fails. Its judgement
        # leads the line: it weighs each tensor against its own rounding noise, where the fixed bound's worst
        # tensor may be rounding noise alone (a bias before BatchNorm: rel-L2 in the thousands between two
        # float32 runs) and say nothing of the fix. The fixed bound's judgement follows it.
        result = dataclasses.replace(result, detail=f"{result.detail}; with the fixed bound: {fixed_verdict.detail}")
    if written:
        notes.append(f"compared the state the step writes too ({describe_paths(list(written))})")
    if draws_random:
        notes.append("the step draws random numbers: each run started from the same seed")
    if notes:
        result.detail = f"{result.detail}; {'; '.join(notes)}"
    return result


def _tf32_enabled() -> bool:
    """Whether float32 convolutions or matmuls on the GPU may run in TF32 (cuDNN's default is yes)."""
    import torch

    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


@contextlib.contextmanager
def autocast_watch(disable: bool = False):
    """Within the block, record the dtype of every ``torch.autocast`` region the code enters enabled (the list
    it yields), and with ``disable`` turn each such region off (the code then runs in its tensors' dtypes)."""
    from torch.amp.autocast_mode import autocast

    entered: list[Any] = []
    enter = autocast.__enter__

    def watched_enter(self):
        if getattr(self, "_enabled", False):
            entered.append(self.fast_dtype)
            if disable:
                self._enabled = False
        return enter(self)

    autocast.__enter__ = watched_enter
    try:
        yield entered
    finally:
        autocast.__enter__ = enter


def _start_differs(patched_state: Any, patched_start: Any, start: Any, paths: list[str]) -> tuple[str, float] | None:
    """The first weight or optimizer state the original step writes (a training step's) whose value in the
    patched workload's own copy differs from the original's before any step.

    Buffers are left out: a fix may run the step once on its copy to record what the modules get (fusion
    does), which writes a cache; S is loaded into them before each trial anyway. Gradients are left out too:
    a step overwrites them, and a captured graph's are unset."""
    import torch

    for path in paths:
        if path not in patched_start:
            continue
        slot = patched_state[path]
        if slot.kind == "grad" or (slot.kind in ("tensor", "item") and not isinstance(slot.get(), torch.nn.Parameter)):
            continue
        mine, theirs = patched_start[path], start[path]
        if mine is None or theirs is None or mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            continue
        theirs = theirs.to(mine.device)
        if not mine.dtype.is_floating_point:
            if not bool((mine == theirs).all()):
                return path, 1.0
            continue
        value = relative_l2(mine, theirs)
        if value > 0:
            return path, value
    return None


def _rng_states(on_cuda: bool) -> tuple:
    import torch

    states = [torch.get_rng_state()]
    if on_cuda:
        states.append(torch.cuda.get_rng_state())
    return tuple(bytes(state.numpy().tobytes()) for state in states)


def _run_noise(first: _Run, second: _Run, start: Any) -> dict[str, float]:
    """The rel-L2 between two runs of the original from the same state, per output and state write that differs
    (``inf`` for an integer output that differs at all); the compared paths that agree exactly map to 0."""
    import torch

    from gpuadvisor.fixes.state import delta

    scatter: dict[str, float] = {}
    pairs = [(path, a, b) for (path, a), (_, b) in zip(first.outputs, second.outputs)]
    pairs += [
        (f"state {path}", delta(first.state_after[path], start[path]), delta(second.state_after[path], start[path]))
        for path in first.state_after
    ]
    for path, a, b in pairs:
        if a is None or b is None or a.shape != b.shape:
            continue
        if not a.dtype.is_floating_point:  # sampled token ids: any difference is all the difference
            scatter[path] = 0.0 if torch.equal(a, b.to(a.dtype)) else math.inf
            continue
        finite = torch.isfinite(a) & torch.isfinite(b)
        scatter[path] = relative_l2(b[finite], a[finite])
    return scatter


def _split_noise(scatter: dict[str, float]) -> tuple[tuple[float, str] | None, dict[str, float]]:
    """The original's run-to-run scatter (``_run_noise``) as (the worst among the tensors judged, None when they
    agree exactly; the state tensors left out of the judgement with their scatter). A few state tensors may scatter
    by more than ``MAX_RUN_NOISE`` while every output agrees: a gradient that is rounding noise (a key bias under
    softmax, zero in exact arithmetic), summed in another order each run by a nondeterministic kernel, and the
    optimizer moments built on it. They are left out when they are at most ``MAX_SCATTERED_SHARE`` of the
    compared tensors; else, or when an output scatters, the worst of all is returned and the step is judged not
    deterministic."""
    over = {path: value for path, value in scatter.items() if value > MAX_RUN_NOISE}
    leave_out = (
        bool(over)
        and all(path.startswith("state ") for path in over)
        and len(over) <= MAX_SCATTERED_SHARE * len(scatter)
    )
    kept = {path: value for path, value in scatter.items() if not (leave_out and path in over)}
    worst = max(kept.items(), key=lambda item: item[1], default=None)
    noise = (worst[1], worst[0]) if worst is not None and worst[1] > 0 else None
    return noise, (over if leave_out else {})


def _entries(
    original: _Run, patched: _Run, reference: _Run | None, start: Any, storage: _Run | None = None
) -> dict[str, Any]:
    """The compared pairs of one trial: outputs, then each written slot's change (after - before); with
    ``storage`` (the "bf16" policy's second emulation, ``bf16_storage``) its outputs and changes by path too."""
    from gpuadvisor.fixes.state import delta

    def state_entries(run_: _Run | None, origin: Any) -> list[tuple[str, Any]] | None:
        if run_ is None:
            return None
        return [(f"state {path}", delta(value, origin[path])) for path, value in run_.state_after.items()]

    entries = {
        "outputs": (original.outputs, patched.outputs, reference.outputs if reference else None),
        "state": (
            state_entries(original, start),
            state_entries(patched, start),
            state_entries(reference, reference.start if reference else None),
        ),
    }
    if storage is not None:
        entries["storage"] = dict([*storage.outputs, *state_entries(storage, storage.start)])
    return entries


@dataclasses.dataclass
class _ReferenceRun(_Run):
    start: Any = None  # the reference's state before its step (its own upcast copy of S)


def _reference_runs(
    original: Any, trial_inputs: list, written: list[str], seed: int, run: Any, wide: Any = None
) -> list[_Run]:
    """The steps of a float32 copy of the original (model and inputs copied together, so a cache object in the
    inputs is the copy's own) on the same trials, each from the copy's S; ``wide=torch.float64``: a float64
    copy (of a float32 original)."""
    import copy

    from gpuadvisor.fixes.copying import deepcopy_state
    from gpuadvisor.fixes.state import collect_state

    memo = _float32_memo(original.model, original.inputs, wide=wide)
    model, inputs = deepcopy_state((original.model, original.inputs), memo)
    reference = dataclasses.replace(original, model=model, inputs=inputs)
    state = collect_state({"model": model, "inputs": inputs})
    start = state.snapshot(written)
    runs: list[_Run] = []
    try:
        for trial, fresh in enumerate(trial_inputs):
            state.restore(start)
            upcast = copy.deepcopy(fresh, {**memo, **_float32_memo(None, fresh, only_new=memo, wide=wide)})
            outputs = run(reference, upcast, trial, "fp64 copy" if wide is not None else "fp32 copy")
            runs.append(_ReferenceRun(outputs, state.snapshot(written).values, start))
    finally:
        del model, inputs, reference, state
    return runs


def _emulated_runs(
    original: Any, state: Any, start: Any, trial_inputs: list, written: list[str], run: Any, mode: Any = None
) -> list[_Run]:
    """The original's steps on the same trials, each from S, under an emulation of lower precision computed in
    float32: ``bf16_rounding`` (the default: the floating inputs, and the operands and results of every op
    autocast lowers to bf16, rounded to bf16 and back), ``bf16_storage`` (also every tensor autocast stores in
    bf16 downstream of those) or ``tf32_rounding`` (the matmuls' operands rounded to TF32, the inputs as they
    are: TF32 rounds nothing else)."""
    mode = mode or bf16_rounding
    tf32 = mode is tf32_rounding
    label = "TF32-rounded original" if tf32 else "bf16-rounded original"
    runs: list[_Run] = []
    try:
        for trial, fresh in enumerate(trial_inputs):
            state.restore(start)
            with _eager(), mode():
                outputs = run(original, fresh if tf32 else _round_to_bf16(fresh), trial, label)
            runs.append(_ReferenceRun(outputs, state.snapshot(written).values, start.values))
    finally:
        state.restore(start)
    return runs


def _eager() -> Any:
    """A context in which torch.compile'd code runs eagerly (``torch.compiler.set_stance("force_eager")``), for
    the emulated runs: dynamo cannot run a compiled module under their TorchFunctionMode (torch 2.13 raised
    ``NameError: name '___get_torch_function_mode_stack_at' is not defined`` for a model the user had compiled),
    and the emulation is of the same computation eagerly. A no-op where torch has no stances."""
    import contextlib

    import torch

    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _lowered_ops() -> set:
    """The functions bf16 autocast runs in bf16 on float32 tensors: matmuls, linear layers, convolutions, attention."""
    import torch
    from torch.nn import functional

    return {
        functional.linear,
        functional.bilinear,
        functional.conv1d,
        functional.conv2d,
        functional.conv3d,
        functional.conv_transpose1d,
        functional.conv_transpose2d,
        functional.conv_transpose3d,
        functional.scaled_dot_product_attention,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.addbmm,
        torch.baddbmm,
        torch.addmv,
        torch.mv,
        torch.einsum,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.Tensor.__rmatmul__,
        torch.Tensor.mm,
        torch.Tensor.bmm,
        torch.Tensor.addmm,
        torch.Tensor.baddbmm,
    }


def _rounded(value: Any) -> Any:
    """A float32 tensor (or the float32 tensors of a list or tuple) rounded to bf16 and back, differentiably."""
    import torch

    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return value.to(torch.bfloat16).to(torch.float32)
    if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
        return type(value)(_rounded(item) for item in value)
    return value


def bf16_rounding() -> Any:
    """A ``TorchFunctionMode`` in which the ops bf16 autocast runs in bf16 (matmuls, linear layers, convolutions,
    attention) get their float32 tensor arguments rounded to bf16 and back, and their results too: the step still
    computes in float32, with bf16's storage error where autocast has it. The rounding is a cast, so backward
    rounds the gradients flowing through those ops the same way. Rounding only the weights and the inputs (the
    first version) missed the activations: on the small ResNet training step of examples/real, autocast moved a
    BatchNorm weight's update by rel-L2 2.4 (batch 2 at a 1 x 1 feature map: the normalisation cancels), the
    weights-and-inputs run by 9e-3; this run moves it as far as autocast does. It still misses what autocast
    stores in bf16 after those ops (``bf16_storage``)."""
    from torch.overrides import TorchFunctionMode

    lowered = _lowered_ops()

    class Bf16Rounding(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in lowered:
                return func(*args, **kwargs)
            result = func(*[_rounded(item) for item in args], **{key: _rounded(v) for key, v in kwargs.items()})
            return _rounded(result)

    return Bf16Rounding()


def round_to_tf32(tensor: Any) -> Any:
    """A float32 tensor rounded to TF32 (10 mantissa bits, to nearest, ties to even) and back to float32; NaN and
    Inf as they are. Not differentiable (``tf32_rounding`` wraps it)."""
    import torch

    bits = tensor.detach().contiguous().view(torch.int32)
    # Add half of the dropped 13 bits' range (less one, plus the kept last bit: ties to even), then drop them.
    rounded = ((bits + (0x0FFF + ((bits >> 13) & 1))) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(tensor), rounded, tensor.detach())


def _tf32_autograd() -> tuple[Any, Any]:
    """Two autograd Functions for ``tf32_rounding``: one rounds forward and passes gradients, one passes forward
    and rounds gradients."""
    import torch

    class OperandToTf32(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor):
            return round_to_tf32(tensor)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class GradientToTf32(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor):
            return tensor.view_as(tensor)

        @staticmethod
        def backward(ctx, grad):
            return round_to_tf32(grad) if grad is not None and grad.dtype == torch.float32 else grad

    return OperandToTf32, GradientToTf32


def tf32_rounding() -> Any:
    """A ``TorchFunctionMode`` in which the ops bf16 autocast lowers (matmuls, linear layers, convolutions,
    attention; TF32 covers the same ones) get their float32 tensor arguments rounded to TF32 and back, and the
    gradient flowing into their result rounded the same way in backward, so that the backward matmuls multiply
    TF32 operands too. Results stay float32: TF32 accumulates and returns float32."""
    import torch
    from torch.overrides import TorchFunctionMode

    lowered = _lowered_ops()
    operand, gradient = _tf32_autograd()

    def rounded(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return operand.apply(value)
        if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
            return type(value)(rounded(item) for item in value)
        return value

    def into(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.requires_grad:
            return gradient.apply(value)
        return value

    class Tf32Rounding(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in lowered:
                return func(*args, **kwargs)
            result = func(*[rounded(item) for item in args], **{key: rounded(v) for key, v in kwargs.items()})
            if isinstance(result, (list, tuple)):
                return type(result)(into(item) for item in result)
            return into(result)

    return Tf32Rounding()


# Autocast's float32 lists (torch.amp docs, "Ops that can autocast to float32"), by function name: on a bf16 input
# these compute and return float32, so bf16_storage rounds neither their result nor what flows from it.
AUTOCAST_FP32_CUDA = frozenset(
    "__pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits cosh cosine_embedding_loss"
    " cdist cosine_similarity cross_entropy cumprod cumsum dist erfinv exp expm1 group_norm hinge_embedding_loss"
    " kl_div l1_loss layer_norm log log_softmax log10 log1p log2 margin_ranking_loss mse_loss multilabel_margin_loss"
    " multi_margin_loss nll_loss norm normalize pdist poisson_nll_loss pow prod reciprocal rsqrt sinh smooth_l1_loss"
    " soft_margin_loss softmax softmin softplus sum renorm tan triplet_margin_loss".split()
)
AUTOCAST_FP32_CPU = frozenset(
    "avg_pool3d binary_cross_entropy grid_sample polar prod quantile nanquantile stft cdist trace view_as_complex"
    " cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d max_unpool2d"
    " max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d"
    " replication_pad3d mse_loss cosine_embedding_loss nll_loss hinge_embedding_loss poisson_nll_loss smooth_l1_loss"
    " cross_entropy l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss"
    " ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits".split()
)
# Normalisations take a bf16 input beside float32 weights and return the input's dtype (no type promotion).
_INPUT_DTYPE_OPS = frozenset({"batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm"})
_CASTS = frozenset({"to", "float", "double", "type"})


def bf16_storage() -> Any:
    """``bf16_rounding``, and bf16 storage wherever autocast stores bf16 downstream of the lowered ops: a
    ``TorchFunctionMode`` that follows autocast's dtype rules through the step. The results of the lowered ops are
    bf16 (rounded, as in ``bf16_rounding``); any other op whose floating tensor arguments include such a result
    returns bf16 too (its result is rounded to bf16 and back, and is itself bf16 for the ops after it), unless
    autocast runs it in float32 (``AUTOCAST_FP32_CUDA``/``_CPU``: softmax, losses, ... on the device), an explicit
    ``dtype=`` or cast asks for float32, or a float32 tensor argument with dimensions promotes it to float32
    (a bf16 activation plus a float32 residual is float32 under autocast). Normalisations return their input's dtype
    whatever their weights' (``_INPUT_DTYPE_OPS``). Views keep their base's dtype; in-place ops keep their target's.
    Casts are differentiable, so backward rounds the gradients of those tensors as autocast stores them.

    Why: a tensor that sums or cancels many bf16-stored terms (BatchNorm over a few values, a bias gradient summed
    over the batch, a momentum update) has a bf16 error relative to the terms' magnitude, not to its own; when the
    terms are BatchNorm, pointwise or residual outputs, ``bf16_rounding`` never rounds them and reports a noise
    autocast cannot meet. On the CPU (torch 2.13, examples/real small sizes, 2 trials) autocast's rel-L2 over this
    run's was 1.00 (0.99 to 1.01 over 196 tensors) on the ResNet training step, where its rel-L2 over
    ``bf16_rounding``'s reached 12 (a momentum buffer behind BatchNorm over 2 values); 1.00 on BERT and GPT-2, 0.89
    to 1.15 on ViT, where the two emulations agree (every activation there enters a matmul, which rounds it
    anyway)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils.weak import WeakIdKeyDictionary

    lowered = _lowered_ops()
    bf16 = WeakIdKeyDictionary()  # the float32 tensors that are bf16 under autocast (ids, weakly held)

    def tensors(value: Any):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from tensors(item)
        elif isinstance(value, dict):
            for item in value.values():
                yield from tensors(item)

    def storage(tensor: Any) -> int | None:
        try:
            return tensor.untyped_storage().data_ptr()
        except Exception:  # a tensor without storage (a functional or sparse one): no views to follow
            return None

    class Bf16Storage(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in lowered:
                result = _rounded(func(*[_rounded(a) for a in args], **{k: _rounded(v) for k, v in kwargs.items()}))
                for tensor in tensors(result):
                    bf16[tensor] = True
                return result
            inputs = [t for t in tensors((args, kwargs)) if t.dtype.is_floating_point]
            result = func(*args, **kwargs)
            low = [t for t in inputs if t in bf16]
            if not low:
                return result
            name = getattr(func, "__name__", "") or ""
            in_place = (name.endswith("_") and not name.startswith("__")) or name.startswith("__i") or "out" in kwargs
            outputs = [t for t in tensors(result) if t.dtype == torch.float32]
            if in_place or not outputs:
                return result  # an in-place op keeps its target's dtype
            dtype = kwargs.get("dtype")
            if name in _CASTS or (dtype is not None and dtype != torch.bfloat16):
                # Explicitly float32: the same values, no longer bf16 (a fresh alias when the cast returned its input).
                if isinstance(result, torch.Tensor) and any(result is t for t in inputs):
                    return result.view_as(result)
                return result
            if name in (AUTOCAST_FP32_CUDA if low[0].device.type == "cuda" else AUTOCAST_FP32_CPU):
                return result
            if name in _INPUT_DTYPE_OPS:
                first = next(tensors(args[:1]), None)
                if first is None or first not in bf16:
                    return result
            elif any(t not in bf16 and t.dtype == torch.float32 and t.dim() > 0 for t in inputs):
                return result  # type promotion: a float32 tensor with dimensions makes the result float32
            if any(out is t for out in outputs for t in inputs):
                return result
            bases: dict[int, bool] = {}
            for tensor in inputs:
                pointer = storage(tensor)
                if pointer is not None:
                    bases[pointer] = bases.get(pointer, False) or tensor in bf16

            def stored(value: Any) -> Any:
                if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
                    return value
                pointer = storage(value)
                if pointer in bases:  # a view: its base's dtype
                    if bases[pointer]:
                        bf16[value] = True
                    return value
                value = _rounded(value)
                bf16[value] = True
                return value

            if isinstance(result, torch.Tensor):
                return stored(result)
            if type(result) in (tuple, list):
                return type(result)(stored(item) for item in result)
            return result

    return Bf16Storage()


def _round_to_bf16(value: Any) -> Any:
    """``value`` with every float32/float64 tensor in it (in tuples, namedtuples, lists, dicts) rounded to bf16 and
    back; other tensors and objects are passed as they are (a cache object stays the one the state walk saw)."""
    import torch

    from gpuadvisor.fixes.state import map_tensors

    def rounded(tensor: Any) -> Any:
        if tensor.dtype in (torch.float32, torch.float64):
            return tensor.detach().to(torch.bfloat16).to(tensor.dtype)
        return tensor

    return map_tensors(rounded, value)


def _float32_memo(model: Any, inputs: Any, only_new: dict | None = None, wide: Any = None) -> dict[int, Any]:
    """A deepcopy memo that maps every tensor reachable from (model, inputs) to a detached clone, low-precision
    floating ones upcast to float32: the copy never deep-copies a tensor itself (one with autograd history
    cannot be), and parameters stay parameters. An optimizer's state (Adam's moments, SGD's momentum) is upcast
    with the parameters it belongs to, its step counter is not: a float64 copy whose Adam moments stayed float32
    raised in ``lerp`` ("expected dtype float for `end` but got dtype double") and had no reference."""
    import torch

    from gpuadvisor.fixes.state import collect_state

    memo: dict[int, Any] = {}
    for slot in collect_state({"model": model, "inputs": inputs}):
        tensor = slot.get() if slot.kind in ("tensor", "item", "optimizer") else None
        if tensor is None or (only_new is not None and id(tensor) in only_new):
            continue
        clone = tensor.detach().clone()
        if slot.kind == "optimizer" and slot.key[1] == "step":
            memo[id(tensor)] = clone
            continue
        if clone.dtype in (torch.bfloat16, torch.float16):
            clone = clone.float()
        if wide is not None and clone.dtype == torch.float32:
            clone = clone.to(wide)
        if isinstance(tensor, torch.nn.Parameter):
            clone = torch.nn.Parameter(clone, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = clone
    return memo


def _fits_fp32_copy(model: Any, state_bytes: int) -> bool:
    """Whether a float32 copy of a low-precision state fits: free CUDA memory >= 2 x its bytes."""
    import torch

    from gpuadvisor.fixes.safety import model_device

    device = model_device(model)
    if device is None or not device.startswith("cuda"):
        return True
    free_bytes, _ = torch.cuda.mem_get_info(torch.device(device))
    return 2 * state_bytes <= free_bytes


def _release(on_cuda: bool) -> None:
    gc.collect()
    if on_cuda:
        import torch

        torch.cuda.empty_cache()


def _verdict_without_numbers(policy: str, detail: str) -> NumericsResult:
    return NumericsResult(False, policy, "", None, None, None, True, detail, None)


# A whole-model fix whose output is a uniform scale of the original's by more than this is wrong, however small
# its rel-L2 against the model's own precision noise: bf16 rounding is unbiased, so over >= 1,024 elements its
# projection onto the output is ~ rel-L2 / sqrt(n) (1.4e-2 / sqrt(32,000) = 8e-5 for a decode step's logits on
# the H200), while a weight scaled by 1.01 in the output head gives 1e-2, under the 2.8e-2 rel-L2 bound there.
# The bound is the larger of that and DRIFT_SIGMAS x the noise's own projection (rel-L2 / sqrt(n), n the nonzero
# elements): a KV-cache write of 512 elements under fused kernels drifted 2.2e-3 on the H200 with rel-L2 1.5e-2.
MAX_SCALE_DRIFT = 2e-3
DRIFT_SIGMAS = 6.0
MIN_DRIFT_ELEMENTS = 256
# A step whose two runs from the same state, inputs and seed differ by more than this cannot be judged:
# a fix's error would hide in the step's own scatter (dropout without a seed it honours, sampling from
# another generator, atomics on a reduction that changes every run).
MAX_RUN_NOISE = 1e-2
# Its outputs agreeing, a step whose scatter is confined to this share of its compared tensors, all state writes,
# is judged on the rest (_split_noise): DistilBERT's masked-LM training step (AdamW) on the H200 scattered by 0.39
# in one key-projection bias's Adam second moment in one guard check of the two that ran on it, and agreed in the
# other; judged as not deterministic, TF32 was rolled back in one candidate and kept in the other.
MAX_SCATTERED_SHARE = 0.1
# Bounds are raised to this many times the original's own run-to-run scatter when that is larger.
NOISE_FACTOR = 2.0


def _judge(
    policy: str,
    trials: list[dict[str, Any]],
    with_reference: bool,
    dtype_name: str | None,
    noise: tuple[float, str] | None,
    wide_reference: bool = False,
    reference_factor: float = REFERENCE_FACTOR,
    fixed_floor: float | None = None,
    scattered: dict[str, float] | None = None,
) -> NumericsResult:
    import torch

    scattered = scattered or {}

    fixed_bound = max(FIXED_REL_L2.get(dtype_name or "", 1e-4), fixed_floor or 0.0)
    metric = "sqnr_db" if policy == "fp8" else ("rel_l2_vs_fp32_reference" if with_reference else "rel_l2_vs_original")
    if policy in EMULATED:
        metric = f"rel_l2_vs_{policy}_rounding"
    elif wide_reference:
        metric = "rel_l2_vs_fp64_reference"
    copy_name = "an fp64 copy" if wide_reference else "an fp32 copy"

    def verdict(passed: bool, detail: str, value=None, bound=None, reference_error=None, parity=True) -> NumericsResult:
        return NumericsResult(passed, policy, metric, value, bound, reference_error, parity, detail, dtype_name)

    if noise is not None and noise[0] > MAX_RUN_NOISE:
        return verdict(
            False,
            f"the step is not deterministic: two runs of the original from the same state, inputs and seed differ"
            f" by rel-L2 {noise[0]:.2e} in {noise[1]}, so a fix cannot be judged; make the step repeatable"
            " (model.eval() to switch dropout off, a seeded torch.Generator for sampling)",
        )
    worst_value: float | None = None
    worst_path = ""
    worst_drift: tuple[float, str, float, bool] | None = None  # (drift, path, its bound, against the reference)
    reference_error: float | None = None
    # (value / bound, value, path, bound, the bf16_rounding run's rel-L2, the bf16_storage run's)
    worst_bf16: tuple[float, float, str, float, float, float] | None = None
    worst_reference: tuple[float, float, str, float, float] | None = None  # the same, against the fp32 reference
    noise_only: set[str] = set()  # tensors the original computes no closer to float32 than NOISE_DOMINATED_REL_L2
    floor = NOISE_FACTOR * noise[0] if noise is not None else 0.0
    compared = 0
    integer_output: tuple[str, str] | None = None  # the first integer output (token ids) found equal: path, dtype
    for trial in trials:
        original, patched, reference = trial["outputs"]
        if [path for path, _ in original] != [path for path, _ in patched]:
            return verdict(
                False, f"the outputs differ in structure: {[p for p, _ in original]} vs {[p for p, _ in patched]}"
            )
        state_original, state_patched, state_reference = trial["state"]
        original = [*original, *state_original]
        patched = [*patched, *state_patched]
        reference = dict([*reference, *state_reference]) if reference is not None else None
        for (path, expected), (_, actual) in zip(original, patched):
            if expected is None or actual is None or path in scattered:
                continue
            if expected.shape != actual.shape or expected.dtype.is_floating_point != actual.dtype.is_floating_point:
                return verdict(
                    False,
                    f"{path}: shape/dtype {tuple(actual.shape)} {actual.dtype} differs from the original's"
                    f" {tuple(expected.shape)} {expected.dtype}",
                )
            actual = actual.to(expected.device)
            if not expected.dtype.is_floating_point:
                if not torch.equal(expected, actual.to(expected.dtype)):
                    mismatched = int((expected != actual.to(expected.dtype)).sum().item())
                    return verdict(
                        False, f"{path} ({expected.dtype}) differs in {mismatched} of {expected.numel()} elements"
                    )
                integer_output = integer_output or (path, str(expected.dtype).removeprefix("torch."))
                continue
            if not nan_inf_parity(actual, expected):
                return verdict(
                    False,
                    f"NaN/Inf parity: {path} has NaN/Inf at {_count_nonfinite(actual)} positions,"
                    f" the original at {_count_nonfinite(expected)}, not the same ones",
                    parity=False,
                )
            finite = torch.isfinite(expected)
            ref_tensor = reference.get(path) if reference is not None else None
            own_drift = 0.0  # the tensor's own bias: the original against float32, or the bf16-rounded run against it
            rel_bound = 0.0  # the rel-L2 this tensor may be off by, where it is judged against its own noise
            against = expected
            if policy in EMULATED:
                # Judged against this tensor's own bf16 (TF32) noise: the rel-L2 of the bf16-rounded original's runs,
                # the larger of the two emulations (bf16_rounding, bf16_storage): a tensor that sums or cancels terms
                # stored in bf16 is as far off as its terms' rounding makes it, relative to the terms' magnitude.
                value = relative_l2(actual[finite], expected[finite])
                own = stored = 0.0
                if ref_tensor is not None and ref_tensor.shape == expected.shape:
                    ref_tensor = ref_tensor.to(expected.device)
                    both = finite & torch.isfinite(ref_tensor)
                    own = relative_l2(ref_tensor[both], expected[both])
                    if own:
                        own_drift = abs(scale_drift(ref_tensor[both], expected[both]))
                stored_tensor = (trial.get("storage") or {}).get(path)
                if stored_tensor is not None and stored_tensor.shape == expected.shape:
                    stored_tensor = stored_tensor.to(expected.device)
                    both = finite & torch.isfinite(stored_tensor)
                    stored = relative_l2(stored_tensor[both], expected[both])
                    if stored:
                        own_drift = max(own_drift, abs(scale_drift(stored_tensor[both], expected[both])))
                noise_level = max(own, stored)
                if noise_level >= NOISE_DOMINATED_REL_L2:
                    # bf16 storage alone moves it this far: the tensor is rounding noise in bf16 (a gradient that
                    # cancels to ~0, BatchNorm over 2 values), and a ratio of two noises says nothing.
                    noise_only.add(path)
                    continue
                factor, least, _ = EMULATED[policy]
                if policy == "tf32" and path.startswith("state "):
                    least = TF32_STATE_FLOOR
                allowed = rel_bound = max(factor * noise_level, least, floor)
                if worst_bf16 is None or value / allowed > worst_bf16[0]:
                    worst_bf16 = (value / allowed, value, path, allowed, own, stored)
                    worst_value, worst_path = value, path
            elif ref_tensor is not None and ref_tensor.shape == expected.shape:
                # Each tensor against its own noise: a gradient that is ~0 in float32 (a key bias under softmax)
                # is all rounding noise in 16 bits, and must not set the bound of every other tensor.
                ref_tensor = ref_tensor.to(expected.device)
                finite = finite & torch.isfinite(ref_tensor)
                own = relative_l2(expected[finite], ref_tensor[finite])
                value = relative_l2(actual[finite], ref_tensor[finite])
                if own >= NOISE_DOMINATED_REL_L2:
                    # The original itself is this far from float32: the tensor is mostly rounding noise (a
                    # gradient that is ~0 in float32, its Adam moments), and a ratio of two noises says nothing.
                    noise_only.add(path)
                    continue
                allowed = rel_bound = max(reference_factor * own, fixed_bound, floor)
                if worst_reference is None or value / allowed > worst_reference[0]:
                    worst_reference = (value / allowed, value, path, allowed, own)
                    worst_value, worst_path = value, path
                reference_error = own if reference_error is None else max(reference_error, own)
                own_drift = abs(scale_drift(expected[finite], ref_tensor[finite]))
                against = ref_tensor  # the scale is judged against float32 too
            elif policy == "fp8":
                value = sqnr_db(actual[finite], expected[finite])
            else:
                value = relative_l2(actual[finite], expected[finite])
            compared += 1
            worse = worst_value is None or (value < worst_value if policy == "fp8" else value > worst_value)
            if worse and policy not in EMULATED and worst_reference is None:
                worst_value, worst_path = value, path
            support = int((expected[finite] != 0).sum().item()) if policy in ("model", *EMULATED) else 0
            if support >= MIN_DRIFT_ELEMENTS:
                # With a float32 reference the scale is judged against it: the patched run may be biased against
                # float32 up to twice as much as the original is (bf16 autocast biases an Adam second moment by
                # ~0.3% on BERT; inductor, rounding elsewhere, by ~1% against eager); else against the original.
                drift = scale_drift(actual[finite], against[finite])
                # Rounding noise of rel-L2 e over n elements projects onto the output as ~ e / sqrt(n).
                noise_drift = DRIFT_SIGMAS * relative_l2(actual[finite], against[finite]) / math.sqrt(support)
                allowed = max(MAX_SCALE_DRIFT, noise_drift, REFERENCE_FACTOR * own_drift)
                if path.startswith("state ") and rel_bound:
                    # What the step wrote into its state may be off in scale by as much as its rel-L2 bound allows:
                    # an Adam update (~lr x sign(gradient) on its first steps) flips sign where the gradient is
                    # rounding noise, BatchNorm's running variance moves with each rounding of the activations
                    # (0.75% under bf16 autocast on ResNet-50). Outputs keep the strict bound: a 1.01 weight shows
                    # there, and a skipped update or cache write is a rel-L2 of 1.
                    allowed = max(allowed, rel_bound)
                if worst_drift is None or abs(drift) / allowed > abs(worst_drift[0]) / worst_drift[2]:
                    worst_drift = (drift, path, allowed, against is not expected)
    if compared == 0:
        if integer_output is not None:
            # Equal token ids say little: a fix that scales every logit by 1.01 keeps each argmax.
            path, dtype = integer_output
            return verdict(
                False,
                f"the step returns only integer tensors ({path}, {dtype}; equal to the original's in every trial),"
                " which cannot show a fix's float error; return the logits or the loss from step() (for"
                " generate(): output_scores=True, return_dict_in_generate=True)",
            )
        return verdict(
            False,
            "the step returns no floating tensor to compare; return the output (or the loss) from step()"
            " so the guard can check the fix",
        )
    noise_note = ""
    if noise_only:
        whose = (
            f"the {EMULATED[policy][2]}-rounded original's rel-L2 to the original"
            if policy in EMULATED
            else "the original's own rel-L2 to float32"
        )
        noise_note = (
            f"; {len(noise_only)} tensor(s) not judged one by one: {whose} is"
            f" >= {NOISE_DOMINATED_REL_L2:g} there (rounding noise, e.g. {sorted(noise_only)[0]})"
        )
    if scattered:
        path, value = max(scattered.items(), key=lambda item: item[1])
        noise_note += (
            f"; {len(scattered)} state tensor(s) not judged: two runs of the original differ by more than"
            f" {MAX_RUN_NOISE:g} there while its outputs agree (nondeterministic sums of rounding noise, e.g."
            f" {path}: {value:.2e})"
        )
    if noise is not None:
        noise_note += (
            f"; the original's own run-to-run scatter: {noise[0]:.2e} in {noise[1]} (bound at least"
            f" {NOISE_FACTOR:g} x that)"
        )
    if policy == "fp8":
        passed = worst_value >= FP8_MIN_SQNR_DB
        detail = f"SQNR of {worst_path} vs the original: {worst_value:.1f} dB, needs >= {FP8_MIN_SQNR_DB:.0f} dB"
        return verdict(passed, detail, worst_value, FP8_MIN_SQNR_DB)
    drift_note = ""
    if worst_drift is not None:
        drift_note = f"; systematic scale {worst_drift[0]:+.1e} in {worst_drift[1]} (bound +/-{worst_drift[2]:.1e})"
    if policy in EMULATED and worst_bf16 is None:
        words = EMULATED[policy][2]
        return verdict(
            False,
            f"every compared tensor is rounding noise in {words} (the {words}-rounded original moves each by rel-L2"
            f" >= {NOISE_DOMINATED_REL_L2:g}): nothing left to judge the fix by{noise_note}",
        )
    if policy == "tf32":
        _, worst_value, worst_path, bound, own, _ = worst_bf16
        detail = (
            f"rel-L2 of {worst_path} vs the original: {worst_value:.2e}; the original with TF32 rounding where TF32"
            f" rounds (matmul and convolution operands, and the gradients into them; computed in float32) moves it"
            f" by {own:.2e}; bound max({TF32_NOISE_FACTOR:g} x {own:.2e}, {TF32_FLOOR:.1e} for an output,"
            f" {TF32_STATE_FLOOR:.0e} for a state write) = {bound:.2e}, each output and state write against its"
            f" own{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound, own)
    elif policy == "bf16":
        _, worst_value, worst_path, bound, own, stored = worst_bf16
        level = max(own, stored)
        storage_note = (
            f", with bf16 storage where autocast stores bf16 after them too (normalization, pointwise and residual"
            f" outputs and their gradients) by {stored:.2e}"
            if any("storage" in trial for trial in trials)
            else ""
        )
        detail = (
            f"rel-L2 of {worst_path} vs the original: {worst_value:.2e}; the original with bf16 rounding where"
            f" autocast rounds (inputs, matmul and convolution operands and results; computed in float32) moves it"
            f" by {own:.2e}{storage_note}; bound max({BF16_NOISE_FACTOR:g} x {level:.2e}, {BF16_FLOOR:.1e})"
            f" = {bound:.2e}, each output and state write against its own{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound, level)
    elif worst_reference is not None:
        _, worst_value, worst_path, bound, own = worst_reference
        detail = (
            f"rel-L2 of {worst_path} vs {copy_name} of the original: {worst_value:.2e} (the original's own:"
            f" {own:.2e}); bound max({reference_factor:g} x {own:.2e}, {fixed_bound:g}) = {bound:.2e}, each"
            f" output and state write against its own{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound, own)
    else:
        bound = max(fixed_bound, floor)
        detail = (
            f"rel-L2 of {worst_path} vs the original: {worst_value:.2e}, bound {bound:g} ({dtype_name})"
            f"{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound)
    if result.passed and worst_drift is not None and abs(worst_drift[0]) > worst_drift[2]:
        whose = "the float32 reference's" if worst_drift[3] else "the original's"
        result.passed = False
        result.detail = (
            f"{worst_drift[1]} is systematically scaled against {whose}: {1 + worst_drift[0]:.4f} x"
            f" (its projection onto {whose}, bound +/-{worst_drift[2]:.1e}: unbiased rounding noise"
            f" projects to ~rel-L2 / sqrt(n)), though its {detail}"
        )
    return result


def scale_drift(test: Any, reference: Any) -> float:
    """<test - reference, reference> / <reference, reference> in float64: the part of the difference that is a
    uniform scale of the reference (0 for unbiased rounding noise, 0.01 for an output scaled by 1.01)."""
    test64, reference64 = test.detach().double().flatten(), reference.detach().double().flatten()
    signal = float((reference64 * reference64).sum().item())
    if signal == 0.0:
        return 0.0
    return float(((test64 - reference64) * reference64).sum().item()) / signal


def _count_nonfinite(tensor: Any) -> int:
    import torch

    return int((~torch.isfinite(tensor)).sum().item())
