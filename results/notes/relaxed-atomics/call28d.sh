#!/usr/bin/env bash
# At the commit after call28c: 1. the GPU tests (test_backward_portable.py's cases now on the
# GPU where they do not compare two variants bit for bit; the two PTX checks whatever the
# Triton's qualifier order), then the paths' (test_fused.py, test_autograd_paths.py);
# 2. the recompute path (budget 0 pinned) and the low-memory path, the kernel before
# (.gpu/old: c175622's own_kernel, carried) against after, one process each, new then old, at
# two heads no preset names with a small D (Gluon W writer).
set -u
export PYTHONUNBUFFERED=1
START=$SECONDS; R=/tmp/rd; mkdir -p $R
el() { echo "$((SECONDS-START)) s"; }
pack() { tar cf $OUT/rd.tar -C /tmp rd; }
timeout -k 5 250 env CCE_TEST_DEVICE=cuda python3 -m pytest -v -rfs --tb=short -n 8 \
  -p no:cacheprovider tests/test_dlogits_ws.py tests/test_determinism.py \
  tests/test_backward_portable.py tests/test_fused.py tests/test_autograd_paths.py \
  > $R/gpu-tests.log 2>&1
echo "gpu tests rc $? at $(el)"; grep -E "FAILED|[0-9]+ (passed|failed)" $R/gpu-tests.log \
  | sed 's/^\[gw[0-9]*\] //' | sort -u | tail -12; pack
mkdir -p /tmp/oldtree && ln -sfn $PWD/suite /tmp/oldtree/suite \
  && ln -sfn $PWD/.gpu/old/own_kernel /tmp/oldtree/own_kernel
for round in 1 2; do
  for arm in new old; do
    for h in 16384x896x151936 8192x1536x151936; do
      IFS=x read -r n d v <<< "$h"
      [ $((SECONDS-START)) -lt 480 ] || { echo "skip $round $arm $h"; continue; }
      dir=$PWD; [ $arm = old ] && dir=/tmp/oldtree
      (cd $dir && timeout -k 5 $((520-SECONDS+START)) python3 -m suite bench --plugin suite.frontier \
        --phases loss+grad --dist lm --dtype bf16 --reps 20 --quiet --clocks \
        --providers own_recompute,own_low_memory --n $n --d $d --v $v --softcap none \
        --out $R/r$round-$arm-h$h >> $R/bench.log 2>&1)
      echo "bench $round $arm $h rc $? at $(el)"; pack
    done
  done
done
pack
for f in $R/r*/results.csv; do python3 - "$f" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r['phase'] == 'loss+grad' and r.get('ms'):
        print(sys.argv[1].split('/')[-2], r['provider'], f"{float(r['floor_ratio']):.3f}",
              f"{float(r['ms']):.2f} {float(r['ms_p20']):.2f}-{float(r['ms_p80']):.2f}",
              f"dE {float(r['de_rel_err']):.5f} dC {float(r['dc_rel_err']):.5f}")
PY
done
