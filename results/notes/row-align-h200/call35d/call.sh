#!/usr/bin/env bash
# call35d: call34g again (hypothesis's random calls on the pointer cuBLAS route, the portable
# target forced, each drawn shape tuned and compiled afresh), with -s so that hypothesis's
# verbose lines reach the log as they happen and a cut run still says how many examples ran;
# the cache of tuned tiles in a fresh folder, so the run starts from nothing as a user's does.
set -u
export PYTHONPATH=$PWD/.gpu/site:$PWD PYTHONUNBUFFERED=1
export CCE_OWN_TUNE_CACHE=$(mktemp -d)/tiles.json
mkdir -p "$OUT"
START=$SECONDS
CCE_OWN_TARGET=portable CCE_TEST_DEVICE=cuda timeout -k 10 ${CAP_S:-500} \
  python3 -m pytest -v -s -rs -p no:cacheprovider --hypothesis-verbosity=verbose \
  --durations=0 \
  "tests/test_backward_portable.py::test_random_calls_on_the_pointer_cublas_route_match_fp64" \
  > "$OUT/gpu-test.log" 2>&1
echo "exit $? after $((SECONDS - START)) s"
echo "examples tried: $(grep -c 'Test case:' "$OUT/gpu-test.log")"
python3 -c "import json,sys; print('tuned entries:', len(json.load(open(sys.argv[1]))))" \
  "$CCE_OWN_TUNE_CACHE" 2>/dev/null
tail -n 4 "$OUT/gpu-test.log"
