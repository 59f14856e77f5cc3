#!/usr/bin/env bash
# call33d: the two test_backward_portable.py cases the cap cut in call33b, with the portable
# target forced (2 workers, 280 s). Carry .gpu/site.
CCE_OWN_TARGET=portable CCE_TEST_DEVICE=cuda PYTHONPATH=$PWD/.gpu/site:$PWD timeout -k 10 280 \
  python3 -m pytest -v -rs -n 2 -p no:cacheprovider \
  "tests/test_backward_portable.py::test_random_calls_on_the_pointer_cublas_route_match_fp64" \
  "tests/test_backward_portable.py::test_pointer_dlogits_writes_a_strided_w" \
  > "$OUT/gpu-tests-2.log" 2>&1
echo "exit $?"; tail -n 6 "$OUT/gpu-tests-2.log"
