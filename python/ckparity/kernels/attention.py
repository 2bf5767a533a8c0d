"""attention: F.scaled_dot_product_attention(q, k, v, is_causal=True,
enable_gqa=...) without dropout -- the llama twin's attention. A slot with
torch's backend alone so far (ATen's CPU flash kernel for float32 training):
a user's attention is judged here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .contract import grads_present, tensor_like
from .record import WIDTHS, BadInput, Conformance, Kernel

HEADS, KV_HEADS, T = 4, 2, 5  # the conformance cases: GQA (two query heads a kv head), 5 positions


def attention(q, k, v, *, is_causal: bool = True, enable_gqa: bool = False, scale: float | None = None):
    """torch's attention as the twins call it: causal, no dropout, no mask."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa, scale=scale)


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g).requires_grad_(True)
    k, v = (torch.randn(2, 2, 5, 8, generator=g).requires_grad_(True) for _ in range(2))
    y = fn(q, k, v, is_causal=True, enable_gqa=True)
    tensor_like(y, (2, 4, 5, 8), "attention(q (2, 4, 5, 8), k and v (2, 2, 5, 8), is_causal, enable_gqa)")
    y.backward(torch.randn(2, 4, 5, 8, generator=g))
    grads_present({"q": q, "k": k, "v": v})


def _make(width, rows, g):
    """q (rows, HEADS, T, d = width), k and v (rows, KV_HEADS, T, d): the rows are the batch."""
    return {"q": torch.randn(rows, HEADS, T, width, generator=g), "k": torch.randn(rows, KV_HEADS, T, width, generator=g),
            "v": torch.randn(rows, KV_HEADS, T, width, generator=g)}


def _call(fn, t, **options):
    return fn(t["q"], t["k"], t["v"], is_causal=True, enable_gqa=True, **options)


_BAD = (BadInput("k and v of head dim 4 for q of head dim 8", "shape",
                 lambda fn: fn(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4),
                               is_causal=True, enable_gqa=False)),)



KERNEL = Kernel(
    name="attention",
    used_by=lambda config: config.model in ("llama", "gpt2"),
    exercise=("llama", {"model": "llama"}),
    flag="ck_attention_backend",
    slot="attention",
    torch_ops=("scaled_dot_product_attention",),
    spellings=("sdpa",),
    # the twins' slot: (q (B, heads, T, d), k, v (B, kv_heads, T, d), is_causal=, enable_gqa=) -> (B, heads, T, d)
    backends={"torch": attention},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=_call, differentiated=("q", "k", "v"),
        widths=WIDTHS, bad=_BAD, batch_widths=(8, 64, 100, 128, 256),  # head dims: 65537 is no attention's
        options=(("scale", lambda f, t: _call(f, t, scale=0.3), ("q", "k", "v")),),
        speed=lambda g: {"q": torch.randn(4, 8, 256, 64, generator=g),  # 4 sequences of 256, 8 heads over 4
                         "k": torch.randn(4, 4, 256, 64, generator=g), "v": torch.randn(4, 4, 256, 64, generator=g)}),
    not_claimed={"attention": "no C kernel yet: torch's backend, and a user's judged against it"},
)
