"""ckparity.embedding (csrc/embedding.c): F.embedding's lookup and weight gradient bit for bit in float32
and bfloat16 (the width sweep: the record's claims, tests/test_capability.py), padding_idx, any thread
count, what is refused, the twins bit-identical with it (tied embeddings too), and an embedding backward
that drops repeated indices caught."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import kernels
from ckparity.check import suite
from ckparity.errors import InvalidArgument, InvalidType, TargetOutOfRange
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train
from ckparity.kernels.sweeping import grad_run, same_bits
from ckparity.ops.embedding import embedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 0, -2])
def test_the_lookup_and_its_gradient_are_torchs(dtype, padding_idx):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (6, 70), generator=g)
    tokens[:, ::4] = 48  # padding_idx -2: a row used many times that must get no gradient
    weight = torch.randn(50, 33, generator=g).to(dtype).requires_grad_(True)
    up = torch.randn(6, 70, 33, generator=g).to(dtype)
    ours = grad_run(lambda w: embedding(tokens, w, padding_idx), [weight], up)
    theirs = grad_run(lambda w: F.embedding(tokens, w, padding_idx), [weight], up)
    assert all(same_bits(a, b) for a, b in zip(ours, theirs))
    if padding_idx is not None:
        assert not ours[1][padding_idx].any()


def test_the_same_bits_at_any_thread_count():
    g = torch.Generator().manual_seed(1)
    tokens, weight = torch.randint(0, 300, (20000,), generator=g), torch.randn(300, 128, generator=g)
    up = torch.randn(20000, 128, generator=g)
    before = ckparity.get_num_threads()
    try:
        grads = []
        for n in (1, 2):
            ckparity.set_num_threads(n)
            grads.append(grad_run(lambda w: embedding(tokens, w), [weight.requires_grad_(True)], up)[1])
    finally:
        ckparity.set_num_threads(before)
    assert torch.equal(grads[0], grads[1])


def test_bad_input_is_refused_by_name():
    w = torch.randn(10, 4)
    with pytest.raises(TargetOutOfRange, match="index 10 at position 1 is out of range"):
        embedding(torch.tensor([0, 10]), w)
    with pytest.raises(TargetOutOfRange, match="index -1"):
        embedding(torch.tensor([-1]), w)
    for kwargs, name in (({"max_norm": 1.0}, "max_norm"), ({"sparse": True}, "sparse"),
                         ({"scale_grad_by_freq": True}, "scale_grad_by_freq")):
        with pytest.raises(InvalidArgument, match=name):
            embedding(torch.tensor([0]), w, **kwargs)
    with pytest.raises(InvalidType, match="int64 or int32"):
        embedding(torch.tensor([0.0]), w)
    with pytest.raises(InvalidArgument, match="padding_idx must be within the 10 rows"):
        embedding(torch.tensor([0]), w, padding_idx=10)


@pytest.mark.parametrize("tie", [False, True])
def test_the_llama_twins_stay_bit_identical_with_the_c_embedding(tie):
    config = RunConfig(model="llama", num_layers=2, heads=4, kv_heads=2, d_model=32, hidden=48, vocab=64, seq_len=16,
                       batch_size=2, grad_accum=2, total_tokens=4096, max_steps=12, no_progress=True,
                       tie_embeddings=tie, ck_embedding_backend="c", ck_loss_backend="c_ptref",
                       ck_optimizer_backend="torch")
    report = train(config)
    assert report["divergence"]["first_step"] is None, report["divergence"]


def _drops_repeats(tokens, weight, *args, **kwargs):
    """planted fault: an embedding backward that writes each row's gradient instead of adding it, so a
    token used twice keeps only its last use's gradient"""
    class _Last(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            ctx.save_for_backward(tokens)
            return F.embedding(tokens, w)

        @staticmethod
        def backward(ctx, dout):
            (t,) = ctx.saved_tensors
            dweight = torch.zeros_like(weight)
            dweight[t.reshape(-1)] = dout.reshape(-1, dout.shape[-1])  # the last write wins
            return dweight
    return _Last.apply(weight)


kernels.register("embedding", "fault_drops_repeats", _drops_repeats)


def test_an_embedding_backward_that_drops_repeated_indices_is_caught():
    report = suite.check("embedding", "fault_drops_repeats")
    assert report["verdict"] == "wrong" and not report["passed"], suite.table(report)
    config = RunConfig(max_steps=4, grad_accum=2, total_tokens=4096, no_progress=True,
                       ck_embedding_backend="fault_drops_repeats")
    report = train(config)
    assert report["first_param_fail_step"] is not None or report["first_grad_fail_step"] == 1, report["summary"]
