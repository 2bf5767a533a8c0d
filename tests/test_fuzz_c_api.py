"""A seeded fuzz of the C API through cffi: every entry point with random
sizes (0, 1, negative, odd), NULL pointers, overlapping buffers,
NaN/Inf/denormal data, out-of-range targets and options out of their
domain. Every call must return a status (never crash), and a call that
returns an error must leave its outputs as they were.

./scripts/test.sh runs this file a second time against the ASan+UBSan build
of the library (CKP_LIB, with libasan preloaded), where an out-of-bounds
read or write, or undefined behaviour, aborts the run.

The buffers are always as large as the sizes passed claim: a caller that
lies about a buffer's size is beyond what any C API can check."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from ckparity._native import ffi, lib
from ckparity.kernels import KERNELS

CASES = 600  # per entry point; a few thousand calls in all
SIZES = [-3, 0, 1, 2, 3, 7, 8, 9, 31, 33, 257]
SPECIAL = [math.nan, math.inf, -math.inf, 1e-45, -1e-45, 1e-38, 3e38, -3e38, 0.0, -0.0]


def data(rng: random.Random, n: int) -> torch.Tensor:
    """n floats (at least one, so a pointer exists), some of them NaN/Inf/denormal."""
    t = torch.randn(max(n, 1), generator=torch.Generator().manual_seed(rng.randrange(2**31))) * rng.choice([1, 30])
    for _ in range(rng.choice([0, 0, 1, 3])):
        t[rng.randrange(t.numel())] = rng.choice(SPECIAL)
    return t


def ptr(t: torch.Tensor | None, offset: int = 0, ctype: str = "float *"):
    """A pointer into t, which the caller must keep alive until the call returns."""
    return ffi.NULL if t is None else ffi.cast(ctype, t.data_ptr() + offset * t.element_size())


def maybe_null(rng: random.Random, t):
    return None if rng.random() < 0.05 else t


def pick(rng: random.Random, good, *bad):
    """Mostly a value in the domain, now and then one outside it: enough calls get through."""
    return rng.choice(bad) if bad and rng.random() < 0.12 else (rng.choice(good) if isinstance(good, list) else good)


def call_and_check(rng: random.Random, call, outputs: list[torch.Tensor]) -> int:
    """Runs call(); on an error status the outputs must be unchanged."""
    for t in outputs:
        t.fill_(rng.choice([7.25, -0.5]))
    before = [t.clone() for t in outputs]
    status = call()
    assert status in (lib.CKP_OK, lib.CKP_ERR_NULL_POINTER, lib.CKP_ERR_BAD_SIZE, lib.CKP_ERR_TARGET_OUT_OF_RANGE,
                      lib.CKP_ERR_BAD_OPTION, lib.CKP_ERR_ALIASING, lib.CKP_ERR_OUT_OF_MEMORY), \
        f"unknown status {status}"
    if status != lib.CKP_OK:
        assert ffi.string(lib.ckp_last_error()), "an error status without a message"
        for a, b in zip(outputs, before):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "an output was written on error"
    return status


def fuzz_cross_entropy(rng: random.Random) -> int:
    N, V = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:], -3, 0)
    n = max(N, 0) * max(V, 0)
    logits = data(rng, n + 1)
    probs = rng.random() < 0.3
    target = torch.tensor([pick(rng, [-100, 0, max(V - 1, 0)], -1, max(V, 0), 10**9)
                           for _ in range(max(N, 1))], dtype=torch.int64)
    target_probs = data(rng, n).abs() if probs else None
    weight = data(rng, max(V, 1)).abs() if rng.random() < 0.3 else None
    row_grad = data(rng, max(N, 1)) if rng.random() < 0.2 else None
    opt = ffi.new("ckp_cross_entropy_options *")
    lib.ckp_cross_entropy_options_init(opt)
    opt.weight, opt.row_grad = ptr(weight), ptr(row_grad)
    opt.ignore_index = rng.choice([-100, 0, 1])
    opt.reduction = pick(rng, [0, 1, 2], 5, 1000)
    opt.label_smoothing = pick(rng, [0.0, 0.1, 1.0], -0.1, 1.5, math.nan)
    opt.z_loss = pick(rng, [0.0, 1e-4], -1.0, math.inf)
    opt.variant = pick(rng, [0, 1], 7)
    opt.torch_threads = pick(rng, [1, 2, 7], 0, -3)
    loss = torch.empty(max(N, 1) + 1)
    dlogits_buffer = torch.empty(n + 1)
    aliasing = rng.random()
    if aliasing < 0.1:
        dlogits_buffer, dlogits_ptr = logits, ptr(logits, 1)   # partial overlap: must be refused
    elif aliasing < 0.2:
        dlogits_buffer, dlogits_ptr = logits, ptr(logits)      # exact in place: allowed
    else:
        dlogits_ptr = ffi.NULL if rng.random() < 0.2 else ptr(dlogits_buffer)
    outputs = [loss] + ([dlogits_buffer] if dlogits_buffer is not logits else [])
    return call_and_check(rng, lambda: lib.ckp_cross_entropy(
        ptr(maybe_null(rng, logits)), ffi.NULL if probs else ptr(target, 0, "int64_t *"), ptr(target_probs), N, V,
        opt if rng.random() > 0.03 else ffi.NULL, ptr(maybe_null(rng, loss)), dlogits_ptr), outputs)


def fuzz_rms_norm(rng: random.Random) -> int:
    N, D = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:], -3, 0)
    n = max(N, 0) * max(D, 0)
    x, weight = data(rng, n), data(rng, max(D, 1)) if rng.random() < 0.7 else None
    y, rstd = torch.empty(n + 1), torch.empty(max(N, 1))
    eps = pick(rng, [1e-5, 0.0], -1e-5, math.nan, math.inf)
    torch_threads = pick(rng, [1, 2, 7], 0, -3)
    if rng.random() < 0.5:
        return call_and_check(rng, lambda: lib.ckp_rms_norm_forward(
            ptr(maybe_null(rng, x)), ptr(weight), N, D, eps, ptr(maybe_null(rng, y)), ptr(rstd), torch_threads),
            [y, rstd])
    dy = data(rng, n)
    rstd = data(rng, max(N, 1)).abs()  # a forward's rstd is positive
    # no dweight with a weight: its gradient not wanted; a dweight without a weight: refused
    dweight = torch.empty(max(D, 1)) if (weight is not None) != (rng.random() < 0.1) else None
    dx = x if rng.random() < 0.05 else (dy if rng.random() < 0.1 else torch.empty(n + 1))  # in place on dy is allowed
    outputs = [t for t in (dx, dweight) if t is not None and t is not x and t is not dy]
    if rng.random() < 0.5:
        return call_and_check(rng, lambda: lib.ckp_rms_norm_backward(
            ptr(dy), ptr(x), ptr(weight), ptr(rstd), N, D, ptr(maybe_null(rng, dx)), ptr(dweight), torch_threads),
            outputs)
    # the two-term form: dx_rstd may overlap nothing (dx, dy, x: refused)
    dx_rstd = rng.choice([x, dy, dx]) if rng.random() < 0.1 else torch.empty(n + 1)
    outputs += [dx_rstd] if all(dx_rstd is not t for t in (x, dy, dx)) else []
    return call_and_check(rng, lambda: lib.ckp_rms_norm_backward_terms(
        ptr(dy), ptr(x), ptr(weight), ptr(rstd), N, D, ptr(maybe_null(rng, dx)), ptr(maybe_null(rng, dx_rstd)),
        ptr(dweight), torch_threads), outputs)


def fuzz_swiglu(rng: random.Random) -> int:
    N, H = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:], -3, 0)
    x = data(rng, max(N, 0) * 2 * max(H, 0))
    out = torch.empty(max(N, 0) * max(H, 0) + 1)
    if rng.random() < 0.5:
        target = x if rng.random() < 0.05 else out
        return call_and_check(rng, lambda: lib.ckp_swiglu_forward(ptr(maybe_null(rng, x)), N, H, ptr(target)),
                              [out] if target is out else [])
    dout = data(rng, max(N, 0) * max(H, 0))
    dx = x if rng.random() < 0.05 else torch.empty(x.numel() + 1)
    return call_and_check(rng, lambda: lib.ckp_swiglu_backward(ptr(maybe_null(rng, dout)), ptr(x), N, H, ptr(dx)),
                          [dx] if dx is not x else [])


def fuzz_rope(rng: random.Random) -> int:
    N, T, d = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:6], 0), pick(rng, [2, 4, 8, 66], 0, 7, -2)
    n = max(N, 0) * max(T, 0) * max(d, 0)
    x = data(rng, n)
    cos, sin = data(rng, max(T, 1) * max(d, 2) // 2), data(rng, max(T, 1) * max(d, 2) // 2)
    out = x if rng.random() < 0.05 else torch.empty(n + 1)
    layout = pick(rng, [0, 1], 2, 100)
    call = lib.ckp_rope_forward if rng.random() < 0.5 else lib.ckp_rope_backward
    return call_and_check(rng, lambda: call(ptr(maybe_null(rng, x)), ptr(cos), ptr(maybe_null(rng, sin)), N, T, d,
                                            layout, ptr(out)), [out] if out is not x else [])


def fuzz_vocab_parallel_ce(rng: random.Random) -> int:
    N, V_local = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:], 0, -1)
    V = max(V_local, 1) + pick(rng, [0, 5, 40], -1)
    vocab_start = pick(rng, [0, max(V - max(V_local, 1), 0)], -1, V)
    n = max(N, 0) * max(V_local, 0)
    logits = data(rng, n)
    target = torch.tensor([pick(rng, [-100, 0, max(V - 1, 0)], -5, V, 10**9) for _ in range(max(N, 1))])
    row_max, sums = data(rng, max(N, 1)), data(rng, 3 * max(N, 1)).double().abs()
    ignore, ls, z = -100, pick(rng, [0.0, 0.1], -0.5, 2.0, math.nan), pick(rng, [0.0, 1e-3], -1.0, math.inf)
    which = rng.randrange(4)
    if which == 0:
        out = torch.empty(max(N, 1))
        return call_and_check(rng, lambda: lib.ckp_vocab_parallel_ce_max(ptr(maybe_null(rng, logits)), N, V_local,
                                                                        ptr(out)), [out])
    if which == 1:
        out = torch.empty(3 * max(N, 1), dtype=torch.float64)
        return call_and_check(rng, lambda: lib.ckp_vocab_parallel_ce_sums(
            ptr(logits), ptr(maybe_null(rng, target), 0, "int64_t *"), N, V_local, vocab_start, V, ignore,
            ptr(row_max), ptr(out, 0, "double *")), [out])
    if which == 2:
        out = torch.empty(max(N, 1))
        return call_and_check(rng, lambda: lib.ckp_vocab_parallel_ce_loss(
            ptr(target, 0, "int64_t *"), N, V, ignore, ls, z, ptr(row_max), ptr(sums, 0, "double *"),
            ptr(maybe_null(rng, out))), [out])
    row_grad = data(rng, max(N, 1))
    out = torch.empty(n + 1)
    return call_and_check(rng, lambda: lib.ckp_vocab_parallel_ce_backward(
        ptr(logits), ptr(target, 0, "int64_t *"), N, V_local, vocab_start, V, ignore, ls, z, ptr(row_max),
        ptr(sums, 0, "double *"), ptr(row_grad), ptr(maybe_null(rng, out))), [out])


def fuzz_compare(rng: random.Random) -> int:
    n = pick(rng, SIZES[2:], -3, 0)
    a, b = data(rng, n), data(rng, n)
    out = ffi.new("double[2]", [7.25, 7.25])
    differing = ffi.new("int64_t *", 7)
    status = lib.ckp_compare(ptr(maybe_null(rng, a)), ptr(b), n, out, out + 1, differing)
    if status != lib.CKP_OK:
        assert (out[0], out[1], differing[0]) == (7.25, 7.25, 7), "an output was written on error"
    return status


def fuzz_adamw(rng: random.Random) -> int:
    n = pick(rng, SIZES[2:], -3, 0)
    p, g, m = data(rng, n), data(rng, n), data(rng, n)
    v = data(rng, n).abs()
    vmax = data(rng, n).abs() if rng.random() < 0.5 else None
    opt = ffi.new("ckp_adamw_options *")
    opt.lr = pick(rng, [1e-3, 0.0], -1e-3, math.nan)
    opt.beta1, opt.beta2 = pick(rng, [0.9, 0.0], 1.0, -0.1), pick(rng, 0.999, 1.0, math.nan)
    opt.eps, opt.weight_decay = pick(rng, [1e-8, 0.0], -1.0), pick(rng, [0.01, 0.0], -0.01, math.inf)
    opt.amsgrad, opt.maximize = rng.random() < 0.5, rng.random() < 0.5
    grad = p if rng.random() < 0.05 else g  # aliasing: must be refused
    step = pick(rng, [1.0, 2.0, 100.0], 0.0, -1.0, 1.5, math.nan)
    outputs = [p, m, v] + ([vmax] if vmax is not None else [])
    return call_and_check(rng, lambda: lib.ckp_adamw_step(
        ptr(maybe_null(rng, p)), ptr(grad), ptr(m), ptr(v), ptr(vmax), n, step,
        opt if rng.random() > 0.03 else ffi.NULL), outputs)


def fuzz_grad_norm(rng: random.Random) -> int:
    count = pick(rng, [0, 1, 2, 5], -1)
    tensors = [data(rng, rng.choice(SIZES[1:])) for _ in range(max(count, 0))]
    sizes = [rng.choice([t.numel(), 0, -1]) if rng.random() < 0.1 else t.numel() for t in tensors]
    arr = ffi.new("const float *[]", [ptr(maybe_null(rng, t)) for t in tensors] or [ffi.NULL])
    sizes_arr = ffi.new("int64_t[]", sizes or [0])
    out = ffi.new("double *", 7.25)
    norm_type = pick(rng, [2.0, 1.0, 3.0, math.inf], 0.0, -1.0, math.nan, -math.inf)
    status = lib.ckp_grad_norm(arr, sizes_arr, count, norm_type, out)
    if status != lib.CKP_OK:
        assert out[0] == 7.25, "total_norm was written on error"
    return status


def fuzz_bf16(rng: random.Random) -> int:
    """The bfloat16 entry points (rms_norm, swiglu, rope, adamw, cross_entropy) and the float16 ones (rms_norm,
    swiglu, rope): uint16 buffers, the float32 ones' sizes and aliasing."""
    N, W = pick(rng, SIZES[2:], -3, 0), pick(rng, SIZES[2:], -3, 0)
    n = max(N, 0) * max(W, 0)
    bf16 = lambda t: None if t is None else t.bfloat16()  # noqa: E731
    hp = lambda t: ptr(t, 0, "uint16_t *")  # noqa: E731
    kind = rng.randrange(7)
    if kind == 6:  # cross_entropy on bf16: ptref, or the default's entry; class targets or bf16 probabilities
        x = bf16(data(rng, n))
        default = rng.random() < 0.4
        probs = rng.random() < 0.4
        f32p = probs and rng.random() < 0.4  # float32 probabilities: ckp_cross_entropy_probs_bf16_f32p, loss float32
        target = (data(rng, n).abs() if f32p else bf16(data(rng, n).abs()) if probs else
                  torch.tensor([pick(rng, [-100, 0, max(W - 1, 0)], -1, max(W, 0)) for _ in range(max(N, 1))],
                               dtype=torch.int64))
        weight = bf16(data(rng, max(W, 1)).abs()).float() if rng.random() < 0.5 else None  # bf16 values as floats
        opt = ffi.new("ckp_cross_entropy_options *")
        lib.ckp_cross_entropy_options_init(opt)
        opt.variant = pick(rng, [0], 1) if default else pick(rng, [1], 0)
        opt.reduction = pick(rng, [0, 1, 2], 7)
        opt.label_smoothing = pick(rng, [0.0, 0.1, 1.0], -0.5, 1.5, float("nan"))
        opt.z_loss = pick(rng, [0.0, 1e-4], -1.0) if default else pick(rng, [0.0], 1e-4)
        opt.torch_threads = pick(rng, [1, 2], 0)
        opt.weight = ptr(weight)
        loss = torch.empty(max(N, 1) + 1, dtype=torch.float32 if default or f32p else torch.bfloat16)
        dlogits = x if rng.random() < 0.05 else (None if rng.random() < 0.2 else torch.empty(n + 1, dtype=torch.bfloat16))
        target_ptr = ptr(target) if f32p else hp(target) if probs else ptr(target, 0, "int64_t *")
        if f32p:
            call = lambda: lib.ckp_cross_entropy_probs_bf16_f32p(  # noqa: E731
                hp(maybe_null(rng, x)), ffi.NULL if rng.random() < 0.05 else target_ptr, N, W, opt, ptr(maybe_null(rng, loss)), hp(dlogits))
        elif default:
            call = lambda: lib.ckp_cross_entropy_default_bf16(  # noqa: E731
                hp(maybe_null(rng, x)), ffi.NULL if probs else target_ptr, target_ptr if probs else ffi.NULL, N, W,
                opt, ptr(maybe_null(rng, loss)), hp(dlogits))
        else:
            entry = lib.ckp_cross_entropy_probs_bf16 if probs else lib.ckp_cross_entropy_bf16
            call = lambda: entry(hp(maybe_null(rng, x)), target_ptr, N, W, opt, hp(maybe_null(rng, loss)),  # noqa: E731
                                 hp(dlogits))
        return call_and_check(rng, call, [t for t in (loss, dlogits) if t is not None and t is not x])
    if kind == 5:  # adamw: param, grad and moments of n
        p, grad, m = (bf16(data(rng, max(N, 1))) for _ in range(3))
        v, vmax = bf16(data(rng, max(N, 1)).abs()), bf16(data(rng, max(N, 1)).abs()) if rng.random() < 0.5 else None
        opt = ffi.new("ckp_adamw_options *")
        opt.lr, opt.beta1, opt.beta2, opt.eps = pick(rng, [1e-3, 0.0], -1e-3), 0.9, pick(rng, 0.999, 1.0), 1e-8
        opt.amsgrad = vmax is not None and rng.random() < 0.9
        grad = p if rng.random() < 0.05 else grad  # aliasing: must be refused
        return call_and_check(rng, lambda: lib.ckp_adamw_step_bf16(
            hp(maybe_null(rng, p)), hp(grad), hp(m), hp(v), hp(vmax), N, pick(rng, [1.0, 7.0], 0.0, 1.5), opt),
            [t for t in (p, m, v, vmax) if t is not None])
    if kind == 4:  # rope: x (N, T, d), cos and sin (T, d/2)
        T, d = pick(rng, [1, 3], 0, -1), pick(rng, [2, 8, 34], 3, 0)
        x = bf16(data(rng, max(N, 0) * max(T, 0) * max(d, 0)))
        table = [bf16(data(rng, max(T, 0) * max(d, 0) // 2)) for _ in range(2)]
        out = x if rng.random() < 0.05 else torch.empty(x.numel() + 1, dtype=torch.bfloat16)
        entry = rng.choice([lib.ckp_rope_forward_bf16, lib.ckp_rope_backward_bf16, lib.ckp_rope_forward_f16,
                            lib.ckp_rope_backward_f16])
        return call_and_check(rng, lambda: entry(hp(maybe_null(rng, x)), hp(table[0]), hp(table[1]), N, T, d,
                                                 pick(rng, [0, 1], 2), hp(out)), [out] if out is not x else [])
    # rms_norm: a bf16 weight, or a float32 one (the _f32w entry points: torch's mixed-dtype call)
    f32w = rng.random() < 0.3
    wp = ptr if f32w else hp
    if kind == 0:
        x = bf16(data(rng, n))
        weight = (data(rng, max(W, 1)) if f32w else bf16(data(rng, max(W, 1)))) if rng.random() < 0.7 else None
        y = x if rng.random() < 0.05 else torch.empty(n + 1, dtype=torch.bfloat16)
        rstd = torch.empty(max(N, 1))
        eps = pick(rng, [1e-5, 0.0], -1e-5, math.nan)
        entry = getattr(lib, "ckp_rms_norm_forward" + rng.choice(["_bf16", "_f16"]) + ("_f32w" if f32w else ""))
        return call_and_check(rng, lambda: entry(
            hp(maybe_null(rng, x)), wp(weight), N, W, eps, hp(maybe_null(rng, y)), ptr(rstd), 1),
            [t for t in (y, rstd) if t is not x])
    if kind == 1:
        dy, x = bf16(data(rng, n)), bf16(data(rng, n))
        weight = (data(rng, max(W, 1)) if f32w else bf16(data(rng, max(W, 1)))) if rng.random() < 0.7 else None
        rstd = data(rng, max(N, 1)).abs()
        dweight = (torch.empty(max(W, 1), dtype=torch.float32 if f32w else torch.bfloat16)
                   if (weight is not None) != (rng.random() < 0.1) else None)
        dx = dy if rng.random() < 0.05 else torch.empty(n + 1, dtype=torch.bfloat16)
        entry = getattr(lib, "ckp_rms_norm_backward" + rng.choice(["_bf16", "_f16"]) + ("_f32w" if f32w else ""))
        return call_and_check(rng, lambda: entry(
            hp(dy), hp(maybe_null(rng, x)), wp(weight), ptr(rstd), N, W, hp(maybe_null(rng, dx)), wp(dweight), 1),
            [t for t in (dx, dweight) if t is not None and t is not dy])
    # swiglu: its bf16 or its float16 entry points (the same uint16 buffers)
    half = rng.random() < 0.5
    dtype = torch.float16 if half else torch.bfloat16
    forward, backward = ((lib.ckp_swiglu_forward_f16, lib.ckp_swiglu_backward_f16) if half else
                         (lib.ckp_swiglu_forward_bf16, lib.ckp_swiglu_backward_bf16))
    x = data(rng, max(N, 0) * 2 * max(W, 0)).to(dtype)
    if kind == 2:
        out = x if rng.random() < 0.05 else torch.empty(n + 1, dtype=dtype)
        return call_and_check(rng, lambda: forward(hp(maybe_null(rng, x)), N, W, hp(out)),
                              [out] if out is not x else [])
    dout = data(rng, n).to(dtype)
    dx = x if rng.random() < 0.05 else torch.empty(x.numel() + 1, dtype=dtype)
    return call_and_check(rng, lambda: backward(hp(maybe_null(rng, dout)), hp(x), N, W, hp(dx)),
                          [dx] if dx is not x else [])


_C_TYPES = {"f": (torch.float32, "float *"), "h": (torch.bfloat16, "uint16_t *"), "i": (torch.int64, "int64_t *"),
            "d": (torch.float64, "double *")}


def fuzz_record_entry(entry, rng: random.Random) -> int:
    """A record's C entry point (kernels.record.CEntry): sizes from SIZES (0 and negative now and then), a NULL
    now and then, an output placed exactly over an input (in place) or one element into it (a partial overlap)."""
    sizes = {k: pick(rng, SIZES[2:], -3, 0) for k in entry.sizes}
    counts = {b.name: max(b.count({k: max(v, 0) for k, v in sizes.items()}), 0) for b in entry.buffers}
    buffers = {b.name: data(rng, counts[b.name] + 1).to(_C_TYPES[b.kind][0]) for b in entry.buffers}
    pointers = {b.name: ptr(maybe_null(rng, buffers[b.name]), 0, _C_TYPES[b.kind][1]) for b in entry.buffers}
    outputs = [b for b in entry.buffers if b.output]
    inputs = [b for b in entry.buffers if not b.output and b.kind in {o.kind for o in outputs}]
    aliased = set()
    if inputs and rng.random() < 0.2:
        onto = rng.choice(inputs)
        # an output placed in an input's buffer only where that buffer holds all of it (a caller's lie about
        # a buffer's size is beyond what a C API can check)
        fits = [b for b in outputs if b.kind == onto.kind and counts[b.name] + 1 <= counts[onto.name]]
        if fits:
            o = rng.choice(fits)
            pointers[o.name] = ptr(buffers[onto.name], rng.choice([0, 1]), _C_TYPES[o.kind][1])
            aliased.add(o.name)
    checked = [buffers[b.name] for b in outputs if b.name not in aliased]
    return call_and_check(rng, lambda: entry.call(lib, pointers, sizes), checked)


FUZZERS = [(f.__name__.removeprefix("fuzz_"), f) for f in (
    fuzz_cross_entropy, fuzz_rms_norm, fuzz_swiglu, fuzz_rope, fuzz_vocab_parallel_ce, fuzz_compare, fuzz_adamw,
    fuzz_grad_norm, fuzz_bf16)]
FUZZERS += [(e.name, functools.partial(fuzz_record_entry, e)) for k in KERNELS.values() for e in k.c_entries]


@pytest.mark.parametrize("name,entry", FUZZERS, ids=[name for name, _ in FUZZERS])
def test_fuzz_every_entry_point(name, entry):
    rng = random.Random(f"ckparity-fuzz-fuzz_{name}")
    statuses = [entry(rng) for _ in range(CASES)]
    # the fuzz reaches both sides of the API: calls that succeed and calls that are refused
    assert statuses.count(lib.CKP_OK) > CASES // 20, "almost every call was refused: the fuzz tests nothing"
    assert len(set(statuses)) >= 3, f"only statuses {set(statuses)}"
