#!/usr/bin/env bash
# call39c: the frontier's forward step (frontier_gpu.sh's: own, own_portable, torch_compile, phase fwd
# under no_grad, a process per provider, 10 timed calls, --clocks where NVML answers) at its
# five shapes and the three heads no preset names, with forward.fixed_base_loads on (the pointer
# forward's k-loop loads from pointers fixed before the loop; call39a-b): only own_portable runs
# the changed kernel (call36f's script, as it ran at 09193dd and da7feba). Carry
# .gpu/site (pynvml). Writes $OUT/forward.tar after every step (deadline_steps.sh).
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
START=$SECONDS DEADLINE=${DEADLINE_S:-540}
source suite/kernel/deadline_steps.sh
RUN=/tmp/run/forward
start_run forward
CLOCK_ARGS=()  # each row's SM clock where NVML answers (.gpu/site's pynvml): frontier_gpu.sh's
python3 -c "import sys; from suite.clocks import unavailable
sys.exit(bool(unavailable('cuda')))" 2> /dev/null && CLOCK_ARGS=(--clocks)
for cell in "llama3-8b|--preset llama3-8b" "qwen25-7b|--preset qwen25-7b" \
  "d5120|--preset llama3-8b --n 8192 --d 5120 --v 131072" "gemma2-2b|--preset gemma2-2b" \
  "d1152|--preset llama3-8b --n 16384 --d 1152 --v 262144 --lm-entropy 3" \
  "h4096x7168|--preset llama3-8b --n 4096 --d 7168 --v 129280" \
  "h8192x8192|--preset llama3-8b --n 8192 --d 8192 --v 152064" \
  "h16384x2048|--preset llama3-8b --n 16384 --d 2048 --v 49152"; do
  name=${cell%%|*} args=${cell#*|}
  # shellcheck disable=SC2086
  step "forward $name" python3 -m suite bench --dist lm --phases fwd --isolate --reps 10 \
    --dtype bf16 --providers own,own_portable,torch_compile $args "${CLOCK_ARGS[@]}" \
    --out "$RUN/forward-$GPU" --resume --quiet
done
print_rows "$RUN/forward-$GPU/results.csv" n d v softcap provider status ms ms_p20 ms_p80 \
  floor_ratio sm_mhz
