#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export CCE_BENCH_COMMIT=$(cat .commit)
mkdir -p $OUT/ws
FWD='[{"fwd": {"WARP_SPECIALIZE": true}}]'
BWD='[{}, {"dlogits_tma": {"WARP_SPECIALIZE": true, "FLATTEN": false}}, {"dlogits_tma": {"WARP_SPECIALIZE": true, "FLATTEN": false, "PERSISTENT": false}}]'
FIL='[{}, {"dlogits_tma": {"WARP_SPECIALIZE": true, "FLATTEN": false}}]'
timeout 170 python -m own_kernel.tune --fwd "$FWD" --bwd "$BWD" --filter "$FIL" --dists lm > $OUT/ws/tune-gemma.txt 2>&1
timeout 120 python -m own_kernel.tune --softcap 0 --n 8192 --d 2304 --v 32000 --fwd "$FWD" --bwd "$BWD" --filter "$FIL" --dists lm > $OUT/ws/tune-n8192d2304v32000.txt 2>&1
timeout 150 python -m own_kernel.tune --softcap 0 --n 32768 --d 2304 --v 32000 --fwd "$FWD" --bwd "$BWD" --filter '[{}]' --dists lm > $OUT/ws/tune-n32768d2304v32000.txt 2>&1
for f in $OUT/ws/*.txt; do echo "== $f"; grep -E "floors|FAILED|^floor" $f | cut -c1-220; done
