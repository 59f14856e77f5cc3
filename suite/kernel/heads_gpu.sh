#!/usr/bin/env bash
# The exact default call, and the three-matmul path at torch.compile's memory, against
# torch.compile at model heads no preset names, in alternating rounds (bench --rounds): the
# check that a speed claim holds outside the shapes it was tuned on. One device call:
#   CCE_BENCH_COMMIT=<commit> HEADS="8192x1536x151936 16384x2048x128256" \
#       bash suite/kernel/heads_gpu.sh
# HEADS: NxDxV[xS] (S: the softcap), space-separated (default: the three heads of the
# where-time-goes notes; three heads at three rounds take longer than one 10-minute call: give
# each call some of them).
# PROVIDERS (default own,own_ws3072,PEER) are compared with PEER (default torch_compile);
# PHASE (default loss+grad; fwd: the forward alone, under no_grad), ROUNDS (default 3), REPS
# timed calls (default 30), DTYPE (default bf16); BENCH_ARGS: more
# bench arguments, split at spaces, e.g. a kernel variant beside the default:
# PROVIDERS=own,own@b,torch_compile BENCH_ARGS='--variant own@b={"forward":{"flatten":true}}'
# (JSON without spaces). PYTHON: the interpreter (default python3).
# TESTS=1 first runs the GPU tests (deadline_steps.sh's gpu_tests_step: GPU_TESTS, TEST_WORKERS,
# TESTS_CAP_S).
# Steps run under what is left of HEADS_DEADLINE_S (default 540 s from the start), so one slow
# step cannot take the others' rows with it. Writes RUN (default /tmp/run/heads-<gpu>: a folder
# per head with round-<r>/ folders) and, after every step, $OUT/<RUN's name>.tar of it and
# $OUT/heads.log; prints the per-round verdicts last (report --versus; with another PHASE,
# each round's rows).
set -uo pipefail
: "${OUT:?OUT: the folder whose files come back}"
START=$SECONDS
DEADLINE=${HEADS_DEADLINE_S:-540}
HEADS=${HEADS:-"8192x1536x151936 16384x2048x128256 8192x4096x32768"}
PEER=${PEER:-torch_compile}
PROVIDERS=${PROVIDERS:-own,own_ws3072,$PEER}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-30}
DTYPE=${DTYPE:-bf16}
PHASE=${PHASE:-loss+grad}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# shellcheck source=suite/kernel/deadline_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/deadline_steps.sh"
start_run heads

if [ "${TESTS:-0}" = 1 ]; then
  gpu_tests_step
fi
for head in $HEADS; do
  IFS=x read -r n d v s <<< "$head"
  # shellcheck disable=SC2046  # head_args is words
  step "head $head" "$PYTHON" -m suite bench --plugin suite.frontier --phases "$PHASE" \
    --dist lm --dtype "$DTYPE" $(head_args "$head") --providers "$PROVIDERS" \
    --rounds "$ROUNDS" --reps "$REPS" --out "$RUN/n$n-d$d-v$v${s:+-sc$s}" --quiet ${BENCH_ARGS:-}
done
shopt -s nullglob
rounds=("$RUN"/n*/round-*)
[ ${#rounds[@]} -gt 0 ] || rounds=("$RUN"/n*)  # ROUNDS=1: each head's folder is the run
if [ "$PHASE" != loss+grad ]; then  # report --versus judges loss+grad: the rows themselves
  for folder in "${rounds[@]}"; do
    print_rows "$folder/results.csv" n d v softcap provider status ms ms_p20 ms_p80 \
      floor_ratio peak_extra_mib | tee -a "$LOG"
  done
  exit 0
fi
for own in ${PROVIDERS//,/ }; do
  [ "$own" = "$PEER" ] || [ ${#rounds[@]} -eq 0 ] || \
    "$PYTHON" -m suite report "${rounds[@]}" --versus "$own" --peers "$PEER" 2>&1 | \
    grep -E '^From|^\||against' | tee -a "$LOG"
done
