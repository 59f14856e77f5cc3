#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
python3 -c "import xdist, pytest_timeout" 2>/dev/null && PAR="-n 6 --timeout=300" || PAR=""
echo "parallel: ${PAR:-none}"
CCE_TEST_DEVICE=cuda timeout -k 10 420 python3 -m pytest -p no:cacheprovider -q -rs $PAR \
  tests/test_fused.py tests/test_autograd_paths.py tests/test_numerics.py tests/test_autocast.py \
  > $OUT/gpu-tests.log 2>&1
echo "rc $?"; tail -25 $OUT/gpu-tests.log
