#!/usr/bin/env bash
# The 850-step drift repro: set up exactly as ./scripts/test.sh does, then run
# `ckparity repro` (loss backends c, c_ptref, c_fused_linear and torch; RMSNorm,
# SwiGLU and AdamW in C), writing reports/repro_850_{c,c_ptref,c_fused_linear,torch}.json
# and an A/B table.
# Extra arguments go to `ckparity repro` (e.g. --out-dir /tmp/r).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec "$ROOT/.venv/bin/ckparity" repro "$@"
