"""Every tensor argument of every kernel in every layout torch accepts, and no
internal error reachable from the public API.

- the layouts sweep (ckparity.sweep.layouts over every record's layout cases:
  strided, transposed, a storage offset, expanded rows and columns, 0-size
  rows) gives the bits of the same call on contiguous copies, torch's bits
  where a claim covers the call, and refuses exactly where torch refuses, in
  float32, bfloat16 and float16; it fails on a planted kernel that reads a
  view as contiguous;
- every public function, called with a bad value in each argument, raises
  ckparity's documented errors (CkparityError and its subclasses, or
  NotImplementedError for what it refuses by design) or the exception type
  torch raises on the same call: never an AssertionError, AttributeError,
  KeyError, a cffi error or anything else from inside.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import kernels, reference, sweep
from ckparity.errors import CkparityError
from ckparity.kernels.layouts import LayoutCase, applicable
from ckparity.kernels.record import Kernel
from parity import MEASUREMENTS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_every_tensor_argument_in_every_layout(dtype):
    result = sweep.layouts(dtype)
    MEASUREMENTS.append({"name": f"layouts.{dtype}", **{k: v for k, v in result.items()}})
    for quantity in ("as a contiguous copy", "torch's bits", "refused as torch refuses"):
        figures = result[quantity]
        assert figures["differing"] == 0, f"{quantity}: {figures['differing']} of {figures['swept']}: {figures['examples']}"
    # every record with layout cases swept, each tensor of each case in at least one layout
    assert result["as a contiguous copy"]["swept"] >= {"float32": 550, "bfloat16": 500, "float16": 200}[dtype]
    if kernels.bit_identical(dtype):  # the library follows torch's capability here
        assert result["torch's bits"]["swept"] >= {"float32": 300, "bfloat16": 300, "float16": 200}[dtype]


def test_every_record_has_layout_cases_that_reach_every_tensor():
    """Every kernel ckparity has C for (a slot with torch's backend alone gets them with its C: the sweep holds
    ckparity's own bits, and torch's own linear and attention move with a layout)."""
    for name, record in kernels.KERNELS.items():
        if "c" not in record.backends:
            assert record.layouts is None, f"{name}: layout cases of torch's own backend"
            continue
        assert record.layouts is not None, f"{name} has no layout cases"
        for case in record.layouts(torch.Generator().manual_seed(0)):
            for tensor_name, t in case.tensors.items():
                assert t.numel() == 0 or list(applicable(t)), f"{name} {case.label}: {tensor_name} takes no layout"


def _planted_record(ours) -> Kernel:
    g = torch.Generator().manual_seed(0)
    case = LayoutCase("x (4, 9)", ours, F.rms_norm, lambda f, t: f(t["x"], (9,), t["weight"], 1e-5),
                      ("x", "weight"), {"x": torch.randn(4, 9, generator=g), "weight": torch.randn(9, generator=g)},
                      claim="rms_norm")
    return Kernel("planted", "none", {}, contract=lambda fn: None, layouts=lambda gen: iter([case]))


def _as_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t's memory read as if t were contiguous: what a C kernel that ignores strides sees."""
    return t.as_strided(t.shape, t.contiguous().stride())


def test_the_sweep_fails_on_a_kernel_that_ignores_strides():
    def weight_as_contiguous(x, shape, weight, eps):  # (torch's own rms_norm moves with x's layout)
        return ckparity.rms_norm(x, shape, _as_contiguous(weight), eps)
    result = sweep.layouts("float32", records=[_planted_record(weight_as_contiguous)])
    differing = result["as a contiguous copy"]["examples"]
    assert differing and all("weight" in case for case in differing)
    assert any("weight strided" in case for case in differing)


def test_the_sweep_fails_on_a_kernel_that_refuses_a_layout_torch_takes():
    """The AssertionError torch's samples found: a weight that is a view, refused from inside."""
    def needs_contiguous(x, shape, weight, eps):
        assert weight.is_contiguous(), "internal: pointer() needs a contiguous tensor"
        return ckparity.rms_norm(x, shape, weight, eps)
    result = sweep.layouts("float32", records=[_planted_record(needs_contiguous)])
    refused = result["refused as torch refuses"]
    assert refused["differing"] >= 2 and any("weight expanded rows" in c for c in refused["examples"])


# ---- no internal error from the public API -----------------------------------------------------------

def _bad_values(good):
    """Values that do not belong where ``good`` goes: other types, dtypes, devices, ranks, sizes."""
    yield "None", None
    yield "a string", "x"
    yield "a list", [1.0, 2.0]
    if isinstance(good, torch.Tensor):
        yield "0-dim", torch.tensor(1.5)
        yield "int64", torch.ones(good.shape, dtype=torch.int64)
        yield "float64", torch.ones(good.shape, dtype=torch.float64)
        yield "complex64", torch.ones(good.shape, dtype=torch.complex64)
        yield "bool", torch.ones(good.shape, dtype=torch.bool)
        yield "meta device", torch.empty(good.shape, dtype=good.dtype, device="meta")
        yield "an extra dimension", good.unsqueeze(0)
        if good.dim():
            yield "a dimension fewer", good[0]
            yield "0 rows", good[:0]
            yield "one element short", good[..., :-1]
            yield "expanded", good[..., :1].expand(good.shape)
    elif isinstance(good, float):
        yield "NaN", math.nan
        yield "inf", math.inf
        yield "negative", -1.0
    elif isinstance(good, int):
        yield "negative", -3
        yield "a float", 2.5
    elif isinstance(good, str):
        yield "an unknown name", "nope"


def _calls():
    """(name, ckparity's call, torch's call, good arguments): each call takes the arguments as a list."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=g), torch.randn(8, generator=g)
    logits, target = torch.randn(5, 7, generator=g), torch.randint(0, 7, (5,), generator=g)
    q, angles = torch.randn(2, 3, 5, 8, generator=g), torch.rand(5, 4, generator=g)
    hidden, lm_head = torch.randn(6, 8, generator=g), torch.randn(11, 8, generator=g)
    yield ("cross_entropy",
           lambda a: ckparity.cross_entropy(a[0], a[1], weight=a[2], label_smoothing=a[3], reduction=a[4]),
           lambda a: F.cross_entropy(a[0], a[1], weight=a[2], label_smoothing=a[3], reduction=a[4]),
           [logits, target, torch.rand(7, generator=g), 0.1, "sum"])
    yield ("cross_entropy ptref", lambda a: ckparity.cross_entropy(a[0], a[1], ignore_index=a[2], variant="ptref"),
           lambda a: F.cross_entropy(a[0], a[1], ignore_index=a[2]), [logits, target, -100])
    yield ("cross_entropy bf16", lambda a: ckparity.cross_entropy(a[0], a[1], variant=a[2]),
           lambda a: F.cross_entropy(a[0], a[1]), [logits.bfloat16(), target, "ptref"])
    yield ("rms_norm", lambda a: ckparity.rms_norm(a[0], a[1], a[2], a[3]), lambda a: F.rms_norm(*a),
           [x, (8,), w, 1e-5])
    yield "swiglu", lambda a: ckparity.swiglu(a[0]), lambda a: reference.swiglu(a[0]), [x]
    yield ("rope", lambda a: ckparity.rope(a[0], a[1], a[2]), lambda a: reference.rope(a[0], a[1], a[2]),
           [q, angles.cos(), angles.sin()])
    yield ("fused_linear_cross_entropy", lambda a: ckparity.fused_linear_cross_entropy(a[0], a[1], a[2]),
           lambda a: F.cross_entropy(F.linear(a[0], a[1]), a[2]), [hidden, lm_head, torch.randint(0, 11, (6,))])

    def clip(fn):
        def call(a):
            p = torch.nn.Parameter(torch.zeros(3))
            p.grad = a[0]
            return fn([p], a[1], a[2])
        return call
    yield "clip_grad_norm_", clip(ckparity.clip_grad_norm_), clip(torch.nn.utils.clip_grad_norm_), [
        torch.randn(3, generator=g), 1.0, 2.0]

    def adamw(make):
        def call(a):
            p = torch.nn.Parameter(torch.zeros(3))
            p.grad = a[0]
            make([p], lr=a[1], weight_decay=a[2]).step()
            return p
        return call
    yield "optim.AdamW", adamw(ckparity.optim.AdamW), adamw(reference.adamw), [torch.randn(3, generator=g), 1e-3, 0.01]
    yield ("nn.CrossEntropyLoss", lambda a: ckparity.nn.CrossEntropyLoss(weight=a[2])(a[0], a[1]),
           lambda a: torch.nn.CrossEntropyLoss(weight=a[2])(a[0], a[1]), [logits, target, None])
    yield ("nn.RMSNorm", lambda a: ckparity.nn.RMSNorm(a[1], eps=a[2])(a[0]),
           lambda a: torch.nn.RMSNorm(a[1], eps=a[2])(a[0]), [x, 8, 1e-5])
    yield "nn.SwiGLU", lambda a: ckparity.nn.SwiGLU()(a[0]), lambda a: reference.swiglu(a[0]), [x]


def _run(call, args):
    try:
        return call(args), None
    except Exception as err:  # noqa: BLE001 -- compared below
        return None, err


# what ckparity raises by design (docs: errors.py's types; NotImplementedError names what it refuses)
DOCUMENTED = (CkparityError, NotImplementedError)


def test_no_internal_error_from_the_public_api():
    """Each argument of each public call replaced in turn by each bad value: ckparity either raises one of
    its documented errors (or torch's exception type for the same call), or computes what torch computes
    on it too. Counted per outcome in reports/parity_latest.json ("public_api.bad_inputs")."""
    counts, problems = Counter(), []
    for name, ours, theirs, good in _calls():
        for position, value in enumerate(good):
            for what, bad in _bad_values(value):
                args = list(good)
                args[position] = bad
                label = f"{name}: argument {position} {what}"
                _, ours_err = _run(ours, args)
                _, theirs_err = _run(theirs, args)
                if ours_err is None:
                    counts["computes" if theirs_err is None else "computes where torch raises"] += 1
                    if theirs_err is not None:
                        problems.append(f"{label}: computes where torch raises {type(theirs_err).__name__}: "
                                        f"{theirs_err}")
                elif isinstance(ours_err, DOCUMENTED) or (theirs_err is not None and
                                                          isinstance(ours_err, type(theirs_err))):
                    counts["raises a documented error"] += 1
                else:
                    counts["internal error"] += 1
                    problems.append(f"{label}: {type(ours_err).__name__}: {ours_err}")
    MEASUREMENTS.append({"name": "public_api.bad_inputs", "counts": dict(counts)})
    print(dict(counts))
    assert sum(counts.values()) >= 150
    assert not problems, "\n".join(problems)


def test_set_num_threads_refuses_by_name():
    before = ckparity.get_num_threads()
    try:
        for bad in (0, -1, 2.5, "2", None):
            with pytest.raises(DOCUMENTED):
                ckparity.set_num_threads(bad)
        assert ckparity.get_num_threads() == before
    finally:
        ckparity.set_num_threads(before)
