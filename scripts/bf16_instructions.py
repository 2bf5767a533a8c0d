"""Can ckparity round to bfloat16 with AVX-512 BF16's VCVTNEPS2BF16 and keep
torch's bits? Compares the instruction with torch's own float32 -> bf16
conversion (the rounding every bf16 op's store goes through) on float32 bit
patterns, and counts where they differ, by class:

    python scripts/bf16_instructions.py --all --json-out reports/bf16_instructions/vcvtneps2bf16.json
    python scripts/bf16_instructions.py --sample 1000000     (every class sampled: seconds)

--all goes through every one of the 2^32 patterns (~10 s). Needs a CPU with
avx512_bf16 and a gcc that takes -mavx512bf16; otherwise exits 3 saying so.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
void convert(const float *in, uint16_t *out, int64_t n) { /* n a multiple of 16 */
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(in + i)));
}
"""
CHUNK = 1 << 24
UNSUPPORTED = 3


def _library(workdir: Path):
    if "avx512_bf16" not in Path("/proc/cpuinfo").read_text():
        raise OSError("this CPU has no avx512_bf16")
    source, library = workdir / "convert.c", workdir / "convert.so"
    source.write_text(SOURCE)
    built = subprocess.run(["gcc", "-O2", "-mavx512f", "-mavx512bf16", "-shared", "-fPIC", str(source), "-o",
                            str(library)], capture_output=True, text=True)
    if built.returncode:
        raise OSError(f"gcc cannot build AVX-512 BF16 code: {built.stderr.strip()[:200]}")
    return ctypes.CDLL(str(library))


def _count(library, bits: np.ndarray, counts: dict) -> None:
    floats = bits.view(np.float32)
    out = np.empty(bits.size, np.uint16)
    library.convert(floats.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_int64(bits.size))
    torchs = torch.from_numpy(floats).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(floats)
    subnormal = ((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)
    differ = out != torchs
    for name, members in (("nan", nan), ("subnormal", subnormal), ("other", ~nan & ~subnormal)):
        counts[name]["compared"] += int(members.sum())
        counts[name]["differing"] += int((differ & members).sum())


def compare(all_patterns: bool, sample: int, seed: int = 0) -> dict:
    counts = {name: {"compared": 0, "differing": 0} for name in ("nan", "subnormal", "other")}
    with tempfile.TemporaryDirectory() as workdir:
        library = _library(Path(workdir))
        if all_patterns:
            for start in range(0, 1 << 32, CHUNK):
                _count(library, np.arange(start, start + CHUNK, dtype=np.uint64).astype(np.uint32), counts)
        else:  # random patterns, plus as many subnormals and NaNs drawn on purpose
            rng = np.random.default_rng(seed)
            n = -(-sample // 16) * 16
            mantissa = rng.integers(1, 1 << 23, n, dtype=np.uint32)
            sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
            for bits in (rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32), sign | mantissa,
                         sign | 0x7F800000 | mantissa):
                _count(library, bits, counts)
    return {"schema": "ckparity.bf16_instructions/1", "instruction": "VCVTNEPS2BF16",
            "against": f"torch {torch.__version__} float32 -> bfloat16 (.to)",
            "patterns": "all 2^32" if all_patterns else f"{sample} random, {sample} subnormal, {sample} NaN",
            "classes": counts}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="every float32 bit pattern (~10 s)")
    parser.add_argument("--sample", type=int, default=1 << 20, help="patterns per class without --all")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    try:
        report = compare(args.all, args.sample)
    except OSError as e:
        print(f"bf16_instructions: cannot run here: {e}", file=sys.stderr)
        return UNSUPPORTED
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
