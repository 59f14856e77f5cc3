#!/usr/bin/env bash
# Prove the regression gate on a GPU, in one call (from the repository root, liger-kernel and
# cut-cross-entropy importable, e.g. from carried wheels on PYTHONPATH):
#   1. python -m suite gate --save                 creates this GPU's baseline     (expect exit 0)
#   2. python -m suite gate                        same code again                 (expect exit 0: PASS)
#   3. CCE_OWN_DEGRADE=slow   python -m suite gate -k own   tiny forward tiles     (expect exit 1: FAIL, time)
#   4. CCE_OWN_DEGRADE=hungry python -m suite gate -k own   extra buffer in bwd    (expect exit 1: FAIL, memory)
# Every output, each run's pytest-benchmark JSON and the new baseline land in $OUT/gate/;
# commit the baseline as results/baselines/<gpu-slug>.json. Takes about 5 minutes on an H100
# (most of it the first run: torch.compile and Triton compilation, input generation).
set -u
: "${OUT:?set OUT to the folder that receives the outputs}"
G="$OUT/gate"
mkdir -p "$G"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if "$PY" -m suite gate --help >/dev/null 2>&1; then
    GATE=("$PY" -m suite gate)
else
    GATE=("$PY" -m suite.gate)  # same entry point, without the CLI
fi

step() {  # step <name> <expected exit> [VAR=value ...] -- <gate args>
    local name=$1 want=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local t0=$SECONDS
    env ${envs[@]+"${envs[@]}"} "${GATE[@]}" "$@" --output "$G/$name.json" 2>&1 | tee "$G/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc (expected $want), $((SECONDS - t0)) s" | tee -a "$G/summary.txt"
    [ "$rc" = "$want" ] || PROOF=failed
}

PROOF=ok
: > "$G/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$G/summary.txt"
step 1_save   0 --                        --save
step 2_pass   0 --                        
step 3_slow   1 CCE_OWN_DEGRADE=slow   -- -k own
step 4_hungry 1 CCE_OWN_DEGRADE=hungry -- -k own
cp results/baselines/*.json "$G/" 2>/dev/null
echo "== proof $PROOF; total $SECONDS s; baseline(s): $(cd "$G" && ls nvidia-*.json 2>/dev/null)" \
    | tee -a "$G/summary.txt"
[ "$PROOF" = ok ]
