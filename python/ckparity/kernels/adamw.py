"""adamw: torch.optim.AdamW's single-tensor step (backend c) and its
fused=True step (c_fused). An optimizer slot is
stepped, not differentiated: its backend is a factory (params, lr, betas,
eps, weight_decay) -> torch.optim.Optimizer keeping torch's state names."""

from __future__ import annotations

from functools import partial

import torch

from .. import reference
from ..optim import AdamW
from .. import _bindings as C
from .benching import Case, compiled_step
from .contract import expect, tensor_like
from .layouts import LayoutCase
from .record import WIDTHS, Claim, Conformance, Kernel
from .sweeping import Tally


def _contract(factory) -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(9, generator=g)), torch.nn.Parameter(torch.randn(2, 3, generator=g))]
    optimizer = factory(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    expect(isinstance(optimizer, torch.optim.Optimizer),
           f"the factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    optimizer.step()
    expect(all(not torch.equal(a, p.detach()) for a, p in zip(before, params)), "step() left a parameter unchanged")
    for p in params:
        state = optimizer.state.get(p, {})
        for name in ("step", "exp_avg", "exp_avg_sq"):
            expect(name in state, f"the optimizer keeps no state[{name!r}] (torch.optim.AdamW's names: step, "
                                  f"exp_avg, exp_avg_sq); the harness compares the moments under these names")
        for name in ("exp_avg", "exp_avg_sq"):
            tensor_like(state[name], p.shape, f"state[{name!r}]")
    saved = optimizer.state_dict()
    expect({"state", "param_groups"} <= set(saved), "state_dict() must hold 'state' and 'param_groups'")


def sweep(tally: Tally, g: torch.Generator) -> None:
    """Three steps of each optimizer from one state. params are compared where
    torch's sqrt of the second moment is correctly rounded (its MKL sqrt is
    not, for a fraction of a percent of inputs: the one known difference)."""
    settings = [dict(weight_decay=0.01), dict(weight_decay=0.0, amsgrad=True), dict(weight_decay=0.1, maximize=True)]
    for kwargs in settings:
        for n in WIDTHS:
            p0 = torch.randn(n, generator=g)
            ck_p, torch_p = p0.clone(), p0.clone()
            ck = AdamW([ck_p], lr=1e-2, **kwargs)
            ref = torch.optim.AdamW([torch_p], lr=1e-2, foreach=False, **kwargs)
            for step in range(1, 4):
                grad = torch.randn(n, generator=g) * 10 ** float(torch.randint(-4, 2, (), generator=g))
                ck_p.grad, torch_p.grad = grad.clone(), grad.clone()
                ck.step()
                ref.step()
                case = f"{kwargs} n={n} step={step}"
                ck_state, torch_state = ck.state[ck_p], ref.state[torch_p]
                for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                    if name in torch_state:
                        tally.add(name, case, ck_state[name], torch_state[name])
                v = torch_state["max_exp_avg_sq" if kwargs.get("amsgrad") else "exp_avg_sq"]
                exact = v.sqrt() == v.double().sqrt().float()
                tally.add("param (where torch's sqrt is exact)", case, ck_p.detach()[exact], torch_p.detach()[exact])
                torch_p.data.copy_(ck_p.data)  # each step from one shared state


def _sweep_every_bit(tally: Tally, g: torch.Generator, dtype: torch.dtype, fused: bool) -> None:
    """Three steps of each setting at every width on ``dtype`` params, ckparity's
    AdamW against torch's (fused=True, or its default single-tensor path), every
    param and moment compared."""
    settings = [dict(weight_decay=0.01), dict(weight_decay=0.0, amsgrad=True), dict(weight_decay=0.1, maximize=True)]
    ours_path, torch_path = (dict(fused=True), dict(fused=True)) if fused else ({}, dict(foreach=False))
    for kwargs in settings:
        for n in WIDTHS:
            p0 = torch.randn(n, generator=g).to(dtype)
            ck_p, torch_p = p0.clone(), p0.clone()
            ck = AdamW([ck_p], lr=1e-2, **ours_path, **kwargs)
            ref = torch.optim.AdamW([torch_p], lr=1e-2, **torch_path, **kwargs)
            for step in range(1, 4):
                grad = (torch.randn(n, generator=g) * 10 ** float(torch.randint(-4, 2, (), generator=g))).to(dtype)
                ck_p.grad, torch_p.grad = grad.clone(), grad.clone()
                ck.step()
                ref.step()
                case = f"{'fused ' if fused else ''}{kwargs} n={n} step={step}"
                for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                    if name in ref.state[torch_p]:
                        tally.add(name, case, ck.state[ck_p][name], ref.state[torch_p][name])
                tally.add("param", case, ck_p.detach(), torch_p.detach())


def sweep_bf16(tally: Tally, g: torch.Generator) -> None:
    """bfloat16 params, grads and moments against torch.optim.AdamW's default
    path on them, every param and moment (on bf16, torch's sqrt is ATen's own,
    correctly rounded: no exception)."""
    _sweep_every_bit(tally, g, torch.bfloat16, fused=False)


def sweep_fused(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """AdamW(fused=True) against torch.optim.AdamW(fused=True) on ``dtype``
    params, every param and moment (the fused kernel's sqrt is correctly
    rounded: no exception)."""
    _sweep_every_bit(tally, g, dtype, fused=True)


def probe_call(L, fill, p, g, m, v, amsgrad, fused=False):
    p, m, v = p.clone(), m.clone(), v.clone()  # the step writes over its inputs: no fill to show
    vmax = v.clone() if amsgrad else None
    options = C.adamw_options(1e-2, 0.9, 0.999, 1e-8, 0.1, amsgrad, fused=fused)
    step_fn = C.adamw_step_bf16 if p.dtype == torch.bfloat16 else C.adamw_step
    for step in range(1, 4):
        step_fn(p, g, m, v, vmax, float(step), options, library=L)
    return (p, m, v) + ((vmax,) if amsgrad else ())


def _probe(gen: torch.Generator):
    for n in (1003, 200003):  # one chunk, and several (threaded)
        pa, ga, ma = (torch.randn(n, generator=gen) for _ in range(3))
        va = torch.rand(n, generator=gen)
        for amsgrad in (False, True):
            yield f"adamw n={n} amsgrad={amsgrad}", lambda L, f, a=amsgrad, t=(pa, ga, ma, va): probe_call(L, f, *t, a)
        bf16 = tuple(t.bfloat16() for t in (pa, ga, ma, va))
        yield f"adamw bf16 n={n}", lambda L, f, t=bf16: probe_call(L, f, *t, True)
        for tensors, dtype in (((pa, ga, ma, va), "float32"), (bf16, "bf16")):
            yield (f"adamw fused {dtype} n={n}",
                   lambda L, f, t=tensors: probe_call(L, f, *t, True, fused=True))


def c_calls(n, gen, fused: bool = False, dtype: torch.dtype = torch.float32):
    """One C step alone (the single-tensor form, or fused=True's), on tensors made once."""
    p, grad, m, v = (torch.randn(n, generator=gen).to(dtype) for _ in range(4))
    v.abs_()
    options = C.adamw_options(1e-3, 0.9, 0.999, 1e-8, 1e-2, fused=fused)
    step = C.adamw_step_bf16 if dtype == torch.bfloat16 else C.adamw_step
    return lambda: step(p, grad, m, v, None, 10.0, options)


def _bench(gen: torch.Generator, select):
    for dtype, suffix in ((torch.float32, ""), (torch.bfloat16, " bf16")):
        for n, label in ((16 * 2**20, "16M"), (64 * 64, "tiny 4096")):
            versus_default, versus_fused = f"n={label} vs default{suffix}", f"n={label} vs fused{suffix}"
            if not (select("adamw", versus_default) or select("adamw", versus_fused)):
                continue
            params = {name: torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype))
                      for name in ("ck", "ck_fused", "torch", "fused", "compiled")}
            grad = torch.randn(n, generator=gen).to(dtype)
            for p in params.values():
                p.grad = grad.clone()
            ck, ck_fused = AdamW([params["ck"]]), AdamW([params["ck_fused"]], fused=True)
            ref = reference.adamw([params["torch"]])
            fused = torch.optim.AdamW([params["fused"]], fused=True)
            compiled = compiled_step(reference.adamw([params["compiled"]]))
            # reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq; each reference against
            # the C form that follows it
            nbytes = 7 * n * params["ck"].element_size()
            yield Case("adamw", versus_default, ck.step, ref.step, nbytes, c_calls(n, gen, dtype=dtype),
                       compiled=compiled)
            yield Case("adamw", versus_fused, ck_fused.step, fused.step, nbytes,
                       c_calls(n, gen, fused=True, dtype=dtype))


def _steps(factory, t: dict) -> dict:
    """Three steps of an AdamW on a parameter laid out as ``t["param"]``, with the gradient ``t["grad"]``:
    the parameter and its moments (a parameter's layout is its own: the state follows it)."""
    p = torch.nn.Parameter(t["param"].detach())
    optimizer = factory([p], lr=1e-2, weight_decay=0.01)
    for _ in range(3):
        p.grad = t["grad"]
        optimizer.step()
    state = optimizer.state[p]
    return {"param": p.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}


def _layout_cases(g):
    """The parameter and its gradient, each in every layout, both paths and amsgrad; torch's bits claimed
    for the moments (the parameter's bits only where torch's sqrt is exact, which a layout does not move).
    An expanded parameter is refused, as torch's single-tensor AdamW refuses it; torch's fused kernel
    writes each update into memory several elements share, which no order of the writes makes right."""
    for kwargs, theirs, claim in (({}, reference.adamw, "adamw"),
                                  ({"amsgrad": True}, partial(reference.adamw, amsgrad=True), "adamw"),
                                  ({"fused": True}, partial(torch.optim.AdamW, fused=True), "adamw.fused")):
        yield LayoutCase(f"param and grad (5, 6), {kwargs or 'single-tensor'}", partial(AdamW, **kwargs), theirs,
                         _steps, (),
                         {"param": torch.randn(5, 6, generator=g), "grad": torch.randn(5, 6, generator=g)},
                         claim=claim, claimed_outputs=("exp_avg", "exp_avg_sq"),
                         refuses=("param expanded rows", "param expanded last dim"))


KERNEL = Kernel(
    name="adamw",
    used_by=lambda config: config.optimizer == "adamw",  # sgd: both twins run torch's SGD
    exercise=("adamw", {"optimizer": "adamw"}),
    flag="ck_optimizer_backend",
    spellings=("optimizer",),
    optimizer=True,
    # c_fused: the CK twin's AdamW when the torch twin runs torch's fused=True (--torch-adamw fused)
    backends={"c": AdamW, "torch": reference.adamw, "c_fused": partial(AdamW, fused=True)},
    contract=_contract,
    # check's sizes: every tensor size 1..300 and large ones, and several of the C AdamW's
    # 65536-float chunks (65537)
    conformance=Conformance(make=None, call=None, differentiated=(), widths=WIDTHS + [65537]),
    claims=(Claim("adamw", ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param (where torch's sqrt is exact)"),
                  sweep),
            Claim("adamw", ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param"), sweep_bf16, dtype="bfloat16"),
            Claim("adamw.fused", ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param"), sweep_fused),
            Claim("adamw.fused", ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "param"),
                  partial(sweep_fused, dtype=torch.bfloat16), dtype="bfloat16")),
    not_claimed={"adamw param": "where torch's MKL sqrt is not correctly rounded (ckparity's sqrtf is)"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
)
