#!/usr/bin/env bash
# A whole llama step in C (issue 55): the 300-step llama run (4 layers, d 64, 4 query heads over 2 kv heads,
# tied embeddings, seq 32) with every op in ckparity's C -- embedding, linear, rms_norm, rope, attention,
# swiglu, residual, the ptref loss, clip, and the C AdamW in its fused form against torch's fused AdamW (the
# single-tensor pair differs in the sqrt's last bit on some CPUs: kernels.record.GPT2_RUN says why it matters)
# -- against the torch twin, torch at one thread (the C linear and attention follow MKL's one-thread order),
# ckparity at 1 and 2 threads, at each CPU capability torch runs at here; and torch at 2 threads with
# ckparity at 2 (at these shapes MKL splits none of the step's GEMMs between its threads: measured, not
# a rule -- GPT-2's K = 1024 projections are split). One report each in reports/llama/
# (tests/test_llama.py reads them; docs/harness.md quotes them).
# CAPS and OUT choose the capabilities and the folder: on a CPU without AVX-512 (MKL's AVX2 branch),
# CAPS="avx2 default" OUT=reports/llama/mkl_avx2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
OUT=${OUT:-reports/llama}
mkdir -p "$OUT"
for cap in ${CAPS:-avx512 avx2 default}; do
  for threads in 1 2; do
    ATEN_CPU_CAPABILITY=$cap timeout 1800 .venv/bin/ckparity train --model llama --num-layers 4 --kv-heads 2 --tie-embeddings --max-steps 300 \
      --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused --expect-bitwise \
      --torch-threads 1 --threads $threads --no-progress --json-out "$OUT"/llama300_allc_${cap}_threads${threads}.json
  done
  ATEN_CPU_CAPABILITY=$cap timeout 1800 .venv/bin/ckparity train --model llama --num-layers 4 --kv-heads 2 --tie-embeddings --max-steps 300 \
    --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused --expect-bitwise \
    --torch-threads 2 --threads 2 --no-progress --json-out "$OUT"/llama300_allc_${cap}_threads2_torch2.json
done
