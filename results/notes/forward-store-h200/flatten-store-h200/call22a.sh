#!/usr/bin/env bash
# The shifted-logits forward's loop options on the three-matmul path, interleaved in one
# process per head: flatten (+ one store slice) against the default, at the default budget and
# 4096 MiB, beside torch.compile. Two tuning heads (Llama 3 (8B), D 5120) and three it was not
# tuned on.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-570}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-flatten-store}
FL1='{"forward":{"flatten":true},"fused":{"y_slices":1}}'
FL='{"forward":{"flatten":true}}'
Y1='{"fused":{"y_slices":1}}'
for head in ${HEADS:-8192x4096x128256 8192x5120x131072 8192x8192x152064 8192x4608x256000x30 4096x7168x129280}; do
  capped_step "head $head" ${HEAD_CAP_S:-110} python3 -m suite kernel interleave --heads $head \
    --variants "fl1=$FL1" "fl=$FL" "y1=$Y1" --budgets default,4096 --compile \
    --reps ${REPS:-20} --out "$RUN/$head"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["chunks"], r["ms"][:6], r["ms_p20"][:6],
              r["ms_p80"][:6], r["floors"][:5], r["ms_over_base"][:6], r["ms_over_compile"][:6],
              r["peak_mib"][:7], r["de_diff_vs_base"][:8])
PY
