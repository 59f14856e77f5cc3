#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export CCE_BENCH_COMMIT=$(cat .commit)
mkdir -p $OUT/p
P="python -m own_kernel.profile host --softcap 0 --d 2304"
timeout 100 $P --n 32768 --v 32000 --trace /tmp/t1.json > $OUT/p/host-n32768v32000.txt 2>&1
timeout 100 $P --n 32768 --v 128256 --filter --trace /tmp/t2.json > $OUT/p/host-n32768v128256--filter.txt 2>&1
timeout 100 $P --n 8192 --v 50257 --filter --trace /tmp/t3.json > $OUT/p/host-n8192v50257--filter.txt 2>&1
for f in $OUT/p/*.txt; do echo "== $f"; grep -E "host .* to queue|GPU busy" $f; grep -A14 "GPU time by operation" $f; done
