#!/usr/bin/env bash
# The ptref twins in bf16 at each CPU capability torch runs at here: pure bf16 and --amp,
# the 850-step preset and a 300-step llama run, one report each in reports/bf16_twins/
# (tests/test_bf16_twins.py reads them; docs/harness.md quotes them). Needs an AVX-512 CPU for all three.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
mkdir -p reports/bf16_twins
for cap in default avx2 avx512; do
  for mode in "--dtype bfloat16" "--amp bfloat16 --ck-optimizer-backend torch"; do
    tag=$(echo "$mode" | awk '{print ($1=="--amp") ? "amp" : "bf16"}')
    ATEN_CPU_CAPABILITY=$cap timeout 900 .venv/bin/ckparity train $mode --ck-loss-backend c_ptref --epochs 8 --seq-len 8 --total-tokens 131072 --grad-accum 8 --lr 1e-3 --seed 42 --max-steps 850 --no-progress --json-out reports/bf16_twins/preset850_${tag}_${cap}.json
    ATEN_CPU_CAPABILITY=$cap timeout 900 .venv/bin/ckparity train $mode --ck-loss-backend c_ptref --model llama --num-layers 2 --seq-len 32 --max-steps 300 --no-progress --json-out reports/bf16_twins/llama300_${tag}_${cap}.json
  done
done
