"""ckparity gate: the CI parity gates.

Each gate is a function of its settings (DEFAULTS, overridden per tier and by
--config gates.toml) that returns a result: passed, a one-line summary and the
details. `run_gates` writes reports/gates/<gate>_latest.json for each and a
Markdown summary. Tests plant faults through the settings (a backend name) or
by swapping an entry of a kernel record's gate_cases / OPTIMIZERS, and check that the gate fails
and says why."""

from __future__ import annotations

import copy
import os
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import ckparity

from . import check, cpu, kernels, reference
from ._tensors import DTYPES
from .check.properties import batch_invariance
from .harness.loop.config import RunConfig, UsageError, kernels_used
from .harness.longrun.interrupts import Interrupted, stop_on_signals
from .harness.studies.repro import PRESET
from .harness.loop.report import write_json, write_text
from .harness.loop.run import train
from .harness.twins.factory import build_twins
from .measure import RULES, differing_elements, max_ulp, nan_max, parity

GATE_NAMES = ["kernel_parity", "optimizer_parity", "fd_gradients", "replay_determinism", "drift_smoke",
              "long_horizon", "depth_sweep", "accuracy_parity", "noise_envelope", "distributed_parity"]

# Settings per gate; the "full" tier overrides some of them (TIERS).
DEFAULTS: dict[str, dict] = {
    "kernel_parity": {"dtype": "float32", "factor": RULES["default"][0], "floor_ulps": RULES["default"][1],
                      "ptref_factor": RULES["ptref"][0], "ptref_floor_ulps": RULES["ptref"][1],
                      # the records' claims that kernel_parity has cases of: held to torch's bits
                      "bitwise_kernels": [c.key for c in kernels.claims("float32")
                                          if any(c.key in k.gate_cases for k in kernels.KERNELS.values())]},
    "optimizer_parity": {"dtype": "float32", "steps": 100, "sizes": [1, 17, 1000, 65537], "max_param_ulp": 8},
    "fd_gradients": {"coordinates": 16, "step": 1e-6, "rtol": 1e-3, "atol": 2e-6, "models": ["tiny", "stacked"],
                     "ck_swiglu_backend": "c", "ck_rmsnorm_backend": "c", "ck_loss_backend": "c"},
    "replay_determinism": {"steps": 10, "threads": [1, 2], "ck_loss_backend": "c"},
    "drift_smoke": {"steps": 100, "grad_accum": 2, "models": ["tiny", "stacked"], "ck_loss_backend": "c",
                    "ck_optimizer_backend": "c"},
    "long_horizon": {"dtype": "float32", "steps": 150, "loss_backends": ["c", "c_ptref"], "ck_optimizer_backend": "c",
                     # loss backends whose runs must stay bit-identical to the torch twin (where the claims hold)
                     "bitwise_loss_backends": []},
    "depth_sweep": {"dtype": "float32", "depths": [1, 4], "steps": 10, "variants": ["bitwise", "c"],
                    "models": ["stacked", "llama"]},
    "accuracy_parity": {"steps": 30, "shadow_every": 5, "factor": 2.0, "grad_floor": 1e-9, "param_floor": 1e-9,
                        "loss_backends": ["c", "c_ptref"], "ck_optimizer_backend": "c"},
    "noise_envelope": {"dtype": "float32", "steps": 150, "members": 2, "ratio": 4.0,
                       "loss_backends": ["c", "c_ptref", "c_fused_linear"],
                       "ck_optimizer_backend": "c"},
    "distributed_parity": {"dtype": "float32", "world_sizes": [2], "steps": 5, "grad_accum": 4, "models": ["stacked"]},
}
TIERS = {"quick": {}, "full": {"long_horizon": {"steps": 850}, "fd_gradients": {"coordinates": 64},
                               "drift_smoke": {"steps": 300},
                               "depth_sweep": {"depths": [1, 2, 6, 12, 24], "steps": 100,
                                               "variants": ["bitwise", "c", "c_ptref", "torch"]},
                               "accuracy_parity": {"steps": 300, "shadow_every": 10},
                               "noise_envelope": {"steps": 850, "members": 4},
                               "distributed_parity": {"world_sizes": [2, 3], "steps": 100,
                                                      "models": ["tiny", "stacked"]}}}


# the gates that run in another dtype (gate --dtype), and what that dtype changes in their settings:
# bf16 holds the kernels with bf16 claims to torch's bf16 bits, ckparity's bf16 AdamW to torch's params
# bit for bit (its claim: no MKL sqrt in bf16's path), and the 850-step preset's ptref twin to every bit
DTYPE_GATES = [name for name, values in DEFAULTS.items() if "dtype" in values]
DTYPE_SETTINGS = {"bfloat16": {
    "kernel_parity": {"bitwise_kernels": [c.key for c in kernels.claims("bfloat16")
                                          if any(c.key in k.gate_cases for k in kernels.KERNELS.values())]},
    "optimizer_parity": {"max_param_ulp": 0},
    "long_horizon": {"bitwise_loss_backends": ["c_ptref"]},
    "noise_envelope": {"loss_backends": ["c", "c_ptref", "c_fused_linear"]}}}


def _result(passed: bool, summary: str, **details) -> dict:
    return {"passed": passed, "summary": summary, "details": details}


# ---- kernel_parity ----------------------------------------------------------

def gate_cases() -> dict[str, kernels.GateCase]:
    """name -> what kernel_parity checks, from every kernel's record; tests swap an entry
    of a record's gate_cases to plant a fault."""
    return {name: case for k in kernels.KERNELS.values() for name, case in k.gate_cases.items()}


def _fwd_bwd(fn, inputs, kwargs, dtype, weight_index: int | None = None):
    """Output and the gradient of its (random-weighted) sum w.r.t. inputs[0]
    and inputs[weight_index]. inputs[0] keeps its strides (a view stays a view)."""
    leaf = inputs[0].detach().to(dtype).requires_grad_(True)
    rest = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs[1:]]
    weight = None
    if weight_index is not None:
        weight = rest[weight_index - 1].detach().requires_grad_(True)
        rest[weight_index - 1] = weight
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    out = fn(leaf, *rest, **kw)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(upstream)
    grads = {"out": out.detach(), "grad": leaf.grad}
    if weight is not None:
        grads["dweight"] = weight.grad
    return grads



def _compare_self_check() -> list[str]:
    """The harness's own measure (ckp_compare, through ckparity.measure's users)
    against the same figures by torch (each difference exact, rounded once to float), on tails of every length
    1..40, a long odd size, and NaN/inf on one side or both: a comparison that
    misses a tail or a lone NaN would make every gate that reads it blind."""
    from . import _bindings

    failures, g = [], torch.Generator().manual_seed(5)
    sizes = list(range(1, 41)) + [4099, 70001]
    for n in sizes:
        a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        b[: n // 2] = a[: n // 2]
        if n % 3 == 0:
            b[-1] = float("nan")
        if n % 5 == 0:
            a[-1] = b[-1] = float("inf")
        max_diff, max_b, differing = _bindings.compare(a, b)
        both_nan = a.isnan() & b.isnan()
        differs = (a != b) & ~both_nan
        diff = (a.double() - b.double()).abs().float()[differs]  # the exact difference rounded once (compare.c)
        expected_diff = float("nan") if bool(diff.isnan().any()) else float(diff.max()) if diff.numel() else 0.0
        expected_b = float("nan") if bool(b.isnan().any()) else float(b.abs().max())
        same = lambda x, y: (x != x and y != y) or x == y  # noqa: E731
        if int(differs.sum()) != differing or not same(max_diff, expected_diff) or not same(max_b, expected_b):
            failures.append(f"compare (the harness's measure), n={n}: ({max_diff}, {max_b}, {differing}) "
                            f"where float64 says ({expected_diff}, {expected_b}, {int(differs.sum())})")
    return failures


def _vocab_parallel_failures(factor: float, floor: float) -> list[str]:
    """The vocab-parallel passes (what --tp ranks run), over 1..3 shards in one
    process, against torch's cross-entropy with smoothing and z-loss: loss rows
    and dlogits held to the default rule, like the single-process kernel."""
    from . import _native
    from .kernels.cross_entropy import vocab_parallel_ce

    g = torch.Generator().manual_seed(4)
    failures = []
    # peaked rows, and flat rows over a wide vocabulary (every exp counts in the sum: a float
    # accumulator over 50257 of them is far from float64)
    for N, V, scale in ((37, 1003, 4.0), (8, 50257, 0.5)):
        x = torch.randn(N, V, generator=g) * scale
        t = torch.randint(0, V, (N,), generator=g)
        t[::5] = -100

        def rows(z, t=t):  # vocab_parallel_ce's smoothing 0.1 and z-loss 1e-4, per row; grads of their mean
            z = z.detach().requires_grad_()
            loss = (F.cross_entropy(z, t, reduction="none", label_smoothing=0.1)
                    + 1e-4 * torch.logsumexp(z, -1) ** 2 * (t != -100))
            (loss.sum() / len(t)).backward()
            return loss.detach(), z.grad

        (torch_loss, torch_grad), (exact_loss, exact_grad) = rows(x), rows(x.double())
        for shards in (1, 2, 3):
            out = vocab_parallel_ce(_native.lib, float("nan"), x, t, shards)
            loss, grad = out[2], torch.cat(out[3:], dim=1)
            for part, ours, theirs, exact in (("loss", loss, torch_loss, exact_loss),
                                              ("grad", grad, torch_grad, exact_grad)):
                fig = parity(f"vocab_parallel.{part}[V={V},shards={shards}]", ours, theirs, exact, factor, floor)
                if not fig["ok"]:
                    failures.append(f"{fig['name']}: {fig['reason']}")
    return failures


def _rounded(inputs, kwargs, dtype):
    """A case's floating inputs rounded to ``dtype`` and widened back: the values the
    float64 reference evaluates, so that it is exact arithmetic on what both sides got."""
    def r(v):
        return v.to(dtype).float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
    return [r(a) for a in inputs], {k: r(v) for k, v in kwargs.items()}


def kernel_parity(settings: dict) -> dict:
    """Every kernel's gate cases in the gate's dtype against torch in it and
    float64: the accuracy rule (measure.parity, the dtype's tolerances and
    ULP), and torch's bits for the kernels whose claims hold here. In bf16 a
    case whose options a bf16 kernel does not take (a TypeError: ptref's
    float32 probability targets) is counted apart as not in bf16; the
    float32-only checks (vocab-parallel CE, the harness's compare) run in float32's tier."""
    checks, failures, not_in_dtype = [], [], []
    dtype = DTYPES[settings["dtype"]]
    # held to torch's bits: the bitwise kernels whose claims hold at this capability (kernels.bit_identical)
    bitwise = [k for k in settings["bitwise_kernels"] if k in kernels.bit_identical(settings["dtype"])]
    for name, probe in gate_cases().items():
        prefix = "" if probe.rule == "default" else f"{probe.rule}_"
        factor, floor = settings[f"{prefix}factor"], settings[f"{prefix}floor_ulps"]
        for label, inputs, kwargs in probe.cases():
            try:
                a = _fwd_bwd(probe.ours, inputs, kwargs, dtype, probe.weight)
            except TypeError as err:
                if dtype == torch.float32:
                    raise
                not_in_dtype.append(f"{name}[{label}]: {err}")
                continue
            b = _fwd_bwd(probe.theirs, inputs, kwargs, dtype, probe.weight)
            r = _fwd_bwd(probe.theirs, *_rounded(inputs, kwargs, dtype), torch.float64, probe.weight)
            for part in a:
                fig = parity(f"{name}.{part}[{label}]", a[part], b[part], r[part], factor, floor)
                if name in bitwise:
                    # a kernel that claims torch's bits is held to them: a reordered sum or another exp
                    # stays within the accuracy rule, but not within this (ckparity mutate's finding)
                    differ = differing_elements(a[part], b[part])
                    fig["bitwise_differing"] = differ
                    if differ and fig["ok"]:
                        fig.update(ok=False, reason=f"{differ} of {a[part].numel()} elements differ from torch's "
                                                    "bits (a bitwise kernel)")
                checks.append(fig)
                if not fig["ok"]:
                    failures.append(f"{fig['name']}: {fig['reason']}")
    if dtype == torch.float32:
        failures += _vocab_parallel_failures(settings["factor"], settings["floor_ulps"])
        failures += _compare_self_check()
    batch = batch_invariance_rows(dtype)
    failures += [f"{r['kernel']} backend {r['backend']!r}: {r['failures'][0]}" for r in batch
                 if r["verdict"] != "bitwise"]
    conformance = _user_backend_checks(settings.get("ck_backends", {}), settings["dtype"])
    failures += [f"{r['kernel']} backend {r['backend']!r}: check says {r['verdict']}" for r in conformance
                 if not r["passed"]]
    worst = max(checks, key=lambda f: f["max_ulp"])
    in_dtype = "" if dtype == torch.float32 else f" in {settings['dtype']} ({len(not_in_dtype)} cases not in it)"
    summary = (f"{len(checks)} checks{in_dtype}, {len(failures)} failed" + (f"; first: {failures[0]}" if failures else
               f"; max {worst['max_ulp']} ULP from torch ({worst['name']})"))
    return _result(not failures, summary, checks=checks, failures=failures, capability=cpu.capability(),
                   held_bitwise=bitwise, user_backends=conformance, not_in_dtype=not_in_dtype, batch_invariance=batch,
                   exercised=[r["kernel"] for r in conformance])


def batch_invariance_rows(dtype: torch.dtype) -> list[dict]:
    """check's batch_invariance on each of ckparity's own backends of a slot
    with rows (rms_norm, swiglu, cross_entropy): a row's bits may not depend
    on its batch, except where they follow torch's own variance."""
    rows = []
    for name in check.covered():
        record = kernels.KERNELS[name]
        if record.optimizer:
            continue
        for backend in (b for b in record.builtin if b != "torch"):
            prop = batch_invariance(record.conformance, record.backends[backend],
                                                     record.backends["torch"], torch.Generator().manual_seed(0), dtype)
            if prop.cases:
                rows.append({"kernel": name, "backend": backend, **prop.report()})
    return rows


def _user_backend_checks(ck_backends: dict[str, str], dtype: str = "float32") -> list[dict]:
    """``ckparity check`` on each --backend of a slot it covers (in its child
    process where the backend can be carried there), held to the pass rule's
    gate column (check/rule.py: ``passed`` is the gate's verdict on it, not
    check's exit code); ckparity's own kernels are held above."""
    rows = []
    for kernel, name in ck_backends.items():
        if kernel in check.covered() and not kernels.KERNELS[kernel].optimizer:  # adamw: optimizer_parity's
            report = check.run(kernel, name, dtype=dtype)
            rows.append({"kernel": report["kernel"], "backend": name, "verdict": report["verdict"],
                         "passed": check.gate_passes(report["verdict"]), "seconds": report["seconds"],
                         "failing": {r["property"]: r["failing"] for r in report["properties"] if r["failing"]},
                         "worst": next((r["failures"][0] for r in report["properties"] if r["failures"]), None)})
    return rows


# ---- optimizer_parity -------------------------------------------------------

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


def optimizer_parity(settings: dict) -> dict:
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
    exercised = [k for k in ("adamw", "clip_grad_norm") if k in settings.get("ck_backends", {})]
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
    return _result(not failures, summary, rows=rows, failures=failures, exercised=exercised)


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
    return _result(not failures, summary, backend=name, sizes=sizes, failures=failures, exercised=exercised)


# ---- fd_gradients -----------------------------------------------------------

# the gates' short runs
SHORT_RUN = RunConfig(no_progress=True, total_tokens=4096, grad_accum=2)


def fd_gradients(settings: dict) -> dict:
    """The CK twin's float32 gradients against float64 central differences of
    the same loss (the model in float64 with torch ops), on random coordinates
    of every parameter tensor."""
    failures, rows, exercised = [], [], set()
    g = torch.Generator().manual_seed(0)
    chosen = settings.get("ck_backends", {})
    # a chosen rope needs the model that calls it; the optimizer and the clip take no part in gradients
    for model in settings["models"] + (["llama"] if "rope" in chosen and "llama" not in settings["models"] else []):
        config = with_backends(replace(SHORT_RUN, model=model, ck_swiglu_backend=settings["ck_swiglu_backend"],
                                       ck_rmsnorm_backend=settings["ck_rmsnorm_backend"],
                                       ck_loss_backend=settings["ck_loss_backend"]), settings)
        exercised |= kernels_used(config) - {"adamw", "clip_grad_norm"}
        ck, ref = build_twins(config)
        tokens = torch.randint(0, config.vocab, (config.seq_len,), generator=g)
        targets = torch.randint(0, config.vocab, (config.seq_len,), generator=g)
        ck.model.zero_grad(set_to_none=True)
        ck.micro_step(tokens, targets, 1.0)
        exact = copy.deepcopy(ref.model).double()

        def loss64():
            with torch.no_grad():
                return float(exact.ops.loss(exact(tokens)["logits"], targets))

        params64 = dict(exact.named_parameters())
        for name, p in ck.model.named_parameters():
            flat64 = params64[name].data.view(-1)
            picks = torch.randint(0, flat64.numel(), (settings["coordinates"],), generator=g)
            if name == "embedding.weight":  # only the rows of tokens in the batch have a gradient
                row = tokens[torch.randint(0, tokens.numel(), (settings["coordinates"],), generator=g)]
                picks = row * p.shape[1] + picks % p.shape[1]
            worst = 0.0
            for k in picks.tolist():
                saved = float(flat64[k])
                flat64[k] = saved + settings["step"]
                up = loss64()
                flat64[k] = saved - settings["step"]
                down = loss64()
                flat64[k] = saved
                fd = (up - down) / (2 * settings["step"])
                analytic = float(p.grad.view(-1)[k])
                err = abs(analytic - fd)
                worst = nan_max([worst, err / (settings["atol"] + settings["rtol"] * abs(fd))])
                if not err <= settings["atol"] + settings["rtol"] * abs(fd):  # NaN fails
                    failures.append(f"{model} {name}[{k}]: grad {analytic:.6g} vs finite difference {fd:.6g}")
            rows.append({"model": model, "tensor": name, "coordinates": len(picks), "worst_error_over_tol": worst})
    summary = (f"{sum(r['coordinates'] for r in rows)} coordinates over {len(rows)} tensors, "
               f"{len(failures)} over tolerance" + (f"; first: {failures[0]}" if failures else ""))
    return _result(not failures, summary, rows=rows, failures=failures[:50],
                   exercised=sorted(exercised & set(chosen)))


# ---- replay_determinism, drift_smoke, long_horizon --------------------------

def _series_without_timing(report: dict) -> dict:
    return {k: v for k, v in report["series"].items() if not k.endswith("_ms")}


# replay_determinism's run: wide enough that every C kernel of the step crosses
# its OpenMP threshold (cross_entropy N*V >= 16384, rms_norm and swiglu N*D >= 32768,
# AdamW more than one 65536-float chunk, compare n >= 65536), so a second thread
# count really runs threaded C -- at SHORT_RUN's sizes it would not.
REPLAY_RUN = replace(SHORT_RUN, model="stacked", vocab=2048, d_model=256, hidden=512, seq_len=128,
                     total_tokens=65536)


def replay_determinism(settings: dict, out_dir: Path) -> dict:
    """The same run twice, and at each of ckparity's thread counts: identical
    series, bit for bit; a run that errors fails the gate (three runs that fail
    alike are not "identical"). torch's threads stay at the first count in every
    run: what varies is what ckparity owns. torch's own GEMMs (the twins'
    linears) are not thread-count invariant on every CPU -- MKL's AVX-512 sgemm
    splits K between 2 threads on an Intel Xeon, not on an AMD Zen 4
    (MKL_CBWR=AUTO,STRICT makes them agree) -- and ckparity's rms_norm and ptref
    follow torch's thread count by design (its split of long sums)."""
    runs, threads_used, failures, exercised = {}, {}, [], set()
    saved = (ckparity.get_num_threads(), torch.get_num_threads())
    try:
        for label, threads in [("first", settings["threads"][0]), ("again", settings["threads"][0])] + \
                [(f"threads={t}", t) for t in settings["threads"][1:]]:
            config = replace(REPLAY_RUN, max_steps=settings["steps"], threads=threads,
                             torch_threads=settings["threads"][0], ck_loss_backend=settings["ck_loss_backend"],
                             json_out=str(out_dir / f"replay_determinism_{label.replace('=', '')}.json"))
            exercised |= kernels_used(config)
            report = _train_in_gate(config, settings)
            if report["status"] not in ("pass", "fail"):
                failures.append(f"{label}: {report['status']}: {report.get('error')}")
            elif report["first_nonfinite_step"] is not None:  # NaN series repeat as "identical" strings
                failures.append(f"{label}: non-finite from step {report['first_nonfinite_step']}")
            threads_used[label] = report["env"].get("ckparity_threads")
            runs[label] = _series_without_timing(report)
    finally:
        ckparity.set_num_threads(saved[0])
        torch.set_num_threads(saved[1])
    base = runs["first"]
    differing = {label: sorted(k for k in base if base[k] != s[k]) for label, s in runs.items() if s != base}
    failures += [f"{label} differs in {', '.join(keys[:3])}" for label, keys in differing.items()]
    summary = (f"{len(runs)} runs of {settings['steps']} steps (C threads {sorted(set(threads_used.values()))}, "
               f"torch threads {settings['threads'][0]}): "
               + ("identical" if not failures else "; ".join(failures)))
    return _result(not failures, summary, runs=list(runs), differing=differing, threads_used=threads_used,
                   failures=failures, exercised=sorted(exercised & set(settings.get("ck_backends", {}))))


def with_backends(config: RunConfig, settings: dict) -> RunConfig:
    """config with those of ``gate --backend SLOT=NAME``'s backends
    (settings["ck_backends"]) that its CK twin calls (kernels_used): a
    backend of a kernel the run does not call is not forced on it."""
    flags = {kernel: flag for flag, kernel in kernels.FLAGS.items()}
    used = kernels_used(config)
    return replace(config, **{flags[kernel]: name for kernel, name in settings.get("ck_backends", {}).items()
                              if kernel in used})



def gate_runs(runs: dict[str, RunConfig], settings: dict) -> dict[str, RunConfig]:
    """A harness gate's runs with gate --backend's backends: each run with the
    ones it calls, labelled with them (``tiny+swiglu=mine``; a run that
    would repeat another is run once), and for a chosen kernel no run calls,
    the first run changed to call it (its record's ``exercise``: ``+llama`` for
    rope, one rank for the loss under --tp) -- or, where that is not a valid run,
    nothing: the gate's ``exercised`` then lacks it and its summary says so."""
    chosen = settings.get("ck_backends", {})
    if not chosen:
        return runs
    out: dict[str, RunConfig] = {}
    for label, config in runs.items():
        config = with_backends(config, settings)
        applied = [f"{k}={n}" for k, n in chosen.items() if k in kernels_used(config) and n != label]
        out["+".join([label, *applied])] = config
    first_label, first = next(iter(runs.items()))
    for kernel in chosen:
        if any(kernel in kernels_used(c) for c in out.values()):
            continue
        if kernels.KERNELS[kernel].exercise is None:
            continue
        name, change = kernels.KERNELS[kernel].exercise
        try:
            config = with_backends(replace(first, **change), settings)
        except UsageError:  # not a valid run of this gate: reported as not exercised
            continue
        applied = [f"{k}={n}" for k, n in chosen.items() if k in kernels_used(config)]
        out["+".join([first_label, name, *applied])] = config
    return out


def _train_in_gate(config: RunConfig, settings: dict) -> dict:
    """train() (or, for --tp/--dp, the launcher) with the gate's backends, and
    a signal that stopped it stopping the gates too. A run with a user's
    backend (gate --backend) trains in a process of its own where the backend
    can be carried there (kernels.carried): a crash in its C is that run's
    error, not the end of the gates."""
    from .harness.loop.child import carry_for, train_in_child
    from .harness.ranks.launch import launch

    config = with_backends(config, settings)
    carry = carry_for(config) if settings.get("ck_backends") else None
    if config.tp * config.dp > 1:
        report = launch(config)
    else:
        report = train_in_child(config, carry) if carry is not None else train(config)
    if report["status"] == "interrupted":
        raise Interrupted(report["stopped_by_signal"])
    return report


def _harness_gate(runs: dict[str, RunConfig], out_dir: Path, gate: str, settings: dict,
                  bitwise: set[str] = frozenset()) -> dict:
    """The runs, each to pass parity; the runs labelled in ``bitwise`` to stay
    bit-identical to the torch twin too (their first divergence, if any, fails)."""
    rows, failures = [], []
    runs = gate_runs(runs, settings)
    for label, config in runs.items():
        path = out_dir / f"{gate}_{label}.json"
        report = _train_in_gate(replace(config, no_progress=True, json_out=str(path)), settings)
        row = {key: report[key] for key in ("status", "steps", "first_loss_fail_step", "first_param_fail_step",
                                            "max_loss_abs_diff", "max_param_abs_diff")}
        row["run"], row["report"] = label, str(path)
        rows.append(row)
        ranks = report.get("ranks") or {}
        if report.get("error"):
            failures.append(f"{label}: {report['status']}: {report['error']}")
        elif ranks.get("replicated_params_identical") is False:
            failures.append(f"{label}: replicated params differ between ranks from step "
                            f"{ranks['first_rank_mismatch_step']}")
        elif not report["pass_parity"]:
            loc = report["localization"] or {}
            where = loc.get("first_forward_stage") or loc.get("first_backward_stage") or loc.get("first_param_tensor")
            failures.append(f"{label}: {report['status']} (loss fails at {report['first_loss_fail_step']}, "
                            f"params at {report['first_param_fail_step']}; localized to {where})")
        elif label in bitwise and report["divergence"]["first_step"] is not None:
            d = report["divergence"]
            failures.append(f"{label}: not bit-identical to the torch twin from step {d['first_step']} (first "
                            f"differing: {d['stage']}, {d['tensor']}; max ULP diff {report['max_ulp_diff']})")
        row["bitwise"] = report["divergence"]["first_step"] is None if report.get("divergence") else None
    # a failed run may have no figures (None): its summary is the failure
    summary = failures[0] if failures else "; ".join(
        f"{r['run']}: {r['status']}, max |loss diff| {r['max_loss_abs_diff']:.2g}, "
        f"max |param diff| {r['max_param_abs_diff']:.2g}" for r in rows)
    return _result(not failures, summary, runs=rows, failures=failures, exercised=_exercised(runs, settings))


def _exercised(runs: dict[str, RunConfig], settings: dict) -> list[str]:
    """The chosen kernels (gate --backend) that a run of the gate called."""
    used = set().union(*(kernels_used(c) for c in runs.values()))
    return sorted(used & set(settings.get("ck_backends", {})))


def drift_smoke(settings: dict, out_dir: Path) -> dict:
    runs = {model: RunConfig(model=model, num_layers=2, max_steps=settings["steps"], grad_accum=settings["grad_accum"],
                             ck_loss_backend=settings["ck_loss_backend"],
                             ck_optimizer_backend=settings["ck_optimizer_backend"])
            for model in settings["models"]}
    return _harness_gate(runs, out_dir, "drift_smoke", settings)


def long_horizon(settings: dict, out_dir: Path) -> dict:
    """The 850-step preset (its first ``steps``) in the gate's dtype under
    each loss backend: every run passes parity, and the runs of
    ``bitwise_loss_backends`` (bf16: ptref, whose twin is bit for bit
    torch's) stay bit-identical where the claims hold at this capability."""
    runs = {b: replace(PRESET, ck_loss_backend=b, max_steps=settings["steps"], dtype=settings["dtype"],
                       ck_optimizer_backend=settings["ck_optimizer_backend"])
            for b in settings["loss_backends"]}
    bitwise = set(settings["bitwise_loss_backends"]) if cpu.matched() and not settings.get("ck_backends") else set()
    return _harness_gate(runs, out_dir, "long_horizon", settings, bitwise)


def depth_sweep(settings: dict, out_dir: Path) -> dict:
    """Residual twins of growing depth: the "bitwise" variant (every kernel
    bit-identical) must stay bit-identical at every depth, and every variant
    must pass parity. Under ``gate --backend``, one variant instead: the CK
    twin with those backends (ckparity's own elsewhere), held to parity at
    every depth -- a user's kernels are not claimed bit-identical."""
    from .harness.studies.repro import DEPTH, DEPTH_VARIANTS
    from .harness.studies.repro import depth_sweep as sweep

    variants = {name: DEPTH_VARIANTS[name] for name in settings["variants"]}
    preset = replace(DEPTH, max_steps=settings["steps"], no_progress=True, dtype=settings["dtype"])
    rows, exercised = [], set()
    for model in settings["models"]:
        if settings.get("ck_backends"):  # the backends each model calls (rope: llama's only)
            chosen = with_backends(replace(preset, model=model), settings)
            exercised |= kernels_used(chosen)
            variants = {"backends": {flag: getattr(chosen, flag) for flag in kernels.FLAGS
                                     if getattr(chosen, flag) != getattr(preset, flag)}}
        rows += sweep(str(out_dir), preset, settings["depths"], variants, [model])[0]
    if any(r["status"] == "interrupted" for r in rows):
        raise Interrupted(2)
    # the bitwise variant is held to bits where its kernels are bit-identical at this capability
    held = {"rms_norm", "swiglu", "rope"} <= set(kernels.bit_identical(settings["dtype"]))
    failures = [f"L={r['layers']} {r['variant']}: not bit-identical (first divergence at {r['first_divergence_stage']})"
                for r in rows if held and r["variant"] == "bitwise" and not r["bitwise"]]
    failures += [f"L={r['layers']} {r['variant']}: {r['status']} (params fail at {r['first_param_fail_step']})"
                 for r in rows if r["status"] != "pass"]
    if failures:
        summary = failures[0]
    elif any(r["variant"] == "bitwise" for r in rows):
        summary = (f"{len(rows)} runs at L={settings['depths']}: all pass, bitwise variant "
                   + ("bit-identical at every depth" if held else "not held to bits (the library and torch run at "
                      "other CPU capabilities)"))
    else:  # gate --backend: the user's kernels are held to parity, not claimed bit-identical
        summary = (f"{len(rows)} runs at L={settings['depths']} with "
                   f"{', '.join(f'{k}={n}' for k, n in settings['ck_backends'].items())}: all pass parity "
                   "(not held to bits)")
    return _result(not failures, summary, rows=rows, failures=failures,
                   exercised=sorted(exercised & set(settings.get("ck_backends", {}))))


def accuracy_parity(settings: dict, out_dir: Path) -> dict:
    """Who is closer to exact arithmetic, step by step: the stress profile with
    the float64 shadow; at every probe (one step from the torch twin's state)
    the CK twin's gradient and parameter errors against float64 must be at
    most ``factor`` times the torch twin's plus a floor. A kernel more accurate
    than torch's passes; one that is merely different from torch does too,
    as long as it is not less accurate."""
    from .harness.studies.repro import STRESS

    failures, rows = [], []
    runs = gate_runs({b: replace(STRESS, max_steps=settings["steps"], f64_shadow=True,
                                 shadow_every=settings["shadow_every"], ck_loss_backend=b,
                                 ck_optimizer_backend=settings["ck_optimizer_backend"], no_progress=True)
                      for b in settings["loss_backends"]}, settings)
    for backend, config in runs.items():
        config = replace(config, json_out=str(out_dir / f"accuracy_parity_{backend}.json"))
        report = _train_in_gate(config, settings)
        if report["status"] == "error" or not report.get("shadow"):
            failures.append(f"loss {backend}: the run {report['status']}: {report.get('error')}")
            continue
        probes = report["shadow"]["probes"]
        if not probes["step"]:
            failures.append(f"loss {backend}: no probe was measured (the run stopped at step {report['steps']})")
            continue
        for kind in ("grad", "param"):
            ck, ref = probes[f"ck_local_{kind}_error"], probes[f"torch_local_{kind}_error"]
            rows.append({"loss_backend": backend, "quantity": kind, "probes": len(ck),
                         "max_ck_error": nan_max(ck), "max_torch_error": nan_max(ref)})
            for step, c, t in zip(probes["step"], ck, ref):
                # written so that NaN fails: NaN <= anything is False
                if not c <= settings["factor"] * t + settings[f"{kind}_floor"]:
                    failures.append(f"loss {backend}, step {step}: CK {kind} error {c:.3g} > "
                                    f"{settings['factor']}x torch's {t:.3g}")
                    break
    summary = failures[0] if failures else "; ".join(
        f"{r['loss_backend']} {r['quantity']}: CK {r['max_ck_error']:.2g} vs torch {r['max_torch_error']:.2g}"
        for r in rows)
    return _result(not failures, summary, rows=rows, failures=failures, exercised=_exercised(runs, settings))


def noise_envelope(settings: dict, out_dir: Path) -> dict:
    """Float noise or a bug: the 850-step repro with --envelope (harness/observers/envelope.py);
    each loss backend's drift must stay within ``ratio`` times the envelope of
    null twins that carry the CK kernels' own differences with random,
    fixed signs, and no kernel's error may lean one way more than torch's
    (harness/observers/envelope.py; README "Noise or bug" for what it detects and what
    it does not)."""
    rows, failures = [], []
    runs = gate_runs({b: replace(PRESET, ck_loss_backend=b, max_steps=settings["steps"], envelope=settings["members"],
                                 dtype=settings["dtype"],
                                 envelope_ratio=settings["ratio"], ck_optimizer_backend=settings["ck_optimizer_backend"],
                                 no_progress=True) for b in settings["loss_backends"]}, settings)
    for backend, config in runs.items():
        config = replace(config, json_out=str(out_dir / f"noise_envelope_{backend}.json"))
        report = _train_in_gate(config, settings)
        if report.get("error"):
            failures.append(f"{backend}: {report['status']}: {report['error']}")
            continue
        if report["first_nonfinite_step"] is not None:
            failures.append(f"{backend}: non-finite from step {report['first_nonfinite_step']}")
            continue
        envelope = report["envelope"]
        rows.append({"loss_backend": backend, "verdict": envelope["verdict"],
                     "first_beyond_step": envelope["first_beyond_step"], "directed": envelope["directed"],
                     "max_noise_ratio": envelope["max_noise_ratio"]})
        if envelope["first_beyond_step"] is not None:
            failures.append(f"{backend}: drift beyond {settings['ratio']}x the noise envelope from step "
                            f"{envelope['first_beyond_step']} (max ratio {envelope['max_noise_ratio']})")
        if envelope["directed"]:
            failures.append(f"{backend}: the error of {', '.join(envelope['directed'])} leans one way more than "
                            f"torch's (null_model.measured.*.lean)")
    summary = failures[0] if failures else "; ".join(
        f"{r['loss_backend']}: within noise (max ratio loss {r['max_noise_ratio']['loss']:.2f}, "
        f"param {r['max_noise_ratio']['param']:.2f})" for r in rows)
    return _result(not failures, summary, rows=rows, failures=failures, exercised=_exercised(runs, settings))


def distributed_parity(settings: dict, out_dir: Path) -> dict:
    """The CK twin split over ranks (gloo, processes on this machine) against
    the single-process torch twin, in the gate's dtype: --tp W (lm_head and
    loss by vocabulary) and --dp W (micro-batches, summed gradients) must pass
    parity, and the ranks' replicated parameters must stay bit-identical to
    each other."""
    runs = {f"{model}_{kind}{w}": RunConfig(model=model, max_steps=settings["steps"], grad_accum=settings["grad_accum"],
                                            dtype=settings["dtype"], **({"num_layers": 2} if model != "tiny" else {}),
                                            **{kind: w})
            for model in settings["models"] for w in settings["world_sizes"] for kind in ("tp", "dp")}
    return _harness_gate(runs, out_dir, "distributed_parity", settings)


GATES: dict[str, Callable] = {
    "kernel_parity": lambda s, out: kernel_parity(s),
    "optimizer_parity": lambda s, out: optimizer_parity(s),
    "fd_gradients": lambda s, out: fd_gradients(s),
    "replay_determinism": replay_determinism,
    "drift_smoke": drift_smoke,
    "long_horizon": long_horizon,
    "depth_sweep": depth_sweep,
    "accuracy_parity": accuracy_parity,
    "noise_envelope": noise_envelope,
    "distributed_parity": distributed_parity,
}


# ---- running the suite ------------------------------------------------------

def settings_for(tier: str, config_path: str | None = None, dtype: str = "float32") -> dict[str, dict]:
    """DEFAULTS, then the tier's overrides, then the dtype's (DTYPE_GATES
    run in it), then the config file's."""
    settings = copy.deepcopy(DEFAULTS)
    for gate, values in TIERS[tier].items():
        settings[gate].update(values)
    if dtype != "float32":
        for gate in DTYPE_GATES:
            settings[gate].update(dtype=dtype, **DTYPE_SETTINGS[dtype].get(gate, {}))
    if config_path:
        try:
            overrides = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"cannot read --config {config_path}: {err}") from None
        for gate, values in overrides.items():
            if gate not in settings or not isinstance(values, dict):
                raise ValueError(f"--config {config_path}: unknown gate [{gate}] (gates: {', '.join(GATE_NAMES)})")
            unknown = set(values) - set(settings[gate])
            if unknown:
                raise ValueError(f"--config {config_path}: [{gate}] has unknown keys {sorted(unknown)} "
                                 f"(known: {sorted(settings[gate])})")
            for key, value in values.items():  # a value of the setting's own kind (an int where a float is, too)
                default = settings[gate][key]
                kinds = (int, float) if isinstance(default, float) else (type(default),)
                if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, kinds):
                    raise ValueError(f"--config {config_path}: [{gate}] {key} = {value!r} is a "
                                     f"{type(value).__name__}, the setting takes a {type(default).__name__} "
                                     f"(default {default!r})")
            settings[gate].update(values)
    for gate in DTYPE_GATES:
        if settings[gate]["dtype"] not in DTYPES:
            raise ValueError(f"[{gate}] dtype must be \"float32\" or \"bfloat16\", got {settings[gate]['dtype']!r}")
    return settings


def settings_with_backends(settings: dict, ck_backends: dict[str, str]) -> dict:
    """A gate's settings with gate --backend's backends in them, as they run:
    ``ck_backends``, each backend flag the settings name set to the chosen
    one, and ``loss_backends`` the chosen loss alone (the gate's runs of
    ckparity's own loss variants would all be the user's loss: one run, not
    three copies)."""
    settings = dict(settings, ck_backends=dict(ck_backends))
    flags = {kernel: flag for flag, kernel in kernels.FLAGS.items()}
    for kernel, name in ck_backends.items():
        if flags[kernel] in settings:
            settings[flags[kernel]] = name
        if kernel == "cross_entropy" and "loss_backends" in settings:
            settings["loss_backends"] = [name]
    return settings


def run_gates(names: list[str], settings: dict[str, dict], out_dir: Path, tier: str,
              echo: Callable[[str], None] = print, ck_backends: dict[str, str] | None = None,
              fail_fast: bool = False) -> list[dict]:
    """Runs the gates ``names`` in that order; ``ck_backends`` (slot -> backend
    name, from ``gate --backend``) puts a registered backend in every gate's
    CK side; ``fail_fast`` stops after the first gate that fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if ck_backends:
            settings[name] = settings_with_backends(settings[name], ck_backends)
    results = []
    with stop_on_signals() as stop:
        _run_each(names, settings, out_dir, tier, echo, results, fail_fast)
        stop.hold()
        summary = markdown_summary(results, tier)
        write_text(out_dir / "summary.md", summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(summary)
    return results


def _run_each(names, settings, out_dir, tier, echo, results, fail_fast) -> None:
    for name in names:
        start = time.perf_counter()
        try:
            result = GATES[name](settings[name], out_dir)
        except KeyboardInterrupt as err:  # Ctrl-C or a signal: this gate proves nothing, and no other gate runs
            signum = err.signum if isinstance(err, Interrupted) else 2
            result = _result(False, "interrupted", interrupted=signum)
        except Exception as err:  # a gate that crashes fails, and says why
            result = _result(False, f"error: {type(err).__name__}: {err}")
        chosen = settings[name].get("ck_backends", {})
        if chosen and "exercised" in result["details"]:  # said plainly: a backend this gate did not call
            missed = [f"{k}={n}" for k, n in chosen.items() if k not in result["details"]["exercised"]]
            result["details"]["not_exercised"] = missed
            if missed:
                result["summary"] += f"; does not exercise {', '.join(missed)}"
        result.update(gate=name, tier=tier, settings=settings[name], seconds=time.perf_counter() - start,
                      schema="ckparity.gate/1", torch=torch.__version__, ckparity=ckparity.__version__)
        write_json(out_dir / f"{name}_latest.json", result)
        results.append(result)
        echo(f"{'PASS' if result['passed'] else 'FAIL'} {name:20s} {result['seconds']:6.1f}s  {result['summary']}")
        if result["details"].get("interrupted") or (fail_fast and not result["passed"]):
            break


def markdown_summary(results: list[dict], tier: str) -> str:
    passed = sum(r["passed"] for r in results)
    lines = [f"## ckparity gates ({tier} tier): {passed}/{len(results)} passed", "",
             "| gate | result | time | summary |", "|---|---|---|---|"]
    for r in results:
        text = r["summary"].replace("|", "\\|")
        lines.append(f"| {r['gate']} | {'pass' if r['passed'] else '**FAIL**'} | {r['seconds']:.1f}s | {text} |")
    return "\n".join(lines) + "\n"
