#!/usr/bin/env bash
# call36d: every row block's last split launched after the launch groups (forward.short_split_last,
# the candidate default) against the launch-order plan without it (call36b-c's default, `launch`)
# and the split-order plan before both (`old`). First each head's lse against fp32 logits'
# logsumexp under the three plans (two Gluon grids at D 3072 among them) and the Gluon forward's
# GPU tests; then the forward alone in one process, interleaved at eight grids (four measured
# before, four not), then blocked and settled at four of them. Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
LAUNCH='launch={"forward":{"short_split_last":false}}'
OLD='old={"forward":{"short_split_last":false,"makespan_order":"split"}}'
SEEN=4096x3584x152064,4096x7168x129280,8192x5120x131072,4096x8192x152064
UNSEEN=4096x4096x152064,4096x8192x200064,16384x3072x128256,16384x3584x128256
timeout -k 5 120 python3 - "$SEEN,$UNSEEN,32768x3072x49152" > "$R/lse.log" 2>&1 <<'PY'
import sys, torch
from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden
from suite.inputs import make_inputs
plans = {"new": {}, "launch": {"forward": {"short_split_last": False}},
         "old": {"forward": {"short_split_last": False, "makespan_order": "split"}}}
print("head", *(f"lse_err_{k}" for k in plans), "max_diff_new_old")
for head in sys.argv[1].split(","):
    n, d, v = map(int, head.split("x"))
    x = make_inputs("lm", n, d, v, "bf16", seed=0, device=torch.device("cuda"))
    e, c, t = x["e"], x["c"], x["targets"]
    ref = torch.logsumexp(e.float() @ c.float().T, dim=1)
    got = {}
    for name, over in plans.items():
        with overridden(over), torch.no_grad():
            got[name] = linear_cross_entropy(e, c, t, reduction="none", return_lse=True)[1].float()
    err = [f"{float((g - ref).abs().max() / ref.abs().max()):.2e}" for g in got.values()]
    print(head, *err, f"{float((got['new'] - got['old']).abs().max()):.2e}")
PY
echo "lse: exit $?"
CCE_TEST_DEVICE=cuda timeout -k 5 120 python3 -m pytest -q -rs -x -p no:cacheprovider \
  tests/test_forward_ws.py > "$R/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 3 "$R/gpu-tests.log"
timeout -k 5 ${CAP_S:-240} python3 -m suite kernel interleave --phase fwd --reps 30 \
  --heads "$SEEN,$UNSEEN" --variants "$LAUNCH" "$OLD" --out "$R/fwd" > "$R/fwd.log" 2>&1
echo "fwd: exit $?"
tar -C "$R" -czf "$OUT/call36d.tgz" .
timeout -k 5 ${CAP2_S:-170} python3 -m suite kernel interleave --phase fwd --reps 20 \
  --order blocked --settle 12 --clocks --heads "$UNSEEN" --variants "$LAUNCH" "$OLD" \
  --out "$R/fwd-blocked" > "$R/fwd-blocked.log" 2>&1
echo "fwd-blocked: exit $?"
tar -C "$R" -czf "$OUT/call36d.tgz" .
cat "$R/lse.log"
for f in fwd fwd-blocked; do
  python3 - "$R/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(*(r.get(k, "") for k in ("head", "entry", "ms", "ms_p20", "ms_p80", "floors",
                                   "ms_over_base", "vs_base", "status", "sm_mhz")))
PY
done
