#!/usr/bin/env bash
# call36b: the forward's split count chosen in the kernels' launch order (the default since
# ee9cbde) against the split-order model before it (forward.makespan_order "split"). The forward
# alone in one process: interleaved at ten grids it moves (three measured before with ov2, seven
# never measured), then blocked and settled at five of the unmeasured ones; first each head's
# lse against fp32 logits' logsumexp under both plans. Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
OLD='old={"forward":{"makespan_order":"split"}}'
SEEN=4096x3584x152064,4096x7168x129280,8192x5120x131072
NEW=4096x8192x152064,4096x5120x151936,5120x3584x32000,8192x3072x131072,16384x3584x49152
NEW2=4096x6144x131072,5120x6144x131072
timeout -k 5 100 python3 - "$SEEN,$NEW,$NEW2" > "$R/lse.log" 2>&1 <<'PY'
import sys, torch
from own_kernel import linear_cross_entropy
from own_kernel.policy.config import overridden
from suite.inputs import make_inputs
print("head lse_err_launch lse_err_split max_diff_between")
for head in sys.argv[1].split(","):
    n, d, v = map(int, head.split("x"))
    x = make_inputs("lm", n, d, v, "bf16", seed=0, device=torch.device("cuda"))
    e, c, t = x["e"], x["c"], x["targets"]
    ref = torch.logsumexp(e.float() @ c.float().T, dim=1)
    got = {}
    for name, over in (("launch", {}), ("split", {"forward": {"makespan_order": "split"}})):
        with overridden(over), torch.no_grad():
            got[name] = linear_cross_entropy(e, c, t, reduction="none", return_lse=True)[1].float()
    err = {k: float((g - ref).abs().max() / ref.abs().max()) for k, g in got.items()}
    print(head, f"{err['launch']:.2e} {err['split']:.2e}",
          f"{float((got['launch'] - got['split']).abs().max()):.2e}")
PY
echo "lse: exit $?"
timeout -k 5 ${CAP_S:-270} python3 -m suite kernel interleave --phase fwd --reps 30 \
  --heads "$SEEN,$NEW,$NEW2" --variants "$OLD" --out "$R/fwd" > "$R/fwd.log" 2>&1
echo "fwd: exit $?"
tar -C "$R" -czf "$OUT/call36b.tgz" .
timeout -k 5 ${CAP2_S:-170} python3 -m suite kernel interleave --phase fwd --reps 20 \
  --order blocked --settle 12 --clocks --heads "$NEW" --variants "$OLD" \
  --out "$R/fwd-blocked" > "$R/fwd-blocked.log" 2>&1
echo "fwd-blocked: exit $?"
tar -C "$R" -czf "$OUT/call36b.tgz" .
cat "$R/lse.log"
for f in fwd fwd-blocked; do
  python3 - "$R/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(*(r.get(k, "") for k in ("head", "entry", "ms", "ms_p20", "ms_p80", "floors",
                                   "ms_over_base", "vs_base", "status", "sm_mhz")))
PY
done
