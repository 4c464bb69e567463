"""The ``fusion`` fix: swap the model's memory-bound chains for the Triton kernels in gpuadvisor/kernels/.

What it looks for, by structure (attribute names and types, never by guessing from kernel names):

- RMSNorm-like modules: a class whose name contains ``RMSNorm`` (``torch.nn.RMSNorm``, transformers'
  ``LlamaRMSNorm``, gpt-fast's ``RMSNorm``) with a 1-D ``weight``, no bias and an epsilon attribute
  (``eps``, ``variance_epsilon`` or ``epsilon``) -> :class:`FusedRMSNorm`.
- SwiGLU MLPs: three bias-free linears named ``w1``/``w3``/``w2`` (gpt-fast) or
  ``gate_proj``/``up_proj``/``down_proj`` (transformers) -> :class:`FusedSwiGLU`.
- gpt-fast style attention: ``wqkv``, ``wo``, ``n_heads``, ``kv_cache.k_cache``/``v_cache`` of shape
  [B, H, T, hd] and a forward taking (x, input_pos, rope/freqs_cis, mask) -> :class:`FusedDecodeAttention`.
  Grouped-query attention (fewer cache heads than query heads) and masks other than causal-by-position
  are left alone.
- transformers attention: ``q_proj``/``k_proj``/``v_proj``/``o_proj`` linears (biases and grouped-query
  attention allowed), integer ``head_dim``, ``num_key_value_groups`` and ``layer_idx``, no other submodules
  (Qwen3's ``q_norm``/``k_norm`` are not covered), no sliding window or logit soft-capping, and a forward taking
  ``hidden_states``, ``position_embeddings``, ``attention_mask`` and the cache (``past_key_values``, or
  ``cache`` in newer transformers) -> :class:`FusedHFAttention`. The recorded call must have used an
  initialized static cache layer (``StaticCache``) and a mask that is None or causal by position (slot t
  visible iff t <= the slot written; boolean, or additive 0 / -inf); at run time another cache or more than
  16 rows runs the original forward.
- Pre-norm blocks with ``attention_norm``/``attention``/``ffn_norm``/``feed_forward`` ->
  :class:`FusedPreNormBlock`, and transformers decoder layers (``input_layernorm``/``self_attn``/
  ``post_attention_layernorm``/``mlp``, ``self_attn`` a transformers attention as above) ->
  :class:`FusedHFDecoderLayer`: the residual add fused into the second norm; a transformers layer passes
  every argument through to ``self_attn`` as the library does and returns its tensor.
- Every remaining ``nn.Linear`` -> :class:`DecodeLinear` (a decode-shape kernel for at most 16 rows).

Nothing is swapped on trust: the fix runs the workload's step once on a copy of the model with hooks
that record each candidate's real inputs and output, builds the replacement, runs it on those inputs and
keeps it only if it reproduces the recorded output (relative L2 within the single-kernel bound for the
dtype: 1e-2 for bf16/fp16, 1e-4 for fp32). A module that fails, or that the step never called, is
listed in ``skipped`` with the reason. The whole patched model then goes through the numerics guard.

A transformers attention or decoder layer writes the cache object it is called with, so its recorded call
cannot simply be replayed: the recording also keeps a copy of that layer's static cache (``keys``, ``values``,
``cumulative_length``) before and after the call. The check puts the "before" state back (with the slots the
call writes set to NaN, so a write that does not happen shows), replays, compares the output and the cache
against the recorded "after" (the written slots within the module bound, every other slot and the counter
exactly), then restores the cache as the recording step left it.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal
from gpuadvisor.fixes.graphs import clone_tensors
from gpuadvisor.fixes.numerics import relative_l2

# Relative L2 a replacement may differ from the module it replaces on the module's recorded inputs
# (DESIGN.md: single kernels keep the fixed per-dtype bounds).
MODULE_BOUNDS = {"bfloat16": 1e-2, "float16": 1e-2, "float32": 1e-4}

MLP_NAMES = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"))  # (gate, up, down)
BLOCK_NAMES = ("attention_norm", "attention", "ffn_norm", "feed_forward")
HF_BLOCK_NAMES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
HF_ATTENTION_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")
HF_ATTENTION_ARGS = ("hidden_states", "position_embeddings", "attention_mask")
EPS_NAMES = ("eps", "variance_epsilon", "epsilon")


class FusionFix(Fix):
    id = "fusion"
    title = "Fused Triton kernels (RMSNorm, residual add + RMSNorm, SwiGLU, decode attention, decode linear)"
    numerics = "model"

    def check(self, workload: Any) -> Refusal | None:
        try:
            import torch
            from torch import nn
        except ImportError:
            return Refusal("fusion needs PyTorch", "pip install torch")
        model = workload.model
        if not isinstance(model, nn.Module):
            return Refusal(
                f"the model is a {type(model).__name__}, not a torch.nn.Module: fusion swaps modules",
                "return the nn.Module itself from build()",
            )
        from gpuadvisor.fixes.safety import model_device

        device = model_device(model)
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if not interpreted and (not torch.cuda.is_available() or device is None or not device.startswith("cuda")):
            where = "no CUDA device" if not torch.cuda.is_available() else f"the model is on {device}"
            return Refusal(f"the Triton kernels need a CUDA GPU ({where})", "build the model on the GPU: .cuda()")
        try:
            import triton  # noqa: F401
        except ImportError:
            return Refusal("fusion needs Triton, which is not installed", "pip install triton")
        if model.training:
            return Refusal(
                "the model is in training mode; the fused kernels are inference-only (no backward)",
                "call model.eval() (and run the step under torch.no_grad()) before apply",
            )
        plan = find_candidates(model)
        if not any(plan[key] for key in ("norms", "mlps", "attentions", "hf_attentions", "linears")):
            return Refusal(
                "found no RMSNorm-like module, SwiGLU MLP, gpt-fast attention or nn.Linear to fuse",
                "the fused kernels cover Llama-style decoders; see docs/apply.md",
            )
        return None

    def apply(self, workload: Any) -> Applied:
        import torch

        model = copy.deepcopy(workload.model)
        plan = find_candidates(model)
        skipped = list(plan["skipped"])
        patched = workload.with_model(model)
        linear_rows: dict[str, int] = {}
        states: dict[str, tuple] = {}
        with torch.no_grad():
            recorded = _record_calls(model, plan, patched, linear_rows, states)
            changes: list[str] = []
            model = _swap_norms(model, plan["norms"], recorded, changes, skipped)
            model = _swap_mlps(model, plan["mlps"], recorded, changes, skipped)
            model = _swap_attentions(model, plan["attentions"], recorded, changes, skipped)
            model = _swap_hf_attentions(model, plan["hf_attentions"], recorded, states, changes, skipped)
            model = _swap_blocks(model, plan["blocks"], recorded, changes, skipped)
            model = _swap_hf_blocks(model, plan["hf_blocks"], recorded, states, changes, skipped)
            model = _swap_linears(model, changes, skipped, linear_rows)
        if not changes:
            # Nothing a kernel here would run faster at these shapes: refuse, rather than "apply" a no-op.
            reasons = list(dict.fromkeys(item["reason"].split(":")[0] for item in skipped))
            seen = "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "") if reasons else "no module matched"
            raise NothingToApply(
                Refusal(
                    f"nothing to fuse at these shapes ({seen})",
                    "torch.compile fuses arbitrary elementwise chains; see `skipped` for each module left alone",
                    [f"{item['target']}: {item['reason']}" for item in skipped[:20]],
                )
            )
        return Applied(workload.with_model(model), changes=changes, skipped=skipped)


# --- finding candidates -------------------------------------------------------------------------


def find_candidates(model) -> dict[str, list]:
    """Names of the modules each swap would replace, plus ``skipped`` entries for look-alikes it won't touch."""
    from torch import nn

    from gpuadvisor.fixes.modules import DecodeLinear, attention_arg_roles

    plan: dict[str, list] = {
        "norms": [],
        "mlps": [],
        "attentions": [],
        "hf_attentions": [],
        "blocks": [],
        "hf_blocks": [],
        "linears": [],
        "skipped": [],
    }
    covered: set[str] = set()  # linears a fused MLP or attention takes over
    for name, module in model.named_modules():
        kind = type(module).__name__
        if "rmsnorm" in kind.lower() and not _is_replacement(module):
            eps = rmsnorm_eps(module)
            weight = getattr(module, "weight", None)
            if eps is None or weight is None or weight.dim() != 1 or getattr(module, "bias", None) is not None:
                plan["skipped"].append(
                    {"target": name or kind, "reason": f"{kind}: no 1-D weight and epsilon, or it has a bias"}
                )
            else:
                plan["norms"].append((name, eps))
            continue
        for gate, up, down in MLP_NAMES:
            parts = [getattr(module, attr, None) for attr in (gate, up, down)]
            if all(isinstance(part, (nn.Linear, DecodeLinear)) for part in parts):
                if any(part.bias is not None for part in parts):
                    plan["skipped"].append({"target": name, "reason": f"{kind}: its projections have biases"})
                else:
                    plan["mlps"].append((name, (gate, up, down)))
                    covered.update(f"{name}.{attr}" if name else attr for attr in (gate, up, down))
        if all(hasattr(module, attr) for attr in ("wqkv", "wo", "kv_cache", "n_heads")):
            reason = _attention_unsupported(module)
            roles = attention_arg_roles(module.forward)
            if reason is None and roles is None:
                reason = "forward does not take (x, input_pos, rope/freqs_cis, mask) by those names"
            if reason is not None:
                plan["skipped"].append({"target": name, "reason": f"{kind}: {reason}"})
            else:
                plan["attentions"].append((name, roles))
                covered.update(f"{name}.{attr}" if name else attr for attr in ("wqkv", "wo"))
        if all(hasattr(module, attr) for attr in HF_ATTENTION_NAMES) and not _is_replacement(module):
            reason, heads = _hf_attention_unsupported(module)
            if reason is not None:
                plan["skipped"].append({"target": name, "reason": f"{kind}: {reason}"})
            else:
                plan["hf_attentions"].append((name, heads))
        if all(hasattr(module, attr) for attr in BLOCK_NAMES):
            plan["blocks"].append((name, BLOCK_NAMES))
        elif all(hasattr(module, attr) for attr in HF_BLOCK_NAMES):
            attention = getattr(module, HF_BLOCK_NAMES[1])
            if all(hasattr(attention, attr) for attr in HF_ATTENTION_NAMES):
                plan["hf_blocks"].append((name, HF_BLOCK_NAMES))
            else:
                plan["skipped"].append(
                    {
                        "target": name,
                        "reason": f"{kind}: residual add + norm not fused (a transformers decoder layer whose "
                        "self_attn has no q_proj/k_proj/v_proj/o_proj); its norms, MLP and linears are swapped",
                    }
                )
    for name, module in model.named_modules():
        if type(module) is nn.Linear and name not in covered:
            plan["linears"].append(name)
        elif isinstance(module, nn.Linear) and type(module) is not nn.Linear:
            plan["skipped"].append({"target": name, "reason": f"{type(module).__name__} subclasses nn.Linear"})
    return plan


def rmsnorm_eps(module) -> float | None:
    for attr in EPS_NAMES:
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    if hasattr(module, "eps") and module.eps is None and getattr(module, "weight", None) is not None:
        import torch

        return float(torch.finfo(module.weight.dtype).eps)  # torch.nn.RMSNorm(eps=None)
    return None


def _attention_unsupported(module) -> str | None:
    import torch

    cache = module.kv_cache
    k_cache, v_cache = getattr(cache, "k_cache", None), getattr(cache, "v_cache", None)
    if not isinstance(k_cache, torch.Tensor) or not isinstance(v_cache, torch.Tensor) or k_cache.dim() != 4:
        return "kv_cache has no k_cache/v_cache tensors of shape [batch, heads, slots, head_dim]"
    n_heads = module.n_heads
    if not isinstance(n_heads, int) or k_cache.shape[1] != n_heads:
        return f"grouped-query attention ({k_cache.shape[1]} cache heads, {n_heads} query heads) is not covered"
    head_dim = k_cache.shape[3]
    if module.wqkv.weight.shape[0] != 3 * n_heads * head_dim:
        return "wqkv does not project to 3 x heads x head_dim"
    return None


def _hf_attention_unsupported(module) -> tuple[str | None, tuple[int, int]]:
    """(None, (H, KVH)) when ``module`` is a transformers attention FusedHFAttention covers, else (reason, ())."""
    import inspect

    from torch import nn

    from gpuadvisor.fixes.modules import HF_CACHE_ARGS, DecodeLinear

    parts = [getattr(module, attr) for attr in HF_ATTENTION_NAMES]
    if not all(type(part) is nn.Linear or (type(part) is DecodeLinear and not part.is_fp8) for part in parts):
        return "its q/k/v/o projections are not all plain nn.Linear layers", ()
    head_dim, groups, layer_idx = (
        getattr(module, attr, None) for attr in ("head_dim", "num_key_value_groups", "layer_idx")
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (head_dim, groups, layer_idx)):
        return "no integer head_dim, num_key_value_groups and layer_idx", ()
    if head_dim < 2 or head_dim % 2 or groups < 1:
        return f"head_dim {head_dim} is not even, or num_key_value_groups {groups} < 1", ()
    q, k, v, o = parts
    n_q, n_k = q.weight.shape[0], k.weight.shape[0]
    if n_q % head_dim or n_k % head_dim or v.weight.shape[0] != n_k or o.weight.shape[1] != n_q:
        return "the projections do not split into heads of head_dim", ()
    n_heads, n_kv_heads = n_q // head_dim, n_k // head_dim
    if n_kv_heads * groups != n_heads:
        return f"{n_heads} query heads are not {groups} x {n_kv_heads} KV heads", ()
    if len({(p.weight.dtype, p.weight.device, p.weight.shape[1]) for p in (q, k, v)}) != 1:
        return "q/k/v projections differ in dtype, device or input width", ()
    extra = sorted(set(dict(module.named_children())) - set(HF_ATTENTION_NAMES))
    if extra:
        return f"it has submodules the fused kernels do not apply ({', '.join(extra)})", ()
    for attr in ("sliding_window", "attn_logit_softcapping", "logit_softcapping"):
        if getattr(module, attr, None) is not None:
            return f"{attr} is set (not covered by the decode attention kernel)", ()
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return "its forward has no signature", ()
    if not all(arg in params for arg in HF_ATTENTION_ARGS) or not any(arg in params for arg in HF_CACHE_ARGS):
        return "forward does not take (hidden_states, position_embeddings, attention_mask, cache) by those names", ()
    return None, (n_heads, n_kv_heads)


def _is_replacement(module) -> bool:
    return type(module).__module__ == "gpuadvisor.fixes.modules"


# --- recording real inputs ----------------------------------------------------------------------


def _record_calls(
    model, plan, workload, linear_rows: dict[str, int] | None = None, states: dict[str, tuple] | None = None
) -> dict[str, tuple]:
    """Run the step once with hooks; the first call of each candidate: (args, kwargs, output), detached copies.

    ``linear_rows``, when given, receives the most rows each ``nn.Linear`` was called with (no copies).
    ``states``, when given, receives for each transformers attention or decoder layer whose first call used a
    static cache layer: (layer, state before the call, state after it) (:func:`_layer_state` copies).
    """
    import torch
    from torch import nn

    stateful = [name for name, _ in plan.get("hf_attentions", []) + plan.get("hf_blocks", [])]
    names = [name for name, _ in plan["norms"] + plan["mlps"] + plan["attentions"] + plan["blocks"]] + stateful
    recorded: dict[str, tuple] = {}
    before: dict[str, tuple] = {}
    handles = []

    def rows_hook(name):
        def hook(module, args):
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.dim() and x.shape[-1]:
                linear_rows[name] = max(linear_rows.get(name, 0), x.numel() // x.shape[-1])

        return hook

    if linear_rows is not None:
        for name, module in model.named_modules():
            if type(module) is nn.Linear:
                handles.append(module.register_forward_pre_hook(rows_hook(name)))

    def hook_for(name):
        def hook(module, args, kwargs, output):
            if name not in recorded:
                recorded[name] = (clone_tensors(args), clone_tensors(kwargs), clone_tensors(output))
                if states is not None and name in before:
                    layer, state = before[name]
                    states[name] = (layer, state, _layer_state(layer))

        return hook

    def pre_hook_for(name):
        def hook(module, args, kwargs):
            if name not in recorded and name not in before:
                layer = _hf_call_layer(module, args, kwargs)
                if layer is not None:
                    before[name] = (layer, _layer_state(layer))

        return hook

    for name in dict.fromkeys(names):
        module = model.get_submodule(name)
        if states is not None and name in stateful:
            handles.append(module.register_forward_pre_hook(pre_hook_for(name), with_kwargs=True))
        handles.append(module.register_forward_hook(hook_for(name), with_kwargs=True))
    try:
        workload.step_fn()
    finally:
        for handle in handles:
            handle.remove()
    return recorded


_STATE_NAMES = ("keys", "values", "cumulative_length")


def _hf_call_layer(module, args, kwargs):
    """The static cache layer a transformers attention (or the decoder layer holding one) is called with, or None."""
    import inspect

    from gpuadvisor.fixes.modules import call_arguments, hf_cache_of, static_cache_layer

    attention = getattr(module, HF_BLOCK_NAMES[1], module)
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    values = call_arguments(signature, args, kwargs)
    if values is None:
        return None
    return static_cache_layer(hf_cache_of(values), getattr(attention, "layer_idx", None))


def _layer_state(layer) -> dict:
    """Copies of a static cache layer's keys, values and counter."""
    return {attr: getattr(layer, attr).detach().clone() for attr in _STATE_NAMES}


def _put_state(layer, state: dict) -> None:
    """Write ``state`` back into the layer's own tensors, in place (a CUDA graph reads them by address)."""
    for attr in _STATE_NAMES:
        getattr(layer, attr).copy_(state[attr])


def _matches_stateful(name: str, replacement, recorded, states, skipped, what: str, needs_cache: bool) -> bool:
    """``_matches`` for a module that writes a static cache layer: replayed from the recorded "before" state (the
    slots the call wrote set to NaN), its output and the layer's state compared with the recorded ones; the cache
    is put back as it was afterwards. A recorded call without any cache object replays as it is, unless
    ``needs_cache`` (the fused attention: without a static cache it would only run the original forward)."""
    import torch

    from gpuadvisor.fixes.modules import call_arguments, hf_cache_of

    if name not in recorded:
        return _matches(name, replacement, recorded, skipped, what)
    if name not in states and not needs_cache:
        args, kwargs, _ = recorded[name]
        signature = getattr(replacement, "_fused_signature", None)  # the original forward's
        values = call_arguments(signature, args, kwargs) if signature is not None else None
        if values is not None and hf_cache_of(values) is None:
            return _matches(name, replacement, recorded, skipped, what)  # no cache written: a plain replay
    if name not in states:
        skipped.append(
            {
                "target": name,
                "reason": f"{what}: the step did not call it with an initialized transformers static cache layer "
                "(StaticCache), which the fused path needs",
            }
        )
        return False
    layer, before, after = states[name]
    current = _layer_state(layer)
    start, stop = int(before["cumulative_length"]), int(after["cumulative_length"])
    try:
        _put_state(layer, before)
        if layer.keys.is_floating_point():
            layer.keys[:, :, start:stop] = float("nan")
            layer.values[:, :, start:stop] = float("nan")
        if not _matches(name, replacement, recorded, skipped, what):
            return False
        reason = _state_differs(_layer_state(layer), after, start, stop)
        if reason is not None:
            skipped.append({"target": name, "reason": f"{what}: {reason}"})
            return False
        return True
    finally:
        with torch.no_grad():
            _put_state(layer, current)


def _state_differs(got: dict, expected: dict, start: int, stop: int) -> str | None:
    """None when the cache state matches: the counter and every slot outside [start, stop) exactly, the
    written slots within the module bound."""
    import torch

    if not torch.equal(got["cumulative_length"], expected["cumulative_length"]):
        return (
            f"the cache counter is {int(got['cumulative_length'])} after the call, the library's is "
            f"{int(expected['cumulative_length'])}"
        )
    for attr in ("keys", "values"):
        g, e = got[attr], expected[attr]
        outside = torch.ones(g.shape[2], dtype=torch.bool, device=g.device)
        outside[start:stop] = False
        if not torch.equal(g[:, :, outside], e[:, :, outside]):
            return f"the cache's {attr} differ from the library's outside the slots written ({start}..{stop - 1})"
        bound = MODULE_BOUNDS.get(str(e.dtype).replace("torch.", ""), 1e-2)
        written = g[:, :, start:stop]
        error = relative_l2(written, e[:, :, start:stop]) if written.numel() else 0.0
        if not bool(torch.isfinite(written).all()) or not error <= bound:
            return f"the cache's {attr} written at slots {start}..{stop - 1} differ from the library's ({error:.2e})"
    return None


def _matches(name: str, replacement, recorded, skipped, what: str) -> bool:
    """Run ``replacement`` on the module's recorded inputs; True when it reproduces the recorded output.

    A tuple output (a transformers attention's ``(output, weights)``) is judged by its first tensor; the other
    items must be None in both."""
    import torch

    if name not in recorded:
        skipped.append({"target": name, "reason": f"{what}: not called by the step, so it could not be checked"})
        return False
    args, kwargs, expected = recorded[name]
    try:
        got = replacement(*clone_tensors(args), **clone_tensors(kwargs))
    except Exception as error:  # a kernel that rejects this input: leave the module alone
        skipped.append({"target": name, "reason": f"{what}: replacement raised {type(error).__name__}: {error}"})
        return False
    if isinstance(expected, tuple) and isinstance(got, tuple) and len(expected) == len(got) and expected:
        if any(item is not None for item in expected[1:]):
            skipped.append(
                {
                    "target": name,
                    "reason": f"{what}: the original returns more than its output (attention weights: eager "
                    "attention?), which the fused kernels do not compute",
                }
            )
            return False
        if any(item is not None for item in got[1:]):
            skipped.append({"target": name, "reason": f"{what}: the replacement returns more than the original"})
            return False
        expected, got = expected[0], got[0]
    if not isinstance(expected, torch.Tensor) or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        skipped.append(
            {"target": name, "reason": f"{what}: the replacement's output does not have the original's shape"}
        )
        return False
    dtype = str(expected.dtype).replace("torch.", "")
    bound = MODULE_BOUNDS.get(dtype, 1e-2)
    error = relative_l2(got, expected)
    if not error <= bound:
        skipped.append(
            {
                "target": name,
                "reason": f"{what}: output differs from the original (relative L2 {error:.2e} > {bound:.0e})",
            }
        )
        return False
    return True


def _replace(model, name: str, new):
    if not name:
        return new
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, new)
    return model


# --- the swaps ----------------------------------------------------------------------------------


def _swap_norms(model, norms, recorded, changes, skipped):
    from gpuadvisor.fixes.modules import FusedRMSNorm

    done = 0
    for name, eps in norms:
        module = model.get_submodule(name)
        fused = FusedRMSNorm(module.weight, eps)
        if _matches(name, fused, recorded, skipped, type(module).__name__):
            model = _replace(model, name, fused)
            done += 1
    if done:
        changes.append(f"{done} RMSNorm module{'s' if done != 1 else ''} -> Triton rmsnorm (one kernel each)")
    return model


def _swap_mlps(model, mlps, recorded, changes, skipped):
    from gpuadvisor.fixes.modules import FusedSwiGLU, as_decode_linear, install

    done = 0
    for name, names in mlps:
        module = model.get_submodule(name)
        what = f"{type(module).__name__} (expected down(silu(gate(x)) * up(x)))"
        undo = install(
            module, FusedSwiGLU, {attr: as_decode_linear(getattr(module, attr)) for attr in names}, _fused_names=names
        )
        if _matches(name, module, recorded, skipped, what):
            done += 1
        else:
            undo()
    if done:
        changes.append(
            f"{done} SwiGLU MLP{'s' if done != 1 else ''} -> gate/up projections + SiLU product in one kernel "
            "at decode shapes (Triton swiglu otherwise)"
        )
    return model


def _swap_attentions(model, attentions, recorded, changes, skipped):
    import inspect

    from gpuadvisor.fixes.modules import FusedDecodeAttention, as_decode_linear, install

    done = 0
    for name, roles in attentions:
        module = model.get_submodule(name)
        what = type(module).__name__
        reason = _mask_not_causal(recorded.get(name), roles, module.forward)
        if reason is not None:
            skipped.append({"target": name, "reason": f"{what}: {reason}"})
            continue
        undo = install(
            module,
            FusedDecodeAttention,
            {"wqkv": as_decode_linear(module.wqkv), "wo": as_decode_linear(module.wo)},
            _fused_roles=roles,
            _fused_signature=inspect.signature(module.forward),
        )
        if _matches(name, module, recorded, skipped, what):
            done += 1
        else:
            undo()
    if done:
        changes.append(
            f"{done} attention module{'s' if done != 1 else ''} -> rotary + KV-cache write in one kernel and "
            "split-slot decode attention (at most 16 query rows; the original forward otherwise); the mask is "
            "taken to stay causal by position, as it was on the recorded call"
        )
    return model


def _mask_not_causal(record, roles, forward) -> str | None:
    """None when the recorded mask lets query s see exactly the cache slots t <= input_pos[s]."""
    import inspect

    import torch

    if record is None:
        return None  # _matches reports it
    args, kwargs, _ = record
    try:
        values = inspect.signature(forward).bind(*args, **kwargs).arguments
    except TypeError as error:
        return f"could not bind the recorded call ({error})"
    mask, input_pos = values.get(roles["mask"]), values.get(roles["input_pos"])
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not isinstance(input_pos, torch.Tensor):
        return "the attention mask is not a boolean tensor (the fused kernel masks by position)"
    slots = mask.shape[-1]
    expected = torch.arange(slots, device=mask.device)[None, :] <= input_pos.reshape(-1, 1)
    if mask.shape[-2] != expected.shape[0] or not bool((mask == expected).all()):
        return "the attention mask is not causal by position (slot t visible iff t <= input_pos)"
    return None


def _swap_hf_attentions(model, attentions, recorded, states, changes, skipped):
    import inspect

    from gpuadvisor.fixes.modules import FusedHFAttention, as_decode_linear, fused_qkv_linear, install

    done = 0
    grouped = 0
    for name, heads in attentions:
        module = model.get_submodule(name)
        what = type(module).__name__
        before = states[name][1] if name in states else None
        reason = _hf_mask_not_causal(recorded.get(name), before, module.forward)
        if reason is not None:
            skipped.append({"target": name, "reason": f"{what}: {reason}"})
            continue
        signature = inspect.signature(module.forward)
        undo = install(
            module,
            FusedHFAttention,
            {"o_proj": as_decode_linear(module.o_proj)},
            _fused_signature=signature,
            _fused_qkv=fused_qkv_linear(module),
            _fused_heads=tuple(heads),
        )
        if _matches_stateful(name, module, recorded, states, skipped, what, needs_cache=True):
            done += 1
            grouped += heads[1] < heads[0]
        else:
            undo()
    if done:
        gqa = f" ({grouped} with grouped-query attention, the KV heads read in place)" if grouped else ""
        changes.append(
            f"{done} transformers attention module{'s' if done != 1 else ''}{gqa} -> q/k/v in one decode GEMV, "
            "rotary + static-cache write in one kernel, split-slot decode attention (at most 16 rows with a "
            "StaticCache layer; the original forward otherwise); the mask is taken to stay causal by position, "
            "as it was on the recorded call"
        )
    return model


def _hf_mask_not_causal(record, state, forward) -> str | None:
    """None when the recorded attention mask is None or lets query s see exactly the slots t <= start + s, where
    start is the cache counter before the call (the slot StaticLayer.update writes); a boolean mask (True =
    visible) or an additive float one (0 visible, -inf or the dtype's minimum masked)."""
    import inspect

    import torch

    from gpuadvisor.fixes.modules import call_arguments

    if record is None or state is None:
        return None  # _matches_stateful reports it
    args, kwargs, _ = record
    values = call_arguments(inspect.signature(forward), args, kwargs)
    if values is None:
        return "could not bind the recorded call to the forward's signature"
    mask, x = values.get("attention_mask"), values.get("hidden_states")
    if mask is None:
        return None  # what the kernel computes is then checked against the recorded output
    if not isinstance(mask, torch.Tensor) or not isinstance(x, torch.Tensor) or x.dim() != 3 or mask.dim() < 2:
        return f"the attention mask is a {type(mask).__name__}, not a tensor (the fused kernel masks by position)"
    if mask.dtype == torch.bool:
        visible = mask
    elif mask.is_floating_point():
        visible = mask == 0
        hidden = (mask == float("-inf")) | (mask <= torch.finfo(mask.dtype).min / 2)
        if not bool((visible | hidden).all()):
            return "the additive attention mask holds values other than 0 and -inf (a bias the kernel does not add)"
    else:
        return f"the attention mask has dtype {mask.dtype}, neither bool nor floating point"
    seq, slots = x.shape[1], mask.shape[-1]
    start = int(state["cumulative_length"])
    positions = torch.arange(seq, device=mask.device) + start
    expected = torch.arange(slots, device=mask.device)[None, :] <= positions[:, None]
    if visible.shape[-2] != seq or not bool((visible == expected).all()):
        return "the attention mask is not causal by position (slot t visible iff t <= the slot written)"
    return None


def _swap_hf_blocks(model, blocks, recorded, states, changes, skipped):
    import inspect

    from gpuadvisor.fixes.modules import FusedHFDecoderLayer, FusedRMSNorm, install

    done = 0
    for name, names in blocks:
        module = model.get_submodule(name)
        kind = type(module).__name__
        if not isinstance(getattr(module, names[2]), FusedRMSNorm):
            skipped.append({"target": name, "reason": f"{kind}: its {names[2]} was not swapped"})
            continue
        what = f"{kind} (expected h = x + self_attn(norm(x))[0]; h + mlp(norm(h)))"
        undo = install(
            module,
            FusedHFDecoderLayer,
            {},
            _fused_names=names,
            _fused_signature=inspect.signature(module.forward),
        )
        if _matches_stateful(name, module, recorded, states, skipped, what, needs_cache=False):
            done += 1
        else:
            undo()
    if done:
        changes.append(
            f"{done} transformers decoder layer{'s' if done != 1 else ''} -> residual add + RMSNorm in one kernel"
        )
    return model


def _swap_blocks(model, blocks, recorded, changes, skipped):
    from gpuadvisor.fixes.modules import FusedPreNormBlock, FusedRMSNorm, install

    done = 0
    for name, names in blocks:
        module = model.get_submodule(name)
        if not isinstance(getattr(module, names[2]), FusedRMSNorm):
            skipped.append({"target": name, "reason": f"{type(module).__name__}: its {names[2]} was not swapped"})
            continue
        what = f"{type(module).__name__} (expected h = x + attention(norm(x)); h + mlp(norm(h)))"
        undo = install(module, FusedPreNormBlock, {}, _fused_names=names)
        if _matches(name, module, recorded, skipped, what):
            done += 1
        else:
            undo()
    if done:
        changes.append(f"{done} pre-norm block{'s' if done != 1 else ''} -> residual add + RMSNorm in one kernel")
    return model


def _swap_linears(model, changes, skipped, rows: dict[str, int]):
    """Every ``nn.Linear`` the step calls with at most MAX_ROWS rows -> DecodeLinear; with more rows cuBLAS
    runs it already (DecodeLinear would only call it), so those are left alone and listed in ``skipped``."""
    from torch import nn

    from gpuadvisor.fixes.modules import MAX_ROWS, DecodeLinear

    names = [name for name, module in model.named_modules() if type(module) is nn.Linear]
    wider = []
    for name in names:
        if name not in rows:
            continue  # not called by the step (or called inside a fused module that streams its weight)
        if rows[name] > MAX_ROWS:
            wider.append(name)
            continue
        model = _replace(model, name, DecodeLinear.from_linear(model.get_submodule(name)))
    if wider:
        most = max(rows[name] for name in wider)
        skipped.append(
            {
                "target": ", ".join(wider[:3]) + (f" and {len(wider) - 3} more" if len(wider) > 3 else ""),
                "reason": f"linear layers called with more than {MAX_ROWS} rows (up to {most}): cuBLAS runs them"
                " already, the decode kernel would not",
            }
        )
    total = sum(isinstance(module, DecodeLinear) for module in model.modules())
    if total:
        changes.append(
            f"{total} linear layer{'s' if total != 1 else ''} -> decode-shape Triton GEMV for at most 16 rows "
            "(cuBLAS above)"
        )
    return model
