"""The twin models. Both twins are instances of the same class built with
different ops (factory.build_twins copies the weights). Tokens are (B, T):
B windows of T tokens.

Every forward returns the activations of each stage by name, so that
localization can compare the twins stage by stage; each is the output of one
slot, which names its kernel record (KERNEL_TAG)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


# the attribute of a slot's output that names its kernel record (factory.ops_for sets it): a stage's kernel
KERNEL_TAG = "_ckparity_kernel"


@dataclass(frozen=True)
class Ops:
    """Every op of the step, one field a kernel record's slot (kernels.SLOTS): factory.ops_for fills
    them from the backend flags."""
    embedding: Callable  # (tokens (B, T), weight (V, D)) -> (B, T, D) like F.embedding
    linear: Callable    # (x (..., K), weight (N, K), bias (N) or None) -> (..., N) like F.linear
    attention: Callable  # (q, k, v (B, heads, T, d), is_causal=, enable_gqa=) like F.scaled_dot_product_attention
    residual: Callable  # (x, y) -> x + y
    rms_norm: Callable  # (x, normalized_shape, weight, eps) like F.rms_norm
    swiglu: Callable    # (x [..., 2H]) -> [..., H]
    loss: Callable      # (logits (N, V), targets (N)) -> mean loss
    rope: Callable      # (q or k (B, heads, T, d), cos, sin (T, d/2)) -> rotated, rotate-half layout
    layer_norm: Callable  # (x, normalized_shape, weight, bias, eps) like F.layer_norm
    gelu: Callable      # (x, approximate="tanh") like F.gelu
    # (hidden (N, D), lm_head weight (V, D), targets (N)) -> mean loss: the lm_head and the
    # loss as one op (the logits are then computed apart, without grad, for the comparison)
    head_loss: Callable | None = None


class Linear(nn.Linear):
    """nn.Linear whose product is the ``linear`` slot (its parameters and names nn.Linear's: state_dicts,
    --init-from and the tp shards see no difference)."""

    def __init__(self, d_in: int, d_out: int, ops: Ops, bias: bool = False) -> None:
        super().__init__(d_in, d_out, bias=bias)
        self.ops = ops

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias)


class Embedding(nn.Embedding):
    """nn.Embedding whose lookup is the ``embedding`` slot."""

    def __init__(self, vocab: int, d_model: int, ops: Ops) -> None:
        super().__init__(vocab, d_model)
        self.ops = ops

    def forward(self, tokens):
        return self.ops.embedding(tokens, self.weight)


class LMHead(Linear):
    """The lm_head (bias-free). It remembers its input so that a fused head
    loss can start from it; under a fused head loss its logits are only
    for the comparison and carry no graph."""

    def __init__(self, d_in: int, d_out: int, ops: Ops) -> None:
        super().__init__(d_in, d_out, ops)
        self.fused = ops.head_loss

    def forward(self, x):
        if self.fused is None:
            return super().forward(x)
        self.last_input = x  # kept only for the fused loss: otherwise it would hold the activation a step longer
        with torch.no_grad():
            return super().forward(x)


def head_name(model: nn.Module) -> str:
    """The lm_head's attribute name (the tiny model, the seed's, calls it fc2)."""
    return "lm_head" if hasattr(model, "lm_head") else "fc2"


def model_loss(model: nn.Module, acts: dict, targets: torch.Tensor) -> torch.Tensor:
    """The twin's loss of one micro-batch: ops.loss on the logits, or the
    fused head loss on the lm_head's input."""
    if model.ops.head_loss is not None:
        head = getattr(model, head_name(model))
        hidden = head.last_input
        return model.ops.head_loss(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1))
    logits = acts["logits"]
    return model.ops.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class RMSNormLayer(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.ops = eps, ops

    def forward(self, x):
        return self.ops.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class TinyModel(nn.Module):
    """The seed's model: embedding, RMSNorm, Linear(D, 2H), SwiGLU, Linear(H, V)."""

    def __init__(self, vocab: int, d_model: int, hidden: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.embedding = Embedding(vocab, d_model, ops)
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.fc1 = Linear(d_model, 2 * hidden, ops)
        self.fc2 = LMHead(hidden, vocab, ops)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        acts = {"embedding": self.embedding(tokens)}
        acts["rmsnorm"] = self.norm(acts["embedding"])
        acts["fc1"] = self.fc1(acts["rmsnorm"])
        acts["swiglu"] = self.ops.swiglu(acts["fc1"])
        acts["logits"] = self.fc2(acts["swiglu"])
        return acts


class Block(nn.Module):
    """x + fc2(swiglu(fc1(rmsnorm(x))))"""

    def __init__(self, d_model: int, hidden: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.fc1 = Linear(d_model, 2 * hidden, ops)
        self.fc2 = Linear(hidden, d_model, ops)

    def forward(self, x, acts: dict, prefix: str):
        acts[f"{prefix}.rmsnorm"] = h = self.norm(x)
        acts[f"{prefix}.fc1"] = h = self.fc1(h)
        acts[f"{prefix}.swiglu"] = h = self.ops.swiglu(h)
        acts[f"{prefix}.out"] = out = self.ops.residual(x, self.fc2(h))
        return out


class StackedModel(nn.Module):
    """Embedding, L residual RMSNorm+SwiGLU blocks, final RMSNorm, lm_head."""

    def __init__(self, vocab: int, d_model: int, hidden: int, eps: float, ops: Ops, num_layers: int) -> None:
        super().__init__()
        self.ops = ops
        self.embedding = Embedding(vocab, d_model, ops)
        self.blocks = nn.ModuleList(Block(d_model, hidden, eps, ops) for _ in range(num_layers))
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.lm_head = LMHead(d_model, vocab, ops)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        acts = {"embedding": self.embedding(tokens)}
        x = acts["embedding"]
        for i, block in enumerate(self.blocks):
            x = block(x, acts, f"block{i}")
        acts["rmsnorm"] = self.norm(x)
        acts["logits"] = self.lm_head(acts["rmsnorm"])
        return acts


def rope_tables(positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's rotary angles: position t times theta**(-2i/d), as cos and sin (T, d/2) in float32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads and rotary embeddings:
    q, k, v projections, rope on q and k, the attention slot (F.scaled_dot_product_attention's contract)
    (is_causal), o projection."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, ops: Ops) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.ops = heads, kv_heads, d_model // heads, ops
        self.q_proj = Linear(d_model, heads * self.head_dim, ops)
        self.k_proj = Linear(d_model, kv_heads * self.head_dim, ops)
        self.v_proj = Linear(d_model, kv_heads * self.head_dim, ops)
        self.o_proj = Linear(heads * self.head_dim, d_model, ops)

    def forward(self, x, cos, sin, acts: dict, prefix: str):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        # the tables in q's dtype, as Hugging Face's Llama casts them (bf16 q and k under --amp)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
        acts[f"{prefix}.q_rope"] = q = self.ops.rope(q, cos, sin)
        acts[f"{prefix}.k_rope"] = k = self.ops.rope(k, cos, sin)
        out = self.ops.attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        acts[f"{prefix}.attention"] = out
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


class LlamaBlock(nn.Module):
    """h = x + attention(rmsnorm(x)), then the stacked model's Block on h:
    h + fc2(swiglu(fc1(rmsnorm(h)))) — fc1's output halves are swiglu's gate
    and up, fc2 is the down projection."""

    def __init__(self, d_model: int, hidden: int, heads: int, kv_heads: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.attn_norm = RMSNormLayer(d_model, eps, ops)
        self.attention = Attention(d_model, heads, kv_heads, ops)
        self.mlp = Block(d_model, hidden, eps, ops)

    def forward(self, x, cos, sin, acts: dict, prefix: str):
        acts[f"{prefix}.attn_norm"] = h = self.attn_norm(x)
        acts[f"{prefix}.attn_out"] = x = self.ops.residual(x, self.attention(h, cos, sin, acts, prefix))
        return self.mlp(x, acts, prefix)


class LlamaModel(nn.Module):
    """Token embedding, L pre-norm Llama blocks, final RMSNorm, lm_head (tied
    to the embedding with tie_embeddings)."""

    def __init__(self, config, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        D = config.d_model
        self.embedding = Embedding(config.vocab, D, ops)
        self.blocks = nn.ModuleList(LlamaBlock(D, config.hidden, config.heads, config.kv_heads or config.heads,
                                               config.eps, ops) for _ in range(config.num_layers))
        self.norm = RMSNormLayer(D, config.eps, ops)
        self.lm_head = LMHead(D, config.vocab, ops)
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.weight
        cos, sin = rope_tables(config.seq_len, D // config.heads, config.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        acts = {"embedding": self.embedding(tokens)}
        x = acts["embedding"]
        for i, block in enumerate(self.blocks):
            x = block(x, self.cos, self.sin, acts, f"block{i}")
        acts["rmsnorm"] = self.norm(x)
        acts["logits"] = self.lm_head(acts["rmsnorm"])
        return acts


class LayerNormLayer(nn.Module):
    """nn.LayerNorm's parameters (weight ones, bias zeros) whose normalization is the ``layer_norm`` slot."""

    def __init__(self, dim: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps, self.ops = eps, ops

    def forward(self, x):
        return self.ops.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class GPT2Attention(nn.Module):
    """GPT-2's causal self-attention: one biased projection to q, k and v (c_attn, as Hugging Face's and
    llm.c's), the attention slot (is_causal), a biased output projection (c_proj)."""

    def __init__(self, d_model: int, heads: int, ops: Ops) -> None:
        super().__init__()
        self.heads, self.ops = heads, ops
        self.c_attn = Linear(d_model, 3 * d_model, ops, bias=True)
        self.c_proj = Linear(d_model, d_model, ops, bias=True)

    def forward(self, x, acts: dict, prefix: str):
        B, T, D = x.shape
        acts[f"{prefix}.c_attn"] = qkv = self.c_attn(x)  # each projection a stage: localization blames its linear
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in qkv.split(D, dim=2))
        acts[f"{prefix}.attention"] = out = self.ops.attention(q, k, v, is_causal=True)
        acts[f"{prefix}.attn.c_proj"] = out = self.c_proj(out.transpose(1, 2).reshape(B, T, D))
        return out


class GPT2Block(nn.Module):
    """h = x + attn(ln_1(x)); h + c_proj(gelu(c_fc(ln_2(h)))): GPT-2's pre-LN block, its MLP 4 x D wide, its
    GELU of the form ``approximate`` ("tanh": GPT-2's; "none": F.gelu's erf form)."""

    def __init__(self, d_model: int, heads: int, eps: float, ops: Ops, approximate: str = "tanh") -> None:
        super().__init__()
        self.ops, self.approximate = ops, approximate
        self.ln_1 = LayerNormLayer(d_model, eps, ops)
        self.attn = GPT2Attention(d_model, heads, ops)
        self.ln_2 = LayerNormLayer(d_model, eps, ops)
        self.c_fc = Linear(d_model, 4 * d_model, ops, bias=True)
        self.c_proj = Linear(4 * d_model, d_model, ops, bias=True)

    def forward(self, x, acts: dict, prefix: str):
        acts[f"{prefix}.ln_1"] = h = self.ln_1(x)
        acts[f"{prefix}.attn_out"] = x = self.ops.residual(x, self.attn(h, acts, prefix))
        acts[f"{prefix}.ln_2"] = h = self.ln_2(x)
        acts[f"{prefix}.c_fc"] = h = self.c_fc(h)
        acts[f"{prefix}.gelu"] = h = self.ops.gelu(h, approximate=self.approximate)
        acts[f"{prefix}.c_proj"] = h = self.c_proj(h)
        acts[f"{prefix}.out"] = out = self.ops.residual(x, h)
        return out


class GPT2Model(nn.Module):
    """GPT-2 as llm.c trains it: token and learned position embeddings (one row per position up to
    --seq-len), L pre-LN blocks, a final LayerNorm, the lm_head tied to the token embedding. The positions
    are looked up through the embedding slot as a (1, T) index and added to every window by the residual
    slot (broadcast: autograd sums their gradient over the batch, as for Hugging Face's GPT-2)."""

    def __init__(self, config, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        D = config.d_model
        self.embedding = Embedding(config.vocab, D, ops)
        self.position = Embedding(config.seq_len, D, ops)
        approximate = {"tanh": "tanh", "erf": "none"}[config.gelu]
        self.blocks = nn.ModuleList(GPT2Block(D, config.heads, config.eps, ops, approximate)
                                    for _ in range(config.num_layers))
        self.norm = LayerNormLayer(D, config.eps, ops)
        self.lm_head = LMHead(D, config.vocab, ops)
        self.lm_head.weight = self.embedding.weight
        # GPT-2's initialization (nanoGPT's, from the GPT-2 paper): weights N(0, 0.02), the projections into
        # the residual stream N(0, 0.02 / sqrt(2 L)), biases zero; torch's defaults (an N(0, 1) embedding
        # shared with the lm_head) would start from logits in the tens
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.num_layers) if name.endswith("c_proj.weight")
                                else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        acts = {"embedding": self.embedding(tokens), "position": self.position(positions)}
        acts["embedded"] = x = self.ops.residual(acts["embedding"], acts["position"])
        for i, block in enumerate(self.blocks):
            x = block(x, acts, f"block{i}")
        acts["layer_norm"] = self.norm(x)
        acts["logits"] = self.lm_head(acts["layer_norm"])
        return acts


def build_model(config, ops: Ops) -> nn.Module:
    if config.model == "gpt2":
        return GPT2Model(config, ops)
    if config.model == "tiny":
        return TinyModel(config.vocab, config.d_model, config.hidden, config.eps, ops)
    if config.model == "llama":
        return LlamaModel(config, ops)
    return StackedModel(config.vocab, config.d_model, config.hidden, config.eps, ops, config.num_layers)

