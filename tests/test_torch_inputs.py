"""ckparity on PyTorch's own test inputs: the OpInfo samples of
nn.functional.cross_entropy, rms_norm and silu (through swiglu with up = 1),
the ModuleInfo inputs of nn.CrossEntropyLoss and nn.RMSNorm, and the
OptimizerInfo configs and error inputs of AdamW (torch.testing._internal,
shipped in the wheel; they need expecttest) — inputs ckparity's authors did
not choose.

Each case must end one of four ways, counted per source in
reports/parity_latest.json ("torch_inputs.*"):
- bitwise: outputs and gradients equal torch's bit for bit;
- close: within assert_close's float32 tolerances of torch's;
- both raise: torch raises and ckparity raises an exception of torch's type
  (ckparity's errors are RuntimeError and the Python type that fits);
- refused: torch computes, ckparity raises, and REFUSALS names why.
Anything else — a different answer, a different exception type, or
ckparity computing what torch refuses — fails the test."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity.kernels.layouts import strided
from parity import MEASUREMENTS

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402
from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db  # noqa: E402
from torch.testing._internal.common_utils import noncontiguous_like  # noqa: E402

# What ckparity refuses that torch computes: (reason, predicate on the error ckparity raised).
REFUSALS = {
    "negative eps": lambda err: "eps must be finite and >= 0" in str(err),
    "gradient of the class weight": lambda err: isinstance(err, NotImplementedError) and "not weight" in str(err),
    "0-dim input to swiglu (it needs a last dimension of 2H)": lambda err: "even size 2H" in str(err),
    "a Tensor lr (torch keeps it in float32 tensor arithmetic)": lambda err: "Tensor lr" in str(err),
    "float16 cross-entropy": lambda err: "must be float32 or bfloat16, got torch.float16" in str(err),
    "bf16 ptref with the class dimension not last (not torch's loops)": lambda err: "ptref takes (C) or (N, C)" in str(err),
}


def _map_tensors(value, fn):
    """value with fn applied to every tensor in it (through lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _fresh_tensor(t: torch.Tensor) -> torch.Tensor:
    """A new leaf with t's values in t's own layout (its strides and gaps: a sample's non-contiguous form
    stays one; clone() would make it contiguous). An expanded tensor, whose elements share memory, is cloned."""
    if 0 in t.stride():
        return t.detach().clone().requires_grad_(t.requires_grad)
    fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    with torch.no_grad():
        fresh.copy_(t)
    return fresh.requires_grad_(t.requires_grad)


def _fresh(value):
    """A copy of a sample's argument; tensors that require grad become new leaves, in the sample's layout."""
    return _map_tensors(value, _fresh_tensor)


def _leaves(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    return []


def _forward_backward(fn, args, kwargs, extra_leaves=(), upstream_dtype=None):
    """The output and the gradient of every leaf, for a fixed upstream gradient
    (with the values of ``upstream_dtype``, the output's by default)."""
    args, kwargs = _fresh(args), _fresh(kwargs)
    out = fn(*args, **kwargs)
    leaves = _leaves(args) + _leaves(kwargs) + list(extra_leaves)
    results = [out.detach()]
    if out.requires_grad and leaves:
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        upstream = upstream.to(upstream_dtype or out.dtype).to(out.dtype)
        grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
        results += [g if g is not None else torch.zeros(()) for g in grads]
    return results


def _run(fn):
    try:
        return fn(), None
    except Exception as err:  # both sides' exceptions are compared below
        return None, err


def _float64(value):
    """A sample's argument with its floating tensors in float64 (the same values: an exact reference)."""
    return _map_tensors(value, lambda t: t.detach().double().requires_grad_(t.requires_grad)
                        if t.is_floating_point() else t)


def _as_accurate(ours_out, theirs_out, exact_out) -> bool:
    """Each of ckparity's results no farther from the float64 evaluation than torch's (worst element)."""
    def error(x, e):
        return (x.double() - e).abs().nan_to_num(0.0, 0.0, 0.0).max().item() if x.numel() else 0.0
    return all(error(a, e) <= error(b, e) for a, b, e in zip(ours_out, theirs_out, exact_out))


def outcome(ours, theirs, label: str, exact=None) -> str:
    """Runs both sides; returns the category, or fails the test with the reason.
    ``exact`` (a 16-bit dtype's float64 evaluation of the same formula): where
    a result is not within assert_close of torch's, it is still "as accurate"
    if no farther from float64 than torch's -- in bf16 two roundings of one
    value can be a whole bf16 step apart, more than assert_close allows near 0."""
    theirs_out, theirs_err = _run(theirs)
    ours_out, ours_err = _run(ours)
    if theirs_err is not None and ours_err is not None:
        assert isinstance(ours_err, type(theirs_err)), (
            f"{label}: torch raises {type(theirs_err).__name__}, ckparity {type(ours_err).__name__}: {ours_err}")
        return "both raise"
    if theirs_err is not None:
        pytest.fail(f"{label}: torch raises {type(theirs_err).__name__} ({theirs_err}) but ckparity computes")
    if ours_err is not None:
        reasons = [reason for reason, matches in REFUSALS.items() if matches(ours_err)]
        assert reasons, f"{label}: torch computes, ckparity raises {type(ours_err).__name__}: {ours_err}"
        return f"refused: {reasons[0]}"
    assert len(ours_out) == len(theirs_out), f"{label}: {len(ours_out)} results vs torch's {len(theirs_out)}"
    if all(a.shape == b.shape and torch.equal(a, b) or (a.isnan() == b.isnan()).all() and
           torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(ours_out, theirs_out)):
        return "bitwise"
    try:
        for k, (a, b) in enumerate(zip(ours_out, theirs_out)):
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{label} result {k}: {m}")
    except AssertionError:
        if exact is None or not _as_accurate(ours_out, theirs_out, exact()):
            raise
        return "as accurate as torch (float64)"
    return "close"


def record(source: str, counts: Counter) -> None:
    MEASUREMENTS.append({"name": f"torch_inputs.{source}", "counts": dict(counts)})
    print(f"{source}: {dict(counts)}")


def _op(name: str):
    return next(o for o in op_db if o.name == name and o.variant_test_name == "")


# torch's samples as it gives them, and in their non-contiguous form (SampleInput.noncontiguous: every tensor
# a stride-2 view whose gaps hold NaN, so a kernel that reads a view as contiguous reads NaN)
FORMS = ["as given", "noncontiguous"]


def _samples(name: str, dtype: torch.dtype = torch.float32, form: str = "as given"):
    samples = _op(name).sample_inputs("cpu", dtype, requires_grad=True)
    return [s.noncontiguous() if form == "noncontiguous" else s for s in samples]


def _noncontiguous_values(value, form: str):
    """A ModuleInfo or OptimizerInfo input's tensors in ``form`` (their non-contiguous form as
    SampleInput.noncontiguous makes it)."""
    return _map_tensors(value, noncontiguous_like) if form == "noncontiguous" else value


def _source(name: str, dtype: torch.dtype, form: str = "as given") -> str:
    """The report's name of a source: float32's as before, a 16-bit dtype's suffixed, the non-contiguous
    form's too."""
    name = name if dtype == torch.float32 else f"{name}.{str(dtype).split('.')[-1]}"
    return name if form == "as given" else f"{name}.noncontiguous"


# torch's samples in its 16-bit dtypes too: the bit-identity claims of each dtype (docs/kernels.md) on inputs
# ckparity's authors did not choose
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opinfo_cross_entropy(dtype, form):
    """float32 and bf16's default variant take every sample (within assert_close of torch's, or no
    farther from float64); bf16 ptref gives torch's bits on every (N, C) sample and refuses the class
    dimension elsewhere; float16 is refused."""
    counts, per_variant = Counter(), {"default": Counter(), "ptref": Counter()}
    for k, s in enumerate(_samples("nn.functional.cross_entropy", dtype, form)):
        for variant in ("default", "ptref"):
            ended = outcome(
                lambda: _forward_backward(lambda *a, **kw: ckparity.cross_entropy(*a, variant=variant, **kw),
                                          (s.input, *s.args), s.kwargs),
                lambda: _forward_backward(F.cross_entropy, (s.input, *s.args), s.kwargs),
                f"cross_entropy sample {k} ({variant}): {s}",
                exact=lambda: _forward_backward(F.cross_entropy, _float64((s.input, *s.args)), _float64(s.kwargs),
                                                upstream_dtype=dtype))
            counts[ended] += 1
            per_variant[variant][ended] += 1
            if variant == "ptref" and dtype == torch.bfloat16 and s.input.dim() <= 2:
                assert ended == "bitwise", f"bf16 ptref sample {k} ({s}): {ended}"
    record(_source("opinfo.cross_entropy", dtype, form), counts)
    if dtype == torch.float16:
        assert set(counts) == {"refused: float16 cross-entropy"}
    else:
        assert sum(counts.values()) == 42 and not any(c.startswith("refused") for c in per_variant["default"])
        assert per_variant["ptref"]["bitwise"] >= (15 if dtype == torch.bfloat16 else 9)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opinfo_rms_norm(dtype, form):
    counts = Counter()
    for k, s in enumerate(_samples("nn.functional.rms_norm", dtype, form)):
        counts[outcome(lambda: _forward_backward(ckparity.rms_norm, (s.input, *s.args), s.kwargs),
                       lambda: _forward_backward(F.rms_norm, (s.input, *s.args), s.kwargs),
                       f"rms_norm sample {k}: {s}")] += 1
    for k, e in enumerate(_op("nn.functional.rms_norm").error_inputs("cpu")):
        s = e.sample_input
        counts[outcome(lambda: ckparity.rms_norm(s.input, *s.args, **s.kwargs),
                       lambda: F.rms_norm(s.input, *s.args, **s.kwargs), f"rms_norm error input {k}")] += 1
    record(_source("opinfo.rms_norm", dtype, form), counts)
    assert counts["bitwise"] >= 4 and counts["both raise"] == 3 and "close" not in counts  # every dtype: torch's bits


def _swiglu_as_silu(x):
    """silu(x) as swiglu's gate with up = 1 (silu(x) * 1 is silu(x) exactly); a non-contiguous x gives
    swiglu a strided input (the concatenation every other element of a wider row)."""
    if not x.dim():
        return ckparity.swiglu(x)
    gate_up = torch.cat([x, torch.ones_like(x)], dim=-1)
    return ckparity.swiglu(gate_up if x.is_contiguous() else strided(gate_up))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opinfo_silu_through_swiglu(dtype, form):
    counts = Counter()
    for k, s in enumerate(_samples("nn.functional.silu", dtype, form)):
        counts[outcome(lambda: _forward_backward(_swiglu_as_silu, (s.input,), {}),
                       lambda: _forward_backward(F.silu, (s.input,), {}), f"silu sample {k}: {s}")] += 1
    record(_source("opinfo.silu", dtype, form), counts)
    # a strided last dim: torch's scalar loop (libm's expf), which swiglu does not follow (its not_claimed): close
    assert counts["bitwise"] >= (2 if form == "as given" else 1) and counts["close"] <= (form != "as given")


def _module_inputs(cls, dtype):
    info = next(m for m in module_db if m.module_cls is cls)
    return info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=True)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cls, ours_cls", [(torch.nn.CrossEntropyLoss, ckparity.nn.CrossEntropyLoss),
                                           (torch.nn.RMSNorm, ckparity.nn.RMSNorm)])
def test_moduleinfo(cls, ours_cls, dtype, form):
    counts = Counter()
    for k, mi in enumerate(_module_inputs(cls, dtype)):
        c, f = mi.constructor_input, mi.forward_input
        if f is None:
            continue
        c, f = copy.copy(c), copy.copy(f)  # the constructor's class weight and the forward's tensors in ``form``
        c.args, c.kwargs, f.args, f.kwargs = (_noncontiguous_values(v, form) for v in (c.args, c.kwargs, f.args,
                                                                                      f.kwargs))

        def run(make):
            module = make(*_fresh(c.args), **_fresh(c.kwargs))
            if cls is torch.nn.RMSNorm:
                module.load_state_dict(reference_state)
            params = [p for p in module.parameters() if p.requires_grad]
            return _forward_backward(module, f.args, f.kwargs, params)

        reference_state = copy.deepcopy(cls(*_fresh(c.args), **_fresh(c.kwargs)).state_dict())
        with torch.random.fork_rng():
            exact = None if cls is torch.nn.RMSNorm else lambda: _forward_backward(
                cls(*_float64(c.args), **_float64(c.kwargs)), _float64(f.args), _float64(f.kwargs), upstream_dtype=dtype)
            counts[outcome(lambda: run(ours_cls), lambda: run(cls), f"{cls.__name__} input {k}: {c.args} {c.kwargs}",
                           exact)] += 1
    record(_source(f"moduleinfo.{cls.__name__}", dtype, form), counts)
    assert counts["bitwise"] + counts["close"] >= 5 and not any(c.startswith("refused") for c in counts)
    assert cls is not torch.nn.RMSNorm or set(counts) == {"bitwise"}


def _adamw_info():
    return next(o for o in optim_db if o.optim_cls is torch.optim.AdamW)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optiminfo_adamw_configs(dtype, form):
    """Each of torch's AdamW configs, five steps: params and moments torch's bits (bf16: its
    single-tensor path's seven roundings per element); in the non-contiguous form, params and gradients
    stride-2 views."""
    counts = Counter()
    for k, config in enumerate(_adamw_info().optim_inputs_func(device="cpu")):
        g = torch.Generator().manual_seed(k)
        start = [torch.randn(7, 5, generator=g).to(dtype), torch.randn(3, generator=g).to(dtype)]

        def run(make):
            params = [torch.nn.Parameter(_noncontiguous_values(t.clone(), form)) for t in start]
            optimizer = make(params, **config.kwargs)
            gen = torch.Generator().manual_seed(100 + k)
            for _ in range(5):
                for p in params:
                    p.grad = _noncontiguous_values(torch.randn(p.shape, generator=gen).to(dtype), form)
                optimizer.step()
            return params + [optimizer.state[p][name] for p in params for name in ("exp_avg", "exp_avg_sq")]

        counts[outcome(lambda: run(ckparity.optim.AdamW),
                       lambda: run(lambda ps, **kw: torch.optim.AdamW(ps, foreach=False, **kw)),
                       f"AdamW config {config.kwargs}")] += 1
    record(_source("optiminfo.AdamW", dtype, form), counts)
    assert counts["bitwise"] + counts["close"] == len(_adamw_info().optim_inputs_func(device="cpu"))
    assert dtype == torch.float32 or counts["bitwise"] == sum(counts.values())


# torch's messages that ckparity words its own way (it says why it refuses)
_OWN_MESSAGES = {"lr as a Tensor is not supported": "takes lr as a Python float",
                 r"betas\[0\] as a Tensor is not supported": "foreach=True asks for one of torch's"}


def _ours_for(regex: str) -> str:
    return next((ours for theirs, ours in _OWN_MESSAGES.items() if regex.startswith(theirs)), regex)


def test_optiminfo_adamw_error_inputs():
    counts = Counter()
    for e in _adamw_info().optim_error_inputs_func(device="cpu", dtype=torch.float32):
        if e.error_on != OptimizerErrorEnum.CONSTRUCTION_ERROR:
            continue
        i = e.optimizer_error_input
        expect = pytest.warns if issubclass(e.error_type, Warning) else pytest.raises
        with expect(e.error_type, match=_ours_for(e.error_regex)):
            ckparity.optim.AdamW(i.params, **i.kwargs)
        counts["both warn" if expect is pytest.warns else "both raise"] += 1
    record("optiminfo.AdamW.errors", counts)
    assert counts["both raise"] >= 10
