#!/usr/bin/env bash
# README's headline run on one GPU: `python -m suite bench` at its default GPU preset (Gemma 2
# (2B): N 8192, D 2304, V 256000, softcap 30; uniform and lm inputs; loss and loss+grad), every
# provider, with every peer installed. Two device calls, the second while the machine is warm:
#   call 1, carry [".cute-a"]:  mkdir -p /tmp/cute && cp .cute-a/* /tmp/cute/
#   call 2, carry [".cute-b", ".gpu", ".whl", ".torch-lce"]:
#       CCE_BENCH_COMMIT=<commit> bash suite/kernel/headline_gpu.sh
# Peers: QuACK, the CuTe DSL, Liger and verl packed by suite/kernel/peers_pack.sh (.cute-a,
# .cute-b); Apple's repository from PEER_SITE (default .gpu/site, as frontier_gpu.sh); Apple's
# PyPI release from .whl (../shared/tools/fetch-wheels.sh); torch's F.linear_cross_entropy from
# .torch-lce. A peer that is missing is recorded as unavailable and the run goes on.
# BENCH_ARGS: more bench arguments, split at spaces; REPORT_ARGS (default --headline): the
# closing report's (a CPU check: a tiny cell, REPORT_ARGS= for its plain table). Steps run under
# what is left of HEADLINE_DEADLINE_S (default 540 s); a bench step that fails or is cut short
# is resumed once (--resume). Writes RUN (default /tmp/run/headline-<gpu>) and, after every step,
# $OUT/<RUN's name>.tar of it and $OUT/headline.log; prints the headline last.
set -uo pipefail
: "${OUT:?OUT: the folder whose files come back}"
START=$SECONDS
DEADLINE=${HEADLINE_DEADLINE_S:-540}
PYTHON=${PYTHON:-python3}
PEER_SITE=${PEER_SITE:-.gpu/site}
export PYTHONUNBUFFERED=1
# shellcheck source=suite/kernel/deadline_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/deadline_steps.sh"
start_run headline
# shellcheck source=suite/kernel/peers_site.sh
source "$(dirname "${BASH_SOURCE[0]}")/peers_site.sh"

export PEERS_SITE
export -f unpack_peers
step "unpack the packed peers" bash -c unpack_peers
path=$PWD
[ -d "$PEER_SITE" ] && path="$PWD/$PEER_SITE:$path"
[ -d "$PEERS_SITE" ] && path="$(peers_pythonpath):$path"
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
[ -d .torch-lce ] && export CCE_BENCH_TORCH_LCE="$PWD/.torch-lce"
apple_pypi=(.whl/cut_cross_entropy-*.whl)
if [ -f "${apple_pypi[0]}" ]; then
  step "Apple's PyPI release" "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/apple-pypi "${apple_pypi[0]}"
  [ -d /tmp/apple-pypi/cut_cross_entropy ] && export CCE_BENCH_APPLE_PYPI=/tmp/apple-pypi
fi
"$PYTHON" -m suite list >> "$LOG" 2>&1
for attempt in 1 2; do  # the second resumes a run cut short (a crashed process)
  # shellcheck disable=SC2086
  step "bench ($attempt)" "$PYTHON" -m suite bench --out "$RUN" --resume --quiet ${BENCH_ARGS:-}
  [ "$STEP_RC" = 0 ] && break
done
# shellcheck disable=SC2086
"$PYTHON" -m suite report "$RUN" ${REPORT_ARGS---headline} 2>&1 | tail -n 40 | tee -a "$LOG"
