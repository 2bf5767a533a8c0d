#!/usr/bin/env bash
# Creates .venv if missing, installs torch (CPU), the other dependencies, and
# ckparity with its C library. Sourced by the README's commands; safe to rerun.
#
# CKP_TORCH_SPEC overrides the torch requirement. The default, torch==2.13.0,
# is the CPU wheel that lies on this project's machines; a plain `torch`
# would download a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
PY="$ROOT/.venv/bin/python"
export PATH="$ROOT/.venv/bin:$PATH"

# pip's own status decides (pipefail); only the local index's noise is dropped.
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }

quiet "$PY" -m pip install --quiet --disable-pip-version-check \
  "${CKP_TORCH_SPEC:-torch==2.13.0}" numpy cffi safetensors pytest pytest-xdist expecttest tqdm matplotlib meson-python meson ninja
# --no-build-isolation: build with the meson/ninja just installed, offline.
quiet "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps .
"$PY" -c "import torch, ckparity" || { echo "setup: torch or ckparity does not import" >&2; exit 2; }
