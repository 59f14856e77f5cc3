#!/usr/bin/env bash
# call34g: the one GPU test case that call33b/d's cap cut with the portable target forced:
# hypothesis's random calls on the pointer cuBLAS route (each drawn shape tuned and compiled
# afresh), alone, with a longer cap; verbose, so a cut run still says how many examples passed.
set -u
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
CCE_OWN_TARGET=portable CCE_TEST_DEVICE=cuda timeout -k 10 ${CAP_S:-500} \
  python3 -m pytest -v -rs -p no:cacheprovider --hypothesis-verbosity=verbose \
  "tests/test_backward_portable.py::test_random_calls_on_the_pointer_cublas_route_match_fp64" \
  > "$OUT/gpu-test.log" 2>&1
echo "exit $?"; grep -c "^Trying example" "$OUT/gpu-test.log"; tail -n 3 "$OUT/gpu-test.log"
