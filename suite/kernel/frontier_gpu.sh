#!/usr/bin/env bash
# The time-memory frontier (suite/frontier.py) at its five shapes, in one or two device calls:
# every exact peer and the own kernel's points, one process per cell, into one run folder per
# shape; then the forward alone (phase fwd, under no_grad) at the same shapes.
#   CCE_BENCH_COMMIT=<commit> SHAPES="llama3-8b gemma2-2b qwen25-7b" \
#       bash suite/kernel/frontier_gpu.sh
# Peers: Liger and Apple's exact CCE from PEER_SITE (default .gpu/site: `pip install --no-deps
# --target .gpu/site` of liger-kernel and of Apple's repository at a commit, made where there is
# a network), torch's F.linear_cross_entropy from .torch-lce (suite/providers/torch_native.py);
# carry both. A peer that is missing is recorded as unavailable; the run goes on.
# SHAPES (default all five): llama3-8b gemma2-2b qwen25-7b d5120 d1152, or NxDxV[xS] (S: the
# softcap; none without it). A softcapped shape runs without torch_native, which lacks one.
# PROVIDERS (default every exact peer and own point), FORWARD_PROVIDERS (default
# own,own_portable,torch_compile: the forward alone, phase fwd, under no_grad), DTYPE (default
# bf16), REPS (default 10), PYTHON (default python3); CLOCKS (default 1 where NVML answers:
# each row's SM clock, `bench --clocks`); FORWARD=0 skips the forward step; TESTS=1
# first runs the GPU tests (deadline_steps.sh's gpu_tests_step: GPU_TESTS, TEST_WORKERS,
# TESTS_CAP_S). Steps run under what is left of FRONTIER_DEADLINE_S (default 540 s from the
# start), so one slow step cannot take the others' rows with it (deadline_steps.sh). Writes RUN
# (default /tmp/run/frontier-<gpu>: frontier-<shape>-<gpu>/, forward-<gpu>/ and targets.csv, the
# exact call's targets per cell) and, after every
# step, $OUT/<RUN's name>.tar of it and $OUT/frontier.log; prints the frontier tables last,
# then the forward step's rows (deadline_steps.sh's print_rows).
set -uo pipefail
: "${OUT:?OUT: the folder whose files come back}"
START=$SECONDS
DEADLINE=${FRONTIER_DEADLINE_S:-540}
SHAPES=${SHAPES:-"llama3-8b gemma2-2b qwen25-7b d5120 d1152"}
REPS=${REPS:-10}
DTYPE=${DTYPE:-bf16}
FORWARD_PROVIDERS=${FORWARD_PROVIDERS:-own,own_portable,torch_compile}
PYTHON=${PYTHON:-python3}
PEER_SITE=${PEER_SITE:-.gpu/site}
export PYTHONUNBUFFERED=1
[ -d "$PEER_SITE" ] && export PYTHONPATH="$PWD/$PEER_SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .torch-lce ] && export CCE_BENCH_TORCH_LCE="$PWD/.torch-lce"
# shellcheck source=suite/kernel/deadline_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/deadline_steps.sh"
start_run frontier
PEERS=naive,torch_compile,chunked,liger_flce,apple_cce_exact,torch_native,torch_native_accurate
OWN=own,own_ws0,own_recompute,own_low_memory,own_filter,own_ws256,own_ws512,own_ws1024,own_ws2048,own_ws3072,own_ws4096,own_ws6144,own_ws8192
PROVIDERS=${PROVIDERS:-$PEERS,$OWN}

without_torch_native() {  # the provider list $1 less torch_native and torch_native_accurate
  local kept=() p
  for p in ${1//,/ }; do
    case $p in torch_native|torch_native_accurate) ;; *) kept+=("$p") ;; esac
  done
  (IFS=,; echo "${kept[*]}")
}

cell_args() {  # the shape's cell, as frontier.md's command names it
  case $1 in
    llama3-8b|gemma2-2b|qwen25-7b) echo "--preset $1" ;;
    d5120) echo "--preset llama3-8b --n 8192 --d 5120 --v 131072" ;;
    d1152) echo "--preset llama3-8b --n 16384 --d 1152 --v 262144 --lm-entropy 3" ;;
    *x*x*) head_args "$1" ;;
    *) echo "unknown shape $1" >&2; return 1 ;;
  esac
}

if [ -z "${CLOCKS:-}" ]; then  # suite.clocks.unavailable: the check bench --clocks makes
  "$PYTHON" -c "import sys; from suite.clocks import unavailable
sys.exit(bool(unavailable('cuda')))" 2> /dev/null && CLOCKS=1 || CLOCKS=0
fi
CLOCK_ARGS=()
[ "$CLOCKS" = 1 ] && CLOCK_ARGS=(--clocks)
"$PYTHON" -c "import liger_kernel, cut_cross_entropy; print('peers import')" >> "$LOG" 2>&1 || \
  echo "warning: a peer does not import (its rows say why)" | tee -a "$LOG"
# torch's F.linear_cross_entropy: the carried module files and version.py load (a run without
# version.py once recorded it as unavailable at every shape)
"$PYTHON" -c "from suite.providers.torch_native import resolve; resolve(); print('torch_native')" \
  >> "$LOG" 2>&1 || echo "warning: torch_native does not load (its rows say why)" | tee -a "$LOG"
[ "${TESTS:-0}" = 1 ] && gpu_tests_step
for shape in $SHAPES; do
  args=$(cell_args "$shape") || continue
  providers=$PROVIDERS
  case $shape in  # torch's F.linear_cross_entropy has no softcap
    gemma2-2b|*x*x*x*) providers=$(without_torch_native "$providers") ;;
  esac
  # shellcheck disable=SC2086
  step "frontier $shape" "$PYTHON" -m suite bench --plugin suite.frontier --dist lm \
    --phases loss+grad --isolate --reps "$REPS" --dtype "$DTYPE" --providers "$providers" $args \
    "${CLOCK_ARGS[@]}" --out "$RUN/frontier-$shape-$GPU" --resume --quiet
done
if [ "${FORWARD:-1}" = 1 ]; then
  for shape in $SHAPES; do
    args=$(cell_args "$shape") || continue
    # shellcheck disable=SC2086
    step "forward $shape" "$PYTHON" -m suite bench --dist lm --phases fwd --isolate \
      --reps "$REPS" --dtype "$DTYPE" --providers "$FORWARD_PROVIDERS" $args \
      "${CLOCK_ARGS[@]}" --out "$RUN/forward-$GPU" --resume --quiet
  done
fi
for folder in "$RUN"/frontier-*; do
  [ -d "$folder" ] && "$PYTHON" -m suite frontier "$folder" 2>&1 | tail -n 40 | tee -a "$LOG"
done
# the exact call's targets per cell (suite/report/exact_targets.py), the forward step's included
FORWARD_ARGS=()
[ -f "$RUN/forward-$GPU/results.csv" ] && FORWARD_ARGS=(--forward "$RUN/forward-$GPU")
compgen -G "$RUN/frontier-*" > /dev/null && "$PYTHON" -m suite frontier "$RUN"/frontier-* \
  "${FORWARD_ARGS[@]}" --targets-csv "$RUN/targets.csv" > /dev/null 2>> "$LOG" && pack_run
if [ "${FORWARD:-1}" = 1 ] && [ -f "$RUN/forward-$GPU/results.csv" ]; then
  print_rows "$RUN/forward-$GPU/results.csv" n d v softcap provider status ms ms_p20 ms_p80 \
    floor_ratio sm_mhz | tee -a "$LOG"
fi
