"""Every op of the step is a slot: the twins call ops.<slot> for the embedding,
every linear, attention and the residual adds as for rms_norm, swiglu, rope and
the loss; each slot a record with torch's backend, a contract, check cases and
its flag; --ck-all sets every slot that has a backend of that name. A planted
linear that accumulates in bf16 and a planted attention without its causal
mask are caught by check, train and attribute."""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import replace

import pytest
import torch.nn.functional as F

from ckparity import kernels
from ckparity.check import suite
from ckparity.harness.basics.config import RunConfig, UsageError, parse_train_args
from ckparity.harness.loop.run import train
from ckparity.harness.studies.attribute import attribute

SHORT = RunConfig(max_steps=4, grad_accum=2, total_tokens=4096, no_progress=True)
LLAMA = replace(SHORT, model="llama", num_layers=2, heads=4, kv_heads=2, seq_len=16)


def _linear_in_bf16(x, weight, bias=None):
    """planted fault: the product accumulated in bfloat16 (a GEMM whose accumulator is the input dtype)"""
    y = F.linear(x.bfloat16(), weight.bfloat16(), None if bias is None else bias.bfloat16())
    return y.float()


def _attention_without_causal_mask(q, k, v, *, is_causal=True, enable_gqa=False, scale=None):
    """planted fault: every position attends to the future too"""
    return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=enable_gqa, scale=scale)


CALLS = Counter()


def _counting(slot: str, fn):
    def counted(*args, **kwargs):
        CALLS[slot] += 1
        return fn(*args, **kwargs)
    return counted


kernels.register("linear", "fault_bf16_accumulation", _linear_in_bf16)
kernels.register("attention", "fault_no_causal_mask", _attention_without_causal_mask)
for _slot, _name in (("embedding", "embedding"), ("linear", "linear"), ("attention", "attention"),
                     ("residual", "residual")):
    kernels.register(_name, "counting", _counting(_slot, kernels.backends(_name)["torch"]))


def test_the_llama_twin_calls_every_slot_and_each_call_is_counted(tmp_path):
    """With counting backends in the four new slots the CK twin is still torch's bits (the counting backends
    are torch's ops), and each slot is called as often as the model has that op: per micro-step one embedding,
    6 linears a layer (q, k, v, o, fc1, fc2) + the lm_head, one attention and 2 residual adds a layer."""
    CALLS.clear()
    config = replace(LLAMA, ck_all="counting", ck_loss_backend="c_ptref", max_steps=1, grad_accum=1,
                     json_out=str(tmp_path / "r.json"))
    assert {config.ck_embedding_backend, config.ck_linear_backend, config.ck_attention_backend,
            config.ck_residual_backend} == {"counting"}
    assert config.ck_rmsnorm_backend == "c"  # a slot without a "counting" backend keeps its default
    report = train(config)
    assert report["status"] == "pass", report.get("error")
    layers = LLAMA.num_layers
    assert dict(CALLS) == {"embedding": 1, "linear": 6 * layers + 1, "attention": layers, "residual": 2 * layers}
    assert report["config"]["ck_linear_backend"] == "counting"  # the report says which ran what


def test_ck_all_leaves_a_slot_whose_flag_is_typed_even_as_its_default():
    """--ck-all takes the slots left alone: a backend flag typed on the command line is the user's
    choice, also when it names the default (it once ran the C attention anyway)."""
    all_c = parse_train_args(["--model", "llama", "--ck-all", "c"])
    assert all_c.ck_attention_backend == all_c.ck_linear_backend == "c"
    config = parse_train_args(["--model", "llama", "--ck-all", "c", "--ck-attention-backend", "torch"])
    assert config.ck_attention_backend == "torch"
    assert config.ck_linear_backend == config.ck_embedding_backend == "c"  # the rest still taken


def test_ck_all_refuses_a_name_no_slot_has():
    with pytest.raises(UsageError, match="no slot this run calls"):
        RunConfig(ck_all="nope")


def test_a_slot_flag_of_an_op_the_model_lacks_is_refused():
    with pytest.raises(UsageError, match="--ck-attention-backend takes no effect with --model tiny"):
        RunConfig(ck_attention_backend="counting")


@pytest.mark.parametrize("name", ["embedding", "linear", "attention", "residual"])
def test_torchs_backend_of_each_new_slot_passes_check(name, monkeypatch):
    """torch's own backend: bitwise or following torch in every property (its MKL GEMM's bits move with its
    thread count on some CPUs: the threads property then says it follows torch)."""
    record = kernels.KERNELS[name]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64, 301]))
    report = suite.check(name, "torch")
    assert report["verdict"] == "bitwise", suite.table(report)
    assert {"widths", "layouts", "threads", "batch_invariance", "non_finite", "bad_input"} <= {
        r["property"] for r in report["properties"]}


def test_check_catches_the_planted_linear_and_attention(monkeypatch):
    for name in ("linear", "attention"):
        record = kernels.KERNELS[name]
        monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[7, 64, 301]))
    linear = suite.check("linear", "fault_bf16_accumulation")
    assert linear["verdict"] == "wrong" and not linear["passed"], suite.table(linear)
    attention = suite.check("attention", "fault_no_causal_mask")
    assert attention["verdict"] == "wrong" and not attention["passed"], suite.table(attention)


@pytest.mark.parametrize("base, flag, fault, slot", [
    (SHORT, "ck_linear_backend", "fault_bf16_accumulation", "linear"),
    (LLAMA, "ck_attention_backend", "fault_no_causal_mask", "attention")])
def test_train_and_attribute_catch_a_planted_slot(tmp_path, base, flag, fault, slot):
    config = replace(base, **{flag: fault}, json_out=str(tmp_path / "r.json"))
    report = train(config)
    assert report["status"] == "fail" and report["first_loss_fail_step"] == 1
    result = attribute(config, str(tmp_path / "attr.json"), jobs=1)
    assert result["verdict"]["responsible"] == [slot], result["verdict"]


def test_the_residual_slot_is_the_models_add():
    """The stacked model's blocks add through ops.residual: a residual backend that doubles its second term
    changes the forward."""
    kernels.register("residual", "fault_doubled", lambda x, y: operator.add(x, 2 * y))
    try:
        config = replace(SHORT, model="stacked", ck_residual_backend="fault_doubled", max_steps=1)
        report = train(replace(config, json_out=None, no_progress=True))
        assert report["first_loss_fail_step"] == 1
    finally:
        del kernels.backends("residual")["fault_doubled"]
