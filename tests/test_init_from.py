"""--init-from: both twins start from a file's weights, the dims taken from
them; Hugging Face Llama names and layout mapped (checked against an
independent forward written the way Hugging Face's modeling_llama computes
it); bad files refused with the tensor's name before the run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ckparity.harness.longrun import checkpoint
from ckparity.harness.twins import init_from
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.harness.loop.run import train
from ckparity.harness.twins.factory import build_twins

DIMS = dict(vocab=61, d_model=32, hidden=40, num_layers=2, heads=4, kv_heads=2)


def _hf_llama(dims: dict, tied: bool, seed: int = 3) -> dict[str, torch.Tensor]:
    """Random weights under Hugging Face Llama's names and shapes."""
    g = torch.Generator().manual_seed(seed)
    V, D, H, L = dims["vocab"], dims["d_model"], dims["hidden"], dims["num_layers"]
    hd = D // dims["heads"]
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.2  # noqa: E731
    state = {"model.embed_tokens.weight": r(V, D), "model.norm.weight": 1 + r(D)}
    for i in range(L):
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": 1 + r(D), p + "post_attention_layernorm.weight": 1 + r(D),
                      p + "self_attn.q_proj.weight": r(D, D), p + "self_attn.k_proj.weight": r(dims["kv_heads"] * hd, D),
                      p + "self_attn.v_proj.weight": r(dims["kv_heads"] * hd, D), p + "self_attn.o_proj.weight": r(D, D),
                      p + "mlp.gate_proj.weight": r(H, D), p + "mlp.up_proj.weight": r(H, D),
                      p + "mlp.down_proj.weight": r(D, H)})
    if not tied:
        state["lm_head.weight"] = r(V, D)
    return state


def _hf_forward(state: dict, tokens: torch.Tensor, heads: int, kv_heads: int, eps: float, theta: float):
    """Logits the way Hugging Face's LlamaForCausalLM computes them (rotate_half,
    cos/sin of cat(freqs, freqs), repeat_kv, SiLU(gate) * up), in float64."""
    s = {k: v.double() for k, v in state.items()}
    x = s["model.embed_tokens.weight"][tokens]
    T, D = x.shape[-2], x.shape[-1]
    hd = D // heads
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rms(h, w):
        return w * h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)

    def rotate_half(h):
        return torch.cat((-h[..., hd // 2:], h[..., :hd // 2]), dim=-1)

    layers = 1 + max(int(k.split(".")[2]) for k in s if k.startswith("model.layers."))
    for i in range(layers):
        p = f"model.layers.{i}."
        h = rms(x, s[p + "input_layernorm.weight"])
        q = (h @ s[p + "self_attn.q_proj.weight"].T).view(1, T, heads, hd).transpose(1, 2)
        k = (h @ s[p + "self_attn.k_proj.weight"].T).view(1, T, kv_heads, hd).transpose(1, 2)
        v = (h @ s[p + "self_attn.v_proj.weight"].T).view(1, T, kv_heads, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, T, D)
        x = x + attn @ s[p + "self_attn.o_proj.weight"].T
        h = rms(x, s[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ s[p + "mlp.gate_proj.weight"].T) * (h @ s[p + "mlp.up_proj.weight"].T)) @ \
            s[p + "mlp.down_proj.weight"].T
    head = s.get("lm_head.weight", s["model.embed_tokens.weight"])
    return rms(x, s["model.norm.weight"]) @ head.T


@pytest.mark.parametrize("tied, fmt", [(False, "safetensors"), (True, "pt")])
def test_hugging_face_llama_weights_give_hugging_faces_logits(tmp_path, tied, fmt):
    state = _hf_llama(DIMS, tied)
    path = tmp_path / f"w.{fmt}"
    save_file(state, str(path)) if fmt == "safetensors" else torch.save(state, path)
    # the flags' dims are not the file's: the file's win, kv-heads from k_proj given --heads
    config = init_from.configure(RunConfig(model="llama", heads=4, seq_len=8, init_from=str(path), no_progress=True))
    assert (config.vocab, config.d_model, config.hidden, config.num_layers, config.kv_heads, config.tie_embeddings) \
        == (61, 32, 40, 2, 2, tied)
    ck, ref = build_twins(config)
    for twin in (ck, ref):
        assert torch.equal(twin.model.state_dict()["blocks.1.mlp.fc1.weight"],
                           torch.cat([state["model.layers.1.mlp.gate_proj.weight"],
                                      state["model.layers.1.mlp.up_proj.weight"]]))
    tokens = torch.randint(0, 61, (1, 8), generator=torch.Generator().manual_seed(0))
    exact = _hf_forward(state, tokens, heads=4, kv_heads=2, eps=config.eps, theta=config.rope_theta)
    with torch.no_grad():
        ours = ref.model(tokens)["logits"].double()
    assert (ours - exact).abs().max() < 1e-4 * exact.abs().max()  # float32 vs float64, same function


def test_a_run_from_a_stacked_checkpoint(tmp_path):
    """Weights a stacked twin wrote (ckparity's names, torch.save) start a run with their dims."""
    source = init_from.configure(RunConfig(model="stacked", vocab=50, d_model=24, hidden=20, num_layers=3))
    ck, _ = build_twins(source)
    torch.save({"state_dict": ck.model.state_dict()}, tmp_path / "ck.pt")
    report = train(RunConfig(model="stacked", init_from=str(tmp_path / "ck.pt"), max_steps=3, no_progress=True,
                             ck_loss_backend="c_ptref", ck_optimizer_backend="torch", json_out=str(tmp_path / "r.json")))
    assert report["status"] == "pass" and report["max_param_abs_diff"] == 0.0
    assert (report["config"]["vocab"], report["config"]["d_model"], report["config"]["num_layers"]) == (50, 24, 3)


def test_a_run_from_where_a_training_run_got_to(tmp_path):
    """A checkpoint directory: the torch twin's weights at its latest step
    (not the first step's, not the CK twin's), the dims from them."""
    source = RunConfig(model="llama", vocab=61, d_model=32, hidden=40, heads=4, num_layers=2, max_steps=4,
                       checkpoint_every=4, checkpoint_dir=str(tmp_path / "ck"), no_progress=True,
                       json_out=str(tmp_path / "t.json"))
    assert train(source)["max_param_abs_diff"] > 0  # the CK twin's weights differ: which one was taken shows
    ck_then, torch_then = build_twins(source)
    fresh = torch_then.model.embedding.weight.clone()
    checkpoint.restore(str(tmp_path / "ck"), {"ck": ck_then, "torch": torch_then})
    config = init_from.configure(RunConfig(model="llama", heads=4, init_from=str(tmp_path / "ck")))
    assert (config.vocab, config.d_model, config.hidden, config.num_layers) == (61, 32, 40, 2)
    ck, ref = build_twins(config)
    for name, tensor in torch_then.model.state_dict().items():
        assert torch.equal(ref.model.state_dict()[name], tensor) and torch.equal(ck.model.state_dict()[name], tensor)
    assert not torch.equal(ref.model.embedding.weight, fresh)  # trained, not the init
    assert not all(torch.equal(a, b) for a, b in zip(ck_then.model.parameters(), torch_then.model.parameters()))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not a ckparity checkpoint"):
        init_from.configure(RunConfig(init_from=str(tmp_path / "empty")))


def test_bad_weights_are_refused_with_the_tensor_and_before_the_run(tmp_path):
    state = _hf_llama(DIMS, tied=False)
    state["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(32, 31)
    save_file(state, str(tmp_path / "bad.safetensors"))
    out = tmp_path / "r.json"
    with pytest.raises(UsageError, match=r"blocks\.0\.attention\.o_proj\.weight is \(32, 31\)"):
        train(RunConfig(model="llama", init_from=str(tmp_path / "bad.safetensors"), json_out=str(out),
                        no_progress=True))
    assert not out.exists()
    with pytest.raises(UsageError, match="need --model llama"):
        init_from.configure(RunConfig(model="stacked", init_from=str(tmp_path / "bad.safetensors")))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "half.safetensors"))
    with pytest.raises(UsageError, match="layer 1 has"):
        init_from.configure(RunConfig(model="llama", init_from=str(tmp_path / "half.safetensors")))
    with pytest.raises(UsageError, match="no such file"):
        init_from.configure(RunConfig(init_from=str(tmp_path / "none.pt")))
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(UsageError, match="cannot read it"):
        init_from.configure(RunConfig(init_from=str(tmp_path / "junk.pt")))
