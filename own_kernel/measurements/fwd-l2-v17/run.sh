#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export CCE_BENCH_COMMIT=$(cat .commit)
D=$OUT/fwd-l2; mkdir -p $D
V='[{"fwd_l2_mib":16},{"fwd_l2_mib":24},{"fwd_l2_mib":32},{"fwd_l2_mib":40}]'
for s in "32768 2304 32000" "32768 2304 128256" "8192 4096 128256" "8192 4096 20000" "8192 2304 151936" "8192 2304 256000" "2048 4096 256000"; do
  set -- $s
  timeout 120 python -m own_kernel.tune --fwd-only --softcap 0 --n $1 --d $2 --v $3 --fwd "$V" --out /tmp/t > /dev/null 2>&1
  cp /tmp/t/tune.txt $D/tune-n$1-d$2-v$3.txt
done
for l2 in 0 24; do
  CCE_OWN_CONFIG="{\"fwd_l2_mib\":$l2}" timeout 120 ncu --metrics dram__bytes_read.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct -k regex:cce_fwd python scratch_fwdncu.py 32768 2304 32000 > $D/ncu-n32768-v32000-l2mib$l2.txt 2>&1
done
for f in $D/tune-*.txt; do echo "== $f"; grep -E "floor|fwd " $f | sed 's/ (lse max err/ (err/' | cut -c1-150; done
for f in $D/ncu-*.txt; do echo "== $f"; grep -E "dram__|gpu__time|hit_rate" $f; done
