#!/usr/bin/env bash
# Prove the regression gate on a GPU, in one call (from the repository root, liger-kernel and
# cut-cross-entropy importable, e.g. from carried wheels on PYTHONPATH):
#   1. python -m suite gate --save                        this GPU's baseline      (expect exit 0)
#   2. python -m suite gate                               same code again          (expect exit 0: PASS)
#   3. python -m suite gate --providers own,own_filter --degrade slow
#        one extra forward pass before each call                     (expect exit 1: FAIL, ms)
#   4. python -m suite gate --providers own,own_filter --degrade hungry
#        a (V/4, D) buffer held from the forward through the backward (expect exit 1: FAIL,
#                                                                     peak_extra_mib of loss+grad)
# The degraded variants wrap the own kernel's providers in the suite (suite/degrade.py); the
# kernel itself is not touched. Each step's output and run folder (results.csv + env.json of
# the suite's one schema) land in $OUT/gate/<step>/, the new baseline in $OUT/gate/baseline/;
# commit it as results/baselines/<gpu-slug>/ (it is written there too).
set -u
: "${OUT:?set OUT to the folder that receives the outputs}"
G="$OUT/gate"
mkdir -p "$G"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BASELINE_DIR=${BASELINE_DIR:-results/baselines}

step() {  # step <name> <expected exit> <gate args...>
    local name=$1 want=$2; shift 2
    local t0=$SECONDS
    "$PY" -m suite gate --baseline-dir "$BASELINE_DIR" --out "$G/$name" "$@" 2>&1 | tee "$G/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc (expected $want), $((SECONDS - t0)) s" | tee -a "$G/summary.txt"
    [ "$rc" = "$want" ] || PROOF=failed
}

PROOF=ok
: > "$G/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$G/summary.txt"
step 1_save   0 --save
step 2_pass   0
step 3_slow   1 --providers own,own_filter --degrade slow
step 4_hungry 1 --providers own,own_filter --degrade hungry
SLUG=$("$PY" -c "import torch; from suite.gate import gpu_slug; print(gpu_slug(torch.cuda.get_device_name()))")
cp -r "$BASELINE_DIR/$SLUG" "$G/baseline" 2>/dev/null
echo "== proof $PROOF; total $SECONDS s; baseline: $BASELINE_DIR/$SLUG (copy in $G/baseline)" \
    | tee -a "$G/summary.txt"
[ "$PROOF" = ok ]
