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
from parity import MEASUREMENTS

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402
from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db  # noqa: E402

# What ckparity refuses that torch computes: (reason, predicate on the error ckparity raised).
REFUSALS = {
    "negative eps": lambda err: "eps must be finite and >= 0" in str(err),
    "gradient of the class weight": lambda err: isinstance(err, NotImplementedError) and "not weight" in str(err),
    "0-dim input to swiglu (it needs a last dimension of 2H)": lambda err: "even size 2H" in str(err),
    "a Tensor lr (torch keeps it in float32 tensor arithmetic)": lambda err: "Tensor lr" in str(err),
}


def _fresh(value):
    """A copy of a sample's argument; tensors that require grad become new leaves."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    return value


def _leaves(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaves(v)]
    return []


def _forward_backward(fn, args, kwargs, extra_leaves=()):
    """The output and the gradient of every leaf, for a fixed upstream gradient."""
    args, kwargs = _fresh(args), _fresh(kwargs)
    out = fn(*args, **kwargs)
    leaves = _leaves(args) + _leaves(kwargs) + list(extra_leaves)
    results = [out.detach()]
    if out.requires_grad and leaves:
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
        results += [g if g is not None else torch.zeros(()) for g in grads]
    return results


def _run(fn):
    try:
        return fn(), None
    except Exception as err:  # both sides' exceptions are compared below
        return None, err


def outcome(ours, theirs, label: str) -> str:
    """Runs both sides; returns the category, or fails the test with the reason."""
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
    for k, (a, b) in enumerate(zip(ours_out, theirs_out)):
        torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{label} result {k}: {m}")
    return "close"


def record(source: str, counts: Counter) -> None:
    MEASUREMENTS.append({"name": f"torch_inputs.{source}", "counts": dict(counts)})
    print(f"{source}: {dict(counts)}")


def _op(name: str):
    return next(o for o in op_db if o.name == name and o.variant_test_name == "")


def _samples(name: str):
    return list(_op(name).sample_inputs("cpu", torch.float32, requires_grad=True))


def test_opinfo_cross_entropy():
    counts = Counter()
    for k, s in enumerate(_samples("nn.functional.cross_entropy")):
        for variant in ("default", "ptref"):
            counts[outcome(
                lambda: _forward_backward(lambda *a, **kw: ckparity.cross_entropy(*a, variant=variant, **kw),
                                          (s.input, *s.args), s.kwargs),
                lambda: _forward_backward(F.cross_entropy, (s.input, *s.args), s.kwargs),
                f"cross_entropy sample {k} ({variant}): {s}")] += 1
    record("opinfo.cross_entropy", counts)
    assert counts["bitwise"] + counts["close"] >= 30


def test_opinfo_rms_norm():
    counts = Counter()
    for k, s in enumerate(_samples("nn.functional.rms_norm")):
        counts[outcome(lambda: _forward_backward(ckparity.rms_norm, (s.input, *s.args), s.kwargs),
                       lambda: _forward_backward(F.rms_norm, (s.input, *s.args), s.kwargs),
                       f"rms_norm sample {k}: {s}")] += 1
    for k, e in enumerate(_op("nn.functional.rms_norm").error_inputs("cpu")):
        s = e.sample_input
        counts[outcome(lambda: ckparity.rms_norm(s.input, *s.args, **s.kwargs),
                       lambda: F.rms_norm(s.input, *s.args, **s.kwargs), f"rms_norm error input {k}")] += 1
    record("opinfo.rms_norm", counts)
    assert counts["bitwise"] >= 4 and counts["both raise"] == 3


def _swiglu_as_silu(x):
    """silu(x) as swiglu's gate with up = 1 (silu(x) * 1 is silu(x) exactly)."""
    return ckparity.swiglu(torch.cat([x, torch.ones_like(x)], dim=-1) if x.dim() else x)


def test_opinfo_silu_through_swiglu():
    counts = Counter()
    for k, s in enumerate(_samples("nn.functional.silu")):
        counts[outcome(lambda: _forward_backward(_swiglu_as_silu, (s.input,), {}),
                       lambda: _forward_backward(F.silu, (s.input,), {}), f"silu sample {k}: {s}")] += 1
    record("opinfo.silu", counts)
    assert counts["bitwise"] >= 2


def _module_inputs(cls):
    info = next(m for m in module_db if m.module_cls is cls)
    return info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True, training=True)


@pytest.mark.parametrize("cls, ours_cls", [(torch.nn.CrossEntropyLoss, ckparity.nn.CrossEntropyLoss),
                                           (torch.nn.RMSNorm, ckparity.nn.RMSNorm)])
def test_moduleinfo(cls, ours_cls):
    counts = Counter()
    for k, mi in enumerate(_module_inputs(cls)):
        c, f = mi.constructor_input, mi.forward_input
        if f is None:
            continue

        def run(make):
            module = make(*_fresh(c.args), **_fresh(c.kwargs))
            if cls is torch.nn.RMSNorm:
                module.load_state_dict(reference_state)
            params = [p for p in module.parameters() if p.requires_grad]
            return _forward_backward(module, f.args, f.kwargs, params)

        reference_state = copy.deepcopy(cls(*_fresh(c.args), **_fresh(c.kwargs)).state_dict())
        with torch.random.fork_rng():
            counts[outcome(lambda: run(ours_cls), lambda: run(cls), f"{cls.__name__} input {k}: {c.args} {c.kwargs}")] += 1
    record(f"moduleinfo.{cls.__name__}", counts)
    assert counts["bitwise"] + counts["close"] >= 5


def _adamw_info():
    return next(o for o in optim_db if o.optim_cls is torch.optim.AdamW)


def test_optiminfo_adamw_configs():
    counts = Counter()
    for k, config in enumerate(_adamw_info().optim_inputs_func(device="cpu")):
        g = torch.Generator().manual_seed(k)
        start = [torch.randn(7, 5, generator=g), torch.randn(3, generator=g)]

        def run(make):
            params = [torch.nn.Parameter(t.clone()) for t in start]
            optimizer = make(params, **config.kwargs)
            gen = torch.Generator().manual_seed(100 + k)
            for _ in range(5):
                for p in params:
                    p.grad = torch.randn(p.shape, generator=gen)
                optimizer.step()
            return params + [optimizer.state[p][name] for p in params for name in ("exp_avg", "exp_avg_sq")]

        counts[outcome(lambda: run(ckparity.optim.AdamW),
                       lambda: run(lambda ps, **kw: torch.optim.AdamW(ps, foreach=False, **kw)),
                       f"AdamW config {config.kwargs}")] += 1
    record("optiminfo.AdamW", counts)
    assert counts["bitwise"] + counts["close"] == len(_adamw_info().optim_inputs_func(device="cpu"))


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
