"""Every entry point of the C API, every pair of its buffers at least one of
which it writes, placed at the same address (exact overlap) and 8 bytes
apart (partial overlap). The call must either refuse (an error status, not
one byte of memory written) or give exactly the outputs it gives with the
same input values in separate buffers (an overlap it supports, such as
dlogits written over the logits, or an output written only after its last
read). A kernel that reads an input after writing an output over it gives
other outputs and fails here.

The buffers live in one arena; each pair test moves buffer B onto buffer A,
fills the arena (outputs with a sentinel, then inputs with data, so a shared
region holds input data, as a caller's in-place call would), and runs the
same call on fresh separate copies of what each input then holds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from ckparity._native import ffi, lib
from ckparity.kernels import KERNELS

N, V, D, H, T, HEAD, R = 3, 5, 6, 4, 2, 4, 2  # rows, vocab, width, hidden, positions, head dim, tensors

_TYPES = {"f": (torch.float32, "float *"), "d": (torch.float64, "double *"), "i": (torch.int64, "int64_t *"),
          "h": (torch.bfloat16, "uint16_t *")}


@dataclass(frozen=True)
class Buffer:
    name: str
    kind: str      # "f" float32, "d" float64, "i" int64 (class targets), "h" bfloat16
    count: int
    output: bool       # written by the call
    reads: bool = False  # an output the call also reads first (AdamW's param and moments)


@dataclass(frozen=True)
class Entry:
    name: str
    buffers: tuple[Buffer, ...]
    call: Callable  # (pointers by name) -> status


def f(name, count, output=False, reads=False):
    return Buffer(name, "f", count, output, reads or not output)


def h(name, count, output=False, reads=False):
    return Buffer(name, "h", count, output, reads or not output)


def _ce_options(pointers, reduction):
    opt = ffi.new("ckp_cross_entropy_options *")
    lib.ckp_cross_entropy_options_init(opt)
    opt.weight, opt.row_grad, opt.reduction, opt.label_smoothing = pointers["weight"], pointers["row_grad"], reduction, 0.1
    return opt


def _ce_bf16_options(pointers=None, reduction=0):
    """ptref; with pointers, their weight and row_grad (bf16 values as floats) and label smoothing."""
    opt = ffi.new("ckp_cross_entropy_options *")
    lib.ckp_cross_entropy_options_init(opt)
    opt.variant, opt.reduction = lib.CKP_CE_PTREF, reduction
    if pointers is not None:
        opt.weight, opt.row_grad, opt.label_smoothing = pointers["weight"], pointers["row_grad"], 0.1
    return opt


def _adamw_options():
    opt = ffi.new("ckp_adamw_options *")
    opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.amsgrad, opt.maximize = 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 0
    return opt


def _grad_norm(p):
    tensors = ffi.new("const float *[]", [p["t0"], p["t1"]])
    sizes = ffi.new("int64_t[]", [D, V])
    return lib.ckp_grad_norm(tensors, sizes, R, 2.0, p["total_norm"])


ENTRIES = [
    Entry("cross_entropy(none)", (f("logits", N * V), Buffer("target", "i", N, False, True), f("weight", V),
                                  f("row_grad", N), f("loss", N, True), f("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy(p["logits"], p["target"], ffi.NULL, N, V, _ce_options(p, 0), p["loss"],
                                          p["dlogits"])),
    Entry("cross_entropy(mean, probs)", (f("logits", N * V), f("probs", N * V), f("weight", V), f("row_grad", 1),
                                         f("loss", 1, True), f("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy(p["logits"], ffi.NULL, p["probs"], N, V, _ce_options(p, 1), p["loss"],
                                          p["dlogits"])),
    Entry("cross_entropy_default_bf16(none)", (h("logits", N * V), Buffer("target", "i", N, False, True),
                                               f("weight", V), f("row_grad", N), f("loss", N, True),
                                               h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_default_bf16(p["logits"], p["target"], ffi.NULL, N, V, _ce_options(p, 0),
                                                       p["loss"], p["dlogits"])),
    Entry("cross_entropy_default_bf16(mean, probs)", (h("logits", N * V), h("probs", N * V), f("weight", V),
                                                      f("row_grad", 1), f("loss", 1, True), h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_default_bf16(p["logits"], ffi.NULL, p["probs"], N, V, _ce_options(p, 1),
                                                       p["loss"], p["dlogits"])),
    Entry("cross_entropy_bf16", (h("logits", N * V), Buffer("target", "i", N, False, True), h("loss", N, True),
                                 h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_bf16(p["logits"], p["target"], N, V, _ce_bf16_options(), p["loss"],
                                               p["dlogits"])),
    Entry("cross_entropy_bf16(none, weight, smoothing)",
          (h("logits", N * V), Buffer("target", "i", N, False, True), f("weight", V), f("row_grad", N),
           h("loss", N, True), h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_bf16(p["logits"], p["target"], N, V, _ce_bf16_options(p), p["loss"],
                                               p["dlogits"])),
    Entry("cross_entropy_probs_bf16", (h("logits", N * V), h("probs", N * V), f("weight", V), f("row_grad", 1),
                                       h("loss", 1, True), h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_probs_bf16(p["logits"], p["probs"], N, V, _ce_bf16_options(p, 1),
                                                     p["loss"], p["dlogits"])),
    Entry("cross_entropy_probs_bf16_f32p(ptref)", (h("logits", N * V), f("probs", N * V), f("weight", V),
                                                   f("row_grad", 1), f("loss", 1, True), h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_probs_bf16_f32p(p["logits"], p["probs"], N, V, _ce_bf16_options(p, 1),
                                                          p["loss"], p["dlogits"])),
    Entry("cross_entropy_probs_bf16_f32p(default)", (h("logits", N * V), f("probs", N * V), f("weight", V),
                                                     f("row_grad", N), f("loss", N, True), h("dlogits", N * V, True)),
          lambda p: lib.ckp_cross_entropy_probs_bf16_f32p(p["logits"], p["probs"], N, V, _ce_options(p, 0),
                                                          p["loss"], p["dlogits"])),
    Entry("rms_norm_forward", (f("x", N * D), f("weight", D), f("y", N * D, True), f("rstd", N, True)),
          lambda p: lib.ckp_rms_norm_forward(p["x"], p["weight"], N, D, 1e-5, p["y"], p["rstd"], 1)),
    Entry("rms_norm_backward", (f("dy", N * D), f("x", N * D), f("weight", D), f("rstd", N), f("dx", N * D, True),
                                f("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx"], p["dweight"], 1)),
    Entry("rms_norm_backward_terms", (f("dy", N * D), f("x", N * D), f("weight", D), f("rstd", N),
                                      f("dx_normalized", N * D, True), f("dx_rstd", N * D, True),
                                      f("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward_terms(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx_normalized"],
                                                    p["dx_rstd"], p["dweight"], 1)),
    Entry("rms_norm_forward_bf16", (h("x", N * D), h("weight", D), h("y", N * D, True), f("rstd", N, True)),
          lambda p: lib.ckp_rms_norm_forward_bf16(p["x"], p["weight"], N, D, 1e-5, p["y"], p["rstd"], 1)),
    Entry("rms_norm_backward_bf16", (h("dy", N * D), h("x", N * D), h("weight", D), f("rstd", N),
                                     h("dx", N * D, True), h("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward_bf16(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx"],
                                                   p["dweight"], 1)),
    Entry("rms_norm_forward_bf16_f32w", (h("x", N * D), f("weight", D), h("y", N * D, True), f("rstd", N, True)),
          lambda p: lib.ckp_rms_norm_forward_bf16_f32w(p["x"], p["weight"], N, D, 1e-5, p["y"], p["rstd"], 1)),
    Entry("rms_norm_backward_bf16_f32w", (h("dy", N * D), h("x", N * D), f("weight", D), f("rstd", N),
                                          h("dx", N * D, True), f("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward_bf16_f32w(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx"],
                                                        p["dweight"], 1)),
    Entry("rms_norm_forward_f16", (h("x", N * D), h("weight", D), h("y", N * D, True), f("rstd", N, True)),
          lambda p: lib.ckp_rms_norm_forward_f16(p["x"], p["weight"], N, D, 1e-5, p["y"], p["rstd"], 1)),
    Entry("rms_norm_backward_f16", (h("dy", N * D), h("x", N * D), h("weight", D), f("rstd", N),
                                    h("dx", N * D, True), h("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward_f16(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx"],
                                                  p["dweight"], 1)),
    Entry("rms_norm_forward_f16_f32w", (h("x", N * D), f("weight", D), h("y", N * D, True), f("rstd", N, True)),
          lambda p: lib.ckp_rms_norm_forward_f16_f32w(p["x"], p["weight"], N, D, 1e-5, p["y"], p["rstd"], 1)),
    Entry("rms_norm_backward_f16_f32w", (h("dy", N * D), h("x", N * D), f("weight", D), f("rstd", N),
                                         h("dx", N * D, True), f("dweight", D, True)),
          lambda p: lib.ckp_rms_norm_backward_f16_f32w(p["dy"], p["x"], p["weight"], p["rstd"], N, D, p["dx"],
                                                       p["dweight"], 1)),
    Entry("swiglu_forward_bf16", (h("x", N * 2 * H), h("out", N * H, True)),
          lambda p: lib.ckp_swiglu_forward_bf16(p["x"], N, H, p["out"])),
    Entry("swiglu_backward_bf16", (h("dout", N * H), h("x", N * 2 * H), h("dx", N * 2 * H, True)),
          lambda p: lib.ckp_swiglu_backward_bf16(p["dout"], p["x"], N, H, p["dx"])),
    Entry("swiglu_forward_f16", (h("x", N * 2 * H), h("out", N * H, True)),
          lambda p: lib.ckp_swiglu_forward_f16(p["x"], N, H, p["out"])),
    Entry("swiglu_backward_f16", (h("dout", N * H), h("x", N * 2 * H), h("dx", N * 2 * H, True)),
          lambda p: lib.ckp_swiglu_backward_f16(p["dout"], p["x"], N, H, p["dx"])),
    Entry("swiglu_forward", (f("x", N * 2 * H), f("out", N * H, True)),
          lambda p: lib.ckp_swiglu_forward(p["x"], N, H, p["out"])),
    Entry("swiglu_backward", (f("dout", N * H), f("x", N * 2 * H), f("dx", N * 2 * H, True)),
          lambda p: lib.ckp_swiglu_backward(p["dout"], p["x"], N, H, p["dx"])),
    Entry("rope_forward", (f("x", N * T * HEAD), f("cos", T * HEAD // 2), f("sin", T * HEAD // 2),
                           f("out", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_forward(p["x"], p["cos"], p["sin"], N, T, HEAD, 0, p["out"])),
    Entry("rope_backward", (f("dout", N * T * HEAD), f("cos", T * HEAD // 2), f("sin", T * HEAD // 2),
                            f("dx", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_backward(p["dout"], p["cos"], p["sin"], N, T, HEAD, 1, p["dx"])),
    Entry("rope_forward_bf16", (h("x", N * T * HEAD), h("cos", T * HEAD // 2), h("sin", T * HEAD // 2),
                                h("out", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_forward_bf16(p["x"], p["cos"], p["sin"], N, T, HEAD, 0, p["out"])),
    Entry("rope_backward_bf16", (h("dout", N * T * HEAD), h("cos", T * HEAD // 2), h("sin", T * HEAD // 2),
                                 h("dx", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_backward_bf16(p["dout"], p["cos"], p["sin"], N, T, HEAD, 1, p["dx"])),
    Entry("rope_forward_f16", (h("x", N * T * HEAD), h("cos", T * HEAD // 2), h("sin", T * HEAD // 2),
                               h("out", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_forward_f16(p["x"], p["cos"], p["sin"], N, T, HEAD, 0, p["out"])),
    Entry("rope_backward_f16", (h("dout", N * T * HEAD), h("cos", T * HEAD // 2), h("sin", T * HEAD // 2),
                                h("dx", N * T * HEAD, True)),
          lambda p: lib.ckp_rope_backward_f16(p["dout"], p["cos"], p["sin"], N, T, HEAD, 1, p["dx"])),
    Entry("vocab_parallel_ce_max", (f("logits", N * V), f("row_max", N, True)),
          lambda p: lib.ckp_vocab_parallel_ce_max(p["logits"], N, V, p["row_max"])),
    Entry("vocab_parallel_ce_sums", (f("logits", N * V), Buffer("target", "i", N, False, True), f("global_max", N),
                                     Buffer("sums", "d", 3 * N, True)),
          lambda p: lib.ckp_vocab_parallel_ce_sums(p["logits"], p["target"], N, V, 0, V, -100, p["global_max"],
                                                   p["sums"])),
    Entry("vocab_parallel_ce_loss", (Buffer("target", "i", N, False, True), f("global_max", N),
                                     Buffer("global_sums", "d", 3 * N, False, True), f("loss_rows", N, True)),
          lambda p: lib.ckp_vocab_parallel_ce_loss(p["target"], N, V, -100, 0.1, 1e-4, p["global_max"],
                                                   p["global_sums"], p["loss_rows"])),
    Entry("vocab_parallel_ce_backward", (f("logits", N * V), Buffer("target", "i", N, False, True), f("global_max", N),
                                         Buffer("global_sums", "d", 3 * N, False, True), f("row_grad", N),
                                         f("dlogits", N * V, True)),
          lambda p: lib.ckp_vocab_parallel_ce_backward(p["logits"], p["target"], N, V, 0, V, -100, 0.1, 1e-4,
                                                       p["global_max"], p["global_sums"], p["row_grad"],
                                                       p["dlogits"])),
    Entry("compare", (f("a", N * D), f("b", N * D), Buffer("max_abs_diff", "d", 1, True),
                      Buffer("max_abs_b", "d", 1, True), Buffer("differing", "i", 1, True)),
          lambda p: lib.ckp_compare(p["a"], p["b"], N * D, p["max_abs_diff"], p["max_abs_b"], p["differing"])),
    Entry("adamw_step", (f("param", D, True, True), f("grad", D), f("exp_avg", D, True, True),
                         f("exp_avg_sq", D, True, True), f("max_exp_avg_sq", D, True, True)),
          lambda p: lib.ckp_adamw_step(p["param"], p["grad"], p["exp_avg"], p["exp_avg_sq"], p["max_exp_avg_sq"], D,
                                       3.0, _adamw_options())),
    Entry("adamw_step_bf16", (h("param", D, True, True), h("grad", D), h("exp_avg", D, True, True),
                              h("exp_avg_sq", D, True, True), h("max_exp_avg_sq", D, True, True)),
          lambda p: lib.ckp_adamw_step_bf16(p["param"], p["grad"], p["exp_avg"], p["exp_avg_sq"], p["max_exp_avg_sq"],
                                            D, 3.0, _adamw_options())),
    Entry("grad_norm", (f("t0", D), f("t1", V), Buffer("total_norm", "d", 1, True)), _grad_norm),
]


def _from_record(entry) -> Entry:
    """A record's C entry point (kernels.record.CEntry) at its small valid sizes."""
    buffers = tuple(Buffer(b.name, b.kind, b.count(entry.sizes), b.output, b.reads or not b.output)
                    for b in entry.buffers)
    return Entry(entry.name, buffers, lambda p: entry.call(lib, p, entry.sizes))


ENTRIES += [_from_record(e) for k in KERNELS.values() for e in k.c_entries]

SLOT = 256  # bytes per buffer's own region: every buffer above fits with room for an 8-byte shift


def _fill(view: torch.Tensor, buffer: Buffer, gen: torch.Generator) -> None:
    if buffer.kind == "i":
        view.copy_(torch.randint(0, min(V, 2), (buffer.count,), generator=gen))
    else:  # positive and moderate: valid as rstd, second moments, probabilities
        view.copy_(torch.rand(buffer.count, generator=gen, dtype=torch.float64) + 0.5)


def _views(arena: torch.Tensor, entry: Entry, offsets: dict[str, int]) -> dict[str, torch.Tensor]:
    raw = arena.view(torch.uint8)
    return {b.name: raw[offsets[b.name]:offsets[b.name] + b.count * _TYPES[b.kind][0].itemsize].view(_TYPES[b.kind][0])
            for b in entry.buffers}


def _pointers(views: dict[str, torch.Tensor], entry: Entry) -> dict:
    return {b.name: ffi.cast(_TYPES[b.kind][1], views[b.name].data_ptr()) for b in entry.buffers}


def run_laid_out(entry: Entry, offsets: dict[str, int], seed: int):
    """The call with the buffers at these byte offsets in one arena: (status,
    the arena before and after, each input as the call saw it, each output after)."""
    arena = torch.zeros(SLOT * (len(entry.buffers) + 1) // 8, dtype=torch.float64)
    views = _views(arena, entry, offsets)
    gen = torch.Generator().manual_seed(seed)
    for b in entry.buffers:  # outputs first: a region an input shares holds the input's data
        if not b.reads:
            views[b.name].view(torch.uint8).fill_(0x7F)
    for b in entry.buffers:
        if b.reads:
            _fill(views[b.name], b, gen)
    seen = {b.name: views[b.name].clone() for b in entry.buffers}
    before = arena.clone()
    status = entry.call(_pointers(views, entry))
    return status, before, arena, seen, {b.name: views[b.name].clone() for b in entry.buffers if b.output}


def run_separate(entry: Entry, inputs: dict[str, torch.Tensor]):
    """The same call with every buffer on its own, holding the given values."""
    arena = torch.zeros(SLOT * (len(entry.buffers) + 1) // 8, dtype=torch.float64)
    offsets = {b.name: SLOT * k for k, b in enumerate(entry.buffers)}
    views = _views(arena, entry, offsets)
    for b in entry.buffers:
        views[b.name].copy_(inputs[b.name])
    status = entry.call(_pointers(views, entry))
    return status, {b.name: views[b.name].clone() for b in entry.buffers if b.output}


def _pairs():
    for entry in ENTRIES:
        for a, b in itertools.permutations(entry.buffers, 2):
            if not (a.output or b.output):
                continue  # two inputs may share memory: nothing writes it
            for shift in (0, 8):
                if shift and a.count * _TYPES[a.kind][0].itemsize <= shift:
                    continue
                yield pytest.param(entry, a.name, b.name, shift, id=f"{entry.name}:{b.name}@{a.name}+{shift}")


@pytest.mark.parametrize("entry,a,b,shift", list(_pairs()))
def test_overlap_is_refused_or_harmless(entry, a, b, shift):
    offsets = {buf.name: SLOT * k for k, buf in enumerate(entry.buffers)}
    offsets[b] = offsets[a] + shift
    status, before, after, seen, outputs = run_laid_out(entry, offsets, seed=len(a) * 31 + len(b))
    if status != lib.CKP_OK:
        assert torch.equal(before.view(torch.int64), after.view(torch.int64)), "refused, yet memory was written"
        return
    expected_status, expected = run_separate(entry, seen)
    assert expected_status == lib.CKP_OK, "accepted with the overlap, refused without it"
    for name, value in expected.items():
        if name in (a, b) and name != b and shift == 0:
            continue  # exact overlap: the later-written of the two buffers is the one compared (b)
        assert torch.equal(outputs[name].view(torch.uint8), value.view(torch.uint8)), (
            f"{b} over {a} (+{shift} bytes) was accepted and changed {name}")


def test_every_entry_point_is_covered():
    declared = {name for name in dir(lib) if name.startswith("ckp_") and callable(getattr(lib, name))}
    plumbing = {"ckp_status_str", "ckp_last_error", "ckp_version", "ckp_build_info", "ckp_isa",
                "ckp_set_num_threads", "ckp_get_num_threads", "ckp_set_capability", "ckp_get_capability", "ckp_cross_entropy_options_init",
                "ckp_set_gemm_order", "ckp_get_gemm_order", "ckp_mkl_auto_runs_avx2"}
    covered = {"ckp_" + e.name.split("(")[0] for e in ENTRIES}
    assert declared - plumbing == covered, f"not covered: {sorted(declared - plumbing - covered)}"
