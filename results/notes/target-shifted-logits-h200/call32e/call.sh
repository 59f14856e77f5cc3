#!/usr/bin/env bash
# call32e: Qwen 2.5 (7B)'s and Llama 3 (8B)'s heads, the portable default (1 GiB) against its
# fp32 logits (@fp32) and torch.compile, one round (what device time was left). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
RUN=/tmp/run/fp32-frontier HEADS_DEADLINE_S=${DEADLINE_S:-170} ROUNDS=1 REPS=20 \
  HEADS="16384x3584x152064 8192x4096x128256" PROVIDERS=own_portable,own_portable@fp32,torch_compile \
  BENCH_ARGS='--variant own_portable@fp32={"fused":{"target_shift":false}}' bash suite/kernel/heads_gpu.sh
