#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
ROOT=$PWD
mkdir -p $OUT/ab
for s in "32768 2304 128256" "8192 2304 50257"; do
  set -- $s
  for tree in old new old new; do
    cd $([ $tree = old ] && echo $ROOT/old_ab || echo $ROOT)
    export PYTHONPATH=/tmp/site:$PWD CCE_BENCH_COMMIT=$(cat $ROOT/.commit)$([ $tree = new ] && echo +prequeue)
    timeout 100 python -m own_kernel.tune --softcap 0 --n $1 --d $2 --v $3 --fwd '[]' --bwd '[]' --filter '[{}]' --dists lm >> $OUT/ab/tune-n$1v$3-$tree.txt 2>&1
  done
  cd $ROOT
done
grep -H "filter auto" $OUT/ab/*.txt | cut -c1-200
