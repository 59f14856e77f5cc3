#!/usr/bin/env bash
# call28b's GPU tests failed some cases and ran out of time before naming them: the writers'
# test files again, verbose (each failure named as it happens), at c47a712 and then with the
# kernel before (.gpu/old, carried: c175622's own_kernel), to tell a regression from a case
# that failed before.
set -u
export PYTHONUNBUFFERED=1
START=$SECONDS; R=/tmp/rc; mkdir -p $R
FILES="tests/test_dlogits_ws.py tests/test_determinism.py tests/test_backward_portable.py"
mkdir -p /tmp/oldtree && ln -sfn $PWD/suite /tmp/oldtree/suite && ln -sfn $PWD/tests /tmp/oldtree/tests && ln -sfn $PWD/pyproject.toml /tmp/oldtree/pyproject.toml \
  && ln -sfn $PWD/.gpu/old/own_kernel /tmp/oldtree/own_kernel
for arm in new old; do
  dir=$PWD; [ $arm = old ] && dir=/tmp/oldtree
  (cd $dir && timeout -k 5 170 env CCE_TEST_DEVICE=cuda python3 -m pytest -v -rfs --tb=short -n 8 \
    -p no:cacheprovider $FILES > $R/tests-$arm.log 2>&1)
  echo "$arm rc $? at $((SECONDS-START)) s"; tar cf $OUT/rc.tar -C /tmp rc
done
for arm in new old; do echo "== $arm"; grep -E "FAILED|passed|failed" $R/tests-$arm.log | sed 's/^\[gw[0-9]*\] //' | sort | uniq | tail -30; done
grep -E "^E " $R/tests-new.log | sort | uniq -c | sort -rn | head -12
