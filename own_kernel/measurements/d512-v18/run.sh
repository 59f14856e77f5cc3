python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export CCE_BENCH_COMMIT=$(cat .commit)
mkdir -p $OUT/d512-v18
FWD='[{}, {"fwd": {"num_stages": 4}}, {"fwd": {"BLOCK_V": 128, "num_stages": 4}}, {"fwd": {"BLOCK_D": 128, "num_stages": 2}}, {"fwd": {"BLOCK_N": 256, "BLOCK_V": 128}}]'
BWD='[{}, {"dlogits_tma": {"num_stages": 4}}, {"dlogits_tma": {"BLOCK_V": 128, "SUBTILES": 2, "num_stages": 4}}, {"dlogits_tma": {"SUBTILES": 8}}, {"dlogits_tma": {"BLOCK_D": 128, "num_stages": 2}}, {"dlogits_tma": {"BLOCK_N": 256, "BLOCK_V": 128, "SUBTILES": 4}}, {"dlogits_tma": {"GROUP_N": 16}}]'
timeout 280 python -m own_kernel.tune --n 26214 --d 512 --v 151936 --softcap 0 --fwd "$FWD" --bwd "$BWD" --filter '[]' --out $OUT/tune-n26214-d512-v151936 2>&1 | grep -v Warn | tail -30
timeout 200 python -m own_kernel.tune --n 8192 --d 2304 --v 256000 --softcap 30 --fwd '[]' --bwd "$BWD" --filter '[]' --out $OUT/tune-n8192-d2304-v256000 2>&1 | grep -v Warn | tail -14
