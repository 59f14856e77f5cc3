# Sourced by the device scripts (heads_gpu.sh, frontier_gpu.sh, headline_gpu.sh, peers_gpu.sh):
# steps that run under what is left of one deadline, so one slow step cannot take the others'
# rows with it, the run's folders (start_run, gpu_label) and the table printed last (print_rows).
# Before a step, the caller sets START (its $SECONDS at the start), DEADLINE (seconds from
# START), LOG (the log file), RUN (the run folder), PACK (the tar under $OUT that RUN is packed
# into after every step; start_run sets these three) and, optionally, STEP_MIN_S (default 30: a
# step with less left is skipped).

# head_args NxDxV[xS]: the bench arguments of a head named by its sizes, S its softcap (none
# without it)
head_args() {
  local n d v s
  IFS=x read -r n d v s <<< "$1"
  echo "--n $n --d $d --v $v --softcap ${s:-none}"
}

left() { echo $(( DEADLINE - (SECONDS - START) )); }

# start_run NAME: GPU (gpu_label), RUN (default /tmp/run/NAME-GPU), LOG ($OUT/NAME.log) and
# PACK ($OUT/<RUN's folder name>.tar: two runs of one device call, each with its RUN, keep two
# packs); makes OUT and RUN, and warns in LOG where CCE_BENCH_COMMIT is unset
start_run() {
  GPU=$(gpu_label)
  RUN=${RUN:-/tmp/run/$1-$GPU}
  LOG=$OUT/$1.log
  PACK=$OUT/$(basename "$RUN").tar
  mkdir -p "$OUT" "$RUN"
  warn_commit_unset
}

# warn_commit_unset: the run's env.json names CCE_BENCH_COMMIT, the commit the call was made from
warn_commit_unset() {
  [ -n "${CCE_BENCH_COMMIT:-}" ] || \
    echo "warning: CCE_BENCH_COMMIT unset: env.json's commit may be wrong (its" \
      "own_kernel_digest is not: python -m suite provenance RUN)" | tee -a "$LOG"
}

# gpu_label: the first GPU's short name, as result folders are labelled (h200, h100, a100)
gpu_label() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
  name=${name#nvidia-}
  echo "${name%%-*}"
}

# step NAME CMD...: CMD under what is left, its output in the log, its exit status in STEP_RC
# (124: out of time; unset: skipped); RUN is packed into PACK after it, whatever it did
step() { local name=$1; shift; capped_step "$name" "$(left)" "$@"; }

# gpu_tests_step: the GPU cases of GPU_TESTS (default every autograd path's and test_fused.py's)
# with the compiled kernels (CCE_TEST_DEVICE=cuda), TEST_WORKERS processes (default 8), under
# at most TESTS_CAP_S seconds (default 300: they took 245 s on a warm H200), skips with reasons.
# Verbose: each case's name and outcome reach the log as it ends, so a failure stays named
# where the cap cuts pytest off before its summary (call29a lost one that way).
gpu_tests_step() {
  # shellcheck disable=SC2086  # GPU_TESTS is a list of paths
  capped_step "gpu tests" "${TESTS_CAP_S:-300}" env CCE_TEST_DEVICE=cuda "$PYTHON" -m pytest -v \
    -rs -n "${TEST_WORKERS:-8}" -p no:cacheprovider \
    ${GPU_TESTS:-tests/test_autograd_paths.py tests/test_fused.py}
}

# capped_step NAME CAP CMD...: step, under at most CAP seconds
capped_step() {
  local name=$1 limit=$2; shift 2
  local rest; rest=$(left); [ "$limit" -gt "$rest" ] && limit=$rest
  STEP_RC=
  if [ "$limit" -lt "${STEP_MIN_S:-30}" ]; then
    echo "== $name: skipped, $rest s left" | tee -a "$LOG"; return
  fi
  echo "== $name (limit ${limit} s, $(( SECONDS - START )) s in)" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" >> "$LOG" 2>&1
  STEP_RC=$?
  echo "   $name: exit $STEP_RC at $(( SECONDS - START )) s" | tee -a "$LOG"
  pack_run
}

# pack_run: RUN into PACK (after every step, and after whatever a script writes last)
pack_run() { tar -C "$(dirname "$RUN")" -cf "$PACK" "$(basename "$RUN")"; }

# print_rows GLOB KEY...: the table a device script prints last, whole cells (never rounded):
# a header, then each row of the CSVs GLOB matches (sorted), its folder's name first and then
# its KEY cells (empty where a CSV lacks the column); last, the board of the first CSV's
# env.json, where there is one
print_rows() {
  "${PYTHON:-python3}" - "$@" <<'PY'
import csv, glob, json, os, sys

pattern, keys = sys.argv[1], sys.argv[2:]
files = sorted(glob.glob(pattern))
print("run", *keys)
for path in files:
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            print(os.path.basename(os.path.dirname(path)), *(row.get(k, "") for k in keys))
env = os.path.join(os.path.dirname(files[0]), "env.json") if files else ""
if env and os.path.exists(env):
    with open(env) as f:
        board = json.load(f)
    print({k: board.get(k) for k in ("gpu_uuid", "power_limit_w", "sm_clock_max_mhz",
                                      "git_commit")})
PY
}
