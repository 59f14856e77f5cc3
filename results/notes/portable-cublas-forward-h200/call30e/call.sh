#!/usr/bin/env bash
# forward.cublas_min_d 3072 at two softcapped heads above it (Gemma 2 (9B)'s and (27B)'s,
# softcap 30), which no earlier call ran with the cuBLAS forward: the portable default against
# the pointer forward (@pointer: cublas_min_d 0), forced on the H200, phase fwd under no_grad,
# 20 timed calls. No peers: carry nothing.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
START=$SECONDS DEADLINE=${DEADLINE_S:-200}
source suite/kernel/deadline_steps.sh
RUN=/tmp/run/cublas-forward-softcap
start_run cublas-forward-softcap
POINTER='own_portable@pointer={"forward":{"cublas_min_d":0}}'
for head in 8192x3584x256000x30 8192x4608x256000x30; do
  # shellcheck disable=SC2046
  step "fwd $head" python3 -m suite bench --dist lm --phases fwd --dtype bf16 \
    $(head_args "$head") --providers own_portable,own_portable@pointer --variant "$POINTER" \
    --reps 20 --out "$RUN/fwd-$head" --quiet
done
print_rows "$RUN/*/results.csv" n d v softcap provider status ms ms_p20 ms_p80 floor_ratio \
  peak_extra_mib loss_rel_err
