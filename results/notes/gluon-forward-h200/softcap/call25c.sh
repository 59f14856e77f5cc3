#!/usr/bin/env bash
# The Gluon forward with the softcap against the TMA forward (forward.ws off) in the frontier's
# own method: suite bench, phase fwd, each provider in a process of its own per round (call25a
# interleaved them in one process: 0.90-0.94x; the frontier's forward step put the Gluon
# forward's ms within 1 % of the TMA's 313aafd run). Gemma 2's three softcapped heads.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-480}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-softcap-fwd}
for head in 8192x2304x256000x30 8192x3584x256000x30 8192x4608x256000x30; do
  IFS=x read -r n d v s <<< "$head"
  # shellcheck disable=SC2046  # head_args is words
  step "fwd $head" python3 -m suite bench --phases fwd --dist lm $(head_args "$head") \
    --providers own,own@tma,torch_compile --variant 'own@tma={"forward":{"ws":false}}' \
    --rounds 2 --reps 20 --out "$RUN/n$n-d$d-v$v-sc$s" --quiet
done
python3 -m suite report "$RUN"/n*/round-* --versus own --peers own@tma,torch_compile 2>&1 | \
  grep -E '^From|^\||against' | tee -a "$LOG"
