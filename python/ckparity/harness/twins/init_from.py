"""--init-from PATH: both twins start from given weights instead of a random init.

PATH is a safetensors file (``.safetensors``), a torch state_dict
(``torch.save``; read with ``weights_only=True``, a ``{"state_dict": ...}``
wrapper accepted) or a ckparity checkpoint directory (--checkpoint-dir; the
torch twin's weights at its latest step: a parity run from where a training
run got to). Names are ckparity's (a model's own ``state_dict()``), or,
for ``--model llama``, Hugging Face Llama's (``model.layers.N.self_attn.q_proj
.weight`` ...), mapped here: gate_proj and up_proj become fc1's two halves
(SwiGLU's gate first), input_layernorm / post_attention_layernorm the two
RMSNorms, a missing lm_head.weight a tied embedding. The rotary layout needs
no permutation: Hugging Face's q/k weights are already in the rotate-half
layout ckparity's llama uses (tests/test_init_from.py checks the logits
against an independent rotate-half forward). For ``--model gpt2``, Hugging
Face GPT-2's names (``transformer.h.N.attn.c_attn.weight`` ...): its Conv1D
weights are stored (in, out), transposed here to Linear's (out, in); wte and
wpe are the token and position embeddings (wpe's first --seq-len rows: a
window never reaches the others); the attention's mask buffers are skipped;
an lm_head.weight, GPT-2's tied one, must be wte's.

The model's dims come from the weights -- vocab and d-model from the
embedding, hidden from fc1, the number of blocks, kv-heads from k_proj given
--heads (a head count is not in the weights), a tied lm_head -- and override
the flags. A tensor that does not fit the model so built, a missing one or an
extra one is refused with its name, before the run starts.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import replace

import torch

from ..basics.checkpoint_format import twin_weights
from ..basics.config import UsageError

_HF_LLAMA = [
    (r"model\.embed_tokens\.weight", "embedding.weight"),
    (r"model\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blocks.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blocks.\1.mlp.norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"blocks.\1.attention.\2_proj.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blocks.\1.mlp.fc2.weight"),
]
_HF_MLP = re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up)_proj\.weight")
_HF_GPT2 = [
    (r"transformer\.wte\.weight", "embedding.weight"),
    (r"transformer\.wpe\.weight", "position.weight"),
    (r"transformer\.ln_f\.(weight|bias)", r"norm.\1"),
    (r"transformer\.h\.(\d+)\.(ln_1|ln_2)\.(weight|bias)", r"blocks.\1.\2.\3"),
    (r"transformer\.h\.(\d+)\.attn\.(c_attn|c_proj)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"transformer\.h\.(\d+)\.mlp\.(c_fc|c_proj)\.(weight|bias)", r"blocks.\1.\2.\3"),
]
# Hugging Face's non-weight buffers some checkpoints carry: llama's rotary frequencies (recomputed from
# --rope-theta), GPT-2's causal mask (the attention slot's is_causal)
_HF_BUFFERS = re.compile(r".*(rotary_emb\.inv_freq|\.attn\.bias|\.attn\.masked_bias)")
# safetensors' names of the floating-point dtypes a weight may have
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def _read(path: str) -> dict[str, torch.Tensor]:
    if os.path.isdir(path):
        return twin_weights(path)
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open
            from safetensors.torch import load_file

            with safe_open(path, "pt") as f:  # the header first: names and dtypes, before any tensor is read
                for name in f.keys():
                    dtype = f.get_slice(name).get_dtype()
                    if _HF_BUFFERS.fullmatch(name):  # a mask buffer may be bool: skipped, not a weight
                        continue
                    if dtype not in _FLOAT_DTYPES:
                        raise UsageError(f"--init-from {path}: {name} is {dtype}, not a floating-point weight")
            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 -- any unreadable file is the user's input, said as such
        raise UsageError(f"--init-from {path}: cannot read it: {type(err).__name__}: {err}") from None
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(f"--init-from {path}: not a state_dict of tensors")
    return state


def _from_hugging_face(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, halves = {}, {}
    for name, tensor in state.items():
        if _HF_BUFFERS.fullmatch(name):
            continue
        mlp = _HF_MLP.fullmatch(name)
        if mlp:
            halves.setdefault(mlp[1], {})[mlp[2]] = tensor
            continue
        for pattern, ours in _HF_LLAMA:
            if re.fullmatch(pattern, name):
                out[re.sub(pattern, ours, name)] = tensor
                break
        else:
            raise UsageError(f"--init-from: {name} is not a Hugging Face Llama tensor ckparity's llama has")
    for layer, parts in halves.items():
        if set(parts) != {"gate", "up"}:
            raise UsageError(f"--init-from: layer {layer} has {sorted(parts)} of gate_proj/up_proj, not both")
        out[f"blocks.{layer}.mlp.fc1.weight"] = torch.cat([parts["gate"], parts["up"]])
    return out


def _from_hugging_face_gpt2(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        if _HF_BUFFERS.fullmatch(name):
            continue
        if name == "lm_head.weight":  # tied: it must be wte itself, which stands for both
            if "transformer.wte.weight" not in state or not torch.equal(tensor, state["transformer.wte.weight"]):
                raise UsageError("--init-from: lm_head.weight differs from transformer.wte.weight: GPT-2's lm_head "
                                 "is tied to the token embedding")
            continue
        for pattern, ours in _HF_GPT2:
            if re.fullmatch(pattern, name):
                # Conv1D keeps its weight (in, out): Linear's is (out, in)
                conv1d = name.endswith(".weight") and (".attn." in name or ".mlp." in name)
                out[re.sub(pattern, ours, name)] = tensor.t() if conv1d and tensor.dim() == 2 else tensor
                break
        else:
            raise UsageError(f"--init-from: {name} is not a Hugging Face GPT-2 tensor ckparity's gpt2 has")
    return out


@functools.lru_cache(maxsize=2)
def _weights(path: str, model: str, stamp: float) -> dict[str, torch.Tensor]:
    """The file's tensors under ckparity's names, float32 (read once per file version)."""
    state = _read(path)
    if any(name.startswith("model.") for name in state):
        if model != "llama":
            raise UsageError(f"--init-from {path}: Hugging Face Llama weights need --model llama, not {model}")
        state = _from_hugging_face(state)
    elif any(name.startswith("transformer.") for name in state):
        if model != "gpt2":
            raise UsageError(f"--init-from {path}: Hugging Face GPT-2 weights need --model gpt2, not {model}")
        state = _from_hugging_face_gpt2(state)
    for name, t in state.items():  # checked as given, before any conversion
        if not t.is_floating_point():
            raise UsageError(f"--init-from {path}: {name} is {t.dtype}, not a floating-point weight")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise UsageError(f"--init-from {path}: {name} has {bad} non-finite value(s) (NaN or inf)")
    return {name: t.float().contiguous() for name, t in state.items()}


def _version(path: str) -> float:
    """When the weights at ``path`` last changed (a file's, or a checkpoint directory's 'latest' pointer's)."""
    if os.path.isdir(path):
        pointers = [p for p in (os.path.join(path, "latest"), os.path.join(path, "rank-0", "latest")) if os.path.isfile(p)]
        if not pointers:
            raise UsageError(f"--init-from {path}: a directory but not a ckparity checkpoint (no 'latest' in it)")
        return os.path.getmtime(pointers[0])
    if not os.path.isfile(path):
        raise UsageError(f"--init-from {path}: no such file")
    return os.path.getmtime(path)


def weights(config) -> dict[str, torch.Tensor]:
    return _weights(config.init_from, config.model, _version(config.init_from))


def _first(state: dict, pattern: str):
    return next((t for name, t in state.items() if re.search(pattern, name)), None)


def configure(config):
    """config with the model's dims taken from --init-from's weights (as is without it)."""
    if not config.init_from:
        return config
    state = weights(config)
    if "embedding.weight" not in state:
        raise UsageError(f"--init-from {config.init_from}: no embedding.weight (model.embed_tokens.weight)")
    if state["embedding.weight"].dim() != 2:
        raise UsageError(f"--init-from {config.init_from}: embedding.weight is {tuple(state['embedding.weight'].shape)}"
                         ", not (vocab, d-model)")
    vocab, d_model = state["embedding.weight"].shape
    changes = {"vocab": vocab, "d_model": d_model}
    fc1 = _first(state, r"(^|\.)fc1\.weight$")
    if fc1 is not None:
        changes["hidden"] = fc1.shape[0] // 2
    layers = {int(m[1]) for name in state for m in [re.match(r"blocks\.(\d+)\.", name)] if m}
    if layers:
        changes["num_layers"] = max(layers) + 1
    if config.model == "llama":
        if d_model % config.heads:
            raise UsageError(f"--init-from: d-model {d_model} (from the embedding) is not a multiple of --heads "
                             f"{config.heads}")
        k_proj = _first(state, r"attention\.k_proj\.weight$")
        head_dim = d_model // config.heads
        if k_proj is not None:
            if k_proj.shape[0] % head_dim:
                raise UsageError(f"--init-from: k_proj has {k_proj.shape[0]} rows, not a multiple of the head dim "
                                 f"{head_dim} (d-model {d_model} / --heads {config.heads})")
            changes["kv_heads"] = k_proj.shape[0] // head_dim
        changes["tie_embeddings"] = "lm_head.weight" not in state
    if config.model == "gpt2":
        if d_model % config.heads:
            raise UsageError(f"--init-from: d-model {d_model} (from the embedding) is not a multiple of --heads "
                             f"{config.heads}")
        positions = state.get("position.weight")
        if positions is not None and positions.shape[0] < config.seq_len:
            raise UsageError(f"--init-from: the position table has {positions.shape[0]} rows, fewer than --seq-len "
                             f"{config.seq_len}")
    return replace(config, **changes)


def load_into(model: torch.nn.Module, config) -> None:
    """The weights into ``model`` (built from configure's config), every tensor's name and shape checked."""
    state, own = weights(config), model.state_dict()
    if (config.model == "llama" and config.tie_embeddings) or config.model == "gpt2":
        own.pop("lm_head.weight", None)  # the embedding's, tied
    if config.model == "gpt2" and "position.weight" in state:  # the rows a window of --seq-len reaches
        state = {**state, "position.weight": state["position.weight"][: config.seq_len]}
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise UsageError(f"--init-from {config.init_from}: " + "; ".join(
            part for part in (f"missing {missing}" if missing else "", f"not in the {config.model} model {extra}"
                              if extra else "") if part))
    for name, tensor in state.items():
        if tensor.shape != own[name].shape:
            raise UsageError(f"--init-from {config.init_from}: {name} is {tuple(tensor.shape)}, the model's is "
                             f"{tuple(own[name].shape)}")
    model.load_state_dict(state, strict=False)
