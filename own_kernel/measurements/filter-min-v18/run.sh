python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export CCE_BENCH_COMMIT=$(cat .commit)
mkdir -p $OUT/fmin
F='[{}, {"filter_min_flops": 6e11}, {"filter_min_flops": 1e12}, {"filter_min_flops": 2e12}, {"filter_min_flops": 1e30}]'
for v in 32000 128256 256000; do
timeout 170 python -m own_kernel.tune --n 32768 --d 2304 --v $v --softcap 0 --fwd '[]' --no-fwd-variants --bwd '[{}]' --filter "$F" --dists lm --out $OUT/tune-n32768-v$v 2>&1 | grep -E "floors" 
done
