"""kernel_parity: every kernel record's gate cases against torch and float64, torch's bits where
the claims hold, ckparity's row kernels batch-invariant, and a user's backend through check."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from .. import check, cpu, kernels
from .._tensors import DTYPES
from ..check.properties import batch_invariance
from ..check.suite import refuses
from ..measure import RULES, differing_elements, parity
from .common import result
from .record import Gate



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
    from .. import _bindings

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
    from .. import _native
    from ..kernels.cross_entropy import vocab_parallel_ce

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


def run(settings: dict, out_dir: Path | None = None) -> dict:
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
                 if not _follows_torchs_variance(r)]
    conformance = user_backend_checks(settings.get("ck_backends", {}), settings["dtype"])
    failures += [f"{r['kernel']} backend {r['backend']!r}: check says {r['verdict']}" for r in conformance
                 if not r["passed"]]
    worst = max(checks, key=lambda f: f["max_ulp"])
    in_dtype = "" if dtype == torch.float32 else f" in {settings['dtype']} ({len(not_in_dtype)} cases not in it)"
    summary = (f"{len(checks)} checks{in_dtype}, {len(failures)} failed" + (f"; first: {failures[0]}" if failures else
               f"; max {worst['max_ulp']} ULP from torch ({worst['name']})"))
    return result(not failures, summary, checks=checks, failures=failures, capability=cpu.capability(),
                   held_bitwise=bitwise, user_backends=conformance, not_in_dtype=not_in_dtype, batch_invariance=batch,
                   exercised=[r["kernel"] for r in conformance])


def _follows_torchs_variance(row: dict) -> bool:
    """A row's bits never move with its batch, or move only where torch's move (linear follows MKL's path for
    each batch size; its one-row gemv is not followed, so it is "as accurate as torch" there, not bitwise)."""
    return row["verdict"] == "bitwise" or (row["verdict"] == "as accurate as torch"
                                           and row["ours_variant"] == row["follows_torch"])


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
            if dtype != torch.float32 and refuses(name, backend, str(dtype).removeprefix("torch.")) is not None:
                continue  # a backend not built for the dtype (layer_norm's in bf16): check says "not supported"
            prop = batch_invariance(record.conformance, record.backends[backend],
                                                     record.backends["torch"], torch.Generator().manual_seed(0), dtype)
            if prop.cases:
                rows.append({"kernel": name, "backend": backend, **prop.report()})
    return rows


def user_backend_checks(ck_backends: dict[str, str], dtype: str = "float32") -> list[dict]:
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


GATE = Gate(
    name="kernel_parity", run=run,
    settings={"dtype": "float32", "factor": RULES["default"][0], "floor_ulps": RULES["default"][1],
              "ptref_factor": RULES["ptref"][0], "ptref_floor_ulps": RULES["ptref"][1],
              # the records' claims that kernel_parity has cases of: held to torch's bits
              "bitwise_kernels": [c.key for c in kernels.claims("float32")
                                  if any(c.key in k.gate_cases for k in kernels.KERNELS.values())]},
    dtypes={"bfloat16": {"bitwise_kernels": [c.key for c in kernels.claims("bfloat16")
                                             if any(c.key in k.gate_cases for k in kernels.KERNELS.values())]}},
    checks="cross_entropy (default, ptref), rms_norm, swiglu, rope (both layouts, a strided (B, heads, T, d) view, "
           "d 2 to 64) forward and backward against torch on fixed shapes (C up to 50257, D 4097, H 11008)",
    passes="every output within `assert_close`'s float32 tolerances of torch and float64 error ≤ `factor` (2) × "
           "torch's (ptref: 1× + 4 ULPs); the `bitwise_kernels` (rms_norm, swiglu, rope, ptref's class-target cases) "
           "bit-identical to torch; ckparity's own row kernels (rms_norm, swiglu, cross_entropy c, c_ptref, "
           "c_fused_linear, linear) batch-invariant: check's `batch_invariance`, a row's bits independent of its "
           "batch unless they move only where torch's do (report key `batch_invariance`)")
