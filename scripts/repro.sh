#!/usr/bin/env bash
# The 850-step drift repro: set up exactly as ./scripts/test.sh does, then run
# `ckparity repro` (loss backends c, c_ptref, c_fused_linear and torch; RMSNorm,
# SwiGLU and AdamW in C), writing reports/repro_850_{c,c_ptref,c_fused_linear,torch}.json
# and an A/B table; then the same preset in bf16 beside it: pure bf16 twins
# (reports/repro_850_bfloat16_*.json) and mixed precision, float32 masters under
# autocast (reports/repro_850_amp_*.json): loss backends c, c_ptref, c_fused_linear and torch in
# pure bf16, c, c_ptref and torch under --amp (c_fused_linear has no --amp form).
# Extra arguments go to every `ckparity repro` (e.g. --out-dir /tmp/r).
# The exit code is the worst of the three.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh || exit $?
worst=0
for precision in "" "--dtype bfloat16" "--amp bfloat16"; do
    echo "== ckparity repro ${precision:-(float32)}"
    # shellcheck disable=SC2086 -- the precision flags split into words on purpose
    "$ROOT/.venv/bin/ckparity" repro $precision "$@"
    rc=$?
    if [ "$rc" -gt "$worst" ]; then worst=$rc; fi
    if [ "$rc" -ge 128 ]; then break; fi  # interrupted: the other runs would not be asked for
done
exit "$worst"
