#!/usr/bin/env bash
# The nightly tier: the test command with the tests marked nightly (longer
# cases of properties CI checks faster; CKP_NIGHTLY=1), then the full tier of
# the parity gates. Extra arguments go to pytest, as for scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CKP_NIGHTLY=1 ./scripts/test.sh "$@"
.venv/bin/ckparity gate --tier full
