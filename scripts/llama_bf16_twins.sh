#!/usr/bin/env bash
# A whole llama step in C in bf16 (issue 55): the 300-step llama run of scripts/llama_twins.sh (4 layers, GQA,
# tied embeddings) with every op in ckparity's C, in pure bf16 (--dtype bfloat16) and under autocast (--amp
# bfloat16), against the torch twin, each required bitwise (--expect-bitwise): ckparity at 1 and 2 threads with
# torch at 1, and both at 2, at each capability in CAPS. Bitwise where torch's bf16 matmul and flash kernel run
# on ATen's own loops and MKL's AVX2 branch (a CPU without AVX-512: ckparity.ops.attention.bf16_followed), so
# run it on such a CPU. One report each in OUT (tests/test_llama.py reads them; docs/harness.md quotes them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
OUT=${OUT:-reports/llama/mkl_avx2/bf16}
mkdir -p "$OUT"
for cap in ${CAPS:-avx2 default}; do
  for mode in "bf16 --dtype bfloat16" "amp --amp bfloat16"; do
    set -- $mode
    tag=$1; shift
    for threads in "1 1" "2 1" "2 2"; do
      set -- $threads
      ATEN_CPU_CAPABILITY=$cap timeout 1800 .venv/bin/ckparity train --model llama --num-layers 4 --kv-heads 2 \
        --tie-embeddings --max-steps 300 $(echo "$mode" | cut -d' ' -f2-) --ck-all c --ck-loss-backend c_ptref \
        --torch-adamw fused --ck-optimizer-backend c_fused --expect-bitwise --threads $1 --torch-threads $2 \
        --no-progress --json-out "$OUT"/llama300_allc_${tag}_${cap}_threads${1}_torch${2}.json
    done
  done
done
