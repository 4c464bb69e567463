"""What the suite's workload files share: the size switch and transformers' decoder recipes; and, for the
suite's tests and benchmarks, how to read a file's KIND and find a model's module and output head.

Not a workload: its name starts with ``_``, so the suite's tests and benchmarks skip it. The files import it
as a neighbour (``gpuadvisor`` puts a workload file's folder on ``sys.path`` while it loads the file).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from pathlib import Path

import torch

# The decoder configurations the decode and prefill workloads share (random weights; "small" for the CPU).
LLAMA_CONFIGS = {
    "full": dict(
        num_hidden_layers=8,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=16,
        intermediate_size=5632,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
    "small": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=176,
        vocab_size=256,
        max_position_embeddings=64,
    ),
}
# Qwen2: grouped-query attention (4 KV heads for 16 query heads at full size) and biases on q, k and v.
QWEN2_CONFIGS = {
    "full": {**LLAMA_CONFIGS["full"], "num_key_value_heads": 4, "intermediate_size": 5504},
    "small": {**LLAMA_CONFIGS["small"], "num_key_value_heads": 2},
}


def real_size() -> str:
    """'full' on a CUDA machine, else 'small'; the environment variable GPUADVISOR_REAL_SIZE=small|full wins."""
    size = os.environ.get("GPUADVISOR_REAL_SIZE", "").strip().lower()
    if size in ("small", "full"):
        return size
    if size:
        raise ValueError(f"GPUADVISOR_REAL_SIZE must be 'small' or 'full', got {size!r}")
    return "full" if torch.cuda.is_available() else "small"


def real_batch(default: int) -> int:
    """The batch a workload with one runs at: ``default``, or the environment variable GPUADVISOR_REAL_BATCH (a
    positive integer), e.g. to take a conv-net training step from host-bound (batch 64 on the H200) to
    GPU-bound."""
    text = os.environ.get("GPUADVISOR_REAL_BATCH", "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"GPUADVISOR_REAL_BATCH must be a positive integer, got {text!r}")
    return int(text)


@functools.cache
def cache_argument(model_class: type) -> str:
    """The keyword a causal LM's forward takes its cache object by: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name still works, with a deprecation warning); 5.17 knows only
    ``past_key_values``. Looked up once per class: a decode step is host-bound, so no per-step inspect."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def causal_lm(model_class: type, config, device: str, dtype: torch.dtype):
    """A transformers causal LM from ``config`` with random weights (the caller seeds), on ``device``, eval."""
    with torch.device(device):
        model = model_class(config)
    return model.to(dtype).eval()


def build_decode(model_class: type, config, *, cache_len: int, prompt_len: int, device: str, dtype: torch.dtype):
    """The model and the decode inputs ``(input_ids [1, 1], cache_position [1], StaticCache)``, the cache
    filled by a ``prompt_len``-token prompt."""
    from transformers import StaticCache

    model = causal_lm(model_class, config, device, dtype)
    cache = StaticCache(config=config, max_cache_len=cache_len)
    prompt = torch.randint(0, config.vocab_size, (1, prompt_len), device=device)
    with torch.no_grad():
        model(input_ids=prompt, use_cache=True, **{cache_argument(model_class): cache})

    # The largest id in the vocabulary: inputs drawn at random in [0, max + 1) then cover all of it.
    input_ids = torch.full((1, 1), config.vocab_size - 1, dtype=torch.long, device=device)
    cache_position = torch.tensor([prompt_len], device=device)
    return model, (input_ids, cache_position, cache)


def decode_step(model, inputs):
    """One token at ``cache_position``: each static cache layer writes where its own ``cumulative_length``
    counter points, so the counters are set to the position first (one small copy per layer, no host sync)
    and every step writes the same slot again."""
    input_ids, cache_position, cache = inputs
    for layer in cache.layers:
        layer.cumulative_length.copy_(cache_position[0])
    with torch.no_grad():
        return model(
            input_ids=input_ids,
            position_ids=cache_position.unsqueeze(0),
            use_cache=True,
            **{cache_argument(type(model)): cache},
        ).logits


def build_prefill(model_class: type, config, *, prompt_len: int, device: str, dtype: torch.dtype):
    """The model and one prompt ``(input_ids [1, prompt_len],)`` whose last id is the vocabulary's largest."""
    model = causal_lm(model_class, config, device, dtype)
    input_ids = torch.randint(0, config.vocab_size, (1, prompt_len), device=device)
    # The largest id in the vocabulary: inputs drawn at random in [0, max + 1) then cover all of it.
    input_ids[0, -1] = config.vocab_size - 1
    return model, (input_ids,)


def prefill_step(model, inputs):
    """One forward of the prompt, no cache, returning the logits."""
    (input_ids,) = inputs
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits


def kind_of(path: str | Path) -> str:
    """A suite file's ``KIND`` ("decode", "prefill", "train" or "infer"), read from its source, not imported."""
    match = re.search(r'^KIND = "(\w+)"', Path(path).read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{Path(path).name} has no KIND")
    return match.group(1)


def module_of(model):
    """The nn.Module a workload's model is or holds (a training state holds the module and its optimizer)."""
    if isinstance(model, torch.nn.Module):
        return model
    values = model.values() if isinstance(model, dict) else vars(model).values()
    return next(value for value in values if isinstance(value, torch.nn.Module))


def head_weight(module) -> tuple[str, torch.Tensor]:
    """The output head's weight, so that scaling it moves the output: transformers' output embedding (which a
    tied model shares with the input embedding), else the last 2-D floating parameter that is not all zeros
    (torchvision's ViT starts its head at zeros)."""
    names = {id(p): n for n, p in module.named_parameters()}
    head = getattr(module, "get_output_embeddings", lambda: None)()
    if head is not None and id(head.weight) in names:
        return names[id(head.weight)], head.weight
    candidates = [(n, p) for n, p in module.named_parameters() if p.dim() == 2 and p.is_floating_point()]
    return [(n, p) for n, p in candidates if bool(p.detach().abs().sum() > 0)][-1]
