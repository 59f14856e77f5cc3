#!/usr/bin/env bash
# forward.softcap_halves on the Hopper (TMA) forward at Gemma 2 (2B), softcap 30: the forward
# alone (phase fwd) and the default loss+grad (the shifted-logits forward), own against own@h,
# two rounds of 20 timed calls, one process per (cell, provider); then own_portable as HEAD's
# PORTABLE runs it (halves with a softcap) in one round; then the GPU tests of the halves.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=560
source suite/kernel/deadline_steps.sh
start_run tma-halves
H='own@h={"forward":{"softcap_halves":true}}'
capped_step "fwd" 130 python3 -m suite bench --dist lm --phases fwd --preset gemma2-2b \
  --dtype bf16 --rounds 2 --reps 20 --providers own,own@h --variant "$H" --out "$RUN/fwd"
capped_step "loss+grad" 200 python3 -m suite bench --dist lm --phases loss+grad --preset gemma2-2b \
  --dtype bf16 --rounds 2 --reps 20 --providers own,own@h --variant "$H" --out "$RUN/loss-grad"
capped_step "portable" 90 python3 -m suite bench --dist lm --phases fwd --preset gemma2-2b \
  --dtype bf16 --reps 20 --providers own_portable --out "$RUN/portable-head"
capped_step "gpu tests" 100 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -n 4 -p no:cacheprovider \
  tests/test_fused.py -k "softcap_halves or matches_reference"
cp $LOG $OUT/
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/**/results.csv", recursive=True)):
    for r in csv.DictReader(open(f)):
        print("/".join(f.split("/")[-3:-1]), r["phase"], r["provider"], r["status"], r["ms"][:6],
              r["ms_p20"][:6], r["ms_p80"][:6], r["floor_ratio"][:5], r["de_rel_err"][:7],
              r["dc_rel_err"][:7], r["ran"], r["error"][:60])
PY
grep -E "passed|failed" $LOG | tail -2
