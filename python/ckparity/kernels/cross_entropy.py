"""cross_entropy: F.cross_entropy, in two variants -- ``default`` (fused,
log-sum-exp, threaded) and ``ptref`` (ATen's order of operations: the one
claimed bit-identical) -- and fused with the lm_head (``c_fused_linear``)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ..ops.cross_entropy import cross_entropy
from ..ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from .. import _bindings
from .contract import expect, grads_present, tensor_like
from .benching import Case, compiled_fwd_bwd, fresh_fwd_bwd, fwd_bwd
from .probing import out
from .layouts import LayoutCase
from .record import WIDTHS, Claim, Conformance, GateCase, Kernel, BadInput
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads


def _variant(variant: str):
    return lambda logits, targets, **kw: cross_entropy(logits, targets, variant=variant, **kw)


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 11, generator=g).requires_grad_(True)
    targets = torch.randint(0, 11, (7,), generator=g)
    loss = fn(logits, targets)
    tensor_like(loss, (), "the loss of logits (7, 11), targets (7) (the mean over rows)")
    reference = F.cross_entropy(logits.detach(), targets)
    value = float(loss.detach())
    expect(abs(value - float(reference)) <= 1e-3 * max(1.0, abs(float(reference))),
           f"the loss {value:.6g} is not the mean cross-entropy {float(reference):.6g}")
    loss.backward()
    grads_present({"logits": logits})


def _make(width, rows, g):
    targets = torch.randint(0, width, (rows,), generator=g)
    targets[1::3] = -100  # ignored rows; row 0 is always kept (a mean over no rows is NaN)
    return {"logits": torch.randn(rows, width, generator=g) * 3, "targets": targets}


_BAD = (BadInput("a target equal to V (5)", "value", lambda fn: fn(torch.randn(3, 5), torch.tensor([0, 5, 1]))),
        BadInput("a negative target other than ignore_index", "value",
                 lambda fn: fn(torch.randn(3, 5), torch.tensor([0, -2, 1]))),
        BadInput("3 targets for 4 rows", "shape", lambda fn: fn(torch.randn(4, 5), torch.tensor([0, 1, 2]))))


def _opinfo_sample(s):
    target = s.args[0]
    extra = {k: v for k, v in s.kwargs.items() if not (k == "reduction" and v == "mean")}
    if s.input.dim() != 2 or target.dtype != torch.int64 or extra:  # (N, V) logits, class targets, the mean
        return None
    return (lambda f, t: f(t["logits"], t["targets"])), {"logits": s.input, "targets": target}, ("logits",)


# ---- kernel_parity's cases ----------------------------------------------------

def _gate_cases():
    g = torch.Generator().manual_seed(0)
    # (2048, 33): many rows, so many distinct sums go through the log (one libm
    # log in place of torch's SLEEF one differs on a few of them only)
    for N, C in ((64, 255), (8, 50257), (7, 3), (2048, 33)):
        x = torch.randn(N, C, generator=g) * 3
        t = torch.randint(0, C, (N,), generator=g)
        t[::4] = -100
        w = torch.rand(C, generator=g) + 0.1
        yield f"N={N},C={C}", (x, t), {}
        yield f"N={N},C={C},weight,smoothing,sum", (x, t), {"weight": w, "label_smoothing": 0.1, "reduction": "sum"}
        yield f"N={N},C={C},weight,smoothing,mean", (x, t), {"weight": w, "label_smoothing": 0.2}
        yield f"N={N},C={C},probs", (x, torch.softmax(torch.randn(N, C, generator=g), 1)), {}


def _z_loss_cases():
    g = torch.Generator().manual_seed(2)
    for N, C in ((64, 255), (7, 3)):
        t = torch.randint(0, C, (N,), generator=g)
        t[::4] = -100
        yield f"N={N},C={C},z_loss", (torch.randn(N, C, generator=g) * 3, t), {"z_loss": 1e-2}


def _with_z_loss(x, t, z_loss):
    """The reference for z_loss (PaLM's; torch has none): z * logsumexp(row)^2 added to
    each non-ignored row's loss, then the mean over the non-ignored rows."""
    kept = t != -100
    rows = F.cross_entropy(x, t, reduction="none") + z_loss * torch.logsumexp(x, -1) ** 2 * kept
    return rows.sum() / kept.sum()


def _z_loss(variant):
    return lambda x, t, z_loss: cross_entropy(x, t, z_loss=z_loss, variant=variant)


# ---- the ptref sweep ------------------------------------------------------------

def _ptref_case(tally: Tally, g: torch.Generator, N: int, V: int, kwargs: dict, threads: int, targets,
                dtype: torch.dtype = torch.float32) -> None:
    """One case of variant="ptref" against F.cross_entropy, loss and dlogits,
    both with torch on ``threads`` (ptref reads torch's thread count at the
    call). kwargs may hold weighted=True (or the weight's dtype); ``targets(N, V)`` draws the targets
    (class indices or probabilities) after the logits. In bf16 the logits,
    weights and upstream gradient are bf16, as torch takes them (the upstream
    gradient float32 where float32 probabilities make the loss float32)."""
    kwargs = dict(kwargs)
    weighted = kwargs.pop("weighted", False)
    weight = (torch.rand(V, generator=g) + 0.5).to(dtype if weighted is True else weighted) if weighted else None
    logits = (torch.randn(N, V, generator=g) * 4).to(dtype).requires_grad_(True)
    target = targets(N, V)
    loss_dtype = target.dtype if target.is_floating_point() else dtype
    up = (torch.randn(N, generator=g) if kwargs.get("reduction") == "none" else torch.tensor(1.0)).to(loss_dtype)
    kind = "" if not target.is_floating_point() else "probs " if target.dtype == dtype else f"{target.dtype} probs "
    case = (f"{kind}N={N} V={V} {kwargs}"
            f"{' weight' if weight is not None else ''}{f' torch threads {threads}' if threads > 1 else ''}")
    with torch_threads(threads):
        ours = grad_run(lambda x: cross_entropy(x, target, weight, variant="ptref", **kwargs), [logits], up)
        theirs = grad_run(lambda x: F.cross_entropy(x, target, weight, **kwargs), [logits], up)
    for q, a, b in zip(("loss", "dlogits"), ours, theirs):
        tally.add(q, case, a, b)


# torch splits a sum over every element across its threads from 32768 elements on:
# label smoothing's sum over the rows and, weighted, its kept rows' weights (many
# rows), and a row's own sum when the input is one row (reduction none too)
CLASS_SPLIT_SHAPES = [(1, 65537), (1, 131071), (40000, 7), (100003, 5)]

# probability targets' sum over every element (N*V) split across torch's threads
# (two_pass_reduction): one to several chunks, a chunk past the last element, and a
# thread count above the chunks' (1031 x 64: three chunks)
SPLIT_SHAPES = [(1, 32767), (1, 32768), (128, 256), (257, 255), (1031, 64), (65, 1009), (4097, 33)]


# class targets: every reduction, label smoothing, class weights, both
CLASS_SETTINGS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
                  dict(weighted=True), dict(weighted=True, label_smoothing=0.2),
                  dict(weighted=True, label_smoothing=0.2, reduction="sum"),
                  dict(weighted=True, label_smoothing=0.05, reduction="none")]


# probability targets: every reduction, smoothing with class weights
PROB_SETTINGS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(weighted=True, label_smoothing=0.1),
                 dict(weighted=True, label_smoothing=0.2, reduction="sum")]


def _class_targets(g: torch.Generator):
    """Draws (N) class targets with every third row ignored; keep_first keeps row 0 (a one-row input's)."""
    def classes(N, V, keep_first=False):
        target = torch.randint(0, V, (N,), generator=g)
        target[::3] = -100  # ignored rows
        if keep_first:
            target[0] = 0
        return target
    return classes


def _special_cases(tally: Tally, g: torch.Generator, dtype: torch.dtype) -> None:
    """special_rows at a few widths, every reduction: loss and dlogits NaN where torch's are (same_bits),
    the rest torch's bits."""
    for V, reduction in itertools.product(SPECIAL_WIDTHS + (32000,), ("mean", "sum", "none")):
        x = special_rows(g, V, dtype).requires_grad_(True)
        target = torch.randint(0, V, x.shape[:1], generator=g)
        target[20] = -100
        up = (torch.randn(x.shape[0] if reduction == "none" else (), generator=g) * 3).to(dtype)
        ours = grad_run(lambda logits: cross_entropy(logits, target, reduction=reduction, variant="ptref"), [x], up)
        with torch_threads(1):
            theirs = grad_run(lambda logits: F.cross_entropy(logits, target, reduction=reduction), [x], up)
        for q, a, b in zip(("loss", "dlogits"), ours, theirs):
            tally.add(q, f"special rows V={V} {reduction}", a, b)


def sweep_ptref(tally: Tally, g: torch.Generator) -> None:
    """variant="ptref" against F.cross_entropy, loss and gradient: class
    targets over reductions, ignore_index, class weights and smoothing, with
    torch on one thread and where its thread split matters on 2..3; then
    probability targets, on one thread and where the split matters on 2..4."""
    classes = _class_targets(g)

    def probabilities(N, V):
        return torch.softmax(torch.randn(N, V, generator=g), dim=1)

    # rows: one, fewer than a cascade level (16), and enough for nll_loss's
    # cascade to flush levels (300) at a few widths
    shapes = [(N, V) for N in (1, 8, 37) for V in WIDTHS + [32000]] + [(300, V) for V in (7, 64, 1000)]
    for (N, V), kwargs in itertools.product(shapes, CLASS_SETTINGS):
        _ptref_case(tally, g, N, V, kwargs, 1, classes)
    for (N, V), threads, kwargs in itertools.product(CLASS_SPLIT_SHAPES, (2, 3), CLASS_SETTINGS):
        _ptref_case(tally, g, N, V, kwargs, threads, lambda n, v: classes(n, v, keep_first=True))
    # probability targets: -(logp * q * w).sum() over every element, or .sum(1) with none
    prob_shapes = [(3, V, 1) for V in WIDTHS + [32000]] + [(37, V, 1) for V in (7, 64, 1000)]
    prob_shapes += [(N, V, threads) for N, V in SPLIT_SHAPES for threads in (2, 3, 4)]
    for (N, V, threads), kwargs in itertools.product(prob_shapes, PROB_SETTINGS):
        _ptref_case(tally, g, N, V, kwargs, threads, probabilities)
    _special_cases(tally, g, torch.float32)


def sweep_ptref_bf16(tally: Tally, g: torch.Generator) -> None:
    """bfloat16 logits, variant="ptref", against F.cross_entropy on them:
    class targets with ignored rows, every reduction, rows from one past
    nll_loss's bf16 count rounding (300 > 256), with torch on one thread (its
    log_softmax keeps a row whole on any thread count, and nll_loss's cascade
    is serial); then class weights and label smoothing, and the sums torch
    splits across 2 or 3 threads (label smoothing's, a one-row input's);
    then bf16 probability targets, their sum over every element split on 2..4."""
    for N, reduction in itertools.product((1, 8, 37, 300), ("mean", "sum", "none")):
        for V in WIDTHS + [32000] if N < 300 else (7, 64, 1000, 32000):
            x = (torch.randn(N, V, generator=g) * 3).bfloat16().requires_grad_(True)
            target = torch.randint(0, V, (N,), generator=g)
            target[1::3] = -100  # ignored rows; row 0 kept
            # the upstream gradient: 1 (loss.backward()) or, every other width, another bf16 value per row
            up = (torch.ones(N if reduction == "none" else ()) if V % 2 else
                  torch.randn(N if reduction == "none" else (), generator=g) * 3).bfloat16()
            ours = grad_run(lambda logits: cross_entropy(logits, target, reduction=reduction, variant="ptref"),
                            [x], up)
            with torch_threads(1):
                theirs = grad_run(lambda logits: F.cross_entropy(logits, target, reduction=reduction), [x], up)
            for q, a, b in zip(("loss", "dlogits"), ours, theirs):
                tally.add(q, f"N={N} V={V} {reduction}", a, b)
    classes = _class_targets(g)
    shapes = [(N, V) for N in (1, 37) for V in WIDTHS + [32000]] + [(300, V) for V in (7, 64, 1000)]
    for (N, V), kwargs in itertools.product(shapes, CLASS_SETTINGS[3:]):
        _ptref_case(tally, g, N, V, kwargs, 1, classes, torch.bfloat16)
    for (N, V), threads, kwargs in itertools.product(CLASS_SPLIT_SHAPES, (2, 3), CLASS_SETTINGS[3:]):
        _ptref_case(tally, g, N, V, kwargs, threads, lambda n, v: classes(n, v, keep_first=True), torch.bfloat16)

    def probabilities(N, V):
        return torch.softmax(torch.randn(N, V, generator=g), dim=1).bfloat16()

    prob_shapes = [(3, V, 1) for V in WIDTHS + [32000]] + [(37, V, 1) for V in (7, 64, 1000)]
    prob_shapes += [(N, V, threads) for N, V in SPLIT_SHAPES for threads in (2, 3, 4)]
    for (N, V, threads), kwargs in itertools.product(prob_shapes, PROB_SETTINGS):
        _ptref_case(tally, g, N, V, kwargs, threads, probabilities, torch.bfloat16)
    # float32 probabilities, which torch takes with bf16 logits (the loss float32): a setting a width in
    # turn, every setting at the split shapes
    settings = PROB_SETTINGS + [dict(weighted=torch.float32, reduction="none")]
    for i, (N, V, threads) in enumerate(prob_shapes):
        for kwargs in settings if threads > 1 else [settings[i % len(settings)]]:
            _ptref_case(tally, g, N, V, kwargs, threads, lambda n, v: torch.softmax(torch.randn(n, v, generator=g), 1),
                        torch.bfloat16)
    _special_cases(tally, g, torch.bfloat16)


# ---- the probe: every C entry point through a given library -----------------------

def probe_call(L, fill, x, target, weight, reduction, variant, row_grad=None, inplace=False, torch_threads=1):
    loss = out((x.shape[0],) if reduction == "none" else (), fill)
    d = x.clone() if inplace else out(x, fill)
    options = _bindings.cross_entropy_options(weight, -100, reduction, 0.1, 1e-4, variant, row_grad, torch_threads)
    _bindings.cross_entropy(d if inplace else x, target, options, loss, d, library=L)
    return loss, d


def vocab_parallel_ce(L, fill, x, target, shards):
    """Every vocab-parallel pass over shards of the vocabulary, the all-reduces done in between (max, then sum)."""
    N, V = x.shape
    bounds = [round(V * k / shards) for k in range(shards + 1)]
    pieces = [x[:, a:b].contiguous() for a, b in zip(bounds, bounds[1:])]
    maxes = []
    for piece in pieces:
        maxes.append(out((N,), fill))
        _bindings.vocab_parallel_ce_max(piece, maxes[-1], library=L)
    global_max = torch.stack(maxes).amax(0)
    sums = []
    for piece, start in zip(pieces, bounds):
        sums.append(out((N, 3), fill, torch.float64))
        _bindings.vocab_parallel_ce_sums(piece, target, start, V, -100, global_max, sums[-1], library=L)
    global_sums = torch.stack(sums).sum(0)
    loss_rows = out((N,), fill)
    _bindings.vocab_parallel_ce_loss(target, V, -100, 0.1, 1e-4, global_max, global_sums, loss_rows, library=L)
    row_grad = torch.full((N,), 1.0 / N)
    grads = []
    for piece, start in zip(pieces, bounds):
        grads.append(out(piece, fill))
        _bindings.vocab_parallel_ce_backward(piece, target, start, V, -100, 0.1, 1e-4, global_max, global_sums,
                                             row_grad, grads[-1], library=L)
    return (global_max, global_sums, loss_rows, *grads)


def probe_call_bf16(L, fill, x, target, reduction, weight=None, label_smoothing=0.0, torch_threads=1,
                    variant="ptref"):
    """The bf16 ptref entry point for class targets, or for bf16 or float32 probabilities (target of x's
    shape; float32: either variant, the loss float32)."""
    loss_dtype = torch.float32 if target.dtype == torch.float32 else torch.bfloat16
    loss, d = out((x.shape[0],) if reduction == "none" else (), fill, loss_dtype), out(x, fill)
    options = _bindings.cross_entropy_options(weight, reduction=reduction, label_smoothing=label_smoothing,
                                              variant=variant, torch_threads=torch_threads)
    _bindings.cross_entropy_bf16(x, target, options, loss, d, library=L)
    return loss, d


def _probe(g: torch.Generator):
    xb, tb = (torch.randn(300, 97, generator=g) * 3).bfloat16(), torch.randint(0, 97, (300,), generator=g)
    tb[::7] = -100
    for V in (5, 97):  # under one bf16 vector, and several
        for reduction in ("mean", "none"):
            xv, tv = xb[:, :V].contiguous(), tb.clamp(max=V - 1)
            yield (f"ce ptref bf16 V={V} {reduction}",
                   lambda L, f, r=reduction, a=xv, b=tv: probe_call_bf16(L, f, a, b, r))
            # label smoothing's and probability targets' rows of terms (weighted, smoothed), and the
            # probabilities' sum over the flattened batch, across rows and vector boundaries
            wv = (torch.rand(V, generator=g) + 0.5).bfloat16().float()
            pv = torch.softmax(torch.randn(300, V, generator=g), -1).bfloat16()
            yield (f"ce ptref bf16 V={V} {reduction} smoothing, weights",
                   lambda L, f, r=reduction, a=xv, b=tv, w=wv: probe_call_bf16(L, f, a, b, r, w, 0.1))
            yield (f"ce ptref bf16 V={V} {reduction} probabilities",
                   lambda L, f, r=reduction, a=xv, p=pv, w=wv: probe_call_bf16(L, f, a, p, r, w, 0.1))
            for variant in ("ptref", "default"):  # float32 probabilities
                yield (f"ce {variant} bf16 V={V} {reduction} float32 probabilities",
                       lambda L, f, r=reduction, a=xv, p=pv.float(), w=wv, v=variant:
                       probe_call_bf16(L, f, a, p, r, w, 0.1, variant=v))
    xs = (torch.randn(64, 4097, generator=g) * 4).bfloat16()
    ps = torch.softmax(torch.randn(64, 4097, generator=g), -1).bfloat16()
    for threads in (2, 3):  # the probabilities' sum split in chunks as torch's threads split it
        yield (f"ce ptref bf16 probabilities torch_threads={threads}",
               lambda L, f, k=threads, a=xs, p=ps: probe_call_bf16(L, f, a, p, "mean", torch_threads=k))
        yield (f"ce ptref bf16 float32 probabilities torch_threads={threads}",
               lambda L, f, k=threads, a=xs, p=ps.float(): probe_call_bf16(L, f, a, p, "mean", torch_threads=k))
    x = torch.randn(37, 1003, generator=g) * 4
    x[3, :] = -1e4  # a row far from its max
    t = torch.randint(0, 1003, (37,), generator=g)
    t[5] = -100
    probs = torch.softmax(torch.randn(37, 1003, generator=g), -1)
    w = torch.rand(1003, generator=g) + 0.5
    row_grad = torch.randn(37, generator=g)
    for variant in ("default", "ptref"):
        for reduction in ("mean", "sum", "none"):
            yield f"ce {variant} {reduction}", lambda L, f, v=variant, r=reduction: probe_call(L, f, x, t, w, r, v)
        yield f"ce {variant} probs", lambda L, f, v=variant: probe_call(L, f, x, probs, None, "mean", v)
        yield f"ce {variant} in place", lambda L, f, v=variant: probe_call(L, f, x, t, w, "mean", v, inplace=True)
        yield f"ce {variant} row_grad", lambda L, f, v=variant: probe_call(L, f, x, t, None, "none", v, row_grad)
    # 64 x 4097 elements, 8 of ATen's grains: ptref splits the probability targets' sum in 2, 3, 4 chunks as
    # torch does on that many threads (one scalar per case: several, so a split that happens to round alike
    # in one does not hide a build that does not split)
    xs, ps = torch.randn(64, 4097, generator=g) * 4, torch.softmax(torch.randn(64, 4097, generator=g), -1)
    for threads in (2, 3, 4):
        for reduction in ("mean", "sum"):
            yield (f"ce ptref probs {reduction} torch_threads={threads}",
                   lambda L, f, r=reduction, k=threads: probe_call(L, f, xs, ps, None, r, "ptref", torch_threads=k))
    # widths around the vector and block boundaries, and enough rows for several reduction blocks
    for V in (1, 7, 8, 9, 15, 16, 17, 31, 33, 255, 257, 4097):
        xv, tv = torch.randn(64, V, generator=g) * 3, torch.randint(0, V, (64,), generator=g)
        for variant in ("default", "ptref"):
            yield f"ce {variant} V={V}", lambda L, f, xv=xv, tv=tv, v=variant: probe_call(L, f, xv, tv, None,
                                                                                           "mean", v)
    xb, tb = torch.randn(4096, 67, generator=g) * 3, torch.randint(0, 67, (4096,), generator=g)
    tb[::7] = -100
    for reduction in ("mean", "sum"):
        yield f"ce default N=4096 {reduction}", lambda L, f, r=reduction: probe_call(L, f, xb, tb, None, r, "default")
    xp, tp = torch.randn(40, 1001, generator=g) * 3, torch.randint(0, 1001, (40,), generator=g)
    tp[::5] = -100
    tp[1:7] = torch.tensor([0, 333, 334, 666, 667, 1000])  # each of 3 shards' first and last column
    for shards in (1, 3):
        yield f"vocab_parallel_ce shards={shards}", lambda L, f, k=shards: vocab_parallel_ce(L, f, xp, tp, k)


# ---- ckparity bench's rows ---------------------------------------------------------

def c_calls(x, t, in_place: bool = False, variant: str = "default"):
    """The C kernel alone on preallocated outputs (in place: on a scratch copy made once), the
    variant's entry point for the logits' dtype (ptref split as torch's threads split it)."""
    options = _bindings.cross_entropy_options(variant=variant, torch_threads=torch.get_num_threads())
    if x.dtype == torch.bfloat16 and variant == "ptref":
        loss, d = torch.empty((), dtype=torch.bfloat16), torch.empty_like(x)
        return lambda: _bindings.cross_entropy_bf16(x, t, options, loss, d)
    call = _bindings.cross_entropy_default_bf16 if x.dtype == torch.bfloat16 else _bindings.cross_entropy
    loss, d = torch.empty(()), torch.empty_like(x)
    if in_place:
        scratch = x.clone()
        return lambda: call(scratch, t, options, loss, scratch)
    return lambda: call(x, t, options, loss, d)


# the fused linear + cross-entropy row: N, D, V (a Llama-3 vocabulary)
FUSED = (4096, 2048, 128256)


def _fused_linear_case(N: int, D: int, V: int, g) -> Case:
    hidden = torch.randn(N, D, generator=g).requires_grad_(True)
    weight = (torch.randn(V, D, generator=g) * D**-0.5).requires_grad_(True)
    t = torch.randint(0, V, (N,), generator=g)

    def run(fn):
        def call():
            hidden.grad = weight.grad = None
            fn(hidden, weight, t).backward()
        return call

    # at least: read hidden and weight, write grad_hidden and grad_weight (the logits never leave the chunk)
    return Case("fused_linear_cross_entropy", f"N={N},D={D},V={V}",
                run(fused_linear_cross_entropy), run(lambda h, w, t: F.cross_entropy(F.linear(h, w), t)),
                8 * (N * D + V * D), once=True)


def _bench(g: torch.Generator, select):
    for N, V in ((2048, 32000), (8192, 256), (8, 256)):
        if select("cross_entropy", f"N={N},V={V}"):
            x = torch.randn(N, V, generator=g).requires_grad_(True)
            t = torch.randint(0, V, (N,), generator=g)
            yield Case("cross_entropy", f"N={N},V={V}", fwd_bwd(cross_entropy, x, t), fwd_bwd(F.cross_entropy, x, t),
                       8 * N * V, c_calls(x.detach(), t), compiled=compiled_fwd_bwd(F.cross_entropy, x, t))
    N, V = 2048, 32000
    if select("cross_entropy", f"N={N},V={V} ptref"):  # torch's bits, where the row above is fused and more accurate
        x, t = torch.randn(N, V, generator=g).requires_grad_(True), torch.randint(0, V, (N,), generator=g)
        yield Case("cross_entropy", f"N={N},V={V} ptref", fwd_bwd(cross_entropy, x, t, variant="ptref"),
                   fwd_bwd(F.cross_entropy, x, t), 8 * N * V, c_calls(x.detach(), t, variant="ptref"),
                   compiled=compiled_fwd_bwd(F.cross_entropy, x, t))
    for (N, V), variant in itertools.product(((2048, 32000), (8, 256)), ("ptref", "default")):
        # the default variant: fused and accurate, not torch's bits
        if select("cross_entropy", f"N={N},V={V} {variant} bf16"):
            xb = torch.randn(N, V, generator=g).bfloat16().requires_grad_(True)
            tb = torch.randint(0, V, (N,), generator=g)
            yield Case("cross_entropy", f"N={N},V={V} {variant} bf16", fwd_bwd(cross_entropy, xb, tb, variant=variant),
                       fwd_bwd(F.cross_entropy, xb, tb), 4 * N * V, c_calls(xb.detach(), tb, variant=variant),
                       compiled=compiled_fwd_bwd(F.cross_entropy, xb, tb))
    N, V = 2048, 32000
    if select("cross_entropy", f"N={N},V={V},inplace_backward"):
        src, t = torch.randn(N, V, generator=g), torch.randint(0, V, (N,), generator=g)
        # in place: fresh logits each call (on every side), dlogits written over them
        yield Case("cross_entropy", f"N={N},V={V},inplace_backward",
                   fresh_fwd_bwd(cross_entropy, src, t, inplace_backward=True),
                   fresh_fwd_bwd(F.cross_entropy, src, t), 8 * N * V, c_calls(src, t, in_place=True),
                   compiled=lambda: fresh_fwd_bwd(torch.compile(F.cross_entropy), src, t))
    if select("cross_entropy", f"N={N},V={V},inplace_backward bf16"):  # the default variant, dlogits over the logits
        src, t = torch.randn(N, V, generator=g).bfloat16(), torch.randint(0, V, (N,), generator=g)
        yield Case("cross_entropy", f"N={N},V={V},inplace_backward bf16",
                   fresh_fwd_bwd(cross_entropy, src, t, inplace_backward=True),
                   fresh_fwd_bwd(F.cross_entropy, src, t), 4 * N * V, c_calls(src, t, in_place=True),
                   compiled=lambda: fresh_fwd_bwd(torch.compile(F.cross_entropy), src, t))
    # lm_head + loss at a 128k vocabulary: timed once per side, in its fresh process (bench_memory.py)
    if select("fused_linear_cross_entropy", f"N={FUSED[0]},D={FUSED[1]},V={FUSED[2]}"):
        yield _fused_linear_case(*FUSED, g)


# lm_head + loss fused, (hidden (N, D), weight (V, D), targets (N)) -> mean loss: chosen by
# --ck-loss-backend like the losses, but it replaces the lm_head's graph too (models.Ops.head_loss)
HEAD_LOSS = {"c_fused_linear": lambda hidden, weight, targets, **kw: fused_linear_cross_entropy(hidden, weight, targets,
                                                                                                **kw)}

def _layout_cases(g):
    """Every tensor argument of ckparity.cross_entropy in both variants (ptref claimed, default held to its
    contiguous bits): logits, class targets (an ignored row; row 0 kept, so an expanded target is a valid
    one), the class weight, probability targets (differentiated), a spatial input, 0 rows; and
    fused_linear_cross_entropy's hidden, weight, bias and targets."""
    N, C = 5, 7
    targets = torch.randint(0, C, (N,), generator=g)
    targets[3] = -100
    calls = (("class targets", lambda f, t: f(t["logits"], t["targets"]), ("logits",),
              {"logits": torch.randn(N, C, generator=g) * 3, "targets": targets}),
             ("class weight, label smoothing, sum",
              lambda f, t: f(t["logits"], t["targets"], weight=t["weight"], label_smoothing=0.1, reduction="sum"),
              ("logits",), {"logits": torch.randn(N, C, generator=g) * 3, "targets": targets,
                            "weight": torch.rand(C, generator=g) + 0.5}),
             ("probability targets", lambda f, t: f(t["logits"], t["probs"]), ("logits", "probs"),
              {"logits": torch.randn(N, C, generator=g) * 3, "probs": torch.rand(N, C, generator=g).softmax(-1)}),
             ("spatial (2, C, 3), reduction none", lambda f, t: f(t["logits"], t["targets"], reduction="none"),
              ("logits",), {"logits": torch.randn(2, C, 3, generator=g), "targets": torch.randint(0, C, (2, 3),
                                                                                                   generator=g)}),
             ("0 rows", lambda f, t: f(t["logits"], t["targets"]), ("logits",),
              {"logits": torch.randn(0, C, generator=g), "targets": torch.zeros(0, dtype=torch.int64)}))
    for label, call, differentiated, tensors in calls:
        for variant in ("default", "ptref"):
            # the class dimension not last is not torch's bits (docs/kernels.md): its own contiguous bits alone
            claim = f"cross_entropy.{variant}" if tensors["logits"].dim() == 2 else None
            yield LayoutCase(f"{label}, {variant}", _variant(variant), F.cross_entropy, call, differentiated,
                             tensors, claim=claim)
    hidden, weight, bias = torch.randn(6, 8, generator=g), torch.randn(11, 8, generator=g), torch.randn(11, generator=g)
    yield LayoutCase("fused_linear_cross_entropy", fused_linear_cross_entropy,
                     lambda h, w, t, bias: F.cross_entropy(F.linear(h, w, bias), t),
                     lambda f, t: f(t["hidden"], t["weight"], t["targets"], bias=t["bias"]), ("hidden", "weight", "bias"),
                     {"hidden": hidden, "weight": weight, "bias": bias, "targets": torch.randint(0, 11, (6,), generator=g)})


KERNEL = Kernel(
    name="cross_entropy",
    used_by=lambda config: config.tp == 1,  # under --tp the CK loss is the vocab-parallel one
    exercise=("one_rank", {"tp": 1}),
    flag="ck_loss_backend",
    slot="loss",
    torch_ops=("cross_entropy", "nll_loss"),
    spellings=("loss",),
    variants=("default", "ptref"),
    # (logits (N, V), targets (N)) -> the mean loss; with --label-smoothing, label_smoothing= too.
    # c_fused_linear is listed so that --ck-loss-backend offers it; on logits alone it is the
    # default kernel, which the fused op runs on each chunk
    backends={"c": _variant("default"), "c_ptref": _variant("ptref"), "torch": F.cross_entropy,
              "c_fused_linear": _variant("default")},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["logits"], t["targets"]), differentiated=("logits",), widths=WIDTHS,
        bad=_BAD,
        options=(("label_smoothing", lambda f, t: f(t["logits"], t["targets"], label_smoothing=0.1),
                  ("logits",)),),
        opinfo=("nn.functional.cross_entropy", _opinfo_sample)),
    gate_cases={
        "cross_entropy.default": GateCase(_variant("default"), F.cross_entropy, _gate_cases, "default"),
        "cross_entropy.default.z_loss": GateCase(_z_loss("default"), _with_z_loss, _z_loss_cases, "default"),
        "cross_entropy.ptref": GateCase(_variant("ptref"), F.cross_entropy, _gate_cases, "ptref"),
    },
    claims=(Claim("cross_entropy.ptref", ("loss", "dlogits"), sweep_ptref),
            Claim("cross_entropy.ptref", ("loss", "dlogits"), sweep_ptref_bf16, dtype="bfloat16")),
    not_claimed={
        "cross_entropy (default variant)": "fused, sums in double: more accurate than torch, not its bits",
        "vocab-parallel cross_entropy": "the default variant's arithmetic, split by rank",
    },
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
)
