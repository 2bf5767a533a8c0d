"""optimizer_parity: ckparity's AdamW against torch's two references, the clip's norm against
float64; a user's AdamW through check."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

import ckparity

from .. import check, kernels, reference
from .._tensors import DTYPES
from ..measure import max_ulp
from .common import result
from .record import Gate



# ckparity's AdamW for each of torch's two references (tests plant faults here)
OPTIMIZERS = {"ckparity": lambda params, **kw: ckparity.optim.AdamW(params, **kw),
              "ckparity_fused": lambda params, **kw: ckparity.optim.AdamW(params, fused=True, **kw)}
# each reference's torch optimizer, and whether ckparity's params are held to it bit for bit (fused: its
# sqrt is correctly rounded, as the C one is) or within max_param_ulp (single-tensor: torch's MKL sqrt)
REFERENCES = {"ckparity": (reference.adamw, False),
              "ckparity_fused": (lambda params, **kw: torch.optim.AdamW(params, fused=True, **kw), True)}


def _grad_norm_failures(sizes: list[int], clip: Callable, own: bool) -> list[str]:
    """clip_grad_norm_'s total norm (2, 1, inf) against float64: ckparity's
    own (``own``) within one float32 ULP, its claim (the norm is reduced in
    double, then rounded; torch's float reduction is allowed more, so a float
    accumulator that is as good as torch's still fails here); a user's
    backend within that or twice torch's error, the accuracy rule."""
    failures, g = [], torch.Generator().manual_seed(3)
    for norm_type in (2.0, 1.0, float("inf")):
        grads = [torch.randn(n, generator=g) * 10 for n in sizes + [200003]]
        exact = float(torch.linalg.vector_norm(torch.cat([t.double() for t in grads]), norm_type))
        errors = {}
        for side, clip_fn in (("ckparity", clip), ("torch", torch.nn.utils.clip_grad_norm_)):
            params = [torch.nn.Parameter(torch.zeros_like(t)) for t in grads]
            for p, t in zip(params, grads):
                p.grad = t.clone()
            errors[side] = abs(float(clip_fn(params, 1.0, norm_type=norm_type)) - exact)
        if not errors["ckparity"] <= max(2.0**-23 * exact, 0.0 if own else 2 * errors["torch"]):
            failures.append(f"clip_grad_norm_ p={norm_type}: total norm {errors['ckparity']:.3g} from float64, "
                            f"torch's {errors['torch']:.3g}")
    return failures


def run(settings: dict, out_dir: Path | None = None) -> dict:
    """ckparity's AdamW against torch.optim.AdamW, both references: the
    single-tensor path (moments bit-identical, params within max_param_ulp
    ULPs: torch's MKL sqrt) and fused=True (params and moments bit-identical).
    A --backend adamw=NAME is held to the bar ``ckparity check`` sets a
    user's kernel instead (_user_optimizer_parity)."""
    if settings.get("ck_backends", {}).get("adamw"):
        return _user_optimizer_parity(settings, settings["ck_backends"]["adamw"])
    rows, failures = [], []
    g = torch.Generator().manual_seed(0)
    dtype = DTYPES[settings["dtype"]]
    # the chosen kernels that are no model op (slot None): the optimizer and the clip this gate runs
    exercised = [k for k in settings.get("ck_backends", {}) if kernels.KERNELS[k].slot is None]
    for size, amsgrad, which in ((s, a, w) for s in settings["sizes"] for a in (False, True) for w in REFERENCES):
        start = torch.randn(size, generator=g).to(dtype)
        p1, p2 = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
        kw = dict(lr=1e-3, weight_decay=0.01, **({"amsgrad": True} if amsgrad else {}))
        torch_optimizer, params_bitwise = REFERENCES[which]
        ours, ref = OPTIMIZERS[which]([p1], **kw), torch_optimizer([p2], **kw)
        for _ in range(settings["steps"]):
            grad = torch.randn(size, generator=g).to(dtype)
            p1.grad, p2.grad = grad.clone(), grad.clone()
            ours.step()
            ref.step()
        moments_equal = all(torch.equal(ours.state[p1][k], ref.state[p2][k])
                            for k in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ()))
        ulp, limit = max_ulp(p1, p2), 0 if params_bitwise else settings["max_param_ulp"]
        case = f"{'fused=True ' if which == 'ckparity_fused' else ''}size {size} amsgrad={amsgrad}"
        rows.append({"reference": "fused" if which == "ckparity_fused" else "single_tensor", "size": size,
                     "amsgrad": amsgrad, "moments_bit_identical": moments_equal,
                     "params_bit_identical": int((p1 == p2).sum()), "params": size, "max_param_ulp": ulp})
        if not moments_equal:
            failures.append(f"{case}: moments not bit-identical")
        if ulp > limit:
            failures.append(f"{case}: params {ulp} ULPs apart (limit {limit})")
    if dtype == torch.float32:  # the clip's claim is float32's (its bf16 form is accurate, not torch's bits)
        failures += _clip_failures(settings)
    counts = {ref: (sum(r["params_bit_identical"] for r in rows if r["reference"] == ref),
                    sum(r["params"] for r in rows if r["reference"] == ref)) for ref in ("single_tensor", "fused")}
    summary = (f"{settings['steps']} steps{'' if dtype == torch.float32 else ' in ' + settings['dtype']}: params "
               f"bit-identical {counts['single_tensor'][0]}/{counts['single_tensor'][1]} (single-tensor), "
               f"{counts['fused'][0]}/{counts['fused'][1]} (fused=True); moments "
               f"{'bit-identical' if not any('moments' in f for f in failures) else 'DIFFER'}")
    if failures:
        summary += f"; {failures[0]}"
    return result(not failures, summary, rows=rows, failures=failures, exercised=exercised)


def _clip_failures(settings: dict) -> list[str]:
    clip = settings.get("ck_backends", {}).get("clip_grad_norm", "c")
    return _grad_norm_failures(settings["sizes"], kernels.backends("clip_grad_norm")[clip], own=clip == "c")


def _user_optimizer_parity(settings: dict, name: str) -> dict:
    """A user's AdamW, called as the harness calls it (docs/plugins.md: no
    amsgrad), against torch's AdamW and float64 at the gate's sizes, held to
    the bar kernel_parity holds a user's kernel to (check/rule.py's gate
    column: less accurate than torch, nondeterministic, wrong or crashing
    fails), over the gate's ``steps``. Bit-identical moments and
    8 ULPs are ckparity's own kernel's claims, not a contract a correct AdamW
    must meet: a plain-C one
    whose multiply-adds torch's vectorized lerp fuses differs in the last
    bits and is as accurate (the example package's, tests/test_example_package.py)."""
    # in check's child where the backend can be carried there: a crash in its C is the verdict crashes
    report = check.run("adamw", name, adamw={"sizes": settings["sizes"], "steps": settings["steps"]},
                       dtype=settings["dtype"])
    rows = {r["property"]: r for r in report["properties"]}
    sizes = rows.get("sizes") or {"verdict": report["verdict"], "failures": [], "bit_identical": 0, "cases": 0,
                                  "max_ulp": None}
    failures = [f for r in rows.values() if not check.gate_passes(r["verdict"]) for f in (r["failures"] or
                                                                                            [r["verdict"]])]
    if not failures and not check.gate_passes(report["verdict"]):  # a child that ended before any row
        failures.append(f"check says {report['verdict']}: {report.get('crash', {}).get('ending')}")
    if settings["dtype"] == "float32":
        failures += _clip_failures(settings)
    summary = (f"{settings['steps']} steps of adamw={name}: {sizes['verdict']} ({sizes['bit_identical']}/"
               f"{sizes['cases']} sizes bit-identical, max {sizes['max_ulp']} ULP from torch)")
    if failures:
        summary += f"; {failures[0]}"
    exercised = ["adamw"] + (["clip_grad_norm"] if "clip_grad_norm" in settings["ck_backends"] else [])
    return result(not failures, summary, backend=name, sizes=sizes, failures=failures, exercised=exercised)


GATE = Gate(
    name="optimizer_parity", run=run,
    settings={"dtype": "float32", "steps": 100, "sizes": [1, 17, 1000, 65537], "max_param_ulp": 8},
    dtypes={"bfloat16": {"max_param_ulp": 0}},
    checks="C AdamW vs `torch.optim.AdamW(foreach=False)` and C `AdamW(fused=True)` vs torch's `fused=True`, for "
           "`steps` (100) on `sizes`, amsgrad off and on",
    passes="moments bit-identical; params within `max_param_ulp` (8) ULPs of the single-tensor path's (its MKL "
           "sqrt), bit-identical to the fused one's")
