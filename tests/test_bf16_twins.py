"""Training in bf16 side by side: --dtype bfloat16 (pure bf16 twins) and --amp
bfloat16 (float32 masters, the forward under autocast). With the kernels
whose bf16 bits follow torch's, the CK twin is the torch twin bit for bit;
a kernel that rounds in another place is seen at the step and stage it
first differs; differences are also counted in ULPs of their dtype, and a
configuration that cannot run in bf16 is refused before it starts."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ckparity import kernels
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.harness.basics.diff import tensor_figures
from ckparity.harness.loop.run import train

# ptref's loss, the C rms_norm, swiglu, rope and AdamW: each bit-identical to torch's bf16 eager
PURE = RunConfig(dtype="bfloat16", ck_loss_backend="c_ptref", seq_len=16, max_steps=25, no_progress=True)
# under autocast the optimizer is float32, where torch's AdamW params are not C's bits (its MKL sqrt)
AMP = replace(PURE, dtype="float32", amp="bfloat16", ck_optimizer_backend="torch")


def _is_bf16_value(x: float) -> bool:
    return float(torch.tensor(x).bfloat16()) == x


@pytest.mark.parametrize("model", ["tiny", "stacked", "llama"])
def test_pure_bf16_twins_are_bit_identical(tmp_path, model):
    r = train(replace(PURE, model=model, json_out=str(tmp_path / "r.json")))
    assert r["status"] == "pass" and r["steps"] == PURE.max_steps
    assert r["divergence"]["first_step"] is None, r["divergence"]
    assert set(r["max_ulp_diff"].values()) == {0.0}
    # the twins trained in bf16: every step's loss (one micro-step each) is a bf16 value, and they moved
    assert all(map(_is_bf16_value, r["series"]["ck_loss"]))
    assert r["series"]["ck_loss"][0] != r["series"]["ck_loss"][-1]
    assert r["config"]["dtype"] == "bfloat16" and r["tolerances"]["compute_dtype"] == "bfloat16"


@pytest.mark.parametrize("model", ["tiny", "llama"])
def test_amp_twins_are_bit_identical_and_the_loss_is_float32(tmp_path, model):
    r = train(replace(AMP, model=model, json_out=str(tmp_path / "r.json")))
    assert r["status"] == "pass" and r["divergence"]["first_step"] is None, r["divergence"]
    # autocast returns F.cross_entropy in float32 (from bf16 logits): so does the CK twin's loss
    assert not all(map(_is_bf16_value, r["series"]["ck_loss"]))
    assert r["series"]["ck_loss"] == r["series"]["torch_loss"]


def test_amp_runs_the_linears_in_bf16_and_the_masters_in_float32():
    from ckparity.harness.twins.factory import build_twins

    ck, ref = build_twins(replace(AMP, model="stacked"))
    tokens = torch.randint(0, AMP.vocab, (1, AMP.seq_len))
    for twin in (ck, ref):
        _, acts = twin.micro_step(tokens, tokens, 1.0)
        assert acts["block0.fc1"].dtype == acts["logits"].dtype == torch.bfloat16
        assert acts["block0.out"].dtype == torch.float32  # the residual stream stays float32
        assert {p.dtype for p in twin.model.parameters()} == {p.grad.dtype for p in twin.model.parameters()} == {
            torch.float32}


def _planted(tmp_path, config: RunConfig, kernel: str, fn) -> dict:
    kernels.register(kernel, "planted", fn)
    flag = next(f for f, k in kernels.FLAGS.items() if k == kernel)
    return train(replace(config, **{flag: "planted"}, json_out=str(tmp_path / "planted.json")))


def test_a_single_rounded_swiglu_is_seen_at_step_1_in_the_swiglu_stage(tmp_path, clean_registry):
    """silu(a) * b rounded once (a fused kernel's habit) where torch rounds silu(a) first."""
    def once(x):
        a, b = x.float().chunk(2, dim=-1)
        return (F.silu(a) * b).to(x.dtype)

    r = train(replace(PURE, model="stacked", json_out=str(tmp_path / "ok.json")))
    assert r["divergence"]["first_step"] is None
    r = _planted(tmp_path, replace(PURE, model="stacked"), "swiglu", once)
    assert r["divergence"]["first_step"] == 1 and r["divergence"]["stage"].endswith("swiglu"), r["divergence"]
    assert r["max_ulp_diff"]["logit"] >= 1


@pytest.mark.parametrize("mode", ["pure", "amp"])
def test_a_cross_entropy_in_float_then_rounded_is_seen_at_the_loss(tmp_path, clean_registry, mode):
    """Pure bf16: log_softmax and nll in float, rounded once (torch keeps bf16 temporaries): the first bits
    to differ are the loss's gradient at step 1 (the loss itself may round alike). Under --amp the loss is
    float32 anyway, and the same kernel is bit-identical there."""
    def in_float(logits, targets):
        return F.cross_entropy(logits.float(), targets).to(logits.dtype)

    r = _planted(tmp_path, PURE if mode == "pure" else AMP, "cross_entropy", in_float)
    if mode == "pure":
        assert r["divergence"]["first_step"] == 1 and r["divergence"]["stage"] in ("loss", "dlogits")
        assert r["max_ulp_diff"]["loss"] >= 1 and r["max_ulp_diff"]["grad"] >= 1
    else:
        assert r["divergence"]["first_step"] is None


def test_the_default_cross_entropy_drifts_in_bf16_and_the_report_says_where(tmp_path):
    r = train(replace(PURE, ck_loss_backend="c", json_out=str(tmp_path / "r.json")))
    assert r["divergence"]["first_step"] == 1 and r["divergence"]["stage"] in ("loss", "dlogits")
    assert 0 < r["max_ulp_diff"]["grad"] < math.inf and r["pass_parity"]  # ULPs apart, within the bf16 tolerances


def test_the_tolerances_are_float32s_scaled_to_the_compute_dtype(tmp_path):
    assert PURE.tolerance("loss_tol") == AMP.tolerance("loss_tol") == PURE.loss_tol * 2**16
    assert RunConfig().tolerance("param_tol") == RunConfig().param_tol
    r = train(replace(PURE, max_steps=2, json_out=str(tmp_path / "r.json")))
    assert r["tolerances"]["grad_tol"] == PURE.grad_tol * 2**16


@pytest.mark.parametrize("dtype, ulp", [(torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-7)])
def test_a_difference_is_counted_in_ulps_of_its_dtype(dtype, ulp):
    b = torch.tensor([1.5, -0.25, 1e-3], dtype=dtype)
    a = b.clone()
    a[0] = 1.5 + ulp  # one ULP at the tensor's largest value
    assert tensor_figures(a, b)[2] == 1.0
    a[0] = 1.5 + 3 * ulp
    assert tensor_figures(a, b)[2] == 3.0
    assert tensor_figures(b, b)[2] == 0.0


def test_what_cannot_run_in_bf16_is_refused_before_the_run(clean_registry):
    def float_only(x):
        if x.dtype != torch.float32:
            raise TypeError("float32 only")
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    kernels.register("swiglu", "float_only", float_only)
    refused = {"--amp keeps float32 master weights": dict(amp="bfloat16"),
               "--ck-swiglu-backend float_only: the backend has no bfloat16 form": dict(ck_swiglu_backend="float_only")}
    for message, change in refused.items():
        with pytest.raises(UsageError, match=message):
            replace(PURE, **change)
    with pytest.raises(UsageError, match="--ck-swiglu-backend float_only"):  # --amp hands swiglu bf16 too
        replace(AMP, ck_swiglu_backend="float_only")
    with pytest.raises(UsageError, match="--ck-loss-backend c_fused_linear"):  # autocast's float32 weight, bf16 input
        replace(AMP, ck_loss_backend="c_fused_linear")
    # pure bf16 runs over ranks (tests/test_ranks.py); --tp's CK loss is the vocab-parallel one
    for ranks in (dict(tp=2, ck_loss_backend="c"), dict(dp=2, grad_accum=4)):
        with pytest.raises(UsageError, match="--tp|--dp"):
            replace(AMP, **ranks)
        replace(PURE, **ranks)
    replace(PURE, ck_loss_backend="c_fused_linear")  # the fused lm_head + loss takes bf16 hidden and weight
    replace(AMP, max_grad_norm=1.0)  # under --amp the clip sees float32 grads
    replace(PURE, max_grad_norm=1.0)  # the C clip takes bf16 grads (its norm from their exact values)


@pytest.mark.parametrize("mode", ["pure", "amp"])
def test_a_bf16_run_resumes_bit_for_bit(tmp_path, mode):
    # a drifting run (the default loss; under amp the C AdamW too): its drift is compared
    base = replace(PURE if mode == "pure" else replace(AMP, ck_optimizer_backend="c"), model="stacked",
                   ck_loss_backend="c", max_steps=10)
    whole = train(replace(base, json_out=str(tmp_path / "whole.json")))
    train(replace(base, max_steps=4, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ck"),
                  json_out=str(tmp_path / "cut.json")))
    resumed = train(RunConfig(resume=str(tmp_path / "ck"), max_steps=10, no_progress=True,
                              json_out=str(tmp_path / "resumed.json")))
    assert (resumed["config"]["dtype"], resumed["config"]["amp"]) == (base.dtype, base.amp)
    series = {k: v for k, v in whole["series"].items() if not k.endswith("_ms")}
    assert {k: resumed["series"][k] for k in series} == series
    assert whole["max_param_abs_diff"] > 0


def test_bf16_weights_load_as_bf16_and_into_float32_masters_under_amp(tmp_path):
    """--init-from a bf16 safetensors file: the pure bf16 twins hold its bits, the --amp masters hold its
    values exactly in float32."""
    from safetensors.torch import save_file

    from ckparity.harness.twins.factory import build_twins

    ck, _ = build_twins(RunConfig())
    weights = {k: (v * 1.37).bfloat16().contiguous() for k, v in ck.model.state_dict().items()}
    save_file(weights, str(tmp_path / "w.safetensors"))
    for config, dtype in ((replace(PURE, init_from=str(tmp_path / "w.safetensors")), torch.bfloat16),
                          (replace(AMP, init_from=str(tmp_path / "w.safetensors")), torch.float32)):
        for twin in build_twins(config):
            state = twin.model.state_dict()
            assert all(state[k].dtype == dtype and torch.equal(state[k].bfloat16(), w) for k, w in weights.items())


def test_a_bf16_step_dumped_replays_to_its_bits(tmp_path):
    from ckparity.harness.longrun.dump import replay

    train(replace(PURE, ck_loss_backend="c", max_steps=4, dump_step=3, dump_dir=str(tmp_path / "dump"),
                  json_out=str(tmp_path / "r.json")))
    result = replay(str(tmp_path / "dump"))
    assert result["faithful"] is True
    rows = {r["stage"]: r for r in result["ck_vs_torch"]["forward"]}
    assert rows["logits"]["abs_diff"] > 0  # the default loss's drift by step 3, in bf16


def test_the_torch_twin_takes_either_adamw_reference_and_the_other_one_is_seen_at_the_update(tmp_path):
    """--torch-adamw fused: torch's fused=True AdamW (float math from unrounded moments) on the torch twin;
    the C AdamW follows the single-tensor path, so in bf16 the twins part at step 1's update."""
    r = train(replace(PURE, torch_adamw="fused", json_out=str(tmp_path / "r.json")))
    assert r["config"]["torch_adamw"] == "fused"
    assert r["divergence"]["first_step"] == 1 and r["divergence"]["stage"] == "update", r["divergence"]
    with pytest.raises(UsageError, match="--torch-adamw takes no effect with --optimizer sgd"):
        replace(PURE, optimizer="sgd", torch_adamw="fused")


BASELINE = Path(__file__).resolve().parent.parent / "reports" / "baseline"
BF16_REPORTS = {"c": "repro_850_bfloat16_c.json", "c_ptref": "repro_850_bfloat16_c_ptref.json",
                "torch": "repro_850_bfloat16_torch.json", "amp c": "repro_850_amp_c.json",
                "amp c_ptref": "repro_850_amp_c_ptref.json", "amp torch": "repro_850_amp_torch.json",
                "amp c_ptref, torch AdamW": "amp_torch_adamw/repro_850_amp_c_ptref.json"}


def test_the_docs_bf16_repro_table_is_the_committed_reports():
    """docs/harness.md's bf16 table: each of its rows is the row `ckparity repro`'s table gives for the
    committed reports, and the ptref runs there are bit-identical over all 850 steps."""
    from ckparity.harness.studies.repro import table

    reports = {name: json.loads((BASELINE / path).read_text()) for name, path in BF16_REPORTS.items()}
    generated = table(reports).splitlines()
    docs = (Path(__file__).resolve().parent.parent / "docs" / "harness.md").read_text()
    header = generated[0]
    assert header in docs
    shown = docs[docs.index(header):].split("\n\n")[0].splitlines()[2:]
    assert len(shown) >= 8 and all(row in generated for row in shown), [r for r in shown if r not in generated]
    for name in ("c_ptref", "amp c_ptref, torch AdamW"):
        r = reports[name]
        assert r["steps"] == 850 and r["divergence"]["first_step"] is None and set(r["max_ulp_diff"].values()) == {0}


def test_the_committed_bf16_twins_are_bit_identical_at_every_capability():
    """reports/bf16_twins/: the ptref twins, pure and amp, over the 850-step preset and 300 llama steps,
    with torch (and the library) at DEFAULT, AVX2 and AVX512 -- not one differing bit."""
    runs = {}
    for path in (BASELINE.parent / "bf16_twins").glob("*.json"):
        r = json.loads(path.read_text())
        runs[path.stem] = r
        assert r["env"]["capability_matched"] and r["divergence"]["first_step"] is None, path.name
        assert r["steps"] == r["planned_steps"] == (850 if path.stem.startswith("preset850") else 300)
    assert {(r["config"]["model"], r["config"]["dtype"], r["config"]["amp"], r["env"]["torch_cpu_capability"])
            for r in runs.values()} == {(m, d, a, cap) for m in ("tiny", "llama")
                                        for d, a in (("bfloat16", "none"), ("float32", "bfloat16"))
                                        for cap in ("DEFAULT", "AVX2", "AVX512")}


def test_attribute_leaves_out_the_alternatives_the_precision_refuses():
    from ckparity.harness.studies.attribute import variants

    names = set(variants(replace(AMP, ck_loss_backend="c")))
    assert "alternative cross_entropy=c_ptref" in names and "alternative cross_entropy=c_fused_linear" not in names
    assert "alternative cross_entropy=c_fused_linear" in variants(replace(PURE, ck_loss_backend="c"))  # pure bf16 keeps it
    assert "alternative cross_entropy=c_fused_linear" in variants(RunConfig())  # float32 too


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_with_torchs_fused_adamw_the_c_fused_one_keeps_the_twins_bit_identical(tmp_path, dtype):
    """--torch-adamw fused --ck-optimizer-backend c_fused: in float32 too every kernel of the CK twin is then
    torch's bits, the optimizer included (the fused kernel's sqrt is correctly rounded, as C's)."""
    r = train(replace(PURE, dtype=dtype, model="stacked", torch_adamw="fused", ck_optimizer_backend="c_fused",
                      json_out=str(tmp_path / "r.json")))
    assert r["divergence"]["first_step"] is None, r["divergence"]
    assert r["series"]["ck_loss"][0] != r["series"]["ck_loss"][-1]
