"""ckparity.linear: F.linear(x, weight, bias) on the C GEMM (csrc/linear.c), forward and backward,
in the order of MKL's one-thread sgemm (kernels/linear.py says where that is torch's bits).

The bindings live here beside the op (as ops/residual.py's): operands go to C by their strides, so a
transposed or strided x or weight is read where it lies, as a BLAS takes transA/transB."""

from __future__ import annotations

import os

import torch

from .._native import check, ffi, lib
from .._tensors import empty, require_floating
from ..errors import InvalidArgument
from . import _aten_bf16, _onednn
from ._function import CFunction, first_order_only

_FLOAT = ffi.typeof("float *")
_U16 = ffi.typeof("uint16_t *")
_cast = ffi.cast


def _at(t: torch.Tensor | None):
    """A pointer to t's first element (its strides say where the others are); NULL for None."""
    return ffi.NULL if t is None else ffi.cast(_FLOAT, t.data_ptr())


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
         bias_after: bool = False, *, library=lib) -> None:
    """out (M, N), contiguous = a (M, K) . b (K, N) + bias (N, contiguous; C's start, as addmm's, or added to
    the product with ``bias_after``, as matmul's then add_), a and b of any strides."""
    M, K = a.shape
    _product(*_operand(a), *_operand(b), M, K, b.shape[1], out, bias, bias_after, library)


def _product(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, out, bias=None, bias_after=False, library=lib) -> None:
    """ckp_gemm on operands by their strides: called for every GEMM of a step (75 in the llama preset's), so
    each pointer is read once and no view is made to say a transpose. In the order of MKL at torch's thread
    count (on its AVX2 branch, 2 threads share some products by rows: [Note: MKL's AVX2 sgemm on two threads])."""
    check(library.ckp_gemm(_cast(_FLOAT, a.data_ptr()), a_rs, a_cs, _cast(_FLOAT, b.data_ptr()), b_rs, b_cs, M, K, N,
                           _at(bias), int(bias_after), _cast(_FLOAT, out.data_ptr()), torch.get_num_threads()),
          "linear", library)


def _operand(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(t, row stride, column stride) of a 2-D t as ATen's addmm hands it to MKL: read where it lies if one
    stride is 1 and the other spans a row or column (a BLAS leading dimension), else a contiguous copy
    (Blas.cpp's addmm_impl_cpu_). The copy changes no value, but MKL's path, and so the order, follows the
    strides it is given."""
    (rows, cols), (s0, s1) = t.shape, t.stride()
    if (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)):
        return t, s0, s1
    return t.contiguous(), cols, 1


def _transposed(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """_operand(t.t()) without making the view where t is read where it lies (the weight, every call)."""
    (rows, cols), (s0, s1) = t.shape, t.stride()
    if (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)):
        return t, s1, s0
    return _operand(t.t())


def _column_major(t: torch.Tensor) -> bool:
    """Whether autograd's mm backward takes the 2-D t as column-major (its test: strides (1, rows))."""
    return t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _rows(x: torch.Tensor) -> tuple[int, torch.Tensor, int, int]:
    """x (..., K) as the (M, K) operand ATen's linear multiplies: its leading dims collapsed, a view where
    they collapse, else a copy."""
    K = x.shape[-1]
    if x.is_contiguous():
        return x.numel() // K, x, K, 1
    rows = x.reshape(-1, K)
    return (rows.shape[0], *_operand(rows))


def dbias(dy: torch.Tensor, out: torch.Tensor, *, library=lib) -> None:
    """out (N) = dy (M, N), contiguous, summed over its rows as torch.sum(0) orders it: float32, or bf16 (out too;
    torch's order for a bf16 tensor, in float32, rounded once)."""
    M, N = dy.shape
    if dy.dtype == torch.bfloat16:
        status = library.ckp_linear_dbias_bf16(_cast(_U16, dy.data_ptr()), M, N, _cast(_U16, out.data_ptr()),
                                               torch.get_num_threads())
    else:
        status = library.ckp_linear_dbias(_at(dy), M, N, _at(out), torch.get_num_threads())
    check(status, "linear backward", library)


class _LinearFunction(CFunction):
    """x (..., K), weight (N, K), bias (N) or None, bias_after -> (..., N). The leading dims are collapsed here,
    inside the Function, rather than by a reshape before it and after it: those would be two more autograd nodes
    per call (a third of a twin's small linear's overhead). First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, weight, bias, bias_after):
        (N, K), (M, *a) = weight.shape, _rows(x)
        y = empty((*x.shape[:-1], N), torch.float32)
        _product(*a, *_transposed(weight), M, K, N, y, bias, bias_after)
        return y

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.has_bias = inputs[2] is not None

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        (N, K), dy = weight.shape, dy.contiguous()
        M = dy.numel() // N
        dx = dw = db = None
        rows = x.reshape(-1, K)  # mm's mat1 as ATen's linear hands it over: x, its rows folded (matmul's reshape)
        # mm's backward (autograd's mm_mat1_backward, mm_mat2_backward) gives a column-major operand a column-major
        # gradient, computing its transpose: another GEMM, whose small paths sum in another order
        if ctx.needs_input_grad[0] and _column_major(rows):
            dxt = empty((K, M), torch.float32)
            _product(*_operand(weight.t()), *_operand(dy.view(M, N).t()), K, N, M, dxt)  # dXᵀ = Wᵀ . dYᵀ
            dx = dxt.t().reshape(x.shape)
        elif ctx.needs_input_grad[0]:
            dx = empty(x.shape, torch.float32)
            _product(dy, N, 1, *_operand(weight), M, N, K, dx)          # dX = dY . W
        if ctx.needs_input_grad[1] and not _column_major(weight.t()):
            dwt = empty((K, N), torch.float32)
            _product(*_operand(rows.t()), dy, N, 1, K, M, N, dwt)        # dWᵀ = Xᵀ . dY
            dw = dwt.t()
        elif ctx.needs_input_grad[1]:
            dw = empty(weight.shape, torch.float32)
            _product(dy, 1, N, *_operand(rows), N, M, K, dw)            # dW = dYᵀ . X, dYᵀ by its strides
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = empty((N,), torch.float32)
            dbias(dy.view(M, N), db)
        return dx, dw, db, None


class _LinearBF16Function(CFunction):
    """x (..., K) and weight (N, K) contiguous bf16, a contiguous bias (N) or None -> (..., N) bf16: each GEMM in
    the order oneDNN sums it for that GEMM's shape and layouts (ops/_onednn.py measures it; the bias in y's float32
    sum), or where none is measured the float32 GEMM rounded once; dbias as torch sums a bf16 dY (in float32, in
    its order for bf16: dbias), rounded once. First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, weight, bias, order):
        (N, K), lead = weight.shape, x.shape[:-1]
        return _onednn.product(x.reshape(-1, K), weight.t(), order, bias).reshape(*lead, N)

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.has_bias = inputs[2] is not None

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        (N, K) = weight.shape
        rows, dy = x.reshape(-1, K), dy.to(torch.bfloat16).reshape(-1, N).contiguous()
        M = rows.shape[0]
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # torch: dY.mm(W)
            dx = _bf16_product(dy, weight, _onednn.order(M, N, K, False, False)).reshape(x.shape)
        if ctx.needs_input_grad[1]:  # torch: dYᵀ.mm(X) (mm's backward for a column-major mat2, Wᵀ)
            dw = _bf16_product(dy.t(), rows, _onednn.order(N, M, K, True, False))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = empty((N,), torch.bfloat16)
            dbias(dy, db)
        return dx, dw, db, None


class _LinearATenBF16Function(_LinearFunction):
    """x (..., K), weight (N, K), bias (N) or None, bias_after, all bf16 -> (..., N) bf16: each GEMM (y, dX, dW) in
    the loop ATen's own bf16 GEMM runs it with, on the layouts autograd's mm backward gives it (as
    _LinearFunction's, whose save it shares); dbias as torch sums a bf16 dY (in float32, in its order for bf16: dbias),
    rounded once. torch's bf16 matmul where it runs no oneDNN (ops/_aten_bf16.py). First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, weight, bias, bias_after):
        N, K = weight.shape
        y = _aten_bf16.product(_mat1(x), weight.t(), bias, bias_after)
        return y.reshape(*x.shape[:-1], N)

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        N, K = weight.shape
        dy = dy.to(torch.bfloat16).reshape(-1, N).contiguous()
        rows, product = _mat1(x), _aten_bf16.product
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # dX = dY . W, or for a column-major x dXᵀ = Wᵀ . dYᵀ
            dx = (product(weight.t(), dy.t()).t() if _column_major(rows) else product(dy, weight)).reshape(x.shape)
        if ctx.needs_input_grad[1]:  # dW = dYᵀ . X, or for a weight not row-major dWᵀ = Xᵀ . dY
            dw = product(dy.t(), rows) if _column_major(weight.t()) else product(rows.t(), dy).t()
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = empty((N,), torch.bfloat16)
            dbias(dy, db)
        return dx, dw, db, None


def _mat1(x: torch.Tensor) -> torch.Tensor:
    """The (M, K) operand ATen's mm gets from F.linear's x: a 2-D x as it lies (its strides pick ATen's loop, a
    one-row x's too), any other folded by reshape (a view with the strides reshape gives it, or a copy)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _bf16_product(a: torch.Tensor, b: torch.Tensor, order: _onednn.Order | None) -> torch.Tensor:
    """a . b in bf16: in oneDNN's measured order, else the float32 GEMM of the widened values rounded once."""
    if order is not None:
        return _onednn.product(a, b, order)
    out = empty((a.shape[0], b.shape[1]), torch.float32)
    gemm(a.float(), b.float(), out)
    return out.bfloat16()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K), bias (N) or None -> (..., N), in float32 or
    bfloat16 (all three of one dtype; under CPU autocast to bfloat16 they are cast to it first, as autocast
    casts F.linear's). Transposed and strided x and weight are read by their strides (no copy where ATen's
    addmm makes none).
    bfloat16: where torch runs its bf16 matmul on ATen's own loops (no oneDNN: a CPU without AVX-512's bf16; and
    anywhere for products of M·K·N up to 16^3), each GEMM (y, dX, dW, with or without a bias) in the loop ATen picks for its layouts (ops/_aten_bf16.py), on
    contiguous copies of x and weight (torch's bits there move with the layout; these do not).
    Where torch runs oneDNN: for contiguous x and weight, each GEMM in the order oneDNN sums it, measured for its
    shape (ops/_onednn.py; an AMX CPU's brgemm without a bias, or AVX-512 bf16's without AMX, with a bias too);
    where no order is measured (another oneDNN path), and with a bias on AMX, the float32 GEMM on the widened
    values, rounded once. Every way float32 sums, the
    same bits at any ckparity thread count."""
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        x, weight, bias = (t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                           for t in (x, weight, bias))
    for t, name in ((x, "x"), (weight, "weight"), (bias, "bias")):
        if t is not None:
            require_floating(t, name, like=x)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise InvalidArgument(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply "
                              "(x (..., K) and weight (N, K))")
    N, K = weight.shape
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise InvalidArgument(f"linear: bias {tuple(bias.shape)} for a weight of {N} outputs (bias ({N},))")
    if x.numel() == 0 or N == 0:  # no rows, K = 0 or no outputs: nothing to multiply
        return _empty_product(x, weight, bias)
    if x.dtype == torch.bfloat16 and _aten_bf16.torch_runs_aten(x.numel() * N):  # y's, dX's and dW's M·K·N
        # ATen's bf16 loops sum in an order set by the operands' layouts, and F.linear rounds the product before
        # the bias for an x it does not fold (a non-contiguous one): torch's bf16 bits move with the layout. Here
        # they do not: every x and weight is taken as its contiguous copy (torch's bits on that copy; a contiguous
        # x of any dims, a 1-D one too, has its bias in the one rounding, as addmm's)
        return _LinearATenBF16Function.apply(x.contiguous(), weight.contiguous(), bias, False)
    if x.dtype == torch.bfloat16 and x.is_contiguous() and weight.is_contiguous():
        # a bias in the float32 sum as oneDNN's AVX-512 bf16 brgemm adds it (measured there; on AMX: not measured)
        order = _onednn.order(x.numel() // K, K, N, False, True)
        if order is not None and (bias is None or order.width == 0):
            return _LinearBF16Function.apply(x, weight, None if bias is None else bias.contiguous(), order)
    if x.dtype == torch.bfloat16:  # widened exactly; the gradients come back through the casts, rounded once
        with torch.autocast("cpu", enabled=False):
            return linear(x.float(), weight.float(), None if bias is None else bias.float()).bfloat16()
    bias_in = bias.contiguous() if bias is not None else None
    return _LinearFunction.apply(x, weight, bias_in, not _addmm(x))


def _addmm(x: torch.Tensor) -> bool:
    """Whether F.linear with a bias takes addmm for this x (the bias as the product's start) rather than
    matmul and then the bias added (ATen's linear: a 2-D x, a contiguous one of any more dims -- measured: a
    contiguous 4-D and 5-D x's bias is in the sum, in float32 at K = 1000 and in bf16 -- or a 3-D one that
    TORCH_LINEAR_FLATTEN_3D=1 makes so)."""
    return x.dim() == 2 or (x.dim() >= 3 and x.is_contiguous()) or \
        (x.dim() == 3 and os.environ.get("TORCH_LINEAR_FLATTEN_3D") == "1")


def _empty_product(x, weight, bias):
    """No rows, K = 0 or no outputs: every output (if any) is the empty sum, 0, plus the bias; x and weight get
    zero gradients, as torch's."""
    zeros = (x.sum(-1, keepdim=True) * 0).expand(*x.shape[:-1], weight.shape[0]) + weight.sum(-1) * 0
    return zeros + bias if bias is not None else zeros
