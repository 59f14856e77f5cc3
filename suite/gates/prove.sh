#!/usr/bin/env bash
# Prove the regression gate on a GPU, in one call from the repository root (pytest-benchmark and
# the peers importable, e.g. from wheels on PYTHONPATH), writing everything under $OUT/$RUN/:
#   1_save   python -m suite gate --save           a fresh baseline of this GPU     (expect exit 0)
#   2_pass   python -m suite gate                  the same code                    (expect exit 0)
#   3_pass   python -m suite gate                  the same code again              (expect exit 0)
#   4_slow   CCE_GATE_INJECT=slow:0.15 ... -k own at Gemma 2 (2B): +15 % GPU work   (expect exit 1)
#   5_mem    CCE_GATE_INJECT=mem:100   ...         +100 MiB held during the call    (expect exit 1)
#   6_err    CCE_GATE_INJECT=err:2     ...         each gradient's error x2 or more (expect exit 1)
# The injections wrap the measured provider in the suite (suite/gates/inject.py); the kernel is
# not touched. The baseline is written to $OUT/$RUN/<gpu-slug>.json, not into the checkout:
# copy it to results/baselines/ to make it this GPU's baseline. Per step: <step>.log (the whole
# pytest output, its gate table last), <step>.json (pytest-benchmark's data of the passing
# runs); summary.md
# lists each step, its command, exit code and verdict, and is printed last.
set -u
: "${OUT:?set OUT to the folder that receives the outputs}"
RUN_DIR="$OUT/${RUN:-gate-proof}"
mkdir -p "$RUN_DIR"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
SUBSET=${SUBSET:-gemma2-2b-own-}  # own (the API's default call) at Gemma 2 (2B), both phases

"$PY" -c "import pytest_benchmark" 2>/dev/null || {
    echo "prove.sh: pytest-benchmark is not importable by $PY (install it or put it on PYTHONPATH)"
    exit 2; }
SLUG=$("$PY" -c "import torch; from suite.gates.spec import gpu_slug
print(gpu_slug(torch.cuda.get_device_name()))") || { echo "prove.sh: no CUDA device"; exit 2; }
BASELINE="$RUN_DIR/$SLUG.json"
SUMMARY="$RUN_DIR/summary.md"
PROOF=ok

{
    echo "# Gate proof on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    echo
    # CCE_BENCH_COMMIT wins, as in the suite's env.json: a GPU copy's .git may be older than its files
    echo "$(date -u +%FT%TZ), commit ${CCE_BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo
    echo "| step | command | exit | expected | verdict | s |"
    echo "|---|---|---|---|---|---|"
} > "$SUMMARY"

step() {  # step <name> <expected exit> <injection or -> <gate args...>
    local name=$1 want=$2 inject=$3; shift 3
    local t0=$SECONDS cmd=("$PY" -m suite gate --baseline "$BASELINE" "$@")
    # The passing runs' data too (the plugin refuses to write any with an injection active).
    [ "$name" = 2_pass ] || [ "$name" = 3_pass ] && cmd+=(-- "--benchmark-json=$RUN_DIR/$name.json")
    echo "== $name: ${inject/#-/no injection}: ${cmd[*]}"
    if [ "$inject" = - ]; then
        env -u CCE_GATE_INJECT "${cmd[@]}" > "$RUN_DIR/$name.log" 2>&1
    else
        CCE_GATE_INJECT="$inject" "${cmd[@]}" > "$RUN_DIR/$name.log" 2>&1
    fi
    local rc=$?
    tail -n 40 "$RUN_DIR/$name.log"
    local verdict
    verdict=$(grep -E '^gate: (PASS|FAIL)' "$RUN_DIR/$name.log" | tail -1)
    [ "$rc" = "$want" ] || { PROOF=failed; verdict="UNEXPECTED EXIT; ${verdict:-no gate table}"; }
    local shown="${cmd[*]}"
    [ "$inject" = - ] || shown="CCE_GATE_INJECT=$inject $shown"
    echo "| $name | \`${shown//|/\\|}\` | $rc | $want | ${verdict:-no gate table} | $((SECONDS - t0)) |" \
        >> "$SUMMARY"
}

step 1_save 0 - --save
step 2_pass 0 -
step 3_pass 0 -
step 4_slow 1 slow:0.15 -k "$SUBSET"
step 5_mem  1 mem:100   -k "$SUBSET"
step 6_err  1 err:2     -k "$SUBSET"

{
    echo
    echo "Proof: **$PROOF** in $SECONDS s. Baseline: \`$BASELINE\` (copy it to results/baselines/$SLUG.json)."
    for s in 4_slow 5_mem 6_err; do
        echo
        echo "### $s: the gate's table"
        echo
        echo '```'
        sed -n '/= cce-bench gate =/,/^gate: /p' "$RUN_DIR/$s.log" | tail -n +2
        echo '```'
    done
} >> "$SUMMARY"
echo
cat "$SUMMARY"
[ "$PROOF" = ok ]
