#!/usr/bin/env bash
# call34a: where the portable 1 GiB default's time goes at the D 3584 heads it loses to
# torch.compile (N 8192, D 3584, V 152064; Qwen 2.5 (7B)), against torch.compile's: one
# profile each (per-kernel GPU time, floors). Then the GPU cases of the layout and
# batch-invariant tests on the default (Hopper) target after route.layouts_of (6b645a7).
# Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-540}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
prof() {  # prof NAME N D V ARGS...
  local name=$1 n=$2 d=$3 v=$4; shift 4
  timeout -k 5 120 python3 -m suite kernel profile host --n "$n" --d "$d" --v "$v" --softcap 0 \
    --trace /tmp/t.json --csv "$OUT/profile.csv" "$@" > "$OUT/$name-profile.txt" 2>&1
  echo "$name: exit $?"
}
prof n8192-d3584-portable 8192 3584 152064 --provider own_portable
prof n8192-d3584-compile 8192 3584 152064 --provider torch_compile
prof n16384-d3584-portable 16384 3584 152064 --provider own_portable
prof n16384-d3584-compile 16384 3584 152064 --provider torch_compile
CCE_TEST_DEVICE=cuda timeout -k 10 $(( $(left) - 10 )) \
  python3 -m pytest -v -rs -n 8 -p no:cacheprovider tests/test_route_launches.py \
  tests/test_batch_invariant.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -n 3
for f in "$OUT"/*-profile.txt; do
  echo "== $f"; grep -A14 "GPU time by operation" "$f"; grep -A12 "in floors" "$f" | head -12
done
