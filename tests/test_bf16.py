"""bfloat16: the ops follow the tensor's dtype as torch's do, give torch's
bf16 bits where their records claim it (the sweeps at every capability are
tests/test_capability.py's), refuse mixed dtypes, and the C entry points
refuse what the float32 ones refuse."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import _bindings, kernels, reference
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.kernels.sweeping import torch_threads


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_rms_norm_follows_the_dtype_and_gives_torchs_bf16_bits():
    g = torch.Generator().manual_seed(0)
    for N, D in ((1, 1), (3, 300), (7, 4097)):
        x = (torch.randn(N, D, generator=g) * 3).bfloat16().requires_grad_(True)
        w = torch.randn(D, generator=g).bfloat16().requires_grad_(True)
        dy = torch.randn(N, D, generator=g).bfloat16()
        y = ckparity.rms_norm(x, (D,), w, 1e-5)
        assert y.dtype == torch.bfloat16
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        ty = F.rms_norm(x, (D,), w, 1e-5)
        tdx, tdw = torch.autograd.grad(ty, (x, w), dy)
        for ours, theirs in ((y, ty), (dx, tdx), (dw, tdw)):
            assert ours.dtype == torch.bfloat16 and torch.equal(_bits(ours), _bits(theirs.detach()))


def test_swiglu_follows_the_dtype_and_rounds_twice_as_torch_does():
    """bf16(bf16(silu(g)) * u): a single rounding of the float product would differ on many elements."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(17, 2 * 301, generator=g) * 4).bfloat16().requires_grad_(True)
    dout = torch.randn(17, 301, generator=g).bfloat16()
    out = ckparity.swiglu(x)
    (dx,) = torch.autograd.grad(out, x, dout)
    theirs = reference.swiglu(x)
    (tdx,) = torch.autograd.grad(theirs, x, dout)
    assert out.dtype == torch.bfloat16 and torch.equal(_bits(out), _bits(theirs.detach()))
    assert torch.equal(_bits(dx), _bits(tdx))
    xf = x.detach().float()
    once = (F.silu(xf[:, :301]) * xf[:, 301:]).bfloat16()  # one rounding: not torch's bf16
    assert not torch.equal(_bits(once), _bits(out))


def test_rope_follows_the_dtype():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 5, 34, generator=g).bfloat16().requires_grad_(True)
    angles = torch.rand(5, 17, generator=g) * 9
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    dout = torch.randn(2, 4, 5, 34, generator=g).bfloat16()
    for layout in ("half", "interleaved"):
        out = ckparity.rope(x, cos, sin, layout=layout)
        (dx,) = torch.autograd.grad(out, x, dout)
        theirs = reference.rope(x, cos, sin, layout)
        (tdx,) = torch.autograd.grad(theirs, x, dout)
        assert out.dtype == torch.bfloat16 and torch.equal(_bits(out), _bits(theirs.detach()))
        assert torch.equal(_bits(dx), _bits(tdx))
    with pytest.raises(InvalidType, match="one dtype for both"):
        ckparity.rope(x, cos.float(), sin.float())


def test_mixed_dtypes_and_other_dtypes_are_refused_with_a_clear_error():
    """bf16 activations with a float32 weight are torch's float composite (y and dx bf16, dweight float32),
    bit for bit, and so are float32 activations with a bf16 or float16 weight (y and dx float32, dweight
    rounded once to the weight's dtype; the rms_norm sweep holds both at every width); two 16-bit dtypes
    are refused by name, as are other dtypes."""
    x = (torch.randn(3, 300) * 3).bfloat16().requires_grad_(True)
    w = torch.randn(300, requires_grad=True)
    ours, theirs = ckparity.rms_norm(x, (300,), w), F.rms_norm(x, (300,), w)
    assert ours.dtype == torch.bfloat16 and torch.equal(_bits(ours.detach()), _bits(theirs.detach()))
    up = torch.randn(3, 300).bfloat16()
    (dx, dw), (tdx, tdw) = torch.autograd.grad(ours, (x, w), up), torch.autograd.grad(theirs, (x, w), up)
    assert dw.dtype == torch.float32 and torch.equal(_bits(dx), _bits(tdx)) and torch.equal(dw.view(torch.int32),
                                                                                          tdw.view(torch.int32))
    x32 = torch.randn(3, 300).requires_grad_(True)
    for dtype in (torch.bfloat16, torch.float16):
        w16 = torch.randn(300).to(dtype).requires_grad_(True)
        ours, theirs = ckparity.rms_norm(x32, (300,), w16), F.rms_norm(x32, (300,), w16)
        assert ours.dtype == torch.float32 and torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
        (dx, dw), (tdx, tdw) = (torch.autograd.grad(y, (x32, w16), up.float()) for y in (ours, theirs))
        assert dw.dtype == dtype and torch.equal(_bits(dw), _bits(tdw)) and torch.equal(dx.view(torch.int32),
                                                                                     tdx.view(torch.int32))
    with pytest.raises(InvalidType, match="one dtype for both"):
        ckparity.rms_norm(torch.randn(3, 8).bfloat16(), (8,), torch.randn(8).half())
    with pytest.raises(InvalidType, match="float32, bfloat16 or float16"):  # rms_norm takes float16 too
        ckparity.rms_norm(torch.randn(3, 8).double(), (8,))
    with pytest.raises(InvalidType, match="float32, bfloat16 or float16"):  # swiglu takes float16 too
        ckparity.swiglu(torch.randn(3, 8).double())


def test_the_bf16_c_entry_points_refuse_bad_sizes_and_aliasing():
    x, out = torch.randn(4, 8).bfloat16(), torch.empty(4, 4, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgument, match="overlaps"):
        _bindings.swiglu_forward(x, x.view(-1)[:16].view(4, 4))
    y, rstd = torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(4)
    with pytest.raises(InvalidArgument, match="overlap"):
        _bindings.rms_norm_forward_16(x, None, 1e-5, x, rstd)
    _bindings.rms_norm_forward_16(x, None, 1e-5, y, rstd)
    torch.testing.assert_close(y, F.rms_norm(x, (8,), eps=1e-5), rtol=0, atol=0)
    _bindings.swiglu_forward(x, out)


def test_the_records_claim_bf16_and_info_says_where_it_holds():
    claimed = {c.key: c.quantities for c in kernels.claims("bfloat16")}
    assert claimed == {"rms_norm": ("y", "dx", "dweight"), "swiglu": ("out", "dx"), "rope": ("out", "dx"),
                       "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param"),
                       "adamw.fused": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param"),
                       "cross_entropy.ptref": ("loss", "dlogits"), "embedding": ("out", "dweight"),
                       "residual": ("out", "dx", "dy"), "gelu": ("y", "dx"), "gelu.erf": ("y", "dx"),
                       "layer_norm": ("y", "dx", "dweight", "dbias"), "layer_norm.mixed": ("y", "dx", "dweight", "dbias"),
                       "linear.onednn": ("y", "dx", "dweight"), "linear.onednn_bias": ("y", "dx", "dweight", "dbias"),
                           "linear.aten": ("y", "dx", "dweight", "dbias"),
                       "attention": ("out", "dq", "dk", "dv")}
    if ckparity.cpu.matched():  # less a claim whose condition fails here (gelu.erf: oneDNN below avx512_core)
        held = {c.key for c in kernels.claims("bfloat16") if c.reason_not_here() is None}
        assert kernels.bit_identical("bfloat16") == {k: list(q) for k, q in claimed.items() if k in held}


def test_the_bf16_sweeps_catch_a_rounding_in_the_wrong_place(monkeypatch):
    """The sweep can fail: swiglu rounded once (the float product of silu and up, then bf16) and
    rms_norm rounded twice (x * rstd to bf16, then * weight) differ from torch's bf16 in many cases.
    (Another capability's float arithmetic -- exp's last bit -- almost never survives the rounding to
    bf16: 0 of 409600 outputs differ where 13960 float ones do, so the bf16 sweep cannot tell the
    capabilities apart, and need not.)"""
    import importlib

    from ckparity import sweep

    swiglu_record = importlib.import_module("ckparity.kernels.swiglu")
    rms_record = importlib.import_module("ckparity.kernels.rms_norm")
    rope_record = importlib.import_module("ckparity.kernels.rope")
    ce_record = importlib.import_module("ckparity.kernels.cross_entropy")

    def rounded_once(x):
        h = x.shape[-1] // 2
        xf = x.float()
        return (F.silu(xf[..., :h]) * xf[..., h:]).to(x.dtype)

    def rounded_twice(x, shape, weight=None, eps=None):
        y = F.rms_norm(x.float(), shape, None, eps).to(x.dtype)
        return y * weight if weight is not None else y

    def rope_rounded_once(x, cos, sin, layout="half"):  # the products kept in float: one rounding at the end
        return reference.rope(x.float(), cos.float(), sin.float(), layout).to(x.dtype)

    monkeypatch.setattr(swiglu_record, "swiglu", rounded_once)
    monkeypatch.setattr(rms_record, "rms_norm", rounded_twice)
    def ce_in_float(logits, target, weight=None, variant="ptref", **kwargs):  # log_softmax and nll in float, then bf16
        return F.cross_entropy(logits.float(), target, None if weight is None else weight.float(),
                               **kwargs).to(logits.dtype)

    monkeypatch.setattr(rope_record, "rope", rope_rounded_once)
    monkeypatch.setattr(ce_record, "cross_entropy", ce_in_float)
    # only the four records planted here: the whole bf16 sweep (GEMMs and attention too) took ~50 s of CI
    result = sweep.run(["cross_entropy.ptref", "swiglu", "rms_norm", "rope"], dtype="bfloat16")["kernels"]
    assert result["cross_entropy.ptref"]["loss"]["differing"] > 100
    assert result["cross_entropy.ptref"]["dlogits"]["differing"] > 100
    assert result["swiglu"]["out"]["differing"] > 100
    assert result["rms_norm"]["y"]["differing"] > 100
    assert result["rope"]["out"]["differing"] > 100


def test_adamw_steps_a_bf16_parameter_as_torch_does_and_the_sweep_sees_a_float_eps(monkeypatch):
    """ckparity.optim.AdamW on a bf16 parameter: bf16 moments, torch's bits after 5 steps. The sweep
    catches an AdamW that adds eps in float: add_(eps) on a bf16 tensor rounds eps to bf16 first (a
    Scalar added takes the tensor's dtype; one multiplied or divided by stays float) -- the one case in
    2754 where it shows is the case the sweep found while this kernel was written."""
    import importlib

    from ckparity import sweep
    from ckparity.optim import AdamW

    g = torch.Generator().manual_seed(3)
    p0 = torch.randn(1000, generator=g).bfloat16()
    ours, theirs = p0.clone(), p0.clone()
    a, b = AdamW([ours], lr=1e-2, amsgrad=True), torch.optim.AdamW([theirs], lr=1e-2, amsgrad=True, foreach=False)
    for _ in range(5):
        grad = torch.randn(1000, generator=g).bfloat16()
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    assert a.state[ours]["exp_avg"].dtype == torch.bfloat16
    for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert torch.equal(_bits(a.state[ours][name]), _bits(b.state[theirs][name]))
    assert torch.equal(_bits(ours), _bits(theirs))

    class FloatEps(torch.optim.Optimizer):
        """torch's bf16 step written out, each op rounded -- but eps kept in float."""

        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
                     maximize=False):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                          maximize=maximize))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                (b1, b2), lr = group["betas"], group["lr"]
                for p in group["params"]:
                    st = self.state[p]
                    if not st:
                        st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                        if group["amsgrad"]:
                            st["max_exp_avg_sq"] = torch.zeros_like(p)
                    st["step"] += 1
                    grad = -p.grad if group["maximize"] else p.grad
                    if group["weight_decay"]:
                        p.mul_(1 - lr * group["weight_decay"])
                    st["exp_avg"].lerp_(grad, 1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                    v = st["exp_avg_sq"]
                    if group["amsgrad"]:
                        torch.maximum(st["max_exp_avg_sq"], v, out=st["max_exp_avg_sq"])
                        v = st["max_exp_avg_sq"]
                    root = (v.sqrt() / (1 - b2 ** st["step"]) ** 0.5).float()
                    denom = (root + torch.tensor(group["eps"])).bfloat16()  # the fault: eps not rounded first
                    p.addcdiv_(st["exp_avg"], denom, value=-lr / (1 - b1 ** st["step"]))

    monkeypatch.setattr(importlib.import_module("ckparity.kernels.adamw"), "AdamW", FloatEps)
    assert sweep.run(["adamw"], dtype="bfloat16")["kernels"]["adamw"]["param"]["differing"] > 0


@pytest.mark.parametrize("fused", [False, True])
def test_adamw_in_bf16_carries_nan_and_inf_where_torch_does(fused):
    """Non-finite grads and params through both bf16 AdamW references, over 600 elements (the C loop's
    blocks of vectors, a part block and the scalar tail): NaN where torch has NaN (torch writes it as
    0xFFFF or 0x7FC0; either is NaN), every other element torch's bits."""
    from ckparity.optim import AdamW

    g = torch.Generator().manual_seed(5)
    p0 = torch.randn(600, generator=g).bfloat16()
    p0[[7, 300]] = float("nan")
    p0[[8, 301, 599]] = float("inf")
    ours, theirs = p0.clone(), p0.clone()
    a = AdamW([ours], lr=1e-2, fused=fused)
    b = torch.optim.AdamW([theirs], lr=1e-2, fused=fused, foreach=False)
    for step in range(3):
        grad = torch.randn(600, generator=g).bfloat16()
        grad[[40 + step, 290, 598]] = torch.tensor([float("nan"), float("-inf"), float("inf")]).bfloat16()
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    for mine, torchs in [(ours, theirs)] + [(a.state[ours][k], b.state[theirs][k]) for k in ("exp_avg", "exp_avg_sq")]:
        nan = torchs.isnan()
        assert nan.any() and torch.equal(mine.isnan(), nan)
        assert torch.equal(_bits(mine)[~nan], _bits(torchs)[~nan])


def test_check_in_bf16_holds_a_backend_to_torchs_bf16(clean_registry, monkeypatch):
    """ckparity check --dtype bfloat16: ckparity's own bf16 kernels are bitwise; a swiglu rounded once
    (more accurate than torch's two roundings) is as accurate as torch, not bitwise; one 3% off is
    wrong; a float32-only backend is not supported (its TypeError on a bf16 input), not a crash."""
    from dataclasses import replace

    from ckparity import check

    record = kernels.KERNELS["swiglu"]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64, 301]))

    def once(x):
        h = x.shape[-1] // 2
        xf = x.float()
        return (F.silu(xf[..., :h]) * xf[..., h:]).to(x.dtype)

    def off(x):
        return reference.swiglu(x) * 1.03

    def float_only(x):
        if x.dtype != torch.float32:
            raise TypeError("float32 only")
        return reference.swiglu(x)

    kernels.register("swiglu", "once", once)
    kernels.register("swiglu", "off", off)
    kernels.register("swiglu", "float_only", float_only)
    verdicts = {name: check.check("swiglu", name, dtype="bfloat16")["verdict"] for name in ("c", "once", "off",
                                                                                             "float_only")}
    assert verdicts == {"c": "bitwise", "once": "as accurate as torch", "off": "wrong",
                        "float_only": "not supported"}


def test_cross_entropy_ptref_follows_the_dtype_and_refuses_what_is_not_in_bf16():
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(300, 97, generator=g) * 3).bfloat16().requires_grad_(True)
    target = torch.randint(0, 97, (300,), generator=g)
    target[::5] = -100
    loss = ckparity.cross_entropy(x, target, variant="ptref")
    (dx,) = torch.autograd.grad(loss, x)
    theirs = F.cross_entropy(x, target)
    (tdx,) = torch.autograd.grad(theirs, x)
    assert loss.dtype == torch.bfloat16 and torch.equal(_bits(loss), _bits(theirs.detach()))
    assert torch.equal(_bits(dx), _bits(tdx))  # bits: an ignored row's zeros are +0, as torch's
    one = x[7].detach().clone().requires_grad_(True)  # (C): one row, torch's bits as well
    mine, torchs = (fn(one, target[7], label_smoothing=0.1) for fn in (
        lambda *a, **k: ckparity.cross_entropy(*a, variant="ptref", **k), F.cross_entropy))
    assert torch.equal(_bits(mine.detach()), _bits(torchs.detach()))
    assert torch.equal(_bits(torch.autograd.grad(mine, one)[0]), _bits(torch.autograd.grad(torchs, one)[0]))
    with pytest.raises(InvalidType, match=r"ptref takes \(C\) or \(N, C\) logits"):  # torch's loops over dim 1
        ckparity.cross_entropy(x.detach().reshape(300, 97, 1), target.reshape(300, 1), variant="ptref")
    weight = (torch.rand(97, generator=g) + 0.5).bfloat16()
    for kwargs, what in ((dict(variant="ptref", inplace_backward=True), "inplace_backward"),
                         (dict(variant="ptref", z_loss=1e-4), "z_loss"),
                         (dict(variant="ptref", target=torch.softmax(x.float(), 1).half()), "probability targets other"),
                         (dict(variant="ptref", weight=torch.ones(97)), "bf16 weight")):
        with pytest.raises(InvalidType, match=what.replace("(", r"\(").replace(")", r"\)")):
            ckparity.cross_entropy(x, kwargs.pop("target", target), **kwargs)
    for reduction, extra in itertools.product(("mean", "sum", "none"), (dict(), dict(weight=weight),
                                                                         dict(label_smoothing=0.1),
                                                                         dict(weight=weight, label_smoothing=0.3))):
        # another upstream gradient is folded in where torch folds it; weights and smoothing as torch rounds them
        up = (torch.randn(300 if reduction == "none" else (), generator=g) * 3).bfloat16()
        ours = ckparity.cross_entropy(x, target, reduction=reduction, variant="ptref", **extra)
        theirs = F.cross_entropy(x, target, reduction=reduction, **extra)
        assert torch.equal(_bits(ours.detach()), _bits(theirs.detach())), (reduction, extra)
        (dx,), (tdx,) = torch.autograd.grad(ours, x, up), torch.autograd.grad(theirs, x, up)
        assert torch.equal(_bits(dx), _bits(tdx)), (reduction, extra)
    probs = torch.softmax(torch.randn(300, 97, generator=g), 1).bfloat16()  # bf16 probability targets
    for reduction in ("mean", "sum", "none"):
        up = (torch.randn(300 if reduction == "none" else (), generator=g) * 3).bfloat16()
        ours = ckparity.cross_entropy(x, probs, weight, reduction=reduction, label_smoothing=0.1, variant="ptref")
        theirs = F.cross_entropy(x, probs, weight, reduction=reduction, label_smoothing=0.1)
        assert ours.dtype == torch.bfloat16 and torch.equal(_bits(ours.detach()), _bits(theirs.detach())), reduction
        (dx,), (tdx,) = torch.autograd.grad(ours, x, up), torch.autograd.grad(theirs, x, up)
        assert torch.equal(_bits(dx), _bits(tdx)), reduction


@pytest.mark.parametrize("V", [97, 300, 1003])
def test_bf16_ptref_rows_with_nan_inf_and_zero_maxima_are_torchs_bits(V):
    """The row max runs four chains of lanes and flags a row that may hold a NaN (a NaN, or an inf beside
    a -inf), which it then takes again in order; rows of those kinds at every place of the chains, the
    tail and the last vector, and rows whose maximum is a zero of either sign: loss (per row) and
    dlogits are torch's bits, NaN where torch's are NaN. (A NaN's own bits are not claimed: torch writes
    0xFFFF from its vectorized float-to-bf16 conversion, as in this dlogits, and 0x7FC0 from its scalar
    one, as in this loss; ckparity writes 0x7FC0.) Before the fix of SLEEF's log for a NaN sum, a row
    holding +inf lost inf here where torch's loses NaN (float32 too)."""
    from ckparity.kernels.sweeping import special_rows

    g = torch.Generator().manual_seed(12)
    x = special_rows(g, V, torch.bfloat16).requires_grad_(True)
    N = x.shape[0]
    target = torch.randint(0, V, (N,), generator=g)
    target[20] = -100
    ours = ckparity.cross_entropy(x, target, reduction="none", variant="ptref")
    theirs = F.cross_entropy(x, target, reduction="none")
    assert theirs.isnan().sum() > 7 and torch.equal(_bits(ours.detach()), _bits(theirs.detach()))
    up = torch.randn(N, generator=g).bfloat16()
    (dx,), (tdx,) = torch.autograd.grad(ours, x, up), torch.autograd.grad(theirs, x, up)
    nan = tdx.isnan()
    assert nan.any() and torch.equal(dx.isnan(), nan) and torch.equal(_bits(dx)[~nan], _bits(tdx)[~nan])
    # float32: the same rows (exactly widened) give torch's loss, NaN where torch's is
    x32 = x.detach().float()
    ours32, theirs32 = (f(x32, target, reduction="none", **kw) for f, kw in ((ckparity.cross_entropy,
                                                                              dict(variant="ptref")),
                                                                             (F.cross_entropy, {})))
    assert torch.equal(ours32.isnan(), theirs32.isnan()) and torch.equal(ours32[~ours32.isnan()],
                                                                          theirs32[~theirs32.isnan()])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bf16_probability_targets_get_torchs_gradient(reduction):
    """bf16 probability targets that require grad (distillation): their gradient is torch's bf16 chain's,
    the logits' still the kernel's, both torch's bits; with weights and smoothing, another upstream
    gradient, and the target alone requiring grad. A weight that requires grad is refused, as in float32."""
    g = torch.Generator().manual_seed(11)
    weight = (torch.rand(37, generator=g) + 0.5).bfloat16()
    for extra, logits_grad in itertools.product((dict(), dict(weight=weight, label_smoothing=0.2)), (True, False)):
        x = (torch.randn(5, 37, generator=g) * 3).bfloat16().requires_grad_(logits_grad)
        q = torch.softmax(torch.randn(5, 37, generator=g), 1).bfloat16().requires_grad_(True)
        up = (torch.randn(5 if reduction == "none" else (), generator=g) * 3).bfloat16()
        ours = ckparity.cross_entropy(x, q, reduction=reduction, variant="ptref", **extra)
        theirs = F.cross_entropy(x, q, reduction=reduction, **extra)
        inputs = (x, q) if logits_grad else (q,)
        for mine, torchs in zip(torch.autograd.grad(ours, inputs, up), torch.autograd.grad(theirs, inputs, up)):
            assert mine.dtype == torch.bfloat16 and torch.equal(_bits(mine), _bits(torchs))
    with pytest.raises(NotImplementedError, match="not weight"):
        ckparity.cross_entropy(x, q, weight=weight.clone().requires_grad_(True), variant="ptref")


def test_the_default_variants_target_gradient_is_float32s_rounded_once():
    """The default variant's rule for bf16 probability targets too: torch's float32 composite on the
    widened values, the gradient rounded once; with (N, C, d) logits as well, where a bf16 chain on the
    flattened rows would be neither torch's bits (its log_softmax over dim 1 runs other loops) nor as
    accurate. Against float64 no farther than torch's bf16 chain."""
    g = torch.Generator().manual_seed(17)
    for shape in ((6, 37), (2, 37, 5), (3, 7, 4, 2)):
        x = (torch.randn(shape, generator=g) * 3).bfloat16()
        q = torch.softmax(torch.randn(shape, generator=g) * 2, 1).bfloat16().requires_grad_(True)
        (ours,) = torch.autograd.grad(ckparity.cross_entropy(x, q), q)
        (torchs,) = torch.autograd.grad(F.cross_entropy(x, q), q)
        q64 = q.detach().double().requires_grad_(True)
        (exact,) = torch.autograd.grad(F.cross_entropy(x.double(), q64), q64)
        assert ours.dtype == torch.bfloat16 and ours.shape == q.shape
        assert (ours.double() - exact).abs().max() <= (torchs.double() - exact).abs().max(), shape
        if len(shape) == 2:
            qf = q.detach().float().requires_grad_(True)
            (wide,) = torch.autograd.grad(F.cross_entropy(x.float(), qf), qf)
            assert torch.equal(_bits(ours), _bits(wide.bfloat16()))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_float32_probabilities_with_bf16_logits_are_torchs_mixed_call(reduction):
    """torch takes bf16 logits with float32 probabilities and promotes the loss to float32: ptref gives its
    bits -- the loss float32, the logits' gradient bf16, the probabilities' float32 -- with a bf16 or float32
    weight, smoothing, another upstream gradient, rows of every kind of non-finite value; a row sum across
    torch's threads (one row of 40000); a float16 target is refused by name."""
    g = torch.Generator().manual_seed(13)
    for V, extra in itertools.product((1, 37, 40000), (dict(), dict(weight=torch.float32, label_smoothing=0.2),
                                                       dict(weight=torch.bfloat16))):
        N = 1 if V == 40000 else 5
        kwargs = dict(extra, weight=(torch.rand(V, generator=g) + 0.5).to(extra["weight"])) if extra else extra
        x = (torch.randn(N, V, generator=g) * 3).bfloat16().requires_grad_(True)
        q = torch.softmax(torch.randn(N, V, generator=g), 1).requires_grad_(True)
        up = torch.randn(N if reduction == "none" else (), generator=g) * 3
        with torch_threads(2):
            ours = ckparity.cross_entropy(x, q, reduction=reduction, variant="ptref", **kwargs)
            theirs = F.cross_entropy(x, q, reduction=reduction, **kwargs)
            assert ours.dtype == torch.float32 and torch.equal(ours.detach(), theirs.detach()), (V, extra)
            mine, torchs = torch.autograd.grad(ours, (x, q), up), torch.autograd.grad(theirs, (x, q), up)
        assert mine[0].dtype == torch.bfloat16 and torch.equal(_bits(mine[0]), _bits(torchs[0])), (V, extra)
        assert torch.equal(mine[1], torchs[1])
    from ckparity.kernels.sweeping import special_rows

    x = special_rows(g, 97, torch.bfloat16).requires_grad_(True)
    q = torch.softmax(torch.randn(x.shape, generator=g), 1)
    ours, theirs = (fn(x, q, reduction=reduction, **kw) for fn, kw in ((ckparity.cross_entropy, {"variant": "ptref"}),
                                                                       (F.cross_entropy, {})))
    nan = theirs.isnan()
    assert nan.any() and torch.equal(ours.isnan(), nan) and torch.equal(ours[~nan], theirs[~nan])
    (dx,), (tdx,) = torch.autograd.grad(ours.sum(), x), torch.autograd.grad(theirs.sum(), x)
    nan = tdx.isnan()
    assert torch.equal(dx.isnan(), nan) and torch.equal(_bits(dx)[~nan], _bits(tdx)[~nan])
    with pytest.raises(InvalidType, match="probability targets other than bf16 or float32"):
        ckparity.cross_entropy(x, q.half(), variant="ptref")


def test_the_bf16_ptref_sweep_catches_smoothing_and_weights_rounded_otherwise(monkeypatch):
    """Label smoothing, class weights and probability targets in bf16 have rounding points of their own:
    the smoothing term's scalars rounded to bf16 (where torch keeps them float), or the whole loss in float
    before one rounding, each differ from torch somewhere in the sweep's weighted, smoothed and probability
    cases -- and only there: the plain cases still match."""
    import importlib

    ce_record = importlib.import_module("ckparity.kernels.cross_entropy")
    real = ce_record.cross_entropy

    def scalars_in_bf16(logits, target, weight=None, label_smoothing=0.0, reduction="mean", variant="ptref"):
        if label_smoothing == 0.0:
            return real(logits, target, weight, reduction=reduction, variant=variant)
        ls = float(torch.tensor(label_smoothing).bfloat16())  # the planted rounding: 0.1 -> 0.10009765625
        return real(logits, target, weight, reduction=reduction, variant=variant, label_smoothing=ls)

    def one_rounding(logits, target, weight=None, label_smoothing=0.0, reduction="mean", variant="ptref"):
        if label_smoothing == 0.0 and weight is None and not target.is_floating_point():
            return real(logits, target, weight, reduction=reduction, variant=variant)
        w = None if weight is None else weight.float()
        target = target.float() if target.is_floating_point() else target
        return F.cross_entropy(logits.float(), target, w, reduction=reduction,
                               label_smoothing=label_smoothing).to(logits.dtype)

    for planted in (scalars_in_bf16, one_rounding):
        monkeypatch.setattr(ce_record, "cross_entropy", planted)
        tally = ce_record.Tally()
        ce_record.sweep_ptref_bf16(tally, torch.Generator().manual_seed(0))
        result = tally.result()
        assert result["loss"]["differing"] > 50 or result["dlogits"]["differing"] > 50, planted.__name__
        differing = tally.differing.get("loss", []) + tally.differing.get("dlogits", [])
        assert all("{" in case for case in differing)  # the plain class-target cases still match
        if planted is one_rounding:  # probability targets rounded once: caught among them too
            assert sum(case.startswith("probs") for case in differing) > 50


def test_check_in_bf16_says_which_option_is_not_in_bf16(monkeypatch, clean_registry):
    """A backend with label smoothing in float32 only: in bf16 its widths bitwise, label smoothing its own
    row, not supported (a TypeError on the option's call in a dtype other than float32), not a crash.
    ckparity's c_ptref, which has it in bf16, is bitwise on every row."""
    from dataclasses import replace

    from ckparity import check

    def no_bf16_smoothing(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        if label_smoothing and logits.dtype == torch.bfloat16:
            raise InvalidType("label smoothing is float32 only here")
        return ckparity.cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing,
                                      variant="ptref")

    ckparity.register_backend("cross_entropy", "no_bf16_smoothing", no_bf16_smoothing)
    record = kernels.KERNELS["cross_entropy"]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64, 301]))
    report = check.check("cross_entropy", "no_bf16_smoothing", dtype="bfloat16")
    rows = {r["property"]: r["verdict"] for r in report["properties"]}
    assert rows["widths"] == "bitwise" and rows["option label_smoothing (bfloat16)"] == "not supported"
    assert report["verdict"] == "not supported" and report["passed"]
    ours = check.check("cross_entropy", "c_ptref", dtype="bfloat16")
    assert ours["verdict"] == "bitwise" and all(r["verdict"] == "bitwise" for r in ours["properties"])


def test_the_default_cross_entropy_in_bf16_is_no_less_accurate_than_torchs():
    """variant="default" on bf16 logits: bf16 loss and dlogits, each no farther from float64 (of the same bf16
    values) than torch's bf16 eager, at every width 1..300 and large odd ones, every reduction, with an upstream
    gradient; and not torch's bits (so the comparison is of two different roundings, not one)."""
    from ckparity.measure import error64

    g = torch.Generator().manual_seed(6)
    worse, differing = [], 0
    for V in [*range(1, 301), 1001, 4097, 32003]:
        x = (torch.randn(5, V, generator=g) * 3).bfloat16()
        target = torch.randint(0, V, (5,), generator=g)
        target[1] = -100
        for reduction in ("mean", "sum", "none"):
            a, b, x64 = x.clone().requires_grad_(True), x.clone().requires_grad_(True), x.double().requires_grad_(True)
            la, lb = ckparity.cross_entropy(a, target, reduction=reduction), F.cross_entropy(b, target, reduction=reduction)
            l64 = F.cross_entropy(x64, target, reduction=reduction)
            up = (torch.randn(la.shape, generator=g) * 2).bfloat16()
            for loss, upstream in ((la, up), (lb, up), (l64, up.double())):
                loss.backward(upstream)
            assert la.dtype == a.grad.dtype == torch.bfloat16
            for name, mine, torchs, exact in (("loss", la, lb, l64), ("dlogits", a.grad, b.grad, x64.grad)):
                if error64(mine, exact) > error64(torchs, exact):
                    worse.append((V, reduction, name))
                differing += int((mine.detach() != torchs.detach()).sum())
    assert not worse, worse[:5]
    assert differing > 0


def test_the_default_cross_entropy_in_bf16_is_the_float32_kernel_on_the_widened_logits():
    """The default variant's bf16 entry point widens a row at a time in C: its loss and dlogits are the
    float32 kernel's on logits.float(), rounded once -- class, bf16 and float32 probability targets (the
    loss then float32, as torch promotes it, with a bf16 or float32 weight), weights, smoothing, z-loss,
    every reduction, an upstream gradient folded in before the rounding, (N, C, d) logits, widths across
    the vector tails; in place (dlogits over the logits) too, at the C level."""
    from ckparity.ops.cross_entropy import cross_entropy_forward_backward

    g = torch.Generator().manual_seed(12)
    for V, probs, reduction, extra in itertools.product(
            (1, 7, 8, 9, 31, 300, 1001), (None, torch.bfloat16, torch.float32), ("mean", "sum", "none"),
            (dict(), dict(label_smoothing=0.1, z_loss=1e-3), dict(weight="w"))):
        x = (torch.randn(6, V, generator=g) * 3).bfloat16()
        t = (torch.softmax(torch.randn(6, V, generator=g), 1).to(probs) if probs else
             torch.tensor([0, V - 1, -100, 0, V // 2, 1 % V]))
        w_dtype = torch.float32 if probs == torch.float32 else torch.bfloat16
        kwargs = dict(extra, weight=(torch.rand(V, generator=g) + 0.5).to(w_dtype)) if "weight" in extra else extra
        loss_dtype = torch.float32 if probs == torch.float32 else torch.bfloat16
        up = (torch.randn(6 if reduction == "none" else (), generator=g) * 3).bfloat16().to(loss_dtype)
        a = x.clone().requires_grad_(True)
        loss = ckparity.cross_entropy(a, t, reduction=reduction, **kwargs)
        (dx,) = torch.autograd.grad(loss, a, up)
        wide = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        f_loss, f_dx = cross_entropy_forward_backward(x.float(), t.float() if probs else t, reduction=reduction,
                                                      row_grad=up.float().reshape(-1), **wide)
        assert loss.dtype == loss_dtype and dx.dtype == torch.bfloat16
        assert torch.equal(loss.detach().float(), f_loss.to(loss_dtype).float()), (V, probs, reduction, extra)
        assert torch.equal(_bits(dx), _bits(f_dx.bfloat16())), (V, probs, reduction, extra)
    x = (torch.randn(2, 33, 5, generator=g) * 3).bfloat16()  # (N, C, d): the class dimension moved last
    t = torch.randint(0, 33, (2, 5), generator=g)
    wide = ckparity.cross_entropy(x.float(), t, reduction="none").bfloat16()
    assert torch.equal(_bits(ckparity.cross_entropy(x, t, reduction="none")), _bits(wide))
    x = (torch.randn(4, 300, generator=g) * 3).bfloat16()
    t = torch.tensor([3, -100, 0, 299])
    options = _bindings.cross_entropy_options()
    loss, d = torch.empty(()), torch.empty_like(x)
    _bindings.cross_entropy_default_bf16(x, t, options, loss, d)
    in_place = x.clone()
    _bindings.cross_entropy_default_bf16(in_place, t, options, torch.empty(()), in_place)
    assert torch.equal(_bits(in_place), _bits(d)) and loss.isfinite()
    with pytest.raises(InvalidArgument, match="default variant"):
        _bindings.cross_entropy_default_bf16(x, t, _bindings.cross_entropy_options(variant="ptref"), loss, d)
    with pytest.raises(InvalidType, match="bf16 or float32 class probabilities"):
        ckparity.cross_entropy(x, torch.softmax(x.float(), 1).half())
    with pytest.raises(InvalidType, match="weight"):
        ckparity.cross_entropy(x, t, weight=torch.ones(300))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_default_cross_entropy_in_bf16_in_place_is_the_same_loss_and_gradient(reduction):
    """inplace_backward in bf16 (the default variant): dlogits written over the logits' storage, the loss
    bf16; for loss.backward() and an upstream gradient that is a power of two (a gradient accumulation's
    1/4) the same bits as without inplace_backward; another upstream gradient scales the stored gradient,
    a second rounding: within one bf16 ulp of the kernel's single rounding, and not always equal to it."""
    g = torch.Generator().manual_seed(13)
    src = (torch.randn(37, 1003, generator=g) * 4).bfloat16()
    target = torch.randint(0, 1003, (37,), generator=g)
    target[::5] = -100
    for up in (1.0, 0.25, 1 / 3):
        plain = src.clone().requires_grad_(True)
        loss = ckparity.cross_entropy(plain, target, reduction=reduction)
        (want,) = torch.autograd.grad(loss, plain, torch.tensor(up).bfloat16())
        logits = src.clone().requires_grad_(True)
        storage = logits.data_ptr()
        got_loss = ckparity.cross_entropy(logits, target, reduction=reduction, inplace_backward=True)
        assert got_loss.dtype == torch.bfloat16 and torch.equal(_bits(got_loss.detach()), _bits(loss.detach()))
        (got,) = torch.autograd.grad(got_loss, logits, torch.tensor(up).bfloat16())
        if up == 1.0:
            assert got.data_ptr() == storage  # the logits' own buffer, nothing allocated
        if up != 1 / 3:
            assert torch.equal(_bits(got), _bits(want)), up
        else:
            apart = (got.float() - want.float()).abs()
            ulp = (want.float().abs() * 2.0 ** -7).clamp_min(2.0 ** -133)
            assert (apart <= ulp).all() and (apart > 0).any()


def test_avx512_bf16s_conversion_is_torchs_rounding_except_subnormals_and_nan():
    """Why ckparity rounds to bf16 with integer operations where the CPU has VCVTNEPS2BF16
    (scripts/bf16_instructions.py; every float32 in reports/bf16_instructions/): the instruction
    rounds every normal, zero and infinity as torch does, but flushes subnormals to zero and keeps a
    NaN's sign and payload where torch writes 0x7FC0."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bf16_instructions.py"
    run = subprocess.run([sys.executable, str(script), "--sample", "20000"], capture_output=True, text=True,
                         timeout=300)
    if run.returncode == 3:
        pytest.skip(run.stderr.strip())
    assert run.returncode == 0, run.stderr
    classes = json.loads(run.stdout)["classes"]
    assert classes["other"]["compared"] > 10000 and classes["other"]["differing"] == 0
    assert classes["subnormal"]["differing"] > classes["subnormal"]["compared"] * 0.9
    assert classes["nan"]["differing"] > 0


def test_float16_rms_norm_swiglu_and_rope_are_torchs_bits_and_the_other_kernels_refuse_float16():
    """float16 where the bf16 machinery gives it (torch's Half rounds where its BFloat16 does): rms_norm
    (a float16 or a float32 weight), swiglu and rope return float16 with torch's bits (their float16
    sweeps hold it at every width and capability); the kernels without float16 entry points refuse it
    by name, never a silent float32 answer."""
    from ckparity.kernels.sweeping import grad_run, same_bits

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 2 * 301, generator=g) * 4).half().requires_grad_(True)
    up = torch.randn(5, 301, generator=g).half()
    for a, b in zip(grad_run(ckparity.swiglu, [x], up), grad_run(reference.swiglu, [x], up)):
        assert a.dtype == torch.float16 and same_bits(a, b)
    q = torch.randn(2, 7, 46, generator=g).half().requires_grad_(True)
    angles = torch.rand(7, 23, generator=g) * 50
    cos, sin = angles.cos().half(), angles.sin().half()
    rotated = torch.randn(2, 7, 46, generator=g).half()
    for layout in ("half", "interleaved"):
        ours = grad_run(lambda t: ckparity.rope(t, cos, sin, layout=layout), [q], rotated)
        theirs = grad_run(lambda t: reference.rope(t, cos, sin, layout), [q], rotated)
        assert all(a.dtype == torch.float16 and same_bits(a, b) for a, b in zip(ours, theirs))
    x = (torch.randn(4, 301, generator=g) * 3).half().requires_grad_(True)
    dy = torch.randn(4, 301, generator=g).half()
    for w in (torch.randn(301, generator=g).half(), torch.randn(301, generator=g)):  # float16 or float32 weight
        w.requires_grad_(True)
        ours = grad_run(lambda a, b: ckparity.rms_norm(a, (301,), b), [x, w], dy)
        theirs = grad_run(lambda a, b: F.rms_norm(a, (301,), b), [x, w], dy)
        assert [t.dtype for t in ours] == [torch.float16, torch.float16, w.dtype]
        assert all(same_bits(a, b) for a, b in zip(ours, theirs))
    p = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    p.grad = torch.randn(3, generator=g).half()
    with pytest.raises(InvalidType, match="float32 or bfloat16"):
        ckparity.clip_grad_norm_([p], 1.0)
    with pytest.raises(InvalidType, match="float32 or bfloat16"):
        ckparity.optim.AdamW([p]).step()
    with pytest.raises(InvalidType, match="float16"):
        ckparity.cross_entropy(torch.randn(3, 8).half(), torch.tensor([0, 1, 2]))
    with pytest.raises(InvalidType, match="one dtype for both"):
        ckparity.rope(q, cos.bfloat16(), sin.bfloat16())
