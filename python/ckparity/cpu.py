"""The torch CPU capability the C kernels follow.

torch builds its CPU kernels once per capability (DEFAULT, AVX2, AVX512) and
runs one of them per process: ``torch.backends.cpu.get_cpu_capability()``,
fixed when torch starts and lowered by ``ATEN_CPU_CAPABILITY``. The vector
width, SLEEF's exp against libm's, and whether the build contracted a * b + c
into an FMA differ between them, and so do torch's bits. ckparity's library
takes the capability as a setting (``ckp_set_capability``); this module sets
it to torch's when ckparity is imported, so the kernels repeat the arithmetic
of the torch they are compared with. A capability ckparity has no arithmetic
for (torch on ARM, POWER or s390x reports others) is not silently treated as
one it knows: ``capability()`` says so, and no bit-identity is claimed.
"""

from __future__ import annotations

import functools
import platform

import torch

from ._native import check, lib

# The order is ckp_capability's: DEFAULT = 0, AVX2 = 1, AVX512 = 2.
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")

_X86 = platform.machine().lower() in ("x86_64", "amd64")


def torch_capability() -> str:
    """The capability torch's CPU kernels run at in this process."""
    return torch.backends.cpu.get_cpu_capability()


def library_capability() -> str:
    """The capability the loaded C library follows."""
    return CAPABILITIES[lib.ckp_get_capability()]


def matched() -> bool:
    """True if the C library repeats the arithmetic torch runs here."""
    return _X86 and torch_capability() == library_capability()


def capability() -> dict:
    """torch's capability, the library's, and whether they match (for reports and ``ckparity info``)."""
    return {"torch": torch_capability(), "library": library_capability(), "matched": matched()}


def follow_torch() -> None:
    """Sets the library's capability to torch's (at import; again after a
    ``CKP_LIB`` swap or a ``ckp_set_capability`` made behind ckparity's back)."""
    name = torch_capability()
    if _X86 and name in CAPABILITIES:
        check(lib.ckp_set_capability(CAPABILITIES.index(name)), "ckp_set_capability")


# [Note: MKL's branch]
# torch's float32 matmul is MKL's sgemm, whose order ckparity's C linear follows (csrc/linear.c) on the
# branch it was measured on: MKL's AVX-512 code. MKL picks its branch from the CPU, not from torch's
# capability (ATEN_CPU_CAPABILITY does not move it); MKL_CBWR (Conditional Numerical Reproducibility)
# and MKL_ENABLE_INSTRUCTIONS pin a lower one (MKL_CBWR=AVX2 takes the AVX2 code, which blocks K
# otherwise). The branch is read from those variables and the CPU's flags, as MKL reads them. With STRICT in
# MKL_CBWR (AUTO,STRICT; AVX2,STRICT) MKL runs one order at every thread count, which the C library follows
# on the AVX-512 branch and on the AVX2 one ([Note: MKL's strict order] in csrc/linear.c): mkl_strict(). On a
# CPU without AVX-512 (or an AMD one past Zen 4) its AVX2 branch's own order is followed too ([Note: MKL's AVX2 order]): mkl_avx2_own().
# MKL 2024.2 runs that AVX2 code on an AMD CPU with AVX-512 other than Zen 4 too (measured on a Zen 5), so the
# branch is the C library's where it chose that order.
MODELLED_MKL_BRANCHES = ("AVX512",)


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def mkl_branch() -> str:
    """The code branch MKL's sgemm takes in this process: AVX512, AVX2, or what MKL_CBWR or
    MKL_ENABLE_INSTRUCTIONS names (e.g. COMPATIBLE, SSE4_2); "none" without MKL or off x86."""
    if not (_X86 and torch.backends.mkl.is_available()):
        return "none"
    import os

    flags = _cpu_flags()
    for variable in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS"):
        pinned = os.environ.get(variable, "").split(",")[0].strip().upper()
        if pinned.startswith("AVX512") and avx512_but_mkl_avx2():
            return f"{pinned} (pinned where MKL's AUTO runs its AVX2 code)"
        if pinned and pinned not in ("AUTO", "AVX512", "AVX512_E1", "AVX512_E2", "AVX512_E3", "AVX512_E4"):
            return pinned
    if lib.ckp_get_gemm_order() == lib.CKP_GEMM_ORDER_AVX2:  # also an AMD CPU with AVX-512 but Zen 4's (the C
        return "AVX2"                                         # library's order_from_env: MKL runs its AVX2 code)
    return "AVX512" if "avx512f" in flags else "AVX2" if {"avx2", "fma"} <= flags else "SSE"


def avx512_but_mkl_avx2() -> bool:
    """A CPU with AVX-512 where MKL's AUTO runs its AVX2 code (an AMD CPU past Zen 4: the C library's
    ckp_mkl_auto_runs_avx2 holds the rule)."""
    return _X86 and "avx512f" in _cpu_flags() and bool(lib.ckp_mkl_auto_runs_avx2())


@functools.lru_cache(maxsize=1)
def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def mkl_not_followed() -> str | None:
    """None where torch's sgemm runs in an order ckparity's GEMMs follow (MKL's AVX-512 branch; its AVX2 branch
    in strict mode, and where MKL's AUTO picks it its own order), else why not. The strict orders
    were measured on an Intel CPU only, the AVX2 branch's own on an AMD one (MKL picks code by vendor):
    elsewhere they are not claimed."""
    vendor = _cpu_vendor() or "unknown"
    if mkl_strict() and vendor != "GenuineIntel":
        return f"MKL's strict order was measured on Intel CPUs only, not on this {vendor} one"
    branch = mkl_branch()
    if branch in MODELLED_MKL_BRANCHES or (branch == "AVX2" and mkl_strict()):
        return None
    if branch == "AVX2" and lib.ckp_get_gemm_order() == lib.CKP_GEMM_ORDER_AVX2:
        if vendor != "AuthenticAMD":
            return f"MKL's AVX2 branch's own order was measured on an AMD CPU only, not on this {vendor} one"
        return None
    return (f"MKL's {branch} branch runs torch's sgemm here: its order is not followed (only "
            f"{MODELLED_MKL_BRANCHES}, AVX2 under MKL_CBWR=AVX2,STRICT, and AVX2's own where MKL's AUTO picks it)")


def mkl_avx2_own() -> bool:
    """Whether torch's sgemm runs MKL's AVX2 branch in its own (not strict) order, which ckparity's GEMMs follow
    for GEMMs of 4+ rows and 12+ columns ([Note: MKL's AVX2 order] in csrc/linear.c)."""
    return lib.ckp_get_gemm_order() == lib.CKP_GEMM_ORDER_AVX2


def mkl_strict() -> bool:
    """Whether MKL runs its strict Conditional Numerical Reproducibility order (MKL_CBWR=AUTO,STRICT): one
    order at every thread count, which ckparity's GEMMs then follow on MKL's AVX-512 and AVX2 branches ([Note:
    MKL's strict order] in csrc/linear.c) -- read from MKL_CBWR once, as MKL and the C library read it."""
    return lib.ckp_get_gemm_order() in (lib.CKP_GEMM_ORDER_STRICT, lib.CKP_GEMM_ORDER_STRICT_AVX2)


@functools.lru_cache(maxsize=1)
def mkl_version() -> str:
    """MKL's version string as the library in torch's process reports it ("" if none is found)."""
    import ctypes
    import os

    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        buffer = ctypes.create_string_buffer(256)
        library.MKL_Get_Version_String(buffer, len(buffer))
        return buffer.value.decode(errors="replace").strip()
    except (OSError, AttributeError):
        return ""


# [Note: oneDNN's ISA]
# torch hands some ops to oneDNN's JIT kernels (F.gelu's erf form: csrc/gelu_erf.c), whose bits depend on
# the instruction set oneDNN generates code for: the CPU's best, lowered by ONEDNN_MAX_CPU_ISA (or its older
# name DNNL_MAX_CPU_ISA) -- not torch's capability. oneDNN reports it through no symbol the wheel exports, so
# it is read as oneDNN reads it: the variable and the CPU's flags.
AVX512_CORE_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def onednn_isa() -> str:
    """The ISA family oneDNN's JIT code runs at in this process: "AVX512_CORE_BF16" (an avx512 one with the
    bf16 instructions), "AVX512_CORE" (without), "AVX2" (avx2 with FMA), or "AVX"/"SSE41" below; "none"
    without oneDNN or off x86."""
    if not (_X86 and torch.backends.mkldnn.is_available()):
        return "none"
    import os

    flags = _cpu_flags()
    order = ("SSE41", "AVX", "AVX2", "AVX512_CORE", "AVX512_CORE_BF16")
    best = ("AVX512_CORE_BF16" if "avx512_bf16" in flags else "AVX512_CORE") if AVX512_CORE_FLAGS <= flags else \
        "AVX2" if {"avx2", "fma"} <= flags else "AVX" if "avx" in flags else "SSE41"
    pinned = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not pinned or pinned in ("ALL", "DEFAULT"):
        return best
    family = ("AVX512_CORE" if pinned in ("AVX512_CORE", "AVX512_CORE_VNNI") else
              "AVX512_CORE_BF16" if pinned.startswith(("AVX512", "AVX10")) else
              "AVX2" if pinned.startswith("AVX2") else "AVX" if pinned == "AVX" else "SSE41")
    return order[min(order.index(best), order.index(family))]
