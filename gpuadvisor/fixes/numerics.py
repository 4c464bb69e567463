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

Stateful steps: the original runs on its own deep copy of the model (the user's model is not touched when
memory allows), the patched workload on its own model (a fix works on a copy or wraps the step), and the
float32 reference on a third copy, each continuing from one trial to the next. A step that writes its state
idempotently (the same slots with the same values for the same inputs, as a decode step writing its KV cache
at the input position does) therefore gives comparable outputs; a step whose output depends on how many
times it ran before (a training step's optimizer update) is compared trial by trial from copies that have
run the same number of steps, which holds only if the patched workload starts from the same state.
The patched workload's state is left as the guard's steps made it (a KV cache has the random trials' slots
written), since a captured graph cannot run on a copy of its model.
The copies run one after the other (original, float32 reference, patched), and each is deleted (and the
CUDA cache emptied) before the next is made, so the guard needs at most the model plus one float32 copy.
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


def _upcast(value: Any) -> Any:
    """Floating tensors (low precision) to float32; everything else as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_upcast(item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_upcast(item) for item in value)
    if isinstance(value, dict):
        return {key: _upcast(item) for key, item in value.items()}
    return value


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


def check_numerics(
    original: Any, patched: Any, policy: NumericsPolicy, *, trials: int = 2, seed: int = 0
) -> NumericsResult:
    """Compare ``patched`` with ``original`` (both :class:`gpuadvisor.workload.Workload`) under ``policy``.

    Raises :class:`gpuadvisor.errors.UserCodeError` when a step raises on the fresh inputs.
    """
    from gpuadvisor.fixes.safety import model_device, private_copy, state_bytes
    from gpuadvisor.workload import _make_step_fn

    if policy not in ("model", "fp8"):
        raise ValueError(f"unknown numerics policy {policy!r} (expected 'model' or 'fp8')")
    inputs = [fresh_inputs(original.inputs, seed + trial) for trial in range(trials)]
    device = model_device(original.model, original.inputs)
    on_cuda = device is not None and device.startswith("cuda")

    def run(step: Any, model: Any, label: str) -> list[list[tuple[str, Any]]]:
        return [flatten_outputs(_make_step_fn(step, model, trial_inputs, label)()) for trial_inputs in inputs]

    # The original first, on its own copy: its dtype decides whether an fp32 reference is worth making.
    notes: list[str] = []
    original_model = private_copy(original.model)
    if original_model is None:
        notes.append("the original ran in place (no copy: not enough memory, or the model cannot be deep-copied)")
        original_model = original.model
    original_outputs = run(original.step, original_model, original.path)
    del original_model
    _release(on_cuda)

    dtype = next((t.dtype for outputs in original_outputs for _, t in outputs if t.dtype.is_floating_point), None)
    dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None

    reference_outputs = None
    if policy == "model" and dtype_name in LOW_PRECISION:
        if not _fits_fp32_copy(original.model, state_bytes):
            notes.append("no fp32 reference: not enough free memory for a float32 copy; fixed bound used")
        else:
            try:
                reference_model = _float32_copy(original.model)
                try:
                    reference_outputs = [
                        flatten_outputs(_make_step_fn(original.step, reference_model, _upcast(trial), "fp32 copy")())
                        for trial in inputs
                    ]
                finally:
                    del reference_model
                    _release(on_cuda)
            except Exception as error:  # the model may not run in fp32 (a hard-coded dtype): say so, go on
                notes.append(f"no fp32 reference: the float32 copy raised {type(error).__name__}; fixed bound used")
                reference_outputs = None

    patched_outputs = run(patched.step, patched.model, patched.path)
    result = _judge(policy, original_outputs, patched_outputs, reference_outputs, dtype_name)
    if notes:
        result.detail = f"{result.detail}; {'; '.join(notes)}"
    return result


def _fits_fp32_copy(model: Any, state_bytes: Any) -> bool:
    """Whether a float32 copy of a low-precision model fits: free CUDA memory >= 2 x its parameter+buffer bytes."""
    import torch

    from gpuadvisor.fixes.safety import model_device

    device = model_device(model)
    if device is None or not device.startswith("cuda"):
        return True
    free_bytes, _ = torch.cuda.mem_get_info(torch.device(device))
    return 2 * state_bytes(model) <= free_bytes


def _float32_copy(model: Any) -> Any:
    """A deep copy whose floating parameters and buffers are float32 (converted one by one, no second copy)."""
    import copy

    import torch

    reference = copy.deepcopy(model)
    if isinstance(reference, torch.nn.Module):
        reference.float()
    return reference


def _release(on_cuda: bool) -> None:
    gc.collect()
    if on_cuda:
        import torch

        torch.cuda.empty_cache()


def _judge(
    policy: str,
    original_outputs: list[list[tuple[str, Any]]],
    patched_outputs: list[list[tuple[str, Any]]],
    reference_outputs: list[list[tuple[str, Any]]] | None,
    dtype_name: str | None,
) -> NumericsResult:
    import torch

    fixed_bound = FIXED_REL_L2.get(dtype_name or "", 1e-4)
    metric = (
        "sqnr_db" if policy == "fp8" else ("rel_l2_vs_fp32_reference" if reference_outputs else "rel_l2_vs_original")
    )

    def verdict(passed: bool, detail: str, value=None, bound=None, reference_error=None, parity=True) -> NumericsResult:
        return NumericsResult(passed, policy, metric, value, bound, reference_error, parity, detail, dtype_name)

    worst_value: float | None = None
    worst_path = ""
    reference_error: float | None = None
    compared = 0
    for trial, (original, patched) in enumerate(zip(original_outputs, patched_outputs)):
        if [path for path, _ in original] != [path for path, _ in patched]:
            return verdict(
                False, f"the outputs differ in structure: {[p for p, _ in original]} vs {[p for p, _ in patched]}"
            )
        reference = reference_outputs[trial] if reference_outputs else None
        for index, ((path, expected), (_, actual)) in enumerate(zip(original, patched)):
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
            if reference is not None:
                ref_tensor = reference[index][1].to(expected.device)
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
    if compared == 0:
        return verdict(
            False,
            "the step returns no floating tensor to compare; return the output (or the loss) from step()"
            " so the guard can check the fix",
        )
    if policy == "fp8":
        passed = worst_value >= FP8_MIN_SQNR_DB
        detail = f"SQNR of {worst_path} vs the original: {worst_value:.1f} dB, needs >= {FP8_MIN_SQNR_DB:.0f} dB"
        return verdict(passed, detail, worst_value, FP8_MIN_SQNR_DB)
    if reference_error is not None:
        bound = max(REFERENCE_FACTOR * reference_error, fixed_bound)
        detail = (
            f"rel-L2 of {worst_path} vs an fp32 copy of the original: {worst_value:.2e} (the original's own:"
            f" {reference_error:.2e}); bound max({REFERENCE_FACTOR:g} x {reference_error:.2e}, {fixed_bound:g})"
            f" = {bound:.2e}"
        )
        return verdict(worst_value <= bound, detail, worst_value, bound, reference_error)
    detail = f"rel-L2 of {worst_path} vs the original: {worst_value:.2e}, bound {fixed_bound:g} ({dtype_name})"
    return verdict(worst_value <= fixed_bound, detail, worst_value, fixed_bound)


def _count_nonfinite(tensor: Any) -> int:
    import torch

    return int((~torch.isfinite(tensor)).sum().item())
