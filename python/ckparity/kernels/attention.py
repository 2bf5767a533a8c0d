"""attention: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=...) without dropout -- the llama
and GPT-2 twins' attention. Its C backend (csrc/attention.c, [Note: ATen's CPU flash attention]) computes what
ATen's CPU flash kernel computes for float32 training: bit for bit with torch's forward, logsumexp and q, k, v
gradients at every capability, with torch at one thread on MKL's modelled branch (and at 2 on its AVX2 branch's own
order, where a pass of one parallel item lets MKL share its GEMMs between threads), wherever each of the kernel's
GEMMs follows MKL's order (csrc/linear.c): not a q block of one row (Tq one past a multiple of the q split: 32,
64 or 256, so Tq = 1 too), a head dim of 1, a key block of 1 (Tk one past a multiple of 512), or MKL's skinny
region (a key block of 2 or 3 against a few q rows, 32 <= d < 24 rows: Tq, Tk <= 3; MKL's AVX2 branch's own
order, on a CPU without AVX-512 or an AMD one past Zen 4, has none of these: its small paths and gemv are followed) (followed()).
A user's attention is judged here ("as accurate as torch" unless bitwise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import cpu
from .._native import ffi, lib
from ..ops.attention import attention as c_attention
from ..ops.attention import attention_backward, attention_forward, bf16_followed, bf16_gemm
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import grads_present, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import Tally, grad_run, sgemm_thread_counts, spread, torch_threads

HEADS, KV_HEADS, T = 4, 2, 5  # the conformance cases: GQA (two query heads a kv head), 5 positions


def attention(q, k, v, *, is_causal: bool = True, enable_gqa: bool = False, scale: float | None = None):
    """torch's attention as the twins call it: causal, no dropout, no mask."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa, scale=scale)


def attention_c(q, k, v, *, is_causal: bool = True, enable_gqa: bool = False, scale: float | None = None):
    """ckparity's C attention with the slot's defaults (causal)."""
    return c_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa, scale=scale)


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g).requires_grad_(True)
    k, v = (torch.randn(2, 2, 5, 8, generator=g).requires_grad_(True) for _ in range(2))
    y = fn(q, k, v, is_causal=True, enable_gqa=True)
    tensor_like(y, (2, 4, 5, 8), "attention(q (2, 4, 5, 8), k and v (2, 2, 5, 8), is_causal, enable_gqa)")
    y.backward(torch.randn(2, 4, 5, 8, generator=g))
    grads_present({"q": q, "k": k, "v": v})


def _make(width, rows, g):
    """q (rows, HEADS, T, d = width), k and v (rows, KV_HEADS, T, d): the rows are the batch."""
    return {"q": torch.randn(rows, HEADS, T, width, generator=g), "k": torch.randn(rows, KV_HEADS, T, width, generator=g),
            "v": torch.randn(rows, KV_HEADS, T, width, generator=g)}


def _call(fn, t, **options):
    return fn(t["q"], t["k"], t["v"], is_causal=True, enable_gqa=True, **options)


_BAD = (BadInput("k and v of head dim 4 for q of head dim 8", "shape",
                 lambda fn: fn(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4),
                               is_causal=True, enable_gqa=False)),)


def _opinfo_sample(s):
    """torch's own SDPA samples without a mask or dropout (neither is in the slot), 4-D."""
    k, v = s.args[0], s.args[1]
    kw = dict(s.kwargs)
    if kw.get("attn_mask") is not None or kw.get("dropout_p", 0.0) or s.input.dim() != 4 or len(s.args) > 2:
        return None
    causal, gqa, scale = bool(kw.get("is_causal", False)), bool(kw.get("enable_gqa", False)), kw.get("scale")
    tensors = {"q": s.input, "k": k, "v": v}
    return (lambda f, t: f(t["q"], t["k"], t["v"], is_causal=causal, enable_gqa=gqa, scale=scale)), tensors, ("q", "k", "v")


def _split(tq: int) -> int:
    return min(256 if tq >= 768 else 64 if tq >= 192 else 32, tq)


def followed(tq: int, tk: int, d: int) -> bool:
    """Whether every GEMM of ATen's flash kernel at these sizes takes the order csrc/linear.c follows (the
    module's docstring): no one-row q block or one-key block (MKL's gemv), no head dim of 1. MKL's AVX-512 branch:
    not its skinny region either (2 or 3 keys against 2..15 q rows with 32 <= d < 24 rows). Its AVX2 branch's own
    order: every size (under 4 rows or 12 columns its small paths, followed: [Note: MKL's AVX2 small sgemm]
    and its by-columns Note, which start a row at its 16-byte boundary -- so ckparity's op reads dO and writes
    dQ, dK and dV where ATen's do; one row or column its gemv), d = 1 where its one-column forms were measured (an
    AMD CPU with AVX-512, a Zen 5; not the AVX2-only EPYC). MKL's strict order: every size."""
    if cpu.mkl_strict():
        return True
    if cpu.mkl_avx2_own():  # its gemv followed too; d = 1's two forms of one column ([Note: MKL's AVX2 sgemv])
        return d >= 2 or cpu.avx512_but_mkl_avx2()  # where they were measured: the Zen 5
    qs, ks = _split(tq), min(512, tk)
    q_rows = {qs, tq % qs or qs}
    k_cols = {ks, tk % ks or ks}
    if d == 1 or tq % qs == 1 or tk % ks == 1:
        return False
    return not any((n == 2 and m < 16 or n == 3 and m < 11) and 32 <= d < 24 * m for m in q_rows for n in k_cols)


def _bf16_not_followed() -> str | None:
    """Why bf16 attention is not torch's bits in this process, or None."""
    if not bf16_followed():
        return ("torch's bf16 flash kernel runs GEMMs ckparity does not follow in bf16 here (oneDNN, or MKL off its "
                "AVX2 branch)")
    if torch.backends.cpu.get_cpu_capability() == "AVX512" and bf16_gemm() == lib.CKP_BF16_GEMM_ATEN:
        return "the bf16 flash kernel at AVX512 on ATen's own bf16 loops is not measured (a CPU with AVX-512 runs " \
               "oneDNN's bf16 GEMMs unless it is off)"
    return None


def followed_bf16(tq: int, tk: int) -> bool:
    """Whether every GEMM of torch's bf16 flash kernel at these sizes takes the order ckparity follows: MKL's bf16
    GEMM is its sgemm on widened copies whose rows start at 16-byte boundaries, except with one row or one column
    (a one-row q block, a one-key block: its own paths, csrc/attention.c's mkl_bf16_gemv). Every size where those
    and the short sequences (under 12: MKL's small paths on its copies' boundaries, [Note: ATen's bf16 flash
    attention]) were measured -- an AMD CPU with AVX-512 whose MKL runs its AVX2 code (a Zen 5); on the AVX2-only
    EPYC, where neither was measured, sequences of 12 or more without a one-row q block or a one-key block."""
    if cpu.avx512_but_mkl_avx2():
        return True
    qs, ks = _split(tq), min(512, tk)
    return min(tq, tk) >= 12 and 1 not in {qs, tq % qs or qs} and 1 not in {ks, tk % ks or ks}


def _spread(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """V's and dO's spread values (sweeping.spread): a one-item pass at 2 threads showed dq differing in 38 of 48
    backwards on them."""
    return spread(*shape, generator=generator, octaves=6)


def _case(tally: Tally, label: str, B: int, H: int, Hkv: int, tq: int, tk: int, d: int, causal: bool,
          g: torch.Generator, scale: float | None = None, dtype: torch.dtype = torch.float32,
          spread: bool = False) -> None:
    threads_swept = sgemm_thread_counts()
    if dtype == torch.bfloat16 and (B * Hkv == 1 or B * H * -(-tq // _split(tq)) == 1):
        threads_swept = (1,)  # a pass of one item runs MKL's bf16 GEMM on torch's threads: its own split, not followed
    values = _spread if spread else torch.randn  # v and dO: q and k stay normal (the softmax's inputs)
    q = torch.randn(B, H, tq, d, generator=g).to(dtype)
    k, v = torch.randn(B, Hkv, tk, d, generator=g).to(dtype), values(B, Hkv, tk, d, generator=g).to(dtype)
    up = values(B, H, tq, d, generator=g).to(dtype)
    kw = {"is_causal": causal, "enable_gqa": H != Hkv, "scale": scale}
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    for threads in threads_swept:
        with torch_threads(threads):  # ckparity's GEMMs follow MKL at torch's thread count too
            ours = grad_run(lambda *t: c_attention(*t, **kw), [q, k, v], up)
            theirs = grad_run(lambda *t: F.scaled_dot_product_attention(*t, **kw), [q, k, v], up)
        for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
            tally.add(name, f"{label} torch threads {threads}", a, b)


def sweep(tally: Tally, g: torch.Generator) -> None:
    """out, dq, dk, dv against F.scaled_dot_product_attention at sgemm_thread_counts(): every head dim 2..300 at
    Tq = Tk = 37 (a q block of 32 and one of 5; causal and not, GQA), every sequence 2..300 at d 24 and 64
    (every q split and tail, the key blocks; causal and not; MHA and GQA), long ones across the 256 and 512
    blocks, Tq != Tk, a scale, head dim 1 at sequences 1..513; the sizes some GEMM of which MKL runs in an order
    not followed skipped (followed())."""
    for d in [w for w in WIDTHS if w <= 300]:
        if followed(37, 37, d):
            _case(tally, f"T=37 d={d}", 1, 2, 1, 37, 37, d, d % 2 == 0, g)
    for t in range(2, 301):
        if followed(t, t, 24):
            _case(tally, f"T={t} d=24 mha", 1, 2, 2, t, t, 24, t % 2 == 1, g)
        if followed(t, t, 64):
            _case(tally, f"T={t} d=64 gqa causal", 1, 4, 2, t, t, 64, True, g)
    for t in (383, 384, 511, 512, 767, 768, 1031):
        if followed(t, t, 32):  # 1031: a q block and a key block of 7 (on the AVX2 branch, its small paths)
            _case(tally, f"T={t} d=32", 1, 2, 1, t, t, 32, t % 2 == 0, g)
    for tq, tk in ((40, 100), (100, 40), (64, 600)):
        _case(tally, f"Tq={tq} Tk={tk} d=16", 2, 2, 2, tq, tk, 16, False, g)
    _case(tally, "T=64 d=48 scale 0.3", 2, 4, 4, 64, 64, 48, True, g, scale=0.3)
    # d = 1: every P.V, dQ, dK and dV is one column, MKL's gemv or sweep; a second batch item starts its rows past
    # a 16-byte boundary (the sweep's first outputs), heads of one and more (dQ's column strided or not), one-row q
    # blocks (T = 33, 65) and a one-key block (T = 513), a scale (alpha on the sweep's vector), a backward of one
    # item (3 heads on one kv head, one batch item: MKL has torch's threads)
    for t in (1, 2, 5, 9, 17, 33, 65, 100, 513):
        for B, H, Hkv in ((2, 1, 1), (2, 2, 2), (1, 3, 1)):
            if followed(t, t, 1):
                _case(tally, f"T={t} d=1 B={B} heads {H}/{Hkv}", B, H, Hkv, t, t, 1, t % 2 == 1, g,
                      scale=0.3 if H == 2 else None)


def sweep_bf16(tally: Tally, g: torch.Generator) -> None:
    """out, dq, dk, dv in bf16 against F.scaled_dot_product_attention where torch's bf16 flash kernel runs on GEMMs
    ckparity follows (ops.attention.bf16_followed): the float sweep's sizes (every head dim from 1, at 1 and 2 kv
    heads), in bf16, at 1 and 2 torch threads -- at 1 only where a pass has one parallel item (_case); the sizes
    followed_bf16 leaves out skipped (where not measured: a one-row q block or a one-key block, a sequence under 12).
    Every other case has V and dO spread over 2^-6..2^6 (_spread), where an order shows through bf16.
    One-row q blocks and one-key blocks at five head dims; every head dim at T = 5 too (`check`'s sequence: MKL's small paths at every C width, where its copies' 16-byte
    boundaries decide the order; the tensors' own addresses gave dQ other bits at 45 of 300)."""
    swept = [0]

    def case(label, B, H, Hkv, tq, tk, d, causal, scale=None):  # every other case on spread values (_spread)
        if followed_bf16(tq, tk):
            swept[0] += 1
            spread = swept[0] % 2 == 0
            _case(tally, label + " spread" * spread, B, H, Hkv, tq, tk, d, causal, g, scale=scale, dtype=torch.bfloat16,
                  spread=spread)
    for d in [w for w in WIDTHS if w <= 300]:
        case(f"T=37 d={d}", 1, 2, 1, 37, 37, d, d % 2 == 0)
        case(f"T=37 d={d} 2 kv heads", 1, 4, 2, 37, 37, d, d % 2 == 1)
        case(f"T=5 d={d}", 1, 2, 2, 5, 5, d, True)
    for t in range(2, 301):
        case(f"T={t} d=24 mha", 1, 2, 2, t, t, 24, t % 2 == 1)
        case(f"T={t} d=64 gqa causal", 1, 4, 2, t, t, 64, True)
    for t in (383, 384, 511, 512, 767, 768, 1031):
        case(f"T={t} d=32", 1, 2, 1, t, t, 32, t % 2 == 0)
    for tq, tk in ((40, 100), (100, 40), (64, 600)):
        case(f"Tq={tq} Tk={tk} d=16", 2, 2, 2, tq, tk, 16, False)
    case("T=64 d=48 scale 0.3", 2, 4, 4, 64, 64, 48, True, scale=0.3)
    # one-row q blocks (T = 1, 33, 65, 193, 449) and one-key blocks (513): MKL's bf16 GEMM of one row or column
    for t in (1, 33, 65, 193, 449, 513):
        for d in (1, 5, 24, 64, 128):
            case(f"T={t} d={d} one-row or one-key blocks", 2, 2, 1, t, t, d, t % 2 == 1, scale=0.3 if d == 5 else None)


def _flash_sdpa(q, k, v, **kw):
    """torch's flash kernel on these values: torch runs its math path instead (softmax of the whole product,
    another order) where a last dim is not contiguous or the inputs are not 4-D (sdp_utils_cpp's checks);
    ckparity runs the flash order on every layout, so its bits are compared with the flash kernel's."""
    return F.scaled_dot_product_attention(*(t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v)), **kw)


def _layout_cases(g):
    """q, k, v 4-D in every layout (a (B, T, H, d) view transposed, as the twins' projections give them:
    torch's flash bits), and 3-D (torch's math path: held to ckparity's own contiguous bits)."""
    for label, shape, claim in (("(2, 4, 37, 16)", (2, 4, 37, 16), "attention"), ("(4, 37, 16)", (4, 37, 16), None)):
        yield LayoutCase(f"q, k, v {label}, causal", c_attention, _flash_sdpa,
                         lambda f, t: f(t["q"], t["k"], t["v"], is_causal=True), ("q", "k", "v"),
                         {n: torch.randn(shape, generator=g) for n in ("q", "k", "v")}, claim=claim)


def _probe(g: torch.Generator):
    for B, H, Hkv, t, d in ((1, 2, 1, 37, 16), (2, 2, 2, 70, 24)):
        q, k, v = torch.randn(B, H, t, d, generator=g), torch.randn(B, Hkv, t, d, generator=g), torch.randn(B, Hkv, t, d, generator=g)
        dout = torch.randn(B, H, t, d, generator=g)

        def run(L, fill, q=q, k=k, v=v, dout=dout):
            o, lse = out(q, fill), out(q.shape[:3], fill)
            attention_forward(q, k, v, 0.25, True, o, lse, library=L)
            dq, dk, dv = out(q, fill), out(k, fill), out(v, fill)
            attention_backward(dout, q, k, v, o, lse, 0.25, True, dq, dk, dv, library=L)
            return o, lse, dq, dk, dv
        yield f"attention B={B} H={H}/{Hkv} T={t} d={d}", run


# The C entries' size arguments: the fuzz draws each from 1..257 (tests/test_fuzz_c_api.py, under the sanitizers
# too), and attention's work grows as B H T^2 d: the forward's entry varies B and d (2 heads, T 3), the backward's
# T alone (1 sequence, 2 heads of 2), so no fuzzed call is a long one.
HEADS_FUZZ, D_FUZZ, T_FUZZ = 2, 2, 3


def _entry(bf16: bool = False) -> CEntry:
    """ckp_attention_forward (or its bf16 form) on contiguous q, k, v: no buffer to fuzz in the strides."""
    forward, kind = "attention_forward" + ("_bf16" if bf16 else ""), "h" if bf16 else "f"

    def call(L, p, s):
        B, d = s["B"], s["d"]
        st = ffi.new("int64_t[3]", [HEADS_FUZZ * T_FUZZ * d, T_FUZZ * d, d])
        return getattr(L, "ckp_" + forward)(p["q"], st, p["k"], st, p["v"], st, B, HEADS_FUZZ, HEADS_FUZZ, T_FUZZ,
                                            T_FUZZ, d, 0.5, 1, p["out"], p["lse"], 1)
    size = lambda s: s["B"] * HEADS_FUZZ * T_FUZZ * s["d"]  # noqa: E731
    return CEntry(forward, (CBuffer("q", kind, size), CBuffer("k", kind, size), CBuffer("v", kind, size),
                             CBuffer("out", kind, size, True),
                             CBuffer("lse", "f", lambda s: s["B"] * HEADS_FUZZ * T_FUZZ, True)),
                  {"B": 2, "d": 4}, call)


def _backward_entry(bf16: bool = False) -> CEntry:
    """ckp_attention_backward (or its bf16 form) on contiguous operands."""
    backward, kind = "attention_backward" + ("_bf16" if bf16 else ""), "h" if bf16 else "f"

    def call(L, p, s):
        T = s["T"]
        st = ffi.new("int64_t[3]", [HEADS_FUZZ * T * D_FUZZ, T * D_FUZZ, D_FUZZ])
        return getattr(L, "ckp_" + backward)(p["dout"], st, p["q"], st, p["k"], st, p["v"], st, p["out"], p["lse"],
                                             1, HEADS_FUZZ, HEADS_FUZZ, T, T, D_FUZZ, 0.5, 1, p["dq"], st, p["dk"],
                                             st, p["dv"], st, *((L.CKP_BF16_GEMM_ONEDNN,) if bf16 else ()), 1)
    size = lambda s: HEADS_FUZZ * s["T"] * D_FUZZ  # noqa: E731
    return CEntry(backward,
                  tuple(CBuffer(n, kind, size) for n in ("dout", "q", "k", "v", "out"))
                  + (CBuffer("lse", "f", lambda s: HEADS_FUZZ * s["T"]),)
                  + tuple(CBuffer(n, kind, size, True) for n in ("dq", "dk", "dv")),
                  {"T": 3}, call)


def _bench(g: torch.Generator, select):
    for B, H, Hkv, t, d in ((8, 4, 2, 64, 64), (4, 16, 16, 1024, 64)):
        shape = f"B={B},H={H}/{Hkv},T={t},d={d}"
        if select("attention", shape):
            q = torch.randn(B, H, t, d, generator=g).requires_grad_(True)
            k, v = torch.randn(B, Hkv, t, d, generator=g), torch.randn(B, Hkv, t, d, generator=g)
            kw = {"is_causal": True, "enable_gqa": H != Hkv}
            ours = lambda q, k, v: c_attention(q, k, v, **kw)  # noqa: E731
            theirs = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)  # noqa: E731
            o, lse, dq, dk, dv = torch.empty_like(q), torch.empty(B, H, t), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

            def c_calls(q=q.detach(), k=k, v=v, o=o, lse=lse, dq=dq, dk=dk, dv=dv, s=d ** -0.5):
                attention_forward(q, k, v, s, True, o, lse)
                attention_backward(o, q, k, v, o, lse, s, True, dq, dk, dv)  # out standing in for dout
            # forward reads q, k, v, writes out and lse; backward reads them, dout and out, writes dq, dk, dv
            yield Case("attention", shape, fwd_bwd(ours, q, k, v), fwd_bwd(theirs, q, k, v),
                       4 * (3 * q.numel() + 4 * k.numel() + 4 * q.numel()), c_calls, 2,
                       compiled=compiled_fwd_bwd(theirs, q, k, v), once=t >= 1024)


KERNEL = Kernel(
    name="attention",
    used_by=lambda config: config.model in ("llama", "gpt2"),
    exercise=("llama", {"model": "llama"}),
    flag="ck_attention_backend",
    slot="attention",
    torch_ops=("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu"),
    spellings=("sdpa",),
    # the twins' slot: (q (B, heads, T, d), k, v (B, kv_heads, T, d), is_causal=, enable_gqa=) -> (B, heads, T, d)
    backends={"c": attention_c, "torch": attention},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=_call, differentiated=("q", "k", "v"),
        widths=WIDTHS, bad=_BAD, batch_widths=(8, 64, 100, 128, 256),  # head dims: 65537 is no attention's
        options=(("scale", lambda f, t: _call(f, t, scale=0.3), ("q", "k", "v")),),
        opinfo=("nn.functional.scaled_dot_product_attention", _opinfo_sample),
        speed=lambda g: {"q": torch.randn(4, 8, 256, 64, generator=g),  # 4 sequences of 256, 8 heads over 4
                         "k": torch.randn(4, 4, 256, 64, generator=g), "v": torch.randn(4, 4, 256, 64, generator=g)}),
    claims=(Claim("attention", ("out", "dq", "dk", "dv"), sweep, holds=cpu.mkl_not_followed,
                  condition="on MKL's AVX-512 branch: torch at 1 thread, every GEMM of the flash kernel off MKL's "
                            "gemv and skinny paths (no q block of one row, no key block of one, d >= 2); on its AVX2 "
                            "branch's own order (AMD, no AVX-512): torch at 1 and 2 threads, every size (its "
                            "small paths and gemv followed, d = 1's one-column forms where measured: the Zen 5, ATen's per-thread buffers placed as ATen places them, and "
                            "a pass of one parallel item whose GEMMs MKL shares between 2 threads); under "
                            "MKL_CBWR=AUTO,STRICT (and AVX2,STRICT) every size at 1 and 2 torch threads"),
            Claim("attention", ("out", "dq", "dk", "dv"), sweep_bf16, dtype="bfloat16", holds=_bf16_not_followed,
                  condition="where torch's bf16 flash kernel runs MKL's bf16 GEMM on its AVX2 branch and ATen's own "
                            "bf16 loops (an AMD CPU with AVX2 only: DEFAULT, AVX2) or oneDNN's AVX-512 bf16 brgemm "
                            "(an AMD Zen 5: every capability): on the Zen 5 every size, elsewhere sequences of 12 or "
                            "more without a one-row q block or a one-key block; every head dim, at 1 and 2 torch "
                            "threads (at 1 where a pass has one parallel item)")),
    not_claimed={"attention": "inputs that are not 4-D or whose last dim is not contiguous (torch runs its math "
                              "path there, ckparity the flash kernel's order), torch at 2 threads on MKL's AVX-512 branch without "
                              "MKL_CBWR=AUTO,STRICT (measured: the same bits below Tq = 192; from there MKL splits some "
                              "of the backward's GEMMs between its threads), torch at 3+ threads, a q block of "
                              "one row or a key block of one there (MKL's gemv), d = 1 on the AVX2-only EPYC (MKL's "
                              "one-column forms: measured on the Zen 5 only); bfloat16 where torch's GEMMs are MKL's AVX-512 or AMX ones or oneDNN's AMX ones, "
                              "or on an AVX2-only CPU with a one-row q block or a one-key block or a sequence under 12 "
                              "(MKL's bf16 GEMM of one row or column, its small paths on its own copies: not measured "
                              "there since they were modelled), or "
                              "at 2 torch threads where a pass has one item (MKL's bf16 GEMM on 2 threads): as accurate "
                              "as torch"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=(_entry(), _backward_entry(), _entry(bf16=True), _backward_entry(bf16=True)),
)
