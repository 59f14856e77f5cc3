#!/usr/bin/env bash
# forward.cublas_min_d 3072 in the portable config (set from call30a and call30b), checked at
# heads those calls did not run, forced on the H200: the default (own_portable) against the
# pointer forward (@pointer: cublas_min_d 0) and, below the threshold, the cuBLAS one forced
# (@cublas), phase fwd under no_grad, 20 timed calls; one loss+grad head whose 1 GiB budget
# does not hold the three-matmul path (32 chunks > fused.dc_max_chunks), so the recompute path
# runs after the cuBLAS forward. First the GPU cases of the new forward's tests and of
# test_backward_portable.py, with a longer cap. No peers: carry nothing.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
START=$SECONDS DEADLINE=${DEADLINE_S:-540}
source suite/kernel/deadline_steps.sh
start_run cublas-forward-check
PYTHON=python3 GPU_TESTS="tests/test_forward_cublas.py tests/test_backward_portable.py" \
  TESTS_CAP_S=240 gpu_tests_step
POINTER='own_portable@pointer={"forward":{"cublas_min_d":0}}'
CUBLAS='own_portable@cublas={"forward":{"cublas_min_d":1}}'
for head in 16384x3072x128256 8192x4096x32000 8192x6144x65536 8192x2560x51200; do
  # shellcheck disable=SC2046
  step "fwd $head" python3 -m suite bench --dist lm --phases fwd --dtype bf16 \
    $(head_args "$head") --providers own_portable,own_portable@pointer,own_portable@cublas \
    --variant "$POINTER" --variant "$CUBLAS" --reps 20 --out "$RUN/fwd-$head" --quiet
done
# shellcheck disable=SC2046
step "loss+grad 65536x4096x128256" python3 -m suite bench --dist lm --phases loss+grad \
  --dtype bf16 $(head_args 65536x4096x128256) --providers own_portable,own_portable@pointer \
  --variant "$POINTER" --reps 10 --out "$RUN/lossgrad-65536x4096x128256" --quiet
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$LOG" | tail -n 30
print_rows "$RUN/*/results.csv" n d v phase provider status ms ms_p20 ms_p80 floor_ratio \
  peak_extra_mib loss_rel_err de_rel_err dc_rel_err
