#!/usr/bin/env bash
# Relaxed atomics for the kernels' sums (RowRound, ColSum, ...), at the commit that makes them
# so. Carry .gpu/site, .gpu/exp (ws_probe.py) and .gpu/old (`git archive c175622 own_kernel`:
# the kernel before, acq_rel atomics). 1. the GPU tests of the writers and paths; 2. the Gluon
# W writer alone (ws_probe.py: acq_rel against relaxed, in one process); 3. loss+grad, the
# kernel before against after, one process each, alternating (new, old, new, old), at D 1152
# and Gemma 2 (2B): the recompute path (budget 0), the portable config's default, the filter.
set -u
export PYTHONUNBUFFERED=1
START=$SECONDS; R=/tmp/ra; mkdir -p $R
el() { echo "$((SECONDS-START)) s"; }
pack() { tar cf $OUT/ra.tar -C /tmp ra; }
timeout -k 5 230 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -rs -n 8 -p no:cacheprovider \
  tests/test_dlogits_ws.py tests/test_determinism.py tests/test_backward_portable.py \
  tests/test_fused.py tests/test_autograd_paths.py > $R/gpu-tests.log 2>&1
echo "gpu tests rc $? at $(el)"; tail -3 $R/gpu-tests.log; pack
PROBE_DIR=/tmp/probe timeout -k 5 120 python3 .gpu/exp/ws_probe.py 2>&1 \
  | grep -v "leaked\|nanobind\|skipped\|refleaks\|warn" > $R/ws-probe.log
echo "probe rc $? at $(el)"; cp $OUT/ws_probe.json $R/ 2>/dev/null; pack
mkdir -p /tmp/oldtree && ln -sfn $PWD/suite /tmp/oldtree/suite \
  && ln -sfn $PWD/.gpu/old/own_kernel /tmp/oldtree/own_kernel
for round in 1 2; do
  for arm in new old; do
    for h in 16384x1152x262144x0 8192x2304x256000x30; do
      IFS=x read -r n d v s <<< "$h"; sc=$s; [ $s = 0 ] && sc=none
      [ $((SECONDS-START)) -lt 520 ] || { echo "skip $round $arm $h"; continue; }
      dir=$PWD; [ $arm = old ] && dir=/tmp/oldtree
      (cd $dir && timeout -k 5 $((560-SECONDS+START)) python3 -m suite bench --plugin suite.frontier \
        --phases loss+grad --dist lm --dtype bf16 --reps 20 --quiet --clocks \
        --providers own_recompute,own_portable,own_filter --n $n --d $d --v $v --softcap $sc \
        --out $R/r$round-$arm-h$h >> $R/bench.log 2>&1)
      echo "bench $round $arm $h rc $? at $(el)"; pack
    done
  done
done
pack
cat $R/ws-probe.log | grep -v "^check"
for f in $R/r*/results.csv; do python3 - "$f" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r['phase'] == 'loss+grad' and r.get('ms'):
        print(sys.argv[1].split('/')[-2], r['provider'], f"{float(r['floor_ratio']):.3f}",
              f"{float(r['ms']):.2f} {float(r['ms_p20']):.2f}-{float(r['ms_p80']):.2f}",
              f"dE {float(r['de_rel_err']):.5f} dC {float(r['dc_rel_err']):.5f}")
PY
done
