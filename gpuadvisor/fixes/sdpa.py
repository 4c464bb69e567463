"""The ``sdpa`` fix: transformers models on the eager attention path run on ``scaled_dot_product_attention``.

Why: the eager path writes the whole score matrix and reads it back for the scaling, the mask and the softmax:
for the GPT-2 example (examples/real/hf_gpt2_eager_attention.py) that is [8, 12, 1024, 1024] in fp16, about
200 MB per layer and four passes over it, where PyTorch's fused SDPA kernels never write it.

transformers picks the attention of every layer at call time from ``config._attn_implementation`` ("eager",
"sdpa", "flash_attention_2", ...), and builds the attention mask for it the same way. ``check()`` finds the
transformers models a workload holds: ``PreTrainedModel`` instances on the model itself or on a training state's
attributes (``state.model``), and every ``PreTrainedModel`` submodule of those (a composite model's towers).
A config on "eager" is switched when every model class using it supports SDPA in the installed transformers
(the class attribute ``_supports_sdpa``, which transformers 5.x itself checks before dispatching to SDPA, and
``_can_set_attn_implementation()``, its test that the modelling code takes the implementation from the
config's attention interface) and the config does not ask for the attention weights (``output_attentions``:
only the eager path computes them).

``apply()`` wraps the user's step: for the duration of each call the switched configs read "sdpa", and in a
``finally`` they are put back to "eager". The model, its weights and optimizer are shared with the original;
between calls nothing about the original changes. SDPA computes the same softmax attention in another order:
the guard's "model" policy judges it (fp32: relative L2 1e-4; fp16/bf16 against an fp32 copy).

Refused: no transformers model (a model of another library: the fix only knows transformers' switch;
``torch.nn.functional.scaled_dot_product_attention`` in the model's own attention does the same there),
attention already on "sdpa" or a flash kernel, a class without SDPA support.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuadvisor.fixes.base import Applied, Fix, NothingToApply, Refusal

TARGET = "sdpa"


def transformers_models(model: Any) -> list[tuple[str, Any]]:
    """(path, PreTrainedModel) for every transformers model the workload's model is or holds, submodules too,
    each once; [] when transformers is not installed or imported."""
    import sys

    from gpuadvisor.fixes.copying import held_modules

    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is None:  # the user's code never imported transformers: no transformers model can be here
        return []
    pretrained = modeling.PreTrainedModel
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for root_path, root in held_modules(model):
        for name, module in root.named_modules():
            if isinstance(module, pretrained) and id(module) not in seen:
                seen.add(id(module))
                found.append((f"{root_path}.{name}" if name else root_path, module))
    return found


class SdpaFix(Fix):
    """Switch transformers' eager attention to SDPA for the duration of each step (see the module docstring)."""

    id = "sdpa"
    title = "attention -> scaled_dot_product_attention"
    numerics = "model"

    def plan(self, workload: Any) -> tuple[list[Any], list[str], list[dict[str, str]], Refusal | None]:
        """(configs to switch, their model classes, skipped places, refusal)."""
        from gpuadvisor.fixes.copying import held_modules

        if getattr(workload.step, "_gpuadvisor_attention", None) == TARGET:
            return [], [], [], Refusal("attention already runs on 'sdpa' (switched by this fix during each step)")
        models = transformers_models(workload.model)
        if not models:
            modules = held_modules(workload.model)
            what = type(modules[0][1]).__name__ if modules else type(workload.model).__name__
            return (
                [],
                [],
                [],
                Refusal(
                    f"no transformers model: {what} is not a transformers PreTrainedModel, and this fix recognises"
                    " only transformers' attention switch (config._attn_implementation)",
                    "in the model's own attention, call torch.nn.functional.scaled_dot_product_attention(q, k, v,"
                    " attn_mask=..., is_causal=...) instead of softmax(q @ k.transpose(-2, -1) * scale) @ v",
                ),
            )
        by_config: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}
        for path, module in models:
            by_config.setdefault(id(module.config), (module.config, []))[1].append((path, module))
        configs, classes, skipped = [], [], []
        current: set[str] = set()
        for config, users in by_config.values():
            implementation = config._attn_implementation
            path, first = users[0]
            name = type(first).__name__
            if implementation != "eager":
                current.add(str(implementation))
                skipped.append({"target": path, "reason": f"{name} already runs attention on {implementation!r}"})
                continue
            unsupported = [
                type(module).__name__
                for _, module in users
                if not getattr(type(module), "_supports_sdpa", False) or not _can_set(module)
            ]
            if unsupported:
                skipped.append(
                    {
                        "target": path,
                        "reason": f"{unsupported[0]} does not support SDPA in this transformers"
                        " (_supports_sdpa is False, or its attention does not read the config's switch)",
                    }
                )
                continue
            if getattr(config, "output_attentions", False):
                skipped.append(
                    {
                        "target": path,
                        "reason": f"{name}'s config asks for the attention weights (output_attentions=True),"
                        " which only the eager path computes",
                    }
                )
                continue
            configs.append(config)
            classes.append(name)
        if configs:
            return configs, classes, skipped, None
        blocked = [item for item in skipped if "already runs" not in item["reason"]]
        if not blocked:
            implementations = ", ".join(repr(value) for value in sorted(current))
            return (
                [],
                [],
                skipped,
                Refusal(
                    f"attention already runs on {implementations} ({skipped[0]['target']}:"
                    f" {type(models[0][1]).__name__})",
                    "nothing to do: transformers already dispatches to a fused attention kernel",
                ),
            )
        first = blocked[0]
        return (
            [],
            [],
            skipped,
            Refusal(
                f"{first['target']}: {first['reason']}",
                "load the model with attn_implementation='sdpa' where the class supports it, or keep eager",
                [f"{item['target']}: {item['reason']}" for item in blocked],
            ),
        )

    def check(self, workload: Any) -> Refusal | None:
        return self.plan(workload)[3]

    def apply(self, workload: Any) -> Applied:
        from gpuadvisor.fixes.copying import wrap_step

        configs, classes, skipped, refusal = self.plan(workload)
        if refusal is not None:
            raise NothingToApply(refusal)
        step = wrap_step(workload.step, lambda: attention_implementation(configs, TARGET))
        step._gpuadvisor_attention = TARGET  # a second sdpa on this workload refuses
        names = ", ".join(dict.fromkeys(classes))
        changes = [
            f"{names}: attention on 'sdpa' (torch.nn.functional.scaled_dot_product_attention) instead of 'eager'"
            f" during each step ({len(configs)} config(s) switched, put back to 'eager' after the step)",
            "the model, its weights and optimizer are shared with the original: only the attention path changes",
        ]
        return Applied(workload.with_step(workload.model, step), changes, skipped)


def _can_set(module: Any) -> bool:
    check = getattr(type(module), "_can_set_attn_implementation", None)
    if check is None:  # older transformers: no such test; _supports_sdpa alone decides
        return True
    try:
        return bool(check())
    except Exception:
        return False


@contextlib.contextmanager
def attention_implementation(configs: list[Any], implementation: str) -> Any:
    """Every config (and its sub-configs) on ``implementation`` inside the block, as it was after it."""
    touched: list[tuple[Any, Any]] = []
    seen: set[int] = set()

    def switch(config: Any) -> None:
        if id(config) in seen:
            return
        seen.add(id(config))
        touched.append((config, config._attn_implementation_internal))
        config._attn_implementation_internal = implementation
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and getattr(sub, "_attn_implementation_internal", None) == "eager":
                switch(sub)

    try:
        for config in configs:
            switch(config)
        yield
    finally:
        for config, previous in reversed(touched):
            config._attn_implementation_internal = previous
