"""--envelope K: is the CK twin's drift float noise or a bug?

Next to the twins, K "null" twins train on the same batches: each is the
torch twin -- torch's ops, torch's AdamW -- carrying the CK kernels' own
float32 differences from torch with their direction taken away, seeded per
member:

- its initial weights moved by a uniform -1..+1 ULP per element;
- every kernel slot (the loss, rms_norm, swiglu, rope) runs torch's op and
  the CK twin's backend on the member's own inputs, and each output element --
  and, in backward, each input-gradient element -- is torch's value moved by
  CK's difference from it, cut to the reach of a correct kernel and given a
  random sign per element that is fixed for the run (Signs). The reach m is REORDER_ULPS + 2 x torch's own distance from
  float64 there, in ULPs of torch's value (the accuracy rule's "twice torch's
  error", ckparity.measure.RULES, plus what a reordered sum costs). The null
  model is thus "a correct kernel with the CK kernel's own error, unbiased":
  element by element as large as CK's wherever CK's is within the reach, so a
  twin drifting beyond it owes the drift to its error's direction (a bias, an
  error correlated with the state) or to errors beyond the reach, not to the
  size of a correct kernel's rounding. A kernel bit-identical to torch adds no
  noise; a user's kernel (a plugin backend) is measured like ckparity's.
  null_model.measured reports each slot's differences from torch in torch's
  ULPs (on the first member): how many differ, the largest, how many fell
  beyond the reach, the mean signed and mean outward difference (a bias shows
  as a mean away from 0).
  (Before: the loss and dlogits moved by a uniform integer in [-m, m]; a
  uniform draw is not the kernel's error, and 8% of the default
  cross-entropy's dlogit differences fell outside it. README "Noise or bug"
  has the figures of both.)
- the optimizer: each member's update is torch's AdamW step, then the CK
  optimizer's step from the same params, gradients and state; each param is
  torch's moved by CK's difference, cut to PARAM_REACH_ULPS (optimizer_parity's
  bar), with the member's fixed random sign per element (the moments stay torch's: the C AdamW's are
  bit-identical to them). With torch's optimizer on the CK twin, none.
  (Before that, a fresh sign per call: README "Noise or bug" has why not.)
  (Before: 1% of the params moved by one ULP after every update, a guess at
  C AdamW's MKL-sqrt differences; the stress profile's ptref twin, whose only
  difference from torch is that AdamW, came out beyond it at step 990.)
Thread counts: torch's reductions gave the same bits for 1 and 2 threads at
these shapes (issue 17's measurement), so no member runs another thread count.

Per step the envelope is the largest (and the median) member-vs-torch-twin
difference of the loss (worst micro-step) and the params (worst tensor), the
same figures the CK twin's drift is measured by. noise_ratio at step s =
CK's largest difference over the last WINDOW steps / max(the members'
largest over the same steps, floor), the floor half an ULP of the params'
scale and REORDER_ULPS ULPs of the loss's (an envelope of 0 is no license for
any difference; the loss is one sum over the batch, which a correct kernel may
round REORDER_ULPS away from torch's where no member's happens to differ --
README "Noise or bug": ptref seed 117, 3 ULPs after 50 silent steps). A window, not the
step alone: a loss difference of a few ULPs is a sporadic event -- on the
stress profile the members' loss equals torch's on 65% of the steps and
CK's on 83% -- and a step where CK's differs and no member's happens to is
one in ~30, a certain false alarm over 1000 steps (README "Noise or bug").
For a drift that grows (the params) the window's largest is the latest.
The verdict is "beyond_noise" from the first step whose ratio exceeds R
(--envelope-ratio, default 4, chosen on the stress profile: see README),
or when a slot's error has a direction (lean: "directed"), else
"within_noise". The size criterion cannot see a direction: a fixed random
sign per element is itself a per-element bias, of random direction, and
drifts as far as one ULP outward on every dlogit does (README "Noise or
bug"). So the measuring member also counts, where CK's value is not
torch's, how often each is above (further from 0 than) the float64 value
and how often below (nearer), and a slot whose CK error leans more than
torch's does is a bias the null model, by construction, has not.

Cost: each member is one more torch twin — K times the torch twin's
training time, plus a parameter comparison per member per step."""

from __future__ import annotations

import copy
import statistics
import zlib
from dataclasses import replace
from typing import Callable, NamedTuple

import torch

from ... import cpu, kernels
from ...measure import nan_max
from ...ops.clip_grad_norm import grad_norm
from ..basics.diff import worst_diff
from ..twins import precision
from ..twins.models import build_model
from ..twins.stepper import Twin
from ..twins.factory import make_optimizer, ops_for
from .protocol import Observer, StepRecord

# the reach of the optimizer's per-step param difference: optimizer_parity's bar for
# ckparity's AdamW (params within 8 ULPs of torch's)
PARAM_REACH_ULPS = 8
# half an ULP, relative, per dtype: the floors' unit
HALF_ULP = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}
# the integer view whose steps are a dtype's ULPs (bf16: the upper half of a float32)
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
QUANTITIES = ("loss", "param")


def move_ulps(t: torch.Tensor, low: int, high: int, gen: torch.Generator, fraction: float = 1.0) -> torch.Tensor:
    """t (float32 or bfloat16) with each finite nonzero element moved by a
    uniform integer number of its dtype's ULPs in [low, high] (only a random
    ``fraction`` of them if < 1)."""
    bits = t.detach().contiguous().view(BITS[t.dtype])
    delta = torch.randint(low, high + 1, t.shape, generator=gen, dtype=BITS[t.dtype])
    if fraction < 1.0:
        delta *= (torch.rand(t.shape, generator=gen) < fraction).to(BITS[t.dtype])
    # a float's bits order its magnitude: adding to them steps ULPs (0, inf and NaN stay as they are)
    keep = (t == 0) | ~torch.isfinite(t)
    return torch.where(keep, t.detach(), (bits + delta).view(t.dtype))


REORDER_ULPS = 2  # what a reordered float32 sum may cost, per element
WINDOW = 50  # steps over which CK's largest difference meets the members' largest
MAX_ULPS = 1 << 20  # a bound on the reach where torch's value underflows next to a float64 one


def spacing(x: torch.Tensor) -> torch.Tensor:
    """The ULP of each element of x (in x's dtype), as float64."""
    return (torch.nextafter(x.abs(), torch.tensor(float("inf"), dtype=x.dtype)) - x.abs()).double()


def reach(ref: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """How far (in ULPs of torch's value) a correct kernel may be from torch:
    REORDER_ULPS + 2 x torch's own distance from float64, per element -- the
    accuracy rule's "twice torch's error" (ckparity.measure.RULES)."""
    torch_error = (ref.double() - exact).abs() / spacing(ref)
    return (REORDER_ULPS + torch.ceil(2 * torch_error)).clamp(max=MAX_ULPS).nan_to_num(MAX_ULPS)


class Signs:
    """A member's sign for each element of each of its noise's tensors, fixed
    for the run (drawn from the member's seed and the tensor's key, so a
    checkpoint needs only the seed). A deterministic kernel's difference from
    torch at an element keeps its sign while its inputs stay alike -- the
    stress profile trains on the same windows again and again -- and adds up
    over the steps; a fresh sign per call lets the null's differences
    cancel where CK's add up (README "Noise or bug": under per-call signs the
    default cross-entropy was beyond noise on 17 of 20 seeds, under fixed
    ones on none of those measured). Calls of one slot with one shape (the
    blocks' rms_norms) share a pattern."""

    STATE = ("seed",)

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, key: str, shape) -> torch.Tensor:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + zlib.crc32(f"{key}{tuple(shape)}".encode()))
                                            % 2**62)
        return torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()


def mirror(ref: torch.Tensor, ck: torch.Tensor, m: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Per element, CK's difference from torch, cut to the reach m (ULPs of
    torch's value), added to torch's value times ``sign`` (+-1 per element):
    CK's value (when within m) or its mirror image about torch's.
    torch's value where CK's is not finite (the null model's errors are)."""
    limit = m * spacing(ref)
    diff = (ck.double() - ref.double()).clamp(-limit, limit)  # exact: float32s of one scale
    moved = (ref.double() + sign * diff).to(ref.dtype)  # CK's own value where the sign is +1
    return torch.where(torch.isfinite(ck) & torch.isfinite(moved), moved, ref).detach()


LEAN_MARGIN = 0.1  # how much more CK's error may lean one way than torch's does (share of the differing elements)
LEAN_MARGIN_ULPS = 0.25  # the same in mean ULPs: a bias of one ULP is four times it
LEAN_CLIP_ULPS = 4.0  # an error counts in the mean up to this many ULPs (a wild one cannot carry it)
LEAN_Z = 5.0  # and how sure the count must make it (standard errors)


def lean(f: dict) -> dict:
    """CK's and torch's lean on the n elements where their values differ, two
    ways. By sign: (#above the float64 value - #below) / n, and outward
    (further from 0 - nearer). In ULPs: the errors' sum over the sum of
    torch's values' ULPs (a mean in ULPs weighed by each value's size: what
    the errors add to the sums downstream), up and outward, over the n_ulps
    elements where torch's own error is within an ULP (where torch's is far
    off -- dlogits of tiny probabilities, by a hundred ULPs and more -- its
    lean would swamp a 1-ULP one), each cut to LEAN_CLIP_ULPS. Unweighed,
    the default CE's dlogits of 1e-38..1e-30 (exp of -60..-88, rounded
    twice) leaned -0.6 ULP on the stress profile: real, and nothing a
    training step can feel. 0 for an error without a
    direction; a correct kernel that rounds otherwise than torch leans as
    torch does (C AdamW's params: README "Noise or bug" has the figures).
    "directed" when CK's lean is
    larger than torch's, either way, by more than LEAN_MARGIN (by sign) or
    LEAN_MARGIN_ULPS (in ULPs) and by LEAN_Z standard errors: a bias CK has
    and torch has not. The sign sees a bias where the errors are within an
    ULP; where torch's own are several ULPs (dlogits: a 1-ULP bias moved the
    sign lean by 0.1 on the stress profile) the mean sees it. A kernel that
    removes a lean of torch's (torch's error one way, CK's without a
    direction) is not directed."""
    n = f["lean_n"]
    if not n:
        return {"n": 0, "directed": False}
    shares = {key: f[key] / n for key in ("ck_up", "torch_up", "ck_out", "torch_out")}
    ulp_sum = f["lean_ulp_sum"] or 1.0
    ulps = {key: f[key] / ulp_sum for key in ("ck_up_ulps", "torch_up_ulps", "ck_out_ulps", "torch_out_ulps")}
    excess = max(abs(shares[f"ck_{d}"]) - abs(shares[f"torch_{d}"]) for d in ("up", "out"))
    excess_ulps = max(abs(ulps[f"ck_{d}_ulps"]) - abs(ulps[f"torch_{d}_ulps"]) for d in ("up", "out"))
    # standard errors, as if the elements were independent: a mean of n values in [-1, 1] has one of at
    # most 1/sqrt(n), a difference of two 2/sqrt(n); a mean of values x, sqrt(sum x^2) / n at most. An
    # element's error repeats over steps (correlated): the margins, not the z, keep a tiny lean out
    se_ulps = (f["ck_sq_ulps"] ** 0.5 + f["torch_sq_ulps"] ** 0.5) / ulp_sum
    by_sign = excess > LEAN_MARGIN and excess * n**0.5 / 2 > LEAN_Z
    by_ulps = excess_ulps > LEAN_MARGIN_ULPS and excess_ulps > LEAN_Z * se_ulps
    return {"n": n, **shares, "excess": excess, "n_ulps": f["lean_n_ulps"], **ulps, "excess_ulps": excess_ulps,
            "directed": by_sign or by_ulps}


class Measured:
    """Each slot's differences from torch in torch's ULPs, over the calls one
    member makes, and how many fell beyond the reach a correct kernel has."""

    STATE = ("figures",)
    FRESH = {"elements": 0, "differing": 0, "up": 0, "out": 0, "beyond_reach": 0, "signed": 0.0, "outward": 0.0,
             "max_abs_ulps": 0.0, "worst_excess_ulps": 0.0,
             "lean_n": 0, "lean_n_ulps": 0, "lean_ulp_sum": 0.0, "ck_up": 0, "ck_out": 0, "torch_up": 0, "torch_out": 0, "ck_up_ulps": 0.0,
             "ck_out_ulps": 0.0, "ck_sq_ulps": 0.0, "torch_up_ulps": 0.0, "torch_out_ulps": 0.0, "torch_sq_ulps": 0.0}

    def __init__(self) -> None:
        self.figures: dict[str, dict] = {}

    def add(self, name: str, ref: torch.Tensor, ck: torch.Tensor, m: torch.Tensor, exact: torch.Tensor) -> None:
        f = self.figures.setdefault(name, {})
        for key, zero in self.FRESH.items():  # setdefault key by key: a checkpoint of an older run lacks some
            f.setdefault(key, zero)
        if torch.equal(ref, ck):  # a bit-identical call (most are): nothing differs, nothing leans
            f["elements"] += int((torch.isfinite(ref)).sum())
            return
        finite = torch.isfinite(ref) & torch.isfinite(ck)
        ulps = ((ck.double() - ref.double()) / spacing(ref))[finite]
        excess = ulps.abs() - m[finite]
        f["elements"] += ulps.numel()
        f["differing"] += int((ulps != 0).sum())
        f["up"] += int((ulps > 0).sum())
        f["out"] += int((ulps * ref[finite].sign() > 0).sum())
        f["beyond_reach"] += int((excess > 0).sum())
        f["signed"] += float(ulps.sum())
        f["outward"] += float((ulps * ref[finite].sign()).sum())
        if ulps.numel():
            f["max_abs_ulps"] = max(f["max_abs_ulps"], float(ulps.abs().max()))
            f["worst_excess_ulps"] = max(f["worst_excess_ulps"], float(excess.max()))
        # the lean: on the elements where CK's value is not torch's, how often each is above / further
        # from 0 than the float64 value, minus how often below / nearer (elsewhere their errors are one).
        # Not where the float64 value is below float32's normal range: a subnormal has fewer bits, its ULP
        # is no relative precision, and a kernel that rounds twice there (the default CE's p * k, ~1e-40)
        # leans by whole ULPs of values no sum will ever see
        differ = finite & (ck != ref) & torch.isfinite(exact) & (exact.abs() >= torch.finfo(ref.dtype).tiny)
        outward, ulp = exact[differ].sign(), spacing(ref[differ])
        near = (ref[differ].double() - exact[differ]).abs() <= ulp  # torch's error within an ULP
        for side, value in (("ck", ck), ("torch", ref)):
            err = value[differ].double() - exact[differ]
            f[f"{side}_up"] += int((err > 0).sum()) - int((err < 0).sum())
            f[f"{side}_out"] += int((err * outward > 0).sum()) - int((err * outward < 0).sum())
            # each error cut to LEAN_CLIP_ULPS of its value, and weighed by its ULP (its size): the lean of
            # what the errors add to the sums downstream, not of the last bits of values far too small to count
            cut = (err / ulp).clamp(-LEAN_CLIP_ULPS, LEAN_CLIP_ULPS)[near] * ulp[near]
            f[f"{side}_up_ulps"] += float(cut.sum())
            f[f"{side}_out_ulps"] += float((cut * outward[near]).sum())
            f[f"{side}_sq_ulps"] += float((cut * cut).sum())
        f["lean_n"] += int(differ.sum())
        f["lean_n_ulps"] += int(near.sum())
        f["lean_ulp_sum"] += float(ulp[near].sum())

    def report(self) -> dict:
        """Per slot: up_share is the share of the differing elements where CK's
        value is above torch's, outward_share where it is further from 0 --
        0.5 for an unbiased error; the mean signed and outward differences
        weigh the elements by their ULPs (a few tiny values can dominate them);
        beyond_reach counts the elements the null model cut to the reach."""
        return {name: {"elements": n, "differing": d, "max_abs_ulps": f["max_abs_ulps"],
                       "beyond_reach": f["beyond_reach"], "worst_excess_ulps": f["worst_excess_ulps"],
                       "up_share": f["up"] / d if d else None, "outward_share": f["out"] / d if d else None,
                       "mean_signed_ulps": f["signed"] / n if n else None,
                       "mean_outward_ulps": f["outward"] / n if n else None, "lean": lean(f)}
                for name, f in self.figures.items() for n, d in [(f["elements"], f["differing"])]}

    def directed(self) -> list[str]:
        """The slot outputs whose error leans one way more than torch's does."""
        return sorted(name for name, f in self.figures.items() if lean(f)["directed"])


class _Slot(NamedTuple):
    name: str
    ref: Callable
    ck: Callable
    kwargs: dict
    signs: Signs
    measured: Measured | None


def _double(args: list) -> list:
    return [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def _exact(ref: torch.Tensor, ck: torch.Tensor, exact: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The float64 value the reach and the lean are measured from; ``ref``
    itself (no cost, and no noise: mirror moves by CK's difference, here 0;
    no lean: none differs) when CK's bits are torch's."""
    return ref.double() if torch.equal(ref, ck) else exact()


class _MeasuredNoise(torch.autograd.Function):
    """torch's op with each output and input-gradient element moved by the
    CK op's difference, cut to the reach and given the member's sign (mirror);
    the reach from torch's op in float64 on the same inputs."""

    @staticmethod
    def forward(ctx, slot: _Slot, *inputs):
        ctx.slot, ctx.inputs = slot, [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]
        ref, ck = slot.ref(*ctx.inputs, **slot.kwargs), slot.ck(*ctx.inputs, **slot.kwargs)
        exact = _exact(ref, ck, lambda: slot.ref(*_double(ctx.inputs), **slot.kwargs))
        m = reach(ref, exact)
        if slot.measured is not None:
            slot.measured.add(slot.name, ref, ck, m, exact)
        return mirror(ref, ck, m, slot.signs(slot.name, ref.shape))

    @staticmethod
    def backward(ctx, grad):
        slot = ctx.slot
        wanted = [i for i, need in enumerate(ctx.needs_input_grad[1:]) if need]

        def input_grads(op, inputs, upstream):
            """The op's gradients of the wanted inputs; one it gives no gradient (a CK op whose output holds no
            graph of an input: a gradient never written) is zeros, as the engine leaves it."""
            with torch.enable_grad():
                args = [x.clone().requires_grad_() if i in wanted else x for i, x in enumerate(inputs)]
                out, leaves = op(*args, **slot.kwargs), [args[i] for i in wanted]
                grads = (torch.autograd.grad(out, leaves, upstream, allow_unused=True) if out.requires_grad
                         else [None] * len(leaves))
                return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]

        refs, cks = input_grads(slot.ref, ctx.inputs, grad), input_grads(slot.ck, ctx.inputs, grad)
        exacts = [None] * len(refs)
        if not all(torch.equal(ref, ck) for ref, ck in zip(refs, cks)):
            exacts = input_grads(slot.ref, _double(ctx.inputs), grad.double())
        grads = [None] * len(ctx.inputs)
        for i, ref, ck, f64 in zip(wanted, refs, cks, exacts):
            exact = _exact(ref, ck, lambda: f64)
            m = reach(ref, exact)
            if slot.measured is not None:
                slot.measured.add(f"{slot.name}.grad{i}", ref, ck, m, exact)
            grads[i] = mirror(ref, ck, m, slot.signs(f"{slot.name}.grad{i}", ref.shape))
        return None, *grads


def _measured(name: str, ref: Callable, ck: Callable, signs: Signs, measured: Measured | None) -> Callable:
    def noisy(*inputs, **kwargs):
        return _MeasuredNoise.apply(_Slot(name, ref, ck, kwargs, signs, measured), *inputs)
    return noisy


def noisy_slots(config) -> list[str]:
    """The slots whose differences the null members carry: every slot ckparity has C for (measured even where
    the CK twin runs torch's: a zero difference), and any other whose CK backend is not torch's (a user's)."""
    return [slot for slot, name in kernels.SLOTS.items()
            if "c" in kernels.backends(name) or getattr(config, kernels.KERNELS[name].flag) != "torch"]


def null_ops(config, signs: Signs, measured: Measured | None = None):
    """A null member's ops: torch's, each carrying the CK backend's measured
    difference within a correct kernel's reach, with the member's signs (the
    loss on the logits: under the fused linear loss, the default kernel the
    fused op runs per chunk)."""
    ref, ck = ops_for(config, "torch"), ops_for(config, "ck")
    return replace(ref, **{slot: _measured(slot, getattr(ref, slot), getattr(ck, slot), signs, measured)
                           for slot in noisy_slots(config)})


def window_ratio(ck: list[float], envelope: list[float], floor: float, window: int = WINDOW) -> float:
    """CK's largest difference over the last ``window`` steps over the members'
    largest there (at least ``floor``); NaN where CK's is NaN."""
    ck_max, env_max = nan_max(ck[-window:]), max(envelope[-window:])
    if not (floor > 0 or env_max > 0):
        return 0.0 if ck_max == 0 else float("inf")
    return ck_max / max(env_max, floor)


class NoiseEnvelope(Observer):
    STATE = ("members", "series", "first_beyond", "measured")  # a member: its twin and its signs

    def __init__(self, config, ref: Twin) -> None:
        self.config, self.ratio_limit = config, config.envelope_ratio
        self.members: list[tuple[Twin, Signs]] = []
        self.ck_optimizers: list = []
        state = ref.model.state_dict()
        self.measured = Measured()  # on the first member's inputs
        for k in range(config.envelope):
            seed = config.seed * 7919 + k + 1
            signs, gen = Signs(seed), torch.Generator().manual_seed(seed)
            # in the run's precision, as the torch twin is (factory.build_twin)
            model = precision.cast_model(build_model(config, null_ops(config, signs, self.measured if k == 0 else None)),
                                         config)
            model.load_state_dict({name: move_ulps(t, -1, 1, gen) if t.is_floating_point() else t
                                   for name, t in state.items()})
            twin = Twin(f"null{k}", model, make_optimizer(config, "torch", model.parameters()),
                        kernels.backends("clip_grad_norm")["torch"], autocast=lambda: precision.autocast(config))
            self.members.append((twin, signs))
            # the CK optimizer over the member's params, for its measured difference (no state of its own:
            # it is given the member's torch state before each step)
            self.ck_optimizers.append(make_optimizer(config, "ck", model.parameters())
                                      if config.optimizer == "adamw" and config.ck_optimizer_backend != "torch"
                                      else None)
        self.series: dict[str, list] = {key: [] for key in (
            "step", "loss_max", "loss_median", "param_max", "param_median", "loss_ratio", "param_ratio",
            "loss_ck", "param_ck", "loss_floor", "param_floor")}
        self.first_beyond: dict[str, int | None] = {q: None for q in QUANTITIES}

    def after_step(self, record: StepRecord) -> None:
        step, windows, ref, row, ref_losses = record.step, record.windows, record.ref, record.row, record.losses["torch"]
        ref_params = ref.params()
        figures = {q: [] for q in QUANTITIES}
        for k, ((twin, signs), ck_optimizer) in enumerate(zip(self.members, self.ck_optimizers)):
            twin.zero_grad()
            losses = [float(loss) for loss, _ in twin.micro_steps(windows)]
            if ck_optimizer is None:
                twin.update(self.config.max_grad_norm)
            else:
                self._measured_update(twin, signs, ck_optimizer, self.measured if k == 0 else None)
            figures["loss"].append(max(abs(a - b) for a, b in zip(losses, ref_losses)))
            figures["param"].append(worst_diff({n: (p, ref_params[n]) for n, p in twin.params().items()})["abs"])
        # the loss is in --dtype (under --amp float32, as autocast's cross-entropy returns it), the params too
        loss_dtype = param_dtype = precision.DTYPES[self.config.dtype]
        floors = {"loss": 2 * REORDER_ULPS * HALF_ULP[loss_dtype] * max(abs(v) for v in ref_losses),
                  "param": HALF_ULP[param_dtype] * grad_norm([p.float() for p in ref_params.values()], float("inf"))}
        ck = {"loss": row["loss_abs_diff"], "param": row["param_abs_diff"]}
        self.series["step"].append(step)
        for q in QUANTITIES:
            self.series[f"{q}_max"].append(max(figures[q]))
            self.series[f"{q}_median"].append(statistics.median(figures[q]))
            self.series[f"{q}_ck"].append(ck[q])
            self.series[f"{q}_floor"].append(floors[q])
            ratio = window_ratio(self.series[f"{q}_ck"], self.series[f"{q}_max"], floors[q])
            self.series[f"{q}_ratio"].append(ratio)
            if self.first_beyond[q] is None and not ratio <= self.ratio_limit:  # NaN is beyond noise
                self.first_beyond[q] = step

    def _measured_update(self, twin: Twin, signs: Signs, ck_optimizer, measured: Measured | None) -> None:
        """The member's update: torch's step, then the CK optimizer's step from the
        same params, gradients and state; each param is torch's moved by CK's
        difference, cut to PARAM_REACH_ULPS of the param or of its update (the larger), with
        the member's sign. The moments stay
        torch's (the C AdamW's are bit-identical to them: docs/kernels.md).
        The measuring member also takes torch's step in float64 from the same
        float32 state, for the lean."""
        params = list(twin.model.parameters())
        start, state = [p.detach().clone() for p in params], copy.deepcopy(twin.optimizer.state_dict())
        twin.update(self.config.max_grad_norm)  # clips the grads in place: the CK step sees the same ones
        torch_params = [p.detach().clone() for p in params]
        exacts = self._float64_step(start, [p.grad for p in params], state) if measured is not None else None
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
            ck_optimizer.load_state_dict(state)
            ck_optimizer.step()
            for i, (p, t, s) in enumerate(zip(params, torch_params, start)):
                # in ULPs of the param or of the update, the larger: near 0 an update's last bit is many of the param's
                m = PARAM_REACH_ULPS * spacing(torch.maximum(t.abs(), (t - s).abs())) / spacing(t)
                if measured is not None:
                    measured.add("adamw.param", t, p.detach(), m, exacts[i])
                p.copy_(mirror(t, p.detach(), m, signs(f"adamw.param{i}", t.shape)))

    def _float64_step(self, start: list, grads: list, state: dict) -> list:
        """torch's optimizer step in float64 from float32 params, grads and state
        (load_state_dict casts the moments to the params' dtype)."""
        params = [s.double().requires_grad_() for s in start]
        for p, g in zip(params, grads):
            p.grad = g.double()
        optimizer = make_optimizer(self.config, "torch", params)
        optimizer.load_state_dict(copy.deepcopy(state))  # a copy: the step counts would be advanced in place
        optimizer.step()
        return [p.detach() for p in params]

    def twins(self) -> list[Twin]:
        return [twin for twin, _ in self.members]

    def report_into(self, result: dict) -> None:
        result["envelope"] = self.report()
        result["noise_verdict"] = result["envelope"]["verdict"]

    def report(self) -> dict:
        beyond = [s for s in self.first_beyond.values() if s is not None]
        ratios = {q: nan_max(self.series[f"{q}_ratio"]) for q in QUANTITIES}
        directed = self.measured.directed()
        return {"members": len(self.members), "ratio_limit": self.ratio_limit, "window_steps": WINDOW,
                "null_model": {"initial_weights_ulps": 1,
                               "kernels": "each slot's CK-minus-torch difference, its sign at random per element "
                                          "and fixed for the run",
                               "measured": self.measured.report(),
                               "adamw": ("measured: the CK optimizer's step on the member's state, its param "
                                         f"difference cut to {PARAM_REACH_ULPS} ULPs, random sign fixed per element"
                                         if any(self.ck_optimizers) else "torch's on both twins: none"),
                               "capability": cpu.capability()},
                "verdict": "beyond_noise" if beyond or directed else "within_noise",
                "first_beyond_step": min(beyond) if beyond else None,
                "directed": directed,
                "first_beyond_step_per_quantity": self.first_beyond,
                "max_noise_ratio": ratios, "series": self.series}
