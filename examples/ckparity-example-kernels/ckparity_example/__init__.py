"""A user's C kernels as ckparity backends named "example": rms_norm, swiglu
and adamw, each a few lines with ckparity.plugin; and two deliberately faulty
swiglus, "example_fast" (an exp2f-based exp) and "example_small" (abort()
past 1024 columns), to see what ckparity says of kernels that are not right. Installed, the package
registers them through its ckparity.backends entry point (pyproject.toml):

    ckparity check swiglu --backend example
    ckparity train --ck-swiglu-backend example --ck-rmsnorm-backend example --ck-optimizer-backend example
"""

import ctypes
from pathlib import Path

import ckparity
from ckparity import plugin
from ckparity.plugin import pointer as P

_lib = ctypes.CDLL(str(next(Path(__file__).parent.glob("libexamplekernels*.so*"))))
_i64, _f32, _f64 = ctypes.c_int64, ctypes.c_float, ctypes.c_double


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("ex_rms_norm_backward could not allocate its row sums")


rms_norm = plugin.rms_norm(
    forward=lambda x, w, y, eps: _lib.ex_rms_norm_forward(P(x), P(w), P(y), _i64(x.shape[0]), _i64(x.shape[1]),
                                                          _f32(eps)),
    backward=lambda dy, x, w, dx, dw, eps: _check(_lib.ex_rms_norm_backward(
        P(dy), P(x), P(w), P(dx), P(dw), _i64(x.shape[0]), _i64(x.shape[1]), _f32(eps))))


def _swiglu_backward(dout, x, dx):
    _lib.ex_swiglu_backward(P(dout), P(x), P(dx), _i64(dout.shape[0]), _i64(dout.shape[1]))


def _swiglu(name: str):
    forward = getattr(_lib, name)
    return plugin.swiglu(forward=lambda x, out: forward(P(x), P(out), _i64(out.shape[0]), _i64(out.shape[1])),
                         backward=_swiglu_backward)


swiglu = _swiglu("ex_swiglu_forward")
# deliberately faulty (src/kernels.c): an exp2f-based exp; an abort() past 1024 columns
swiglu_fast = _swiglu("ex_swiglu_forward_fast")
swiglu_small = _swiglu("ex_swiglu_forward_small")

AdamW = plugin.adamw(
    lambda p, g, m, v, step, lr, beta1, beta2, eps, wd: _lib.ex_adamw_step(
        P(p), P(g), P(m), P(v), _i64(p.numel()), _i64(step), _f64(lr), _f64(beta1), _f64(beta2), _f64(eps), _f64(wd)))


def register() -> None:
    """The entry point: ckparity calls it when it loads installed plugins."""
    ckparity.register_backend("rms_norm", "example", rms_norm)
    ckparity.register_backend("swiglu", "example", swiglu)
    ckparity.register_backend("swiglu", "example_fast", swiglu_fast)
    ckparity.register_backend("swiglu", "example_small", swiglu_small)
    ckparity.register_backend("adamw", "example", AdamW)
