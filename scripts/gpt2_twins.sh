#!/usr/bin/env bash
# The GPT-2 twin (issue 56's small GPT-2: 4 layers, d 256, vocab 8192, seq 64) with every op in
# ckparity's C: embedding, linear with biases, layer_norm, gelu, attention, residual, the ptref loss,
# and the C AdamW in its fused form against torch's fused AdamW
# (--torch-adamw fused: the single-tensor path's MKL sqrt is another rounding, which GPT-2's key bias
# turns into drift: kernels.record.GPT2_RUN). torch at one thread, where the C linear follows MKL's
# order; ckparity at 1 and 2 threads; each CPU capability torch runs at here. And with --gelu erf (F.gelu's
# default form, which torch hands to oneDNN: csrc/gelu_erf.c), ckparity at 1 thread.
# One report each in reports/gpt2/ (tests/test_gpt2.py reads them; docs/harness.md quotes them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
mkdir -p reports/gpt2
for cap in avx512 avx2 default; do
  for threads in 1 2; do
    ATEN_CPU_CAPABILITY=$cap timeout 1800 .venv/bin/ckparity train --model gpt2 --num-layers 4 --d-model 256 \
      --vocab 8192 --seq-len 64 --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused --expect-bitwise \
      --torch-threads 1 --threads $threads --max-steps 850 --no-progress \
      --json-out reports/gpt2/gpt2_850_${cap}_threads${threads}.json
  done
done
for cap in avx512 avx2 default; do
  ATEN_CPU_CAPABILITY=$cap timeout 1800 .venv/bin/ckparity train --model gpt2 --num-layers 4 --d-model 256 \
    --vocab 8192 --seq-len 64 --gelu erf --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused \
    --expect-bitwise --torch-threads 1 --threads 1 --max-steps 850 --no-progress \
    --json-out reports/gpt2/gpt2_850_erf_${cap}_threads1.json
done
# MKL's strict order (MKL_CBWR=AUTO,STRICT: one order at every thread count, which the C linear and attention
# follow: [Note: MKL's strict order] in csrc/linear.c): torch at 2 threads too; 850 steps at AVX512, 300 at the others.
for cap in avx512 avx2 default; do
  steps=$([ $cap = avx512 ] && echo 850 || echo 300)
  MKL_CBWR=AUTO,STRICT ATEN_CPU_CAPABILITY=$cap timeout 3600 .venv/bin/ckparity train --model gpt2 --num-layers 4 --d-model 256 \
    --vocab 8192 --seq-len 64 --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused \
    --expect-bitwise --torch-threads 2 --threads 2 --max-steps $steps --no-progress \
    --json-out reports/gpt2/gpt2_${steps}_strict_${cap}_torch2.json
done
# and MKL's AVX2 branch in strict mode (MKL_CBWR=AVX2,STRICT: blocks of 192), torch at 2 threads, 300 steps.
MKL_CBWR=AVX2,STRICT timeout 3600 .venv/bin/ckparity train --model gpt2 --num-layers 4 --d-model 256 \
  --vocab 8192 --seq-len 64 --ck-all c --ck-loss-backend c_ptref --torch-adamw fused --ck-optimizer-backend c_fused \
  --expect-bitwise --torch-threads 2 --threads 2 --max-steps 300 --no-progress \
  --json-out reports/gpt2/gpt2_300_strict_avx2branch_torch2.json
