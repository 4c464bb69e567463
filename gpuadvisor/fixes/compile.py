"""The ``compile`` fix: ``torch.compile`` the workload's modules, with the mode chosen by measurement.

Why: torch.compile is what a user would otherwise reach for, and on some steps it is the best lever there is. On
the H200 (benchmarks/results/real_models.json) transformers BERT at 8 x 128 tokens took 9,661 µs per eager step
and 816 µs under ``mode="reduce-overhead"``, where a CUDA graph of the step is refused (transformers checks the
padding mask on the host, a value a graph would freeze).

What it compiles: the ``torch.nn.Module`` the step calls: the model itself, or the modules held by the object
``build()`` returned (a ``TrainState`` with ``.model``, a dict of modules), one attribute deep. Each is compiled
the way ``nn.Module.compile()`` does it (its ``_call_impl`` through ``torch.compile``, as the module's
``_compiled_call_impl``), with the call wrapped in a function of this file: torch 2.13 lists ``nn.Module``'s own
methods among the frames dynamo skips, so ``torch.compile(module._call_impl)`` (and ``module.compile()``) ran
eagerly there without a word, while a frame of this file is traced and inlines the module's call. After the first
call dynamo must hold compiled code for that frame, or the mode is skipped as "compiled nothing". The compiled
call is in place only for the duration of the patched step: switched in on entry and out again on exit, so the
user's module, its weights and its optimizer are shared with the original and the original runs eagerly between
calls (the numerics guard compares the two from the same state). The user's step itself (``zero_grad``,
``backward``, ``optimizer.step()``, a cache object's bookkeeping) stays eager Python around the compiled forward.

Modes: on a GPU ``default`` and ``reduce-overhead`` (CUDA graphs of the compiled code) by default, or those the
environment variable ``GPUADVISOR_COMPILE_MODES`` lists (comma-separated; ``max-autotune`` and
``max-autotune-no-cudagraphs`` tune GEMMs for minutes). Each mode is compiled and warmed up (``WARMUP_STEPS``
calls: compilation, then cudagraph recording), timed over ``TIMING_STEPS`` steps with CUDA events, and the state
the steps wrote (a cache, weights, optimizer moments) is restored after each mode; the fastest mode is kept. On
the CPU only ``default`` runs (CUDA graphs need a GPU). The outcome's ``facts`` hold each mode's median step
time, its compile time (the first call) and the graph breaks dynamo reported with their reasons.

Dropout: a training step with active dropout draws random masks; inductor's own random stream differs from
eager's, so the same seed gives other masks and the guard could not compare like with like. Such modules are
compiled with ``fallback_random=True`` (eager's random ops inside the compiled code), which the changes say.

``GPUADVISOR_COMPILE_BACKEND=aot_eager`` (or another registered backend) compiles with that backend instead of
inductor, to tell a dynamo or autograd problem from a code-generation one.

Refused: no module to compile, a module already compiled, dynamo unsupported on this Python.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, Refusal
from gpuadvisor.fixes.copying import held_modules

WARMUP_STEPS = 3  # compile on the first call; reduce-overhead records its CUDA graphs on the next ones
TIMING_STEPS = 10  # per mode, after warm-up: a median of 10 separates modes that differ by a few percent
GPU_MODES = ("default", "reduce-overhead")
MODES_ENV = "GPUADVISOR_COMPILE_MODES"
# Another torch.compile backend than inductor ("aot_eager": dynamo and AOTAutograd without code generation), to
# tell a dynamo problem from an inductor one; modes do not apply to it.
BACKEND_ENV = "GPUADVISOR_COMPILE_BACKEND"
KNOWN_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes whose compiled code replays CUDA graphs: a second CUDA graph around them (the ``graphs`` fix) is refused.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
MAX_BREAK_REASONS = 3


def compile_modes(cuda: bool) -> list[str]:
    """The modes to try: ``GPUADVISOR_COMPILE_MODES`` if set (validated), else ``GPU_MODES`` (CPU: default)."""
    from gpuadvisor.errors import BadInputError

    text = os.environ.get(MODES_ENV, "").strip()
    if not text:
        return list(GPU_MODES) if cuda else ["default"]
    modes = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [mode for mode in modes if mode not in KNOWN_MODES]
    if unknown or not modes:
        raise BadInputError(
            f"{MODES_ENV}: unknown mode(s) {', '.join(unknown) or '(none)'}; known: {', '.join(KNOWN_MODES)}"
        )
    if not cuda:
        modes = [mode for mode in modes if mode not in CUDAGRAPH_MODES] or ["default"]
    return modes


def compiled_mode(workload: Any) -> str | None:
    """The torch.compile mode the workload's step runs under when the ``compile`` fix made it, else None."""
    return getattr(workload.step, "compile_mode", None)


def _dropout_active(module: Any) -> bool:
    from torch import nn

    if not module.training:
        return False
    for sub in module.modules():
        if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0 and sub.training:
            return True
        rate = getattr(sub, "attention_dropout", None) or getattr(sub, "dropout", None)
        if isinstance(rate, float) and rate > 0 and sub.training:
            return True
    return False


class _SwitchedIn:
    """Puts compiled call implementations on modules for the duration of a ``with`` block, then takes them off."""

    def __init__(self, pairs: list[tuple[Any, Any]]):
        self.pairs = pairs

    @contextmanager
    def __call__(self):
        previous = [module._compiled_call_impl for module, _ in self.pairs]
        for module, compiled in self.pairs:
            module._compiled_call_impl = compiled
        try:
            yield
        finally:
            for (module, _), old in zip(self.pairs, previous):
                module._compiled_call_impl = old


class CompiledStep:
    """The user's step with the compiled modules switched in while it runs; ``compile_mode`` names the mode."""

    def __init__(self, step: Any, switch: _SwitchedIn, mode: str):
        self.user_step = step
        self.__wrapped__ = step  # state.step_globals looks through to what the user's step reaches
        self.switch = switch
        self.compile_mode = mode

    def __call__(self, model: Any, inputs: tuple) -> Any:
        with self.switch():
            return self.user_step(model, inputs)


def _traced_call(module: Any) -> Any:
    """``module._call_impl`` behind a function of this file, for ``torch.compile`` (module docstring)."""
    impl = module._call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        return impl(*args, **kwargs)

    # A code object of its own: dynamo keeps compiled code per code object, so each module's (and each mode's)
    # entries are its own to count, and no two share a recompile limit.
    call.__code__ = call.__code__.replace()
    return call


def _compiled_code_count(function: Any) -> int:
    """How many compiled entries dynamo holds for ``function``'s frame (0: it ran eagerly); -1 if unknown."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(function.__code__))
    except Exception:  # a private helper: a torch without it cannot tell
        return -1


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {str(reason): int(count) for reason, count in counters["graph_break"].items()}


def _break_summary(before: dict[str, int], after: dict[str, int]) -> tuple[int, list[str]]:
    new = {reason: count - before.get(reason, 0) for reason, count in after.items() if count > before.get(reason, 0)}
    reasons = [reason.splitlines()[0][:160] for reason, _ in sorted(new.items(), key=lambda kv: -kv[1])]
    return sum(new.values()), reasons[:MAX_BREAK_REASONS]


class CompileFix(Fix):
    """torch.compile the step's modules, keeping the fastest mode (see the module docstring)."""

    id = "compile"
    title = "torch.compile (mode chosen by measurement)"
    numerics = "model"

    def check(self, workload: Any) -> Refusal | None:
        import torch

        if not hasattr(torch, "compile"):
            return Refusal(f"torch {torch.__version__} has no torch.compile", "install torch 2.0 or newer")
        try:
            from torch._dynamo import is_dynamo_supported

            supported = is_dynamo_supported()
        except Exception:
            supported = False
        if not supported:
            return Refusal("torch.compile (dynamo) is not supported on this Python or platform")
        if compiled_mode(workload):
            return Refusal(f"the step already runs under torch.compile (mode {compiled_mode(workload)})")
        modules = held_modules(workload.model)
        if not modules:
            return Refusal(
                f"the model is a {type(workload.model).__name__} holding no torch.nn.Module: nothing to compile",
                "return the module (or an object holding it as an attribute) from build()",
            )
        for label, module in modules:
            if isinstance(module, torch._dynamo.eval_frame.OptimizedModule) or module._compiled_call_impl is not None:
                return Refusal(f"{label} is already compiled (torch.compile)", "compare against the eager model")
        return None

    def apply(self, workload: Any) -> Applied:
        import torch

        from gpuadvisor.capture.timing import time_steps
        from gpuadvisor.fixes.safety import model_device
        from gpuadvisor.fixes.state import collect_state, workload_roots
        from gpuadvisor.workload import make_step_fn

        device = model_device(workload.model, workload.inputs) or "cpu"
        cuda = device.startswith("cuda") and torch.cuda.is_available()
        modes = compile_modes(cuda)
        modules = held_modules(workload.model)
        random = [label for label, module in modules if _dropout_active(module)]

        state = collect_state(workload_roots(workload))
        start_state = state.snapshot()
        tried: dict[str, dict[str, Any]] = {}
        steps: dict[str, CompiledStep] = {}
        skipped: list[dict[str, str]] = []
        try:
            for mode in modes:
                backend = os.environ.get(BACKEND_ENV, "").strip() or "inductor"
                if backend != "inductor":
                    how = {"backend": backend}
                elif random:
                    import torch._inductor

                    how = {"options": {**torch._inductor.list_mode_options(mode), "fallback_random": True}}
                else:
                    how = {"mode": None if mode == "default" else mode}
                calls = [_traced_call(module) for _, module in modules]
                pairs = [(module, torch.compile(call, **how)) for (_, module), call in zip(modules, calls)]
                step = CompiledStep(workload.step, _SwitchedIn(pairs), mode)
                run = make_step_fn(step, workload.model, workload.inputs, workload.path)
                breaks_before = _graph_breaks()
                try:
                    started = time.perf_counter()
                    run()
                    if cuda:
                        torch.cuda.synchronize()
                    compile_s = time.perf_counter() - started
                    eager = [label for (label, _), call in zip(modules, calls) if _compiled_code_count(call) == 0]
                    if len(eager) == len(modules):
                        raise RuntimeError(
                            f"torch.compile compiled nothing for {', '.join(eager)}: dynamo ran the step eagerly"
                        )
                    for _ in range(WARMUP_STEPS - 1):
                        run()
                    median = None
                    if len(modes) > 1:
                        times = time_steps(lambda i, run=run: run(), TIMING_STEPS, cuda=cuda)
                        median = sorted(times.samples_us)[len(times.samples_us) // 2]
                except Exception as error:  # one mode failing (an inductor error) leaves the others
                    from gpuadvisor.workload import describe_error

                    skipped.append({"target": f"mode {mode}", "reason": describe_error(error)})
                    continue
                finally:
                    state.restore(start_state)
                count, reasons = _break_summary(breaks_before, _graph_breaks())
                tried[mode] = {
                    "step_us": round(median, 1) if median is not None else None,
                    "compile_s": round(compile_s, 1),
                    "graph_breaks": count,
                    "graph_break_reasons": reasons,
                    "not_compiled": eager,  # held modules the step did not call, or dynamo ran eagerly
                }
                steps[mode] = step
        finally:
            state.restore(start_state)
            del start_state
        if not steps:
            raise RuntimeError("torch.compile failed in every mode: " + "; ".join(s["reason"] for s in skipped))
        chosen = min(steps, key=lambda mode: tried[mode]["step_us"] if tried[mode]["step_us"] is not None else 0.0)
        chosen_step = steps[chosen]
        patched = workload.with_step(workload.model, chosen_step)

        facts = tried[chosen]
        names = ", ".join(label for label, _ in modules)
        changes = [f"{names} compiled with torch.compile(mode={chosen!r}), switched in for each step"]
        if len(tried) > 1:
            others = ", ".join(
                f"{mode} {info['step_us']:,.0f} µs"
                for mode, info in tried.items()
                if mode != chosen and info["step_us"]
            )
            changes.append(
                f"mode chosen by measurement ({TIMING_STEPS} steps back to back per mode after its warm-up): "
                f"{chosen} {facts['step_us']:,.0f} µs per step; {others}"
            )
        changes.append(f"first call (compilation) took {facts['compile_s']:.1f} s")
        if facts["graph_breaks"]:
            changes.append(f"{facts['graph_breaks']} graph break(s): " + "; ".join(facts["graph_break_reasons"]))
        else:
            changes.append("no graph breaks")
        if facts["not_compiled"]:
            changes.append(
                f"left eager: {', '.join(facts['not_compiled'])} (the step did not call it, or dynamo ran it eagerly)"
            )
        if random:
            changes.append(
                f"dropout is active in {', '.join(random)}: compiled with fallback_random=True (eager's random"
                " stream), so the guard compares the same masks"
            )
        return Applied(
            patched,
            changes,
            skipped,
            facts={
                "mode": chosen,
                "modes": tried,
                "compiled": [label for label, _ in modules],
                "fallback_random": bool(random),
            },
        )
