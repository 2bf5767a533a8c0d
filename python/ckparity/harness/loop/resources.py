"""What a run needs of the machine, checked before any of it runs: a config
whose twins cannot fit in memory is refused with both figures, instead of
dying in torch's allocator after the work has started."""

from __future__ import annotations

from ..basics.config import UsageError

# per parameter and twin: the weights, the gradient, AdamW's two moments, and
# the localization snapshot (weights and moments again)
_COPIES_PER_TWIN = 7


def parameter_count(config) -> int:
    V, D, H = config.vocab, config.d_model, config.hidden
    if config.model == "gpt2":  # wte, wpe; per block two LayerNorms, c_attn, c_proj, the 4 x D MLP; ln_f; tied head
        block = 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (4 * D * D + 4 * D) + (4 * D * D + D)
        return V * D + config.seq_len * D + config.num_layers * block + 2 * D
    block = D + D * 2 * H + H * (V if config.model == "tiny" else D)
    if config.model == "tiny":
        return V * D + block
    if config.model == "llama":
        kv = (config.kv_heads or config.heads) * (D // config.heads)
        block += D + 2 * D * D + 2 * D * kv  # attention norm, q and o, k and v
    return V * D + config.num_layers * block + D + (0 if config.tie_embeddings else D * V)


def estimated_bytes(config) -> int:
    """float32 bytes both twins hold at their peak (parameters and their
    copies, plus one micro-batch's activations and their gradients)."""
    params = parameter_count(config) * _COPIES_PER_TWIN
    hidden = 4 * config.d_model if config.model == "gpt2" else config.hidden
    width = config.d_model + 2 * hidden + hidden + config.vocab
    layers = config.num_layers if config.model == "stacked" else 1
    activations = 2 * config.batch_size * config.seq_len * width * layers
    return 4 * 2 * (params + activations)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(config) -> None:
    needed, available = estimated_bytes(config), available_bytes()
    if available is not None and needed > available:
        raise UsageError(f"the twins need about {needed / 2**30:.1f} GiB of memory; this machine has "
                         f"{available / 2**30:.1f} GiB available (shrink --vocab, --d-model, --hidden or --num-layers)")
