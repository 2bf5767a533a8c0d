"""--model llama: the torch twin is the model it claims to be (a hand-written
Llama block gives the same logits), grouped-query attention and tied
embeddings work, and with every kernel bitwise (C rms_norm, swiglu and rope;
torch's loss and AdamW) the CK twin is bit-identical to the torch twin."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ckparity import cpu
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.kernels.attention import followed, followed_bf16
from ckparity.harness.loop.run import train
from ckparity.harness.twins.factory import build_twins
from ckparity.ops.attention import bf16_followed

REPORTS = Path(__file__).resolve().parent.parent / "reports"
LLAMA = RunConfig(model="llama", num_layers=2, heads=4, kv_heads=2, d_model=32, hidden=48, vocab=64, seq_len=8,
                  batch_size=2, grad_accum=2, total_tokens=2048, max_steps=20, no_progress=True,
                  ck_loss_backend="torch", ck_optimizer_backend="torch")


def reference_llama(model, tokens):
    """A Llama forward written out by hand from the model's weights."""
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LLAMA.eps) * w

    def rotate(x, cos, sin):  # rotate-half, Llama's layout
        h = x.shape[-1] // 2
        return x * torch.cat((cos, cos), -1) + torch.cat((-x[..., h:], x[..., :h]), -1) * torch.cat((sin, sin), -1)

    B, T = tokens.shape
    hd = LLAMA.d_model // LLAMA.heads
    inv_freq = 1.0 / LLAMA.rope_theta ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.outer(torch.arange(T).float(), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    x = model.embedding.weight[tokens]
    for blk in model.blocks:
        a = blk.attention
        h = rms(x, blk.attn_norm.weight)
        q = (h @ a.q_proj.weight.T).view(B, T, 4, hd).transpose(1, 2)
        k = (h @ a.k_proj.weight.T).view(B, T, 2, hd).transpose(1, 2)
        v = (h @ a.v_proj.weight.T).view(B, T, 2, hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # each kv head serves 2 query heads
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + attn @ a.o_proj.weight.T
        gate, up = (rms(x, blk.mlp.norm.weight) @ blk.mlp.fc1.weight.T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ blk.mlp.fc2.weight.T
    return rms(x, model.norm.weight) @ model.lm_head.weight.T


@pytest.mark.parametrize("tie", [False, True])
def test_torch_twin_is_a_llama(tie):
    _, ref = build_twins(replace(LLAMA, tie_embeddings=tie))
    tokens = torch.randint(0, LLAMA.vocab, (3, 8))
    with torch.no_grad():
        torch.testing.assert_close(ref.model(tokens)["logits"], reference_llama(ref.model, tokens), rtol=1e-5,
                                   atol=1e-5)
    assert (ref.model.lm_head.weight is ref.model.embedding.weight) == tie
    assert ref.model.blocks[0].attention.k_proj.weight.shape == (2 * 8, 32)  # 2 kv heads of dim 8


@pytest.mark.parametrize("num_layers", [1, 2, 4])
def test_llama_twin_is_bit_identical(tmp_path, num_layers):
    result = train(replace(LLAMA, num_layers=num_layers, json_out=str(tmp_path / "r.json")))
    assert result["divergence"]["first_step"] is None, result["divergence"]
    assert result["max_param_abs_diff"] == 0.0 and result["max_grad_abs_diff"] == 0.0


def test_llama_with_c_loss_and_adamw_stays_in_parity(tmp_path):
    result = train(replace(LLAMA, ck_loss_backend="c", ck_optimizer_backend="c", tie_embeddings=True,
                           json_out=str(tmp_path / "r.json")))
    assert result["pass_parity"] and result["divergence"]["stage"] == "loss"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_whole_llama_step_in_c_is_bit_identical(tmp_path, threads):
    """Every op of the CK twin's step in ckparity's C -- embedding, linear, rms_norm, rope, attention, swiglu,
    residual, the ptref loss, the fused C AdamW against torch's fused AdamW -- torch at one thread: not one
    differing bit. The C linear and attention follow MKL's modelled branches only (docs/kernels.md): elsewhere
    those two are torch's, the rest still C. ckparity's own thread count changes no bit. Head dim 16 and 16
    positions: every GEMM of the flash kernel is one MKL's AVX2 branch runs in the order followed too."""
    gemm = "c" if cpu.mkl_not_followed() is None else "torch"
    config = replace(LLAMA, d_model=64, seq_len=16, ck_all="c", ck_loss_backend="c_ptref",
                     ck_optimizer_backend="c_fused", torch_adamw="fused", tie_embeddings=True, threads=threads,
                     torch_threads=1, json_out=str(tmp_path / "r.json"))
    assert followed(config.seq_len, config.seq_len, config.d_model // config.heads)
    # after --ck-all: "torch" is those flags' default, which --ck-all would take for "not given"
    config = replace(config, ck_linear_backend=gemm, ck_attention_backend=gemm)
    assert {getattr(config, f"ck_{k}_backend") for k in ("embedding", "rmsnorm", "rope", "swiglu", "residual")} == {"c"}
    result = train(config)
    assert result["divergence"]["first_step"] is None, result["divergence"]
    assert result["max_param_abs_diff"] == 0.0 and result["max_grad_abs_diff"] == 0.0


@pytest.mark.skipif(not bf16_followed(), reason="torch's bf16 matmul and flash kernel run oneDNN's GEMMs here")
@pytest.mark.parametrize("precision", [{"dtype": "bfloat16"}, {"amp": "bfloat16"}], ids=["bf16", "amp"])
def test_a_whole_llama_step_in_c_in_bf16_is_bit_identical(tmp_path, precision):
    """Where torch's bf16 linear and flash attention run ATen's own loops and MKL's AVX2 branch (an AMD CPU with
    AVX2 only), every op of the CK twin's step in C in pure bf16 and under autocast: not one differing bit, at
    ckparity's 2 threads and torch's 2 (every attention pass here has two items or more)."""
    config = replace(LLAMA, d_model=64, seq_len=16, ck_all="c", ck_loss_backend="c_ptref", max_steps=30,
                     ck_optimizer_backend="c_fused", torch_adamw="fused", tie_embeddings=True, threads=2,
                     torch_threads=2, json_out=str(tmp_path / "r.json"), **precision)
    assert followed_bf16(config.seq_len, config.seq_len)
    result = train(config)
    assert result["divergence"]["first_step"] is None, result["divergence"]
    assert set(result["max_ulp_diff"].values()) == {0}


@pytest.mark.parametrize("folder, onednn_isa, caps", [
    ("llama/mkl_avx2/bf16", "AVX2", ("DEFAULT", "AVX2")),  # ATen's own bf16 loops
    ("llama/zen5/bf16", "AVX512_CORE_BF16", ("DEFAULT", "AVX2", "AVX512"))])  # oneDNN's AVX-512 bf16 brgemm
def test_the_committed_bf16_all_c_llama_runs_on_mkls_avx2_branch_are_bit_identical(folder, onednn_isa, caps):
    """reports/llama/mkl_avx2/bf16/ (scripts/llama_bf16_twins.sh on an AMD CPU without AVX-512) and
    reports/llama/zen5/bf16/ (CAPS="avx512 avx2 default" on an AMD Zen 5, whose MKL runs its AVX2 code and whose
    torch runs its bf16 GEMMs on oneDNN without AMX): the 300-step all-C llama run in pure bf16 and under bf16
    autocast at each capability, ckparity at 1 and 2 threads with torch at 1, and both at 2 -- not one differing
    bit."""
    seen = set()
    for r in _reports(folder):
        c = r["config"]
        mode = "bf16" if c["dtype"] == "bfloat16" else "amp" if c["amp"] == "bfloat16" else None
        assert r["env"]["mkl_branch"] == "AVX2" and r["env"]["onednn_isa"] == onednn_isa
        seen.add((mode, *_bitwise_all_c_llama(r)))
    assert seen == {(m, cap, t, tt) for m in ("bf16", "amp") for cap in caps for t, tt in ((1, 1), (2, 1), (2, 2))}


def test_the_committed_all_c_llama_runs_are_bit_identical():
    """reports/llama/ (scripts/llama_twins.sh): the 300-step llama run (4 layers, GQA, tied embeddings) with
    every op in C, the C AdamW's fused form against torch's fused AdamW; at each capability torch at one
    thread with ckparity at 1 and 2, and torch at 2 with ckparity at 2 -- not one differing bit."""
    seen = {_bitwise_all_c_llama(r) for r in _reports("llama")}
    caps = ("DEFAULT", "AVX2", "AVX512")
    assert seen == {(cap, t, 1) for cap in caps for t in (1, 2)} | {(cap, 2, 2) for cap in caps}


def test_the_committed_all_c_llama_runs_on_mkls_avx2_branch_are_bit_identical():
    """reports/llama/mkl_avx2/ (scripts/llama_twins.sh on an AMD CPU without AVX-512): the same runs where MKL
    takes its AVX2 branch's own order and its small sgemm (attention's key blocks of 8), at DEFAULT and AVX2,
    torch at one thread with ckparity at 1 and 2, and torch at 2 with ckparity at 2 -- not one differing bit."""
    runs = _reports("llama/mkl_avx2")
    seen = {_bitwise_all_c_llama(r) for r in runs}
    assert all(r["env"]["mkl_branch"] == "AVX2" and not r["env"]["mkl_strict"] for r in runs)
    caps = ("DEFAULT", "AVX2")
    assert seen == {(cap, t, 1) for cap in caps for t in (1, 2)} | {(cap, 2, 2) for cap in caps}


def test_the_committed_all_c_llama_runs_on_an_amd_cpu_past_zen_4_are_bit_identical():
    """reports/llama/zen5/ (scripts/llama_twins.sh with CAPS="avx512 avx2 default" on an AMD Zen 5): MKL runs its
    AVX2 code there though the CPU has AVX-512 (csrc/linear.c's order_from_env), and torch's kernels run at
    AVX512 too -- at each capability, torch at one thread with ckparity at 1 and 2, and torch at 2 with ckparity
    at 2: not one differing bit."""
    runs = _reports("llama/zen5")
    assert all(r["env"]["mkl_branch"] == "AVX2" and not r["env"]["mkl_strict"] and r["env"]["cpu"].startswith("AMD")
               for r in runs)
    caps = ("DEFAULT", "AVX2", "AVX512")
    assert {_bitwise_all_c_llama(r) for r in runs} == {(cap, t, 1) for cap in caps for t in (1, 2)} | \
        {(cap, 2, 2) for cap in caps}


def test_on_mkls_avx2_branch_an_all_c_llama_follows_torch_at_2_threads_where_its_bits_move():
    """reports/llama/mkl_avx2/shares/ (docs/harness.md's command): 11 tokens a step and one kv head put every
    linear on MKL's 2-thread row shares and attention's backward on MKL's own threads ([Note: MKL's AVX2 sgemm
    on two threads]). Both 300-step all-C runs are bitwise, and the torch twin's loss is not the same at torch's 1
    and 2 threads: the second thread moved torch's bits, and ckparity's followed them."""
    runs = {}
    for p in sorted((REPORTS / "llama" / "mkl_avx2" / "shares").glob("llama300_seq11_kv1_torch*.json")):
        r = json.loads(p.read_text())
        c = r["config"]
        assert (c["seq_len"], c["batch_size"], c["kv_heads"], c["ck_linear_backend"], c["ck_attention_backend"]) == \
            (11, 1, 1, "c", "c")
        assert r["env"]["mkl_branch"] == "AVX2" and not r["env"]["mkl_strict"]
        assert r["status"] == "pass" and r["steps"] == 300 and set(r["max_ulp_diff"].values()) == {0.0}
        runs[c["torch_threads"]] = r
    assert set(runs) == {1, 2}
    assert runs[1]["final_torch_loss"] != runs[2]["final_torch_loss"]


def _reports(folder: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((REPORTS / folder).glob("llama300_allc_*_threads*.json"))]


def _bitwise_all_c_llama(r: dict) -> tuple:
    """The run's (capability, ckparity threads, torch threads), once it is shown to be the 300-step all-C llama run
    and bitwise throughout."""
    c = r["config"]
    assert (c["model"], c["num_layers"], c["heads"], c["kv_heads"], c["tie_embeddings"]) == ("llama", 4, 4, 2, True)
    assert {c[f"ck_{k}_backend"] for k in ("embedding", "linear", "rmsnorm", "rope", "attention", "swiglu",
                                             "residual", "clip")} == {"c"}
    assert (c["ck_loss_backend"], c["ck_optimizer_backend"], c["torch_adamw"]) == ("c_ptref", "c_fused", "fused")
    assert r["status"] == "pass" and r["steps"] == r["planned_steps"] == 300
    assert r["divergence"]["first_step"] is None and set(r["max_ulp_diff"].values()) == {0}
    assert r["env"]["capability_matched"]
    return r["env"]["torch_cpu_capability"], r["env"]["ckparity_threads"], r["env"]["torch_threads"]


def test_rope_backend_torch_is_bit_identical_too(tmp_path):
    a = train(replace(LLAMA, ck_rope_backend="torch", json_out=str(tmp_path / "a.json")))
    assert a["divergence"]["first_step"] is None


@pytest.mark.parametrize("overrides, message", [
    ({"heads": 3}, "must split into --heads 3"),
    ({"heads": 4, "kv_heads": 3}, "multiple of --kv-heads 3"),
    ({"d_model": 12, "heads": 4}, "even head dim"),
    ({"rope_theta": 0.0}, "--rope-theta"),
    ({"batch_size": 0}, "--batch-size must be >= 1"),
])
def test_bad_llama_configs(overrides, message):
    with pytest.raises(UsageError, match=message):
        replace(LLAMA, **overrides)
