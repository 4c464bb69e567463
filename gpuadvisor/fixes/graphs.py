"""The ``graphs`` fix: capture the whole step in one CUDA graph and replay it.

Why: an eager decode step of the Llama-style example spent 5856 µs per step on the H200, almost all of it
launching 267 small kernels; the same step captured in one CUDA graph by hand took 815 µs (shared/GPU.md).

``check()`` refuses, with the user's source line, what a graph cannot capture (``gpuadvisor.fixes.safety``:
host syncs, copies to the CPU, data-dependent shapes, CPU ops, shapes that change between calls), and a
model that is not on CUDA. On a CPU machine it still runs the analysis, so the refusal names the ``.item()``
as well as the missing GPU ("host sync: .item() at model.py:12 (...); also: needs a CUDA device").

``apply()`` follows the PyTorch capture recipe: static input buffers (clones of the example inputs), three
warm-up steps on a side stream (lazy initialization, cuBLAS workspaces and the allocator settle outside the
capture), then ``step(model, static_inputs)`` captured in a ``torch.cuda.CUDAGraph`` with its own memory pool.
The returned workload's step copies its inputs into the static buffers (unless they are those very tensors)
and replays; its ``inputs`` stay the example inputs. The model is shared with the original when the step
writes no parameter or buffer in place; a step that does (a KV cache, an optimizer step) is captured on a
deep copy where one fits and the model can be copied, else on the model itself; the state the warm-up steps
write (a cache, an optimizer step, BatchNorm statistics) is restored after the capture either way.
Optimizers with a ``capturable`` option (Adam, AdamW, ...) are switched to it (step counters on the GPU).
A training step's gradients live in the graph's pool: after each replay the parameters' ``.grad`` point at
them again (a ``zero_grad()`` in the step sets them to None only in Python). The graph reads the model's
weights by address: changing them in place is seen by the next replay, replacing a parameter object is not.

The output of a replay lives in the graph's pool and is overwritten by the next replay: clone it to keep it.
"""

from __future__ import annotations

from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, Refusal

WARMUP_STEPS = 3  # the PyTorch docs' recipe warms up on a side stream before capture; 3 covers lazy init


class GraphedStep:
    """A step captured in a CUDA graph, called like the model: ``graphed(*inputs)``.

    Checks each input's shape, dtype and device against the captured ones (a graph replays fixed shapes and
    addresses) and raises a one-line ValueError on a mismatch; copies tensors into the static buffers;
    replays; returns the static output, which the next call overwrites (clone it to keep it). Non-tensor
    inputs were baked in at capture and must be equal.
    """

    def __init__(self, graph: Any, static_inputs: tuple, static_output: Any, model: Any, grads: list | None = None):
        self.graph = graph
        self.static_inputs = static_inputs
        self.static_output = static_output
        self.model = model  # kept alive: the graph reads its tensors by address
        # (parameter, gradient) pairs as the capture left them: a replay writes these gradient tensors, and a
        # step that sets .grad to None (zero_grad) does so only in Python, which a replay does not run.
        self.grads = grads or []

    def __call__(self, *inputs: Any) -> Any:
        self.copy_inputs(inputs)
        self.graph.replay()
        for parameter, grad in self.grads:
            if parameter.grad is not grad:
                parameter.grad = grad
        return self.static_output

    def step(self, model: Any, inputs: tuple) -> Any:
        """The two-argument form for a Workload; ``model`` is ignored (the graph is bound to the captured one)."""
        return self(*inputs)

    def copy_inputs(self, inputs: tuple) -> None:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"graphed step was captured for {len(self.static_inputs)} inputs, got {len(inputs)}")
        for index, (static, value) in enumerate(zip(self.static_inputs, inputs)):
            _copy_into(static, value, f"input {index}")


def _copy_into(static: Any, value: Any, label: str) -> None:
    import torch

    if isinstance(static, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"graphed step was captured with a tensor as {label}, got {type(value).__name__}")
        if value is static:
            return
        if value.shape != static.shape or value.dtype != static.dtype or value.device != static.device:
            raise ValueError(
                f"graphed step was captured for {label} of shape {tuple(static.shape)} {_dtype(static)} on"
                f" {static.device}; got shape {tuple(value.shape)} {_dtype(value)} on {value.device}"
                " (a CUDA graph replays fixed shapes: pad to the captured shape, or optimize again for this one)"
            )
        static.copy_(value)
    elif isinstance(static, (tuple, list)):
        if not isinstance(value, (tuple, list)) or len(value) != len(static):
            raise ValueError(f"graphed step was captured with {label} a sequence of {len(static)} items")
        for index, (inner_static, inner_value) in enumerate(zip(static, value)):
            _copy_into(inner_static, inner_value, f"{label}[{index}]")
    elif isinstance(static, dict):
        if not isinstance(value, dict) or value.keys() != static.keys():
            raise ValueError(f"graphed step was captured with {label} a dict with keys {sorted(static)}")
        for key in static:
            _copy_into(static[key], value[key], f"{label}[{key!r}]")
    elif value is not static and value != static:
        raise ValueError(f"graphed step was captured with {label} = {static!r} (baked in); got {value!r}")


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def clone_tensors(value: Any) -> Any:
    """``value`` with every tensor in it (in tuples, namedtuples, lists, dicts) detached and cloned."""
    from gpuadvisor.fixes.state import map_tensors

    return map_tensors(lambda tensor: tensor.detach().clone(), value)


class GraphsFix(Fix):
    """Capture the step in one CUDA graph (see the module docstring)."""

    id = "graphs"
    title = "CUDA graph of the whole step"
    numerics = "model"

    def __init__(self) -> None:
        self._analysis: tuple[Any, Any] | None = None  # (workload, StepAnalysis) from the last check()

    def analysis(self, workload: Any) -> Any:
        """The safety analysis of ``workload`` (cached for the workload check() saw last)."""
        from gpuadvisor.fixes.safety import analyze_step

        if self._analysis is None or self._analysis[0] is not workload:
            self._analysis = (workload, analyze_step(workload))
        return self._analysis[1]

    def check(self, workload: Any) -> Refusal | None:
        import torch

        from gpuadvisor.fixes.compile import CUDAGRAPH_MODES, compiled_mode
        from gpuadvisor.fixes.safety import model_device
        from gpuadvisor.fixes.state import step_globals

        if compiled_mode(workload) in CUDAGRAPH_MODES:
            return Refusal(
                f"the step runs under torch.compile(mode={compiled_mode(workload)!r}), which replays CUDA graphs"
                " itself; a second graph around it adds nothing",
                "keep one of the two: compile or graphs",
            )

        device = model_device(workload.model, workload.inputs)
        no_cuda = None
        if not torch.cuda.is_available():
            no_cuda = "needs a CUDA device (CUDA is not available here)"
        elif device is None or not device.startswith("cuda"):
            no_cuda = f"needs a CUDA device (the model is on {device or 'no device: it holds no tensors'})"

        undo: list = []
        if no_cuda is None:
            # Analyze what apply will capture: a capturable optimizer reads no step count on the host. The
            # user's optimizer is put back afterwards (apply switches the one it captures).
            make_capturable({"model": workload.model, "step": step_globals(workload.step)}, undo)
        try:
            analysis = self.analysis(workload)
        finally:
            for revert in reversed(undo):
                revert()
        findings = analysis.findings
        details = [finding.reason for finding in findings]
        if not findings:
            if no_cuda:
                return Refusal(no_cuda, "move the model and the example inputs to the GPU: model.cuda()")
            return None
        first = findings[0]
        reason = first.reason
        if len(findings) > 1:
            others = "; ".join(finding.reason for finding in findings[1:3])
            more = ", ..." if len(findings) > 3 else ""
            reason += f" (and {len(findings) - 1} more: {others}{more})"
        if no_cuda:
            reason += f"; also: {no_cuda}"
        return Refusal(reason, first.suggestion, details)

    def apply(self, workload: Any) -> Applied:
        import torch

        from gpuadvisor.fixes.safety import host_sync_mode, private_copy
        from gpuadvisor.fixes.state import collect_state, step_globals

        analysis = self.analysis(workload)
        changes: list[str] = []
        model = workload.model
        copied = None
        own = step_globals(workload.step)
        outside = collect_state({"step": own})
        if outside.slots:
            # The step drives state of its own (a module-level optimizer holding the model's parameters): a copy
            # of the model would be trained by nobody, so capture on the model itself.
            names = sorted({path.split(".")[0].split("[")[0] for path in outside.slots})
            changes.append(f"the step uses {', '.join(names)} from its module, so the model itself is captured")
        else:
            # Capture on a copy where memory allows, so the user's model keeps working eagerly beside the graph
            # (the analysis sees aten ops only: a Triton or extension kernel writing a buffer is invisible to it).
            copied = private_copy(model, 2)
        if copied is not None:
            model = copied
            if analysis.writes_state:
                names = ", ".join(analysis.writes_state[:3]) + (", ..." if len(analysis.writes_state) > 3 else "")
                changes.append(f"captured on a copy of the model: the step writes {names} in place")
            else:
                changes.append("captured on a copy of the model")
        elif not outside.slots:
            changes.append(
                "captured on the model itself (it cannot be deep-copied, or a copy does not fit): its state is"
                " restored after the warm-up, and the eager model and the graph share it"
            )
        changes += make_capturable({"model": model, "step": own})

        static_inputs = clone_tensors(workload.inputs)
        # Warm-up steps write state (a cache, an optimizer step, BatchNorm statistics): put it back afterwards,
        # so the patched step starts where the user's state was.
        state = collect_state({"model": model, "inputs": static_inputs, "step": own})
        before = state.snapshot()
        side_stream = torch.cuda.Stream()
        side_stream.wait_stream(torch.cuda.current_stream())
        recorder = host_sync_mode()
        with torch.cuda.stream(side_stream):
            for index in range(WARMUP_STEPS):
                if index == WARMUP_STEPS - 1 and analysis.baked_syncs:
                    with recorder:
                        workload.step(model, static_inputs)
                else:
                    workload.step(model, static_inputs)
        torch.cuda.current_stream().wait_stream(side_stream)
        torch.cuda.synchronize()

        graph = torch.cuda.CUDAGraph()
        if analysis.baked_syncs:
            # Library host syncs that take the same values for any input of these shapes (checked on fresh
            # inputs by the analysis; the numerics guard checks fresh inputs again): answered from the warm-up
            # during capture, where a sync would raise, so the graph keeps the path they chose.
            replay = host_sync_mode(replay=recorder.values)
            with torch.cuda.graph(graph), replay:
                static_output = workload.step(model, static_inputs)
            where = ", ".join(analysis.baked_where[:2]) + (", ..." if len(analysis.baked_where) > 2 else "")
            changes.append(
                f"{len(recorder.values)} host sync(s) inside {where} baked into the graph: they took the same"
                " values on the example and on fresh inputs, so they choose a fixed path for these shapes"
            )
        else:
            with torch.cuda.graph(graph):  # a private memory pool for this graph
                static_output = workload.step(model, static_inputs)
        torch.cuda.synchronize()
        grads = [(slot.owner, slot.owner.grad) for slot in state if slot.kind == "grad" and slot.get() is not None]
        # Tensors only: Python numbers are left as the warm-up made them (a cache's "initialized" flag must not
        # go back to False under a graph that holds its tensors).
        state.restore(before, [path for path in before.values if state[path].kind not in ("grad", "scalar")])
        del before

        graphed = GraphedStep(graph, tuple(static_inputs), static_output, model, grads)
        # The workload keeps its own example inputs: each step copies them into the static buffers (two small
        # device copies for a decode step, as a serving loop feeding new tokens pays too). Were the static
        # buffers its inputs, the numerics guard's random inputs would stay in them after the guard ran.
        patched = workload.with_step(model, graphed.step)
        ops = analysis.ops_per_run[0] if analysis.ops_per_run else 0
        changes.insert(0, f"the whole step ({ops} aten ops) captured in one CUDA graph, replayed each step")
        changes.append(
            "inputs are copied into static buffers before each replay; the output is overwritten by the next"
        )
        return Applied(patched, changes)


def make_capturable(roots: dict[str, Any], undo: list | None = None) -> list[str]:
    """Set ``capturable=True`` on the CUDA optimizers reachable from ``roots`` that have the option and lack it,
    moving their step counters to the GPU; return one line per optimizer changed.

    A non-capturable Adam/AdamW keeps its step count on the CPU and reads it with ``.item()``: a graph would
    bake the count in, and PyTorch refuses to capture it. The capturable form computes the same update on the
    GPU. ``undo``, when given, receives one function per change that puts it back.
    """
    import torch

    from gpuadvisor.fixes.state import optimizers_in

    changes = []
    for optimizer in optimizers_in(roots):
        if "capturable" not in optimizer.defaults:
            continue
        groups = [group for group in optimizer.param_groups if not group.get("capturable")]
        if not groups or any(p.device.type != "cuda" for group in groups for p in group["params"]):
            continue
        for group in groups:
            previous = group.get("capturable")
            group["capturable"] = True
            if undo is not None:
                undo.append(lambda group=group, previous=previous: group.__setitem__("capturable", previous))
            for parameter in group["params"]:
                entry = optimizer.state.get(parameter)
                step = entry.get("step") if entry else None
                if isinstance(step, torch.Tensor) and step.device != parameter.device:
                    entry["step"] = step.to(parameter.device, torch.float32)
                    if undo is not None:
                        undo.append(lambda entry=entry, step=step: entry.__setitem__("step", step))
        changes.append(
            f"{type(optimizer).__name__}: capturable=True (its step counters on the GPU, as a CUDA graph needs)"
        )
    return changes
