#!/usr/bin/env bash
# The portable forward (phase fwd, under no_grad) with and without the cuBLAS forward
# (config.Forward.cublas_min_d: row chunks of cuBLAS's fp32 logits in the 1 GiB budget, one
# pass each), forced on the H200, at the frontier's five shapes and three heads no preset names,
# beside torch.compile; two alternating rounds, 20 timed calls. First the GPU cases of the new
# forward's tests and of test_backward_portable.py (its sixth case had not finished at 240 s).
# No peers beyond torch.compile: carry nothing.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
START=$SECONDS DEADLINE=${DEADLINE_S:-560}
source suite/kernel/deadline_steps.sh
start_run cublas-forward
PYTHON=python3 GPU_TESTS="tests/test_forward_cublas.py tests/test_backward_portable.py" \
  TESTS_CAP_S=170 gpu_tests_step
VARIANT='own_portable@cublas={"forward":{"cublas_min_d":1}}'
for cell in "llama3-8b|--preset llama3-8b" "gemma2-2b|--preset gemma2-2b" \
  "qwen25-7b|--preset qwen25-7b" "d5120|--preset llama3-8b --n 8192 --d 5120 --v 131072" \
  "d1152|--preset llama3-8b --n 16384 --d 1152 --v 262144 --lm-entropy 3" \
  "h8192x8192x152064|$(head_args 8192x8192x152064)" \
  "h16384x2048x49152|$(head_args 16384x2048x49152)" \
  "h4096x7168x129280|$(head_args 4096x7168x129280)"; do
  name=${cell%%|*} args=${cell#*|}
  # shellcheck disable=SC2086
  step "fwd $name" python3 -m suite bench --dist lm --phases fwd --dtype bf16 $args \
    --providers own_portable,own_portable@cublas,torch_compile --variant "$VARIANT" \
    --rounds 2 --reps 20 --out "$RUN/$name" --quiet
done
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$LOG" | tail -n 40
print_rows "$RUN/*/round-*/results.csv" n d v softcap provider status ms ms_p20 ms_p80 \
  floor_ratio peak_extra_mib loss_rel_err
