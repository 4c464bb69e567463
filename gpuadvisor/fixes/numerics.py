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
- ``"fp8"`` policy: signal-to-quantization-noise ratio of the patched output against the original, >= 25 dB.
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
``MAX_RUN_NOISE``, fails the guard: such a step cannot be judged.
The float32 reference copies the model and the inputs together (a cache object in the inputs becomes the
copy's own, upcast), and runs after the original and the patched trials.
"""

from __future__ import annotations

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
# fp8 e4m3 has 3 mantissa bits: per-tensor-scaled GEMMs land near 30 dB; 25 dB leaves margin (DESIGN.md).
FP8_MIN_SQNR_DB = 25.0
LOW_PRECISION = ("bfloat16", "float16")


@dataclasses.dataclass
class NumericsResult:
    """The guard's verdict and the numbers behind it."""

    passed: bool
    policy: str
    metric: str  # "rel_l2_vs_fp32_reference" | "rel_l2_vs_original" | "sqnr_db" | "" (nothing compared)
    value: float | None  # the patched run's error (rel-L2) or SQNR (dB); the worst over outputs and trials
    bound: float | None  # rel-L2: at most this; SQNR: at least this
    reference_error: float | None  # "model" with an fp32 reference: the original's own rel-L2 to it
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
        if self.reference_error is not None:
            return (
                f"rel-L2 {self.value:.2e} vs fp32 reference"
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

    generator = torch.Generator().manual_seed(seed)

    def make(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
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
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
            return type(value)(*(make(item) for item in value))
        if isinstance(value, (tuple, list)):
            return type(value)(make(item) for item in value)
        if isinstance(value, dict):
            return {key: make(item) for key, item in value.items()}
        return value

    return make(example_inputs)


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
    from gpuadvisor.workload import _make_step_fn

    if policy not in ("model", "fp8"):
        raise ValueError(f"unknown numerics policy {policy!r} (expected 'model' or 'fp8')")
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
    moved: tuple[str, float] | None = None
    draws_random = False

    drew: list[bool] = []

    def run(workload: Any, inputs: Any, trial: int, label: str) -> Any:
        torch.manual_seed(seed * 1_000 + trial)
        rng_before = _rng_states(on_cuda)
        outputs = flatten_outputs(_make_step_fn(workload.step, workload.model, inputs, label)())
        drew.append(_rng_states(on_cuda) != rng_before)
        return outputs

    with torch.random.fork_rng(devices=cuda_devices):
        try:
            for trial, inputs in enumerate(trial_inputs):
                original_state.restore(start, list(written))
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
                    noise = _run_noise(runs_original[0], again, start)
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

        runs_reference = None
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
                    runs_reference = _reference_runs(original, trial_inputs, list(written), seed, run)
                except Exception as error:  # the model may not run in fp32 (a hard-coded dtype): say so, go on
                    from gpuadvisor.workload import _describe

                    notes.append(f"no fp32 reference: the float32 copy raised {_describe(error)}; fixed bound used")
                    runs_reference = None
                finally:
                    _release(on_cuda)

    entries = [
        _entries(run_original, run_patched, run_reference, start)
        for run_original, run_patched, run_reference in zip(
            runs_original, runs_patched, runs_reference or [None] * len(runs_original)
        )
    ]
    result = _judge(policy, entries, runs_reference is not None, dtype_name, noise)
    if written:
        notes.append(f"compared the state the step writes too ({describe_paths(list(written))})")
    if draws_random:
        notes.append("the step draws random numbers: each run started from the same seed")
    if notes:
        result.detail = f"{result.detail}; {'; '.join(notes)}"
    return result


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


def _run_noise(first: _Run, second: _Run, start: Any) -> tuple[float, str] | None:
    """The worst rel-L2 between two runs of the original from the same state (None when they agree exactly)."""
    import torch

    from gpuadvisor.fixes.state import delta

    worst: tuple[float, str] | None = None
    pairs = [(path, a, b) for (path, a), (_, b) in zip(first.outputs, second.outputs)]
    pairs += [
        (f"state {path}", delta(first.state_after[path], start[path]), delta(second.state_after[path], start[path]))
        for path in first.state_after
    ]
    for path, a, b in pairs:
        if a is None or b is None or a.shape != b.shape:
            continue
        if not a.dtype.is_floating_point:  # sampled token ids: any difference is all the difference
            if not torch.equal(a, b.to(a.dtype)):
                return (math.inf, path)
            continue
        finite = torch.isfinite(a) & torch.isfinite(b)
        value = relative_l2(b[finite], a[finite])
        if value > 0 and (worst is None or value > worst[0]):
            worst = (value, path)
    return worst


def _entries(original: _Run, patched: _Run, reference: _Run | None, start: Any) -> dict[str, Any]:
    """The compared pairs of one trial: outputs, then each written slot's change (after - before)."""
    from gpuadvisor.fixes.state import delta

    def state_entries(run_: _Run | None, origin: Any) -> list[tuple[str, Any]] | None:
        if run_ is None:
            return None
        return [(f"state {path}", delta(value, origin[path])) for path, value in run_.state_after.items()]

    return {
        "outputs": (original.outputs, patched.outputs, reference.outputs if reference else None),
        "state": (
            state_entries(original, start),
            state_entries(patched, start),
            state_entries(reference, reference.start if reference else None),
        ),
    }


@dataclasses.dataclass
class _ReferenceRun(_Run):
    start: Any = None  # the reference's state before its step (its own upcast copy of S)


def _reference_runs(original: Any, trial_inputs: list, written: list[str], seed: int, run: Any) -> list[_Run]:
    """The steps of a float32 copy of the original (model and inputs copied together, so a cache object in the
    inputs is the copy's own) on the same trials, each from the copy's S."""
    import copy

    from gpuadvisor.fixes.state import collect_state

    memo = _float32_memo(original.model, original.inputs)
    model, inputs = copy.deepcopy((original.model, original.inputs), memo)
    reference = dataclasses.replace(original, model=model, inputs=inputs)
    state = collect_state({"model": model, "inputs": inputs})
    start = state.snapshot(written)
    runs: list[_Run] = []
    try:
        for trial, fresh in enumerate(trial_inputs):
            state.restore(start)
            upcast = copy.deepcopy(fresh, {**memo, **_float32_memo(None, fresh, only_new=memo)})
            outputs = run(reference, upcast, trial, "fp32 copy")
            runs.append(_ReferenceRun(outputs, state.snapshot(written).values, start))
    finally:
        del model, inputs, reference, state
    return runs


def _float32_memo(model: Any, inputs: Any, only_new: dict | None = None) -> dict[int, Any]:
    """A deepcopy memo that maps every tensor reachable from (model, inputs) to a detached clone, low-precision
    floating ones upcast to float32: the copy never deep-copies a tensor itself (one with autograd history
    cannot be), and parameters stay parameters."""
    import torch

    from gpuadvisor.fixes.state import collect_state

    memo: dict[int, Any] = {}
    for slot in collect_state({"model": model, "inputs": inputs}):
        tensor = slot.get() if slot.kind in ("tensor", "item") else None
        if tensor is None or (only_new is not None and id(tensor) in only_new):
            continue
        clone = tensor.detach().clone()
        if clone.dtype in (torch.bfloat16, torch.float16):
            clone = clone.float()
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
# Bounds are raised to this many times the original's own run-to-run scatter when that is larger.
NOISE_FACTOR = 2.0


def _judge(
    policy: str,
    trials: list[dict[str, Any]],
    with_reference: bool,
    dtype_name: str | None,
    noise: tuple[float, str] | None,
) -> NumericsResult:
    import torch

    fixed_bound = FIXED_REL_L2.get(dtype_name or "", 1e-4)
    metric = "sqnr_db" if policy == "fp8" else ("rel_l2_vs_fp32_reference" if with_reference else "rel_l2_vs_original")

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
    worst_drift: tuple[float, str, float] | None = None  # (drift, path, its bound)
    reference_error: float | None = None
    compared = 0
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
            if expected is None or actual is None:
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
            if ref_tensor is not None and ref_tensor.shape == expected.shape:
                ref_tensor = ref_tensor.to(expected.device)
                finite = finite & torch.isfinite(ref_tensor)
                own = relative_l2(expected[finite], ref_tensor[finite])
                value = relative_l2(actual[finite], ref_tensor[finite])
                reference_error = own if reference_error is None else max(reference_error, own)
            elif policy == "fp8":
                value = sqnr_db(actual[finite], expected[finite])
            else:
                value = relative_l2(actual[finite], expected[finite])
            compared += 1
            worse = worst_value is None or (value < worst_value if policy == "fp8" else value > worst_value)
            if worse:
                worst_value, worst_path = value, path
            support = int((expected[finite] != 0).sum().item()) if policy == "model" else 0
            if support >= MIN_DRIFT_ELEMENTS:
                drift = scale_drift(actual[finite], expected[finite])
                # Rounding noise of rel-L2 e over n elements projects onto the output as ~ e / sqrt(n).
                noise_drift = DRIFT_SIGMAS * relative_l2(actual[finite], expected[finite]) / math.sqrt(support)
                allowed = max(MAX_SCALE_DRIFT, noise_drift)
                if worst_drift is None or abs(drift) / allowed > abs(worst_drift[0]) / worst_drift[2]:
                    worst_drift = (drift, path, allowed)
    if compared == 0:
        return verdict(
            False,
            "the step returns no floating tensor to compare; return the output (or the loss) from step()"
            " so the guard can check the fix",
        )
    noise_note = ""
    if noise is not None:
        noise_note = (
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
    floor = NOISE_FACTOR * noise[0] if noise is not None else 0.0
    if reference_error is not None:
        bound = max(REFERENCE_FACTOR * reference_error, fixed_bound, floor)
        detail = (
            f"rel-L2 of {worst_path} vs an fp32 copy of the original: {worst_value:.2e} (the original's own:"
            f" {reference_error:.2e}); bound max({REFERENCE_FACTOR:g} x {reference_error:.2e}, {fixed_bound:g})"
            f" = {bound:.2e}{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound, reference_error)
    else:
        bound = max(fixed_bound, floor)
        detail = (
            f"rel-L2 of {worst_path} vs the original: {worst_value:.2e}, bound {bound:g} ({dtype_name})"
            f"{noise_note}{drift_note}"
        )
        result = verdict(worst_value <= bound, detail, worst_value, bound)
    if result.passed and worst_drift is not None and abs(worst_drift[0]) > worst_drift[2]:
        result.passed = False
        result.detail = (
            f"{worst_drift[1]} is systematically scaled against the original's: {1 + worst_drift[0]:.4f} x"
            f" (its projection onto the original's, bound +/-{worst_drift[2]:.1e}: unbiased rounding noise"
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
