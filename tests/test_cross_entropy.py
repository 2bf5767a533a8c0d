"""ckparity.cross_entropy against F.cross_entropy (float32) and float64.

Every comparison goes through parity.check_parity: assert_close's float32
tolerances against torch, and a float64 error no worse than 2x torch's
(1x for ptref, which follows torch's own order of operations)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity.measure import RULES
from ckparity.ops.cross_entropy import cross_entropy_forward_backward
from parity import check_parity, max_ulp

VARIANTS = ["default", "ptref"]


def run_both(variant, logits, target, grad_output=None, **kwargs):
    """Loss and input gradient from ckparity, torch float32 and torch float64."""
    results = []
    for fn, dtype in ((lambda *a, **k: ckparity.cross_entropy(*a, variant=variant, **k), torch.float32),
                      (F.cross_entropy, torch.float32), (F.cross_entropy, torch.float64)):
        x = logits.detach().to(dtype).requires_grad_(True)
        t = target.to(dtype) if target.is_floating_point() else target
        kw = dict(kwargs)
        if kw.get("weight") is not None:
            kw["weight"] = kw["weight"].to(dtype)
        loss = fn(x, t, **kw)
        g = torch.ones_like(loss) if grad_output is None else grad_output.to(dtype)
        loss.backward(g)
        results.append((loss.detach(), x.grad))
    return results


def check_case(name, variant, logits, target, grad_output=None, **kwargs):
    (loss, grad), (tloss, tgrad), (rloss, rgrad) = run_both(variant, logits, target, grad_output, **kwargs)
    factor, floor_ulps = RULES[variant]  # the reasons are written in ckparity.measure
    check_parity(f"cross_entropy.{variant}.loss[{name}]", loss, tloss, rloss, factor, floor_ulps)
    check_parity(f"cross_entropy.{variant}.grad[{name}]", grad, tgrad, rgrad, factor, floor_ulps)
    return loss, grad


def class_targets(N, C, ignore_frac=0.0, ignore_index=-100):
    target = torch.randint(0, C, (N,))
    if ignore_frac:
        target[torch.rand(N) < ignore_frac] = ignore_index
    return target


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("N, C", [pytest.param(n, c, marks=[pytest.mark.nightly] if n * c > 10**7 else [])
                                  for n in (1, 7, 64, 1000) for c in (1, 2, 3, 255, 50257)])
def test_grid_with_ignored_rows(variant, N, C):
    logits = torch.randn(N, C) * 3
    target = class_targets(N, C, ignore_frac=0.25)
    if N > 1:
        target[0] = -100  # at least one ignored row
        target[-1] = C - 1  # and one that counts
    for reduction in ("mean", "sum", "none"):
        check_case(f"N={N},C={C},{reduction}", variant, logits, target, reduction=reduction)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_rows_ignored(variant, reduction):
    logits = torch.randn(9, 17)
    target = torch.full((9,), -100)
    loss, grad = check_case(f"all-ignored,{reduction}", variant, logits, target, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss)
    else:
        assert (loss == 0).all()
    assert (grad == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ignore_index", [-1, 0, 4, 1000])
def test_other_ignore_index(variant, ignore_index):
    # 0 and 4 lie inside [0, C): those rows must be skipped, not scored as class 0/4.
    C = 11
    logits = torch.randn(50, C)
    target = class_targets(50, C)
    target[::3] = ignore_index
    for reduction in ("mean", "sum", "none"):
        loss, grad = check_case(f"ignore_index={ignore_index},{reduction}", variant, logits, target,
                                ignore_index=ignore_index, reduction=reduction)
    assert (grad[::3] == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("with_ignored", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weights(variant, with_ignored, reduction):
    N, C = 64, 255
    logits = torch.randn(N, C) * 2
    target = class_targets(N, C, ignore_frac=0.3 if with_ignored else 0.0)
    weight = torch.rand(C) + 0.1
    check_case(f"weights,ignored={with_ignored},{reduction}", variant, logits, target,
               weight=weight, reduction=reduction)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.1, 1.0])
def test_label_smoothing_with_ignore_and_weights(variant, with_weight, reduction, smoothing):
    N, C = 64, 255
    logits = torch.randn(N, C) * 2
    target = class_targets(N, C, ignore_frac=0.3, ignore_index=7)
    weight = torch.rand(C) + 0.1 if with_weight else None
    check_case(f"smoothing={smoothing},weight={with_weight},{reduction}", variant, logits, target,
               weight=weight, ignore_index=7, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("N,C", [(1, 1), (7, 3), (64, 255), (33, 50257)])
def test_probability_targets(variant, with_weight, smoothing, reduction, N, C):
    logits = torch.randn(N, C) * 2
    probs = torch.softmax(torch.randn(N, C), dim=1)
    weight = torch.rand(C) + 0.1 if with_weight else None
    check_case(f"probs,N={N},C={C},smoothing={smoothing},weight={with_weight},{reduction}", variant,
               logits, probs, weight=weight, reduction=reduction, label_smoothing=smoothing)


def test_ptref_probability_targets_split_their_sum_as_torch_does_on_its_threads():
    """-(logp * q).sum() over N*V >= 32768 elements is split across torch's
    threads (ATen's two_pass_reduction), and its bits change with the thread
    count; ptref follows the split for the count torch has at the call. The
    case would pass without the split at 1 thread and fail at the others."""
    from ckparity.kernels.cross_entropy import SPLIT_SHAPES
    from ckparity.kernels.sweeping import torch_threads

    g = torch.Generator().manual_seed(3)
    torch_changed = 0
    for N, V in SPLIT_SHAPES:
        logits, probs = torch.randn(N, V, generator=g) * 4, torch.softmax(torch.randn(N, V, generator=g), dim=1)
        for reduction in ("mean", "sum"):
            losses = {}
            for threads in (1, 2, 3, 4):
                with torch_threads(threads):
                    ours = ckparity.cross_entropy(logits, probs, reduction=reduction, variant="ptref")
                    theirs = F.cross_entropy(logits, probs, reduction=reduction)
                assert torch.equal(ours, theirs), f"N={N} V={V} {reduction}, torch on {threads} threads"
                losses[threads] = theirs
            torch_changed += any(not torch.equal(losses[1], losses[t]) for t in (2, 3, 4))
    assert torch_changed >= 3, "the shapes no longer meet torch's thread split: the case checks nothing"


def test_ptref_label_smoothing_splits_its_sums_as_torch_does_on_its_threads():
    """Label smoothing's sums over every element are split across torch's
    threads from 32768 elements on: the rows' smoothing terms and the kept
    rows' weights (weighted mean; the gradient divides by it too), and the one
    row's own sum of a (1, V) input. ptref follows; both cases differ from a
    sum in one piece."""
    from ckparity.kernels.sweeping import torch_threads

    kinds = []
    g = torch.Generator().manual_seed(100003)
    w = torch.rand(5, generator=g) + 0.5
    x = torch.randn(100003, 5, generator=g) * 4
    t = torch.randint(0, 5, (100003,), generator=g)
    t[::3] = -100
    kinds.append([(x, t, w, {"label_smoothing": 0.2})])
    # One row's sum: whether its split moves the rounded loss depends on the values and on the CPU's
    # vector width, so the kind has a few rows, one of which is enough to show it.
    rows = []
    for seed in (65537, 2, 5, 7):
        g = torch.Generator().manual_seed(seed)
        rows.append((torch.randn(1, 65537, generator=g) * 4, torch.randint(0, 65537, (1,), generator=g), None,
                     {"label_smoothing": 0.1}))
    kinds.append(rows)
    torch_changed = 0
    for cases in kinds:
        changed = False
        for x, t, w, kwargs in cases:
            results = {}
            for threads in (1, 2, 3):
                with torch_threads(threads):
                    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
                    ours = ckparity.cross_entropy(a, t, w, variant="ptref", **kwargs)
                    theirs = F.cross_entropy(b, t, w, **kwargs)
                    ours.backward()
                    theirs.backward()
                assert torch.equal(ours, theirs) and torch.equal(a.grad, b.grad), \
                    f"{tuple(x.shape)} {kwargs}, {threads} threads"
                results[threads] = theirs
            changed |= not torch.equal(results[1], results[2])
        torch_changed += changed
    assert torch_changed == len(kinds), "torch's bits no longer depend on its threads here: the case checks nothing"


@pytest.mark.parametrize("variant", VARIANTS)
def test_extreme_logits(variant):
    C = 255
    logits = torch.randn(6, C)
    logits[0] = 1e4 * torch.sign(torch.randn(C))  # +-1e4
    logits[1] = -1e4
    logits[1, 17] = 1e4
    logits[2] = float("-inf")  # -inf everywhere but the target
    logits[2, 5] = 0.0
    logits[3] = 3.25  # a row of equal values
    logits[4] = torch.randn(C) * 1e4
    target = torch.tensor([3, 17, 5, 9, 100, 0])
    for reduction in ("mean", "sum", "none"):
        loss, grad = check_case(f"extreme,{reduction}", variant, logits, target, reduction=reduction)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_reduction_none_nonuniform_upstream(variant):
    N, C = 64, 255
    logits = torch.randn(N, C)
    target = class_targets(N, C, ignore_frac=0.2)
    upstream = torch.randn(N) * 5
    check_case("none,upstream=randn", variant, logits, target, grad_output=upstream, reduction="none")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_grad_output_not_one(variant, reduction):
    logits = torch.randn(64, 255)
    target = class_targets(64, 255, ignore_frac=0.2)
    check_case(f"{reduction},upstream=0.125", variant, logits, target,
               grad_output=torch.tensor(0.125), reduction=reduction)
    check_case(f"{reduction},upstream=-3.7", variant, logits, target,
               grad_output=torch.tensor(-3.7), reduction=reduction)


@pytest.mark.parametrize("shape", [(255,), (4, 255, 3), (2, 7, 3, 5)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_input_shapes(variant, shape):
    logits = torch.randn(shape)
    C = shape[0] if len(shape) == 1 else shape[1]
    target_shape = () if len(shape) == 1 else shape[:1] + shape[2:]
    target = torch.randint(0, C, target_shape)
    for reduction in ("mean", "sum", "none"):
        loss, _ = check_case(f"shape={shape},{reduction}", variant, logits, target, reduction=reduction)
        assert loss.shape == F.cross_entropy(logits, target, reduction=reduction).shape
    probs = torch.softmax(torch.randn(shape), dim=0 if len(shape) == 1 else 1)
    check_case(f"shape={shape},probs", variant, logits, probs, reduction="none")


def z_loss_reference(logits, target, z, weight=None, ignore_index=-100, reduction="mean"):
    """float64: F.cross_entropy plus z * logsumexp(row)^2 on non-ignored rows."""
    x = logits.double().requires_grad_(True)
    w = weight.double() if weight is not None else None
    ce = F.cross_entropy(x, target, weight=w, ignore_index=ignore_index, reduction="none")
    keep = target != ignore_index
    zrow = z * torch.logsumexp(x, dim=1) ** 2 * keep
    rows = ce + zrow
    if reduction == "none":
        loss = rows
    elif reduction == "sum":
        loss = rows.sum()
    else:
        denominator = (w[target[keep]] if w is not None else keep[keep].double()).sum()
        loss = rows.sum() / denominator
    loss.backward(torch.ones_like(loss))
    return loss.detach(), x.grad


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_weight", [False, True])
def test_z_loss_against_float64(variant, reduction, with_weight):
    N, C, z = 64, 255, 1e-3
    logits = torch.randn(N, C) * 4 + 2
    target = class_targets(N, C, ignore_frac=0.2)
    weight = torch.rand(C) + 0.1 if with_weight else None
    x = logits.clone().requires_grad_(True)
    loss = ckparity.cross_entropy(x, target, weight=weight, reduction=reduction, z_loss=z, variant=variant)
    loss.backward(torch.ones_like(loss))
    ref_loss, ref_grad = z_loss_reference(logits, target, z, weight, reduction=reduction)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), ref_grad, rtol=2e-6, atol=1e-7)
    # and z_loss=0 is exactly the plain loss
    plain = ckparity.cross_entropy(logits, target, weight=weight, reduction=reduction, variant=variant)
    zero = ckparity.cross_entropy(logits, target, weight=weight, reduction=reduction, z_loss=0.0,
                                  variant=variant)
    assert torch.equal(plain, zero)
    assert not torch.equal(plain, loss.detach())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("probs", [False, True])
def test_inplace_dlogits_same_bits(variant, probs):
    N, C = 257, 1031
    logits = torch.randn(N, C) * 3
    target = torch.softmax(torch.randn(N, C), 1) if probs else class_targets(N, C, ignore_frac=0.2)
    kwargs = dict(reduction="mean", label_smoothing=0.1, z_loss=1e-4, variant=variant)
    loss, dlogits = cross_entropy_forward_backward(logits, target, **kwargs)
    buffer = logits.clone()
    loss_inplace, same = cross_entropy_forward_backward(buffer, target, **kwargs, dlogits=buffer)
    assert same.data_ptr() == buffer.data_ptr()
    assert torch.equal(loss, loss_inplace)
    assert torch.equal(dlogits, buffer)
    assert not torch.equal(buffer, logits)


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_across_threads_and_calls(variant):
    N, C = 1000, 2053
    logits = torch.randn(N, C) * 3
    target = class_targets(N, C, ignore_frac=0.1)
    weight = torch.rand(C) + 0.5
    results = []
    for threads in (1, 2, 4, 4, 1):
        ckparity.set_num_threads(threads)
        for reduction in ("mean", "none"):
            results.append(cross_entropy_forward_backward(
                logits, target, weight, reduction=reduction, label_smoothing=0.05, variant=variant))
    for i, (loss, grad) in enumerate(results):
        ref_loss, ref_grad = results[i % 2]
        assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad), f"run {i} differs"


def test_variants_agree_closely():
    logits = torch.randn(64, 50257)
    target = class_targets(64, 50257, ignore_frac=0.2)
    a = ckparity.cross_entropy(logits, target, variant="default")
    b = ckparity.cross_entropy(logits, target, variant="ptref")
    assert max_ulp(a, b) <= 8


def test_nn_module_matches_functional():
    logits = torch.randn(20, 31, requires_grad=True)
    target = class_targets(20, 31, ignore_frac=0.2, ignore_index=3)
    weight = torch.rand(31)
    module = ckparity.nn.CrossEntropyLoss(weight=weight, ignore_index=3, label_smoothing=0.1, variant="ptref")
    expected = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=3, label_smoothing=0.1)(logits, target)
    torch.testing.assert_close(module(logits, target), expected)
    assert torch.equal(module.weight, weight) and "weight" in dict(module.named_buffers())


# ---- bad input --------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_out_of_range_target_names_row_and_value(variant):
    logits = torch.randn(10, 5, requires_grad=True)
    target = torch.tensor([0, 1, 2, 3, 4, 0, 7, 1, 2, 3])
    with pytest.raises(IndexError, match=r"Target 7 is out of bounds at row 6"):
        ckparity.cross_entropy(logits, target, variant=variant)
    target[6] = -5
    with pytest.raises(IndexError, match=r"Target -5 .* row 6"):
        ckparity.cross_entropy(logits, target, variant=variant)


def test_wrong_dtypes_raise_type_error():
    logits = torch.randn(4, 5)
    target = torch.tensor([0, 1, 2, 3])
    with pytest.raises(TypeError, match="float32"):
        ckparity.cross_entropy(logits.double(), target)
    with pytest.raises(TypeError, match="int64"):
        ckparity.cross_entropy(logits, target.int())
    with pytest.raises(TypeError, match="float32"):
        ckparity.cross_entropy(logits, target, weight=torch.ones(5, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        ckparity.cross_entropy(logits, torch.softmax(logits, 1).double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        ckparity.cross_entropy(logits.numpy(), target)


def test_shape_mismatches_raise_value_error():
    logits = torch.randn(4, 5)
    with pytest.raises(ValueError, match="target shape"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="weight must have shape"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), weight=torch.ones(4))
    with pytest.raises(ValueError, match="probabilities"):
        ckparity.cross_entropy(logits, torch.rand(4, 6))
    with pytest.raises(ValueError, match="reduction"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), reduction="avg")
    with pytest.raises(ValueError, match="variant"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), variant="fast")
    with pytest.raises(ValueError, match="label_smoothing"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="z_loss"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), z_loss=-1.0)
    with pytest.raises(ValueError, match="ignore_index"):
        ckparity.cross_entropy(logits, torch.softmax(logits, 1), ignore_index=2)


def test_non_cpu_tensor_raises_clear_error():
    # No GPU here: the "meta" device stands in for any non-CPU device; the
    # check is on tensor.device, the same path a CUDA tensor takes.
    logits = torch.randn(4, 5, device="meta")
    with pytest.raises(TypeError, match="CPU only"):
        ckparity.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    if torch.cuda.is_available():  # pragma: no cover - only on GPU machines
        with pytest.raises(TypeError, match="CPU only"):
            ckparity.cross_entropy(torch.randn(4, 5).cuda(), torch.tensor([0, 1, 2, 3]).cuda())


@pytest.mark.parametrize("variant", VARIANTS)
def test_non_contiguous_input_gives_right_answer(variant):
    base = torch.randn(255, 64)
    logits = base.t()  # (64, 255), not contiguous
    assert not logits.is_contiguous()
    target = torch.randint(0, 255, (128,))[::2]  # strided target
    check_case("non-contiguous", variant, logits, target)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("extra", [{}, {"label_smoothing": 0.2}, {"weight": "w"}])
def test_gradient_wrt_probability_target_matches_torch(reduction, extra):
    logits, soft = torch.randn(6, 5) * 2, torch.softmax(torch.randn(6, 5), 1)
    kwargs = {k: (torch.rand(5) + 0.5 if v == "w" else v) for k, v in extra.items()}
    grads = []
    for ce in (ckparity.cross_entropy, F.cross_entropy):
        x, t = logits.clone().requires_grad_(True), soft.clone().requires_grad_(True)
        loss = ce(x, t, reduction=reduction, **kwargs)
        loss.backward(torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape))
        grads.append(t.grad)
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_gradient_wrt_weight_is_refused():
    w = torch.rand(5).requires_grad_(True)
    with pytest.raises(NotImplementedError, match="not weight"):
        ckparity.cross_entropy(torch.randn(4, 5), torch.tensor([0, 1, 2, 3]), w)


def test_empty_batch_matches_torch():
    logits = torch.randn(0, 5)
    target = torch.zeros(0, dtype=torch.int64)
    assert torch.isnan(ckparity.cross_entropy(logits, target))
    assert ckparity.cross_entropy(logits, target, reduction="sum") == 0
    assert ckparity.cross_entropy(logits, target, reduction="none").shape == (0,)


def test_ckp_lib_override(tmp_path):
    code = "import ckparity, ckparity._native as n; print(n.LIBRARY_PATH)"
    env = dict(os.environ, CKP_LIB=str(tmp_path / "missing.so"))
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "CKP_LIB" in bad.stderr
    real = str(ckparity._native.LIBRARY_PATH)
    env["CKP_LIB"] = real
    good = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert good.returncode == 0 and good.stdout.strip() == real


def test_row_grad_has_one_element_per_loss():
    logits, target = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match="row_grad must have 1 elements with reduction 'mean', got 4"):
        cross_entropy_forward_backward(logits, target, reduction="mean", row_grad=torch.ones(4))
    with pytest.raises(ValueError, match="row_grad must have 4 elements"):
        cross_entropy_forward_backward(logits, target, reduction="none", row_grad=torch.ones(1))
    # with reduction none, row_grad scales each row's gradient before rounding
    _, plain = cross_entropy_forward_backward(logits, target, reduction="none")
    _, scaled = cross_entropy_forward_backward(logits, target, reduction="none",
                                               row_grad=torch.tensor([1.0, 0.0, -2.0, 0.5]))
    assert torch.equal(scaled[0], plain[0]) and (scaled[1] == 0).all()
    torch.testing.assert_close(scaled[2], -2 * plain[2])


@pytest.mark.parametrize("variant", ["default", "ptref"])
@pytest.mark.parametrize("kwargs", [{}, {"reduction": "sum", "label_smoothing": 0.1}, {"z_loss": 1e-3},
                                    {"weight": "w", "ignore_index": 2}])
def test_inplace_backward_gives_the_same_bits(variant, kwargs):
    """inplace_backward: dlogits written over the logits, the same bits as out of place, through autograd."""
    g = torch.Generator().manual_seed(3)
    base, target = torch.randn(37, 1003, generator=g) * 3, torch.randint(0, 1003, (37,), generator=g)
    kwargs = {k: (torch.rand(1003, generator=g) + 0.5 if v == "w" else v) for k, v in kwargs.items()}
    results = []
    for inplace in (False, True):
        leaf = base.clone().requires_grad_(True)
        logits = leaf * 1.0  # a non-leaf, as a model's lm_head output is
        loss = ckparity.cross_entropy(logits, target, variant=variant, inplace_backward=inplace, **kwargs)
        (loss * 0.5).backward()
        results.append((loss.detach(), leaf.grad, logits.detach()))
    (loss_a, grad_a, logits_a), (loss_b, grad_b, logits_b) = results
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert torch.equal(logits_a, base) and not torch.equal(logits_b, base)  # the in-place one overwrote its logits


def test_inplace_backward_misuse_is_caught():
    target = torch.tensor([0, 1, 2])
    leaf = torch.randn(3, 5, requires_grad=True)
    logits = leaf * 1.0
    kept = logits.pow(2)  # an op that saves the logits for its own backward
    loss = ckparity.cross_entropy(logits, target, inplace_backward=True) + kept.sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(ValueError, match="reduction 'mean' or 'sum'"):
        ckparity.cross_entropy(leaf * 1.0, target, reduction="none", inplace_backward=True)
    with pytest.raises(ValueError, match=r"contiguous \(N, C\)"):
        ckparity.cross_entropy((leaf * 1.0).t().contiguous().t(), target, inplace_backward=True)
    probs = torch.softmax(torch.randn(3, 5), 1).requires_grad_(True)
    with pytest.raises(ValueError, match="probability targets"):
        ckparity.cross_entropy(leaf * 1.0, probs, inplace_backward=True)
    untouched = torch.randn(3, 5)
    before = untouched.clone()
    ckparity.cross_entropy(untouched, target, inplace_backward=True)  # no gradient wanted: nothing overwritten
    assert torch.equal(untouched, before)


def test_inplace_backward_module():
    loss_fn = ckparity.nn.CrossEntropyLoss(inplace_backward=True)
    x = torch.randn(4, 7, requires_grad=True)
    target = torch.tensor([1, 2, 3, 4])
    expected = torch.autograd.grad(F.cross_entropy(x, target), x)[0]
    logits = x * 1.0
    loss_fn(logits, target).backward()
    torch.testing.assert_close(x.grad, expected)


def test_leaf_takes_the_gradient_without_a_copy():
    """A leaf's AccumulateGrad takes the kernel's dlogits as .grad when nothing
    else holds it (a copy of (N, V) floats otherwise: a third of the large
    row's time in `ckparity bench`), and the saved buffer is released."""
    x = torch.randn(16, 300, requires_grad=True)
    t = torch.randint(0, 300, (16,))
    arrived = []
    x.register_hook(lambda g: arrived.append(g.data_ptr()))
    loss = ckparity.cross_entropy(x, t)
    loss.backward()
    assert x.grad.data_ptr() == arrived[0]
    with pytest.raises(RuntimeError, match="freed|second time"):
        loss.grad_fn.saved_tensors


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_retain_graph_second_backward_accumulates(reduction):
    """A retained graph's second backward gives the gradient again (saved, not handed away)."""
    x = torch.randn(16, 300, requires_grad=True)
    t = torch.randint(0, 300, (16,))
    loss = ckparity.cross_entropy(x, t, reduction=reduction).sum()
    loss.backward(retain_graph=True)
    once = x.grad.clone()
    loss.backward()
    assert torch.equal(x.grad, once + once)
    y = x.detach().clone().requires_grad_(True)
    F.cross_entropy(y, t, reduction=reduction).sum().backward()
    torch.testing.assert_close(once, y.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("upstream", [1.0 / 3, -2.5, 1e-3])
@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(label_smoothing=0.1),
                                    dict(weighted=True, label_smoothing=0.2), dict(probs=True)])
def test_ptref_folds_an_upstream_gradient_as_torch_does(upstream, kwargs):
    """A loss scaled before backward (1/K of gradient accumulation, a loss
    weight): ptref folds the upstream gradient in where torch's chain does,
    so the gradient stays bit-identical; scaling the finished gradient would
    round differently (K = 3 in a harness run)."""
    kwargs = dict(kwargs)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 1000, generator=g) * 3
    if kwargs.pop("probs", False):
        target = torch.softmax(torch.randn(37, 1000, generator=g), 1)
    else:
        target = torch.randint(0, 1000, (37,), generator=g)
        target[::3] = -100
    weight = torch.rand(1000, generator=g) + 0.5 if kwargs.pop("weighted", False) else None
    grads = []
    for fn in (lambda a: ckparity.cross_entropy(a, target, weight, variant="ptref", **kwargs),
               lambda a: F.cross_entropy(a, target, weight, **kwargs)):
        leaf = x.clone().requires_grad_(True)
        (fn(leaf) * upstream).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1]), f"{int((grads[0] != grads[1]).sum())} elements differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["default", "ptref"])
def test_nan_and_inf_logits_give_nan_where_torch_does_ignored_rows_included(variant, dtype):
    """Rows holding a NaN, an inf beside a -inf, an inf alone, all -inf, among them ignored rows: the loss
    and dlogits are NaN exactly where torch's are. An ignored row's gradient is torch's 0 - exp(logp) * 0:
    NaN on a row whose max is not finite (it was zeros: a NaN in padding logits vanished)."""
    from ckparity.kernels.sweeping import special_rows

    g = torch.Generator().manual_seed(5)
    for V in (1, 97, 1003):
        x = special_rows(g, V, dtype)
        target = torch.randint(0, V, x.shape[:1], generator=g)
        target[[3, 10, 20, 21]] = -100  # a NaN row, an inf/-inf row, an inf row, the -inf row
        for reduction in ("none", "sum"):
            ours_x, theirs_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
            ours = ckparity.cross_entropy(ours_x, target, reduction=reduction, variant=variant)
            theirs = F.cross_entropy(theirs_x, target, reduction=reduction)
            assert torch.equal(ours.isnan(), theirs.isnan()), (V, reduction)
            (dx,), (tdx,) = torch.autograd.grad(ours.sum(), ours_x), torch.autograd.grad(theirs.sum(), theirs_x)
            assert tdx[20].isnan().all() and torch.equal(dx.isnan(), tdx.isnan()), (V, reduction)


GUESSING = [("ptref", torch.float32), ("ptref", torch.bfloat16), ("default", torch.float32), ("default", torch.bfloat16)]


def _loss_and_grad(x, t, scale, variant, weight=None, label_smoothing=0.0, reduction="mean", fn=None):
    x = x.clone().requires_grad_(True)
    kw = dict(weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    loss = F.cross_entropy(x, t, **kw) if fn is None else fn(x, t, variant=variant, **kw)
    (loss * scale).backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("variant, dtype", GUESSING)
@pytest.mark.parametrize("setting", ["plain", "weight", "smoothing", "probabilities", "sum"])
@pytest.mark.parametrize("scale", [1.0, 0.125, 1 / 3, -0.0])
def test_a_guessed_upstream_gradient_changes_no_bit(monkeypatch, variant, dtype, setting, scale):
    """[Note: guessing the upstream gradient]: whatever the forward guesses -- 1, the upstream
    gradient to come, another value, 0 of the other sign -- the loss and gradient are the same bits,
    and ptref's are torch's."""
    from ckparity.ops import cross_entropy as ops

    g = torch.Generator().manual_seed(7)
    N, C = 37, 300
    x = (torch.randn(N, C, generator=g) * 3).to(dtype)
    t = torch.randint(0, C, (N,), generator=g)
    if setting == "probabilities":
        t = torch.softmax(torch.randn(N, C, generator=g), -1).to(dtype)
    kw = {"weight": (torch.rand(C, generator=g) + 0.5).to(dtype) if setting == "weight" else None,
          "label_smoothing": 0.1 if setting == "smoothing" else 0.0, "reduction": "sum" if setting == "sum" else "mean"}
    results = []
    for guess in (1.0, scale, 0.5, 0.0):
        monkeypatch.setattr(ops, "_guess", lambda key, guess=guess: guess)
        results.append(_loss_and_grad(x, t, scale, variant, fn=ckparity.cross_entropy, **kw))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])
        assert torch.equal(grad.signbit(), results[0][1].signbit())  # -0.0 and 0.0 are equal, not the same bits
    if variant == "ptref":
        loss_t, grad_t = _loss_and_grad(x, t, scale, variant, **kw)
        assert torch.equal(results[0][0], loss_t) and torch.equal(results[0][1], grad_t)
        assert torch.equal(results[0][1].signbit(), grad_t.signbit())


@pytest.mark.parametrize("variant, dtype", GUESSING)
def test_the_forward_folds_in_the_last_backwards_upstream_gradient(monkeypatch, variant, dtype):
    """The upstream gradient each C call folds in (1: none), over four micro-steps: loss / 8 twice,
    then the loss itself twice. The first forward guesses 1 and backward runs the kernel again with
    1/8; the second forward folds 1/8 in and backward has nothing to do; the third guesses 1/8
    wrongly; the fourth folds 1 in."""
    from ckparity import _bindings
    from ckparity.ops import cross_entropy as ops

    monkeypatch.setattr(ops, "_LAST_UPSTREAM", {})
    folded = []
    for name in ("cross_entropy", "cross_entropy_bf16", "cross_entropy_default_bf16"):
        def spy(logits, target, options, loss, dlogits=None, _call=getattr(_bindings, name), **kwargs):
            assert dlogits is not None  # every call here computes a gradient
            folded.append(1.0 if options.row_grad == _bindings.ffi.NULL else options.row_grad[0])
            return _call(logits, target, options, loss, dlogits, **kwargs)
        monkeypatch.setattr(_bindings, name, spy)
    x = torch.randn(8, 256).to(dtype)
    t = torch.randint(0, 256, (8,))
    calls = []
    for scale in (0.125, 0.125, 1.0, 1.0):
        _loss_and_grad(x, t, scale, variant, fn=ckparity.cross_entropy)
        calls.append(folded[:])
        folded.clear()
    assert calls == [[1.0, 0.125], [0.125], [0.125, 1.0], [1.0]]


@pytest.mark.parametrize("upstream", [1.0 / 3, -2.5, 1e-3])
@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(label_smoothing=0.1)])
def test_the_default_variant_folds_an_upstream_gradient_into_its_row_scale(upstream, kwargs):
    """The default variant's gradient for a scaled loss is the kernel's, the upstream gradient in its
    float64 row scale (one rounding), not the finished gradient rescaled (a second rounding, its
    rule until stop 51): other bits, and closer to float64 -- the largest error and the mean one (most
    of an element's error is its float exp's, shared by both, so element by element it is near a coin
    flip)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 1000, generator=g) * 3
    target = torch.randint(0, 1000, (64,), generator=g)
    leaf = x.clone().requires_grad_(True)
    (ckparity.cross_entropy(leaf, target, **kwargs) * upstream).backward()
    _, unit = cross_entropy_forward_backward(x, target, **kwargs)
    g32 = torch.tensor(upstream, dtype=torch.float32)  # the upstream gradient both float32 paths receive
    rescaled = unit * g32
    exact = x.double().requires_grad_(True)
    (F.cross_entropy(exact, target, **kwargs) * float(g32)).backward()
    ours, theirs = (leaf.grad.double() - exact.grad).abs(), (rescaled.double() - exact.grad).abs()
    assert not torch.equal(leaf.grad, rescaled)
    assert ours.max() < theirs.max() and ours.mean() < theirs.mean()


@pytest.mark.parametrize("shape", [(2, 4, 3), (2, 4, 3, 3)])
def test_uint8_targets_of_a_spatial_input_raise_as_in_torch(shape):
    """torch's nll_loss takes Byte class targets; its spatial form (an input of 3 or more dimensions)
    takes Long only: a RuntimeError in torch, ckparity's InvalidType (a RuntimeError too)."""
    logits = torch.randn(shape)
    target = torch.randint(0, 4, shape[:1] + shape[2:], dtype=torch.uint8)
    with pytest.raises(RuntimeError):
        F.cross_entropy(logits, target)
    for variant in ("default", "ptref"):
        with pytest.raises(RuntimeError, match="uint8"):
            ckparity.cross_entropy(logits, target, variant=variant)
    flat = torch.randn(5, 4)  # (N, C) with uint8 targets: torch takes them, so does ckparity
    small = torch.randint(0, 4, (5,), dtype=torch.uint8)
    assert torch.equal(ckparity.cross_entropy(flat, small, variant="ptref"), F.cross_entropy(flat, small))
