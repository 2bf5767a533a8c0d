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

"$PY" -m pip install --quiet --disable-pip-version-check \
  "${CKP_TORCH_SPEC:-torch==2.13.0}" numpy cffi pytest tqdm matplotlib \
  meson-python meson ninja 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -c "import torch" || { echo "setup: torch did not install" >&2; exit 2; }
# --no-build-isolation: build with the meson/ninja just installed, offline.
"$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps . \
  2>&1 | grep -v "^WARNING: Location" || true
"$PY" -c "import ckparity" || { echo "setup: ckparity did not install" >&2; exit 2; }
