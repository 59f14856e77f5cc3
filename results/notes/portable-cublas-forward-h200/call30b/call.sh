#!/usr/bin/env bash
# call30a's forward comparison at the shapes its deadline left out: the portable forward with
# and without the cuBLAS forward (forward.cublas_min_d 1 forces it), forced on the H200, phase
# fwd under no_grad, one run of 20 timed calls a shape (two rounds took about 150 s a shape:
# the pointer forward's tiles are timed in every process). No torch.compile, no GPU tests.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
START=$SECONDS DEADLINE=${DEADLINE_S:-560}
source suite/kernel/deadline_steps.sh
start_run cublas-forward
VARIANT='own_portable@cublas={"forward":{"cublas_min_d":1}}'
for cell in "h4096x7168x129280|$(head_args 4096x7168x129280)" \
  "d5120|--preset llama3-8b --n 8192 --d 5120 --v 131072" \
  "h8192x8192x152064|$(head_args 8192x8192x152064)" \
  "d1152|--preset llama3-8b --n 16384 --d 1152 --v 262144 --lm-entropy 3" \
  "h16384x2048x49152|$(head_args 16384x2048x49152)"; do
  name=${cell%%|*} args=${cell#*|}
  # shellcheck disable=SC2086
  step "fwd $name" python3 -m suite bench --dist lm --phases fwd --dtype bf16 $args \
    --providers own_portable,own_portable@cublas --variant "$VARIANT" \
    --reps 20 --out "$RUN/$name" --quiet
done
print_rows "$RUN/*/results.csv" n d v softcap provider status ms ms_p20 ms_p80 \
  floor_ratio peak_extra_mib loss_rel_err
