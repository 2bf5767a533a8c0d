"""--envelope K: is the CK twin's drift float noise or a bug?

Next to the twins, K "null" twins train on the same batches: each is the
torch twin — torch's ops, torch's AdamW — with the float32 variation a
correct kernel is allowed, seeded per member:

- its initial weights moved by a uniform -1..+1 ULP per element;
- the loss value and each dlogit (the cross-entropy kernel's outputs) moved
  at every micro-step by a uniform integer number of ULPs in [-m, m], m =
  LOSS_ULPS + ceil(2 x torch's own error there), torch's error being its
  distance from the same loss and dlogit in float64, in ULPs of torch's value:
  the accuracy rule's "twice torch's error" (ckparity.measure.RULES) plus the
  2 ULPs a reordered sum costs, per element, unbiased. A fixed +-2 ULPs was
  narrower than a correct kernel's real difference from torch on the small
  dlogits (the default cross-entropy's reach 842 of their ULPs in
  docs/kernels.md); the report's null_model.coverage says which share of the
  CK loss kernel's own differences from torch fall inside [-m, m];
- after every update, PARAM_FRACTION of the params moved by one ULP: C AdamW
  differs from torch by one ULP where MKL's sqrt rounds differently,
  on 1.4% of the params after 100 steps (docs/kernels.md).
rms_norm, swiglu and rope are bit-identical to torch when the C library
follows the capability torch runs at (ckparity.cpu; tests/test_capability.py
sweeps it at each): no noise for them then. Where it cannot (a capability
ckparity has no arithmetic for), each of their outputs and input gradients is
moved by -1..+1 ULP too, and the report's null model says so. Thread counts: torch's reductions gave the same bits for
1 and 2 threads at these shapes (issue 17's measurement), so no member runs
another thread count.

Per step the envelope is the largest (and the median) member-vs-torch-twin
difference of the loss (worst micro-step) and the params (worst tensor), the
same figures the CK twin's drift is measured by. noise_ratio = CK's
difference / max(envelope, floor), the floor half an ULP of the quantity's
scale (an envelope of 0 is no license for any difference). The verdict is
"beyond_noise" from the first step whose ratio exceeds R (--envelope-ratio,
default 4, chosen on the stress profile: see README), else "within_noise".

Cost: each member is one more torch twin — K times the torch twin's
training time, plus a parameter comparison per member per step."""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from .. import cpu
from ..measure import nan_max
from ..ops.clip_grad_norm import grad_norm
from .diff import worst_diff
from .models import build_model
from .twin import Twin
from . import backends
from .twins import make_optimizer, ops_for

LOSS_ULPS = 2
UNMATCHED_ULPS = 1  # rms_norm, swiglu, rope where the library cannot follow torch's capability
PARAM_FRACTION = 0.01
HALF_ULP = 2.0**-24  # relative
QUANTITIES = ("loss", "param")


def move_ulps(t: torch.Tensor, low: int, high: int, gen: torch.Generator, fraction: float = 1.0) -> torch.Tensor:
    """t with each finite nonzero element moved by a uniform integer number
    of ULPs in [low, high] (only a random ``fraction`` of them if < 1)."""
    bits = t.detach().contiguous().view(torch.int32)
    delta = torch.randint(low, high + 1, t.shape, generator=gen, dtype=torch.int32)
    if fraction < 1.0:
        delta *= (torch.rand(t.shape, generator=gen) < fraction).to(torch.int32)
    # a float's bits order its magnitude: adding to them steps ULPs (0, inf and NaN stay as they are)
    keep = (t == 0) | ~torch.isfinite(t)
    return torch.where(keep, t.detach(), (bits + delta).view(torch.float32))


class _Noise(torch.autograd.Function):
    """Forward moves the value by up to ``value_ulps`` ULPs, backward the
    gradient by up to ``grad_ulps``."""

    @staticmethod
    def forward(ctx, x, gen, value_ulps, grad_ulps):
        ctx.gen, ctx.grad_ulps = gen, grad_ulps
        return move_ulps(x, -value_ulps, value_ulps, gen) if value_ulps else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        k = ctx.grad_ulps
        return (move_ulps(grad, -k, k, ctx.gen) if k else grad), None, None, None


MAX_ULPS = 1 << 20  # a bound on m where torch's value underflows next to a float64 one (0 is never moved)


def ulps_from(x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|x - exact| in ULPs of x (float64 counts; x float32)."""
    spacing = (torch.nextafter(x.abs(), torch.tensor(float("inf"))) - x.abs()).double()
    return (x.double() - exact.double()).abs() / spacing


def _bound(x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """The null model's per-element reach m: LOSS_ULPS + ceil(2 x torch's error)."""
    return (LOSS_ULPS + torch.ceil(2 * ulps_from(x, exact))).clamp(max=MAX_ULPS).nan_to_num(MAX_ULPS).long()


def move_within(t: torch.Tensor, m: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """t with each finite nonzero element moved by a uniform integer in [-m, m] ULPs."""
    delta = (torch.rand(t.shape, generator=gen, dtype=torch.float64) * (2 * m + 1)).floor().long() - m
    keep = (t == 0) | ~torch.isfinite(t)
    moved = (t.detach().contiguous().view(torch.int32).long() + delta).to(torch.int32).view(torch.float32)
    return torch.where(keep, t.detach(), moved)


class Coverage:
    """Which share of the CK loss kernel's differences from torch (loss values
    and dlogits) fall within the null model's reach m, over the micro-steps
    one member sees: the null model's calibration, measured."""

    def __init__(self, ck_loss) -> None:
        self.ck_loss, self.counts = ck_loss, {q: [0, 0] for q in ("loss", "dlogits")}
        self.worst_excess = {q: 0.0 for q in ("loss", "dlogits")}

    def add(self, part: str, ck: torch.Tensor, torch_value: torch.Tensor, m: torch.Tensor) -> None:
        reach = ulps_from(torch_value, ck)  # CK's distance from torch, in torch's ULPs
        inside = reach <= m
        self.counts[part][0] += int(inside.sum())
        self.counts[part][1] += inside.numel()
        self.worst_excess[part] = max(self.worst_excess[part], float((reach - m).max()))

    def report(self) -> dict:
        return {q: {"inside": a, "of": n, "share": a / n if n else None,
                    "worst_excess_ulps": self.worst_excess[q]} for q, (a, n) in self.counts.items()}


class _NullLoss(torch.autograd.Function):
    """torch's loss with its value and dlogits moved within torch's own error
    (see the module's docstring); with a Coverage, the CK loss kernel's
    differences on the same logits are measured against the same reach."""

    @staticmethod
    def forward(ctx, logits, targets, loss, gen, coverage):
        ctx.save_for_backward(logits, targets)
        ctx.loss, ctx.gen, ctx.coverage = loss, gen, coverage
        value = loss(logits, targets)
        m = _bound(value, loss(logits.double(), targets))
        if coverage is not None:
            coverage.add("loss", coverage.ck_loss(logits, targets).detach(), value, m)
        return move_within(value, m, gen)

    @staticmethod
    def backward(ctx, grad):
        logits, targets = ctx.saved_tensors

        def dlogits(fn, x):
            with torch.enable_grad():
                x = x.detach().requires_grad_()
                return torch.autograd.grad(fn(x, targets), x, grad.to(x.dtype))[0]

        d = dlogits(ctx.loss, logits)
        m = _bound(d, dlogits(ctx.loss, logits.double()))
        if ctx.coverage is not None:
            ctx.coverage.add("dlogits", dlogits(ctx.coverage.ck_loss, logits), d, m)
        return move_within(d, m, ctx.gen), None, None, None, None


def _noisy_loss(loss, gen: torch.Generator, coverage: Coverage | None):
    def noisy(logits, targets):
        return _NullLoss.apply(logits, targets, loss, gen, coverage)
    return noisy


def _noisy_op(op, gen: torch.Generator):
    """op with its output and its first input's gradient moved by -1..+1 ULP."""
    def noisy(x, *args, **kwargs):
        return _Noise.apply(op(_Noise.apply(x, gen, 0, UNMATCHED_ULPS), *args, **kwargs), gen, UNMATCHED_ULPS, 0)
    return noisy


def null_ops(config, gen: torch.Generator, coverage: Coverage | None = None):
    """A null member's ops: torch's, with the noise of the kernels that are
    not bit-identical to torch in this process."""
    ops = ops_for(config, "torch")
    ops = replace(ops, loss=_noisy_loss(ops.loss, gen, coverage))
    if not cpu.matched():
        ops = replace(ops, rms_norm=_noisy_op(ops.rms_norm, gen), swiglu=_noisy_op(ops.swiglu, gen),
                      rope=_noisy_op(ops.rope, gen))
    return ops


class NoiseEnvelope:
    def __init__(self, config, ref: Twin) -> None:
        self.config, self.ratio_limit = config, config.envelope_ratio
        self.members: list[tuple[Twin, torch.Generator]] = []
        state = ref.model.state_dict()
        # the first member also measures the CK loss kernel against its reach (on its own logits)
        self.coverage = Coverage(ops_for(config, "ck").loss)
        for k in range(config.envelope):
            gen = torch.Generator().manual_seed(config.seed * 7919 + k + 1)
            model = build_model(config, null_ops(config, gen, self.coverage if k == 0 else None))
            model.load_state_dict({name: move_ulps(t, -1, 1, gen) if t.is_floating_point() else t
                                   for name, t in state.items()})
            twin = Twin(f"null{k}", model, make_optimizer(config, "torch", model.parameters()),
                        backends.CLIP_GRAD_NORM["torch"])
            self.members.append((twin, gen))
        self.series: dict[str, list] = {key: [] for key in (
            "step", "loss_max", "loss_median", "param_max", "param_median", "loss_ratio", "param_ratio")}
        self.first_beyond: dict[str, int | None] = {q: None for q in QUANTITIES}

    def after_step(self, step: int, windows, ref: Twin, row: dict, ref_losses: list[float]) -> None:
        ref_params = ref.params()
        figures = {q: [] for q in QUANTITIES}
        for twin, gen in self.members:
            twin.zero_grad()
            losses = [float(loss) for loss, _ in twin.micro_steps(windows)]
            twin.update(self.config.max_grad_norm)
            with torch.no_grad():
                for p in twin.model.parameters():
                    p.copy_(move_ulps(p, -1, 1, gen, PARAM_FRACTION))
            figures["loss"].append(max(abs(a - b) for a, b in zip(losses, ref_losses)))
            figures["param"].append(worst_diff({n: (p, ref_params[n]) for n, p in twin.params().items()})["abs"])
        floors = {"loss": HALF_ULP * max(abs(v) for v in ref_losses),
                  "param": HALF_ULP * grad_norm([p for p in ref_params.values()], float("inf"))}
        ck = {"loss": row["loss_abs_diff"], "param": row["param_abs_diff"]}
        self.series["step"].append(step)
        for q in QUANTITIES:
            envelope = max(figures[q])
            ratio = ck[q] / max(envelope, floors[q]) if floors[q] > 0 or envelope > 0 else 0.0
            self.series[f"{q}_max"].append(envelope)
            self.series[f"{q}_median"].append(statistics.median(figures[q]))
            self.series[f"{q}_ratio"].append(ratio)
            if self.first_beyond[q] is None and not ratio <= self.ratio_limit:  # NaN is beyond noise
                self.first_beyond[q] = step

    def report(self) -> dict:
        beyond = [s for s in self.first_beyond.values() if s is not None]
        ratios = {q: nan_max(self.series[f"{q}_ratio"]) for q in QUANTITIES}
        return {"members": len(self.members), "ratio_limit": self.ratio_limit,
                "null_model": {"initial_weights_ulps": 1,
                               "loss_and_dlogits_ulps": f"{LOSS_ULPS} + ceil(2 x torch's error from float64)",
                               "coverage": self.coverage.report(),
                               "param_fraction_moved_1_ulp_per_step": PARAM_FRACTION,
                               "capability": cpu.capability(),
                               "rms_norm_swiglu_rope_ulps": 0 if cpu.matched() else UNMATCHED_ULPS},
                "verdict": "beyond_noise" if beyond else "within_noise",
                "first_beyond_step": min(beyond) if beyond else None,
                "first_beyond_step_per_quantity": self.first_beyond,
                "max_noise_ratio": ratios, "series": self.series}
