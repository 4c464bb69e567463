"""Long-sequence inference of transformers' own ``GPT2LMHeadModel`` with the eager attention path, in fp16.

Full size (a CUDA machine): 6 layers, d_model 768, 12 heads, 1024 positions, vocab 50257: about 82 M
parameters with random weights (seed 0), nothing downloaded, cast to fp16. The config asks for
``attn_implementation="eager"``, the library's own matmul-softmax-matmul attention, which users select
to read the attention weights (``output_attentions``) or keep from older code; ``build()`` checks that
the model really took that path. The step runs a batch of 8 sequences of 1024 tokens,
``input_ids [8, 1024]``, under ``torch.no_grad()`` and returns the logits ``[8, 1024, 50257]``.

What a performance engineer would expect on an H200: the eager attention materializes the full score
matrix, [8, 12, 1024, 1024] in fp16 (about 200 MB) per layer: the first matmul writes it, the scaling,
the additive causal mask and the softmax each read and write it again, the second matmul reads it.
GPT-2's "gelu_new" is written out in Python (pow, mul, add, tanh, ...): about eight elementwise kernels
over each [8, 1024, 3072] MLP activation (48 MB in fp16). Measured there with torch 2.11 and
transformers 5.17: 201 kernels, about 15 ms of GPU work in a 17 ms step (GPU-bound), and the biggest
single cost is the LM head: its 8192 x 768 x 50257 GEMM takes about 7.4 ms in an old ``align1`` CUTLASS
kernel, because the odd vocabulary (50257) leaves the logits' rows unaligned; padding the vocabulary to
a multiple of 64 fixes that. The softmax and the elementwise chains take most of the rest; fused SDPA
(``attn_implementation="sdpa"``) and fusion of the GELU pay. Two host syncs, in transformers' mask
creation (masking_utils: ``find_packed_sequence_indices``'s ``.all()``, and the ``torch.tensor(0.0,
device=...)`` that turns the boolean mask into the eager path's additive one).

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration (float32 on the CPU,
the same dtype as above on a GPU): 2 layers, d_model 64, 4 heads, 64 positions, vocab 256, a batch of 2
sequences of 32 tokens.
"""

from __future__ import annotations

import torch
from _real import real_size
from transformers import GPT2Config, GPT2LMHeadModel

KIND = "infer"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32  # fp16 is slow on the CPU

FULL = dict(
    config=dict(n_layer=6, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
    batch=8,
    seq_len=1024,
)
SMALL = dict(
    # bos/eos inside the small vocabulary (GPT-2's are 50256), so the config validates without warnings
    config=dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256, bos_token_id=255, eos_token_id=255),
    batch=2,
    seq_len=32,
)
SIZES = FULL if SIZE == "full" else SMALL
TOKENS_PER_STEP = SIZES["batch"] * SIZES["seq_len"]


def build(vocab_multiple: int = 1):
    torch.manual_seed(0)
    # On the config: transformers 5.17 and 5.24 both take it there (GPT2LMHeadModel(config, ...) does not).
    sizes = dict(SIZES["config"])
    sizes["vocab_size"] = -(-sizes["vocab_size"] // vocab_multiple) * vocab_multiple
    config = GPT2Config(**sizes, attn_implementation="eager")
    with torch.device(DEVICE):
        model = GPT2LMHeadModel(config)
    model = model.to(DTYPE).eval()
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"expected the eager attention path, got {model.config._attn_implementation!r}")

    vocab = SIZES["config"]["vocab_size"]  # the ids of the unpadded vocabulary, whatever the padding
    input_ids = torch.randint(0, vocab, (SIZES["batch"], SIZES["seq_len"]), device=DEVICE)
    # The largest id in the vocabulary: inputs drawn at random in [0, max + 1) then cover all of it.
    input_ids[0, -1] = vocab - 1
    return model, (input_ids,)


def build_padded_vocab():
    """The same model with its vocabulary padded to a multiple of 64 (50257 -> 50304), the manual fix GA303
    names: the LM head's GEMM is aligned; the 47 extra logits are never a target (the ids stay below 50257)."""
    return build(vocab_multiple=64)


def step(model, inputs):
    (input_ids,) = inputs
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits
