#!/usr/bin/env bash
# Prove the regression gate on one GPU, from the repository root, in one call (~6-8 minutes on an
# H100; pytest-benchmark importable, the peers optional):
#
#   CCE_BENCH_COMMIT=<the commit of these files> OUT=<folder> bash suite/gates/prove.sh
#
# CCE_BENCH_COMMIT may be left out only in a clean git checkout; every log, report and
# summary.md then names the same commit (suite/results.py's git_commit, exported to each step).
# Steps, each `python -m suite gate --baseline $RUN_DIR/<gpu-slug>.json ...`:
#   save         --save: a fresh baseline, spec.SAVE_PROCESSES fresh processes   (expect exit 0)
#   pass1..pass5 the unchanged code, 5 runs in a row                             (expect exit 0)
#   injected     CCE_GATE_INJECT, one injection per benchmark: +10 % GPU work at three 50-75 ms
#                calls, +100 MiB held, gradient errors x2, loss errors x2; and
#                cut_cross_entropy made unimportable (apple_cce skips: fails unless the baseline
#                has it optional, i.e. it was not installed at --save)              (expect exit 1)
#   pointer_fwd  CCE_OWN_CONFIG: the pointer forward instead of TMA               (expect exit 1)
#   recompute    CCE_OWN_CONFIG: no three-matmul budget by default, so the default call at the
#                small vocabulary takes the recompute path (its path check)       (expect exit 1)
# Each regression step names the checks that must fail (proof.py expect). Everything goes to
# $OUT/${RUN:-gate-proof}/: <step>.log (the whole output, the gate's table last),
# <step>.report.json (every check), pass<i>.json (pytest-benchmark's data), the baseline and
# its processes' JSON, steps.md (written as the steps end) and summary.md: the step table, the
# 5 runs' spread of every check, what each regression step caught, its gate tables. The step
# table is printed last. Steps start only before DEADLINE_S (default 540) seconds; where a call
# ran out of time, BASELINE_IN=<its baseline file> runs the other steps against it, PRIOR_DIR=<that
# call's run folder> keeps its step rows and reports in this summary, and PROVE_ONLY="<steps>"
# runs only those (e.g. PROVE_ONLY="pass5 injected pointer_fwd recompute").
set -u
: "${OUT:?set OUT to the folder that receives the outputs}"
RUN_DIR="$OUT/${RUN:-gate-proof}"
mkdir -p "$RUN_DIR"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-540}

# What the regression steps do and what must fail.
INJECTED='slow:0.1@gemma2-2b-own-loss+grad,slow:0.1@gemma2-2b-own_low_memory-loss+grad,slow:0.1@llama3-8b-own-loss+grad,mem:100@small-own-fwd,mem:100@small-own_filter-loss+grad,err:2@small-own-loss+grad,loss_err:2@gemma2-2b-own-fwd,loss_err:2@gemma2-2b-own_fused-loss+grad'
INJECTED_K='gemma2-2b-own- or gemma2-2b-own_low or gemma2-2b-own_fused or llama3-8b-own-loss or small-own- or small-own_filter or gemma2-2b-apple_cce-fwd'
INJECTED_EXPECT=(gemma2-2b-own-loss+grad:min_ms gemma2-2b-own-loss+grad:median_ms
    gemma2-2b-own_low_memory-loss+grad:min_ms gemma2-2b-own_low_memory-loss+grad:median_ms
    llama3-8b-own-loss+grad:min_ms llama3-8b-own-loss+grad:median_ms small-own-fwd:peak_extra_mib
    small-own_filter-loss+grad:peak_extra_mib small-own-loss+grad:de_rel_err
    small-own-loss+grad:dc_rel_err gemma2-2b-own-fwd:loss_rel_err
    gemma2-2b-own_fused-loss+grad:loss_rel_err)
POINTER_FWD='{"forward":{"tma":false}}'
RECOMPUTE='{"fused":{"default_workspace_mib":0}}'

"$PY" -c "import pytest_benchmark" 2>/dev/null || {
    echo "prove.sh: pytest-benchmark is not importable by $PY (install it or put it on PYTHONPATH)"
    exit 2; }
COMMIT=$("$PY" -c "from suite.results import git_commit
commit, dirty = git_commit()
print(commit if commit and dirty is not True else '')")
[ -n "$COMMIT" ] || {
    echo "prove.sh: set CCE_BENCH_COMMIT to the commit these files are (no .git here, or"
    echo "uncommitted changes): every log and summary.md names it"; exit 2; }
export CCE_BENCH_COMMIT="$COMMIT"
SLUG=$("$PY" -c "import torch; from suite.gates.spec import gpu_slug
print(gpu_slug(torch.cuda.get_device_name()))") || { echo "prove.sh: no CUDA device"; exit 2; }
BASELINE="$RUN_DIR/$SLUG.json"
rm -f "$BASELINE"
# The processes share each shape's inputs (suite/gates/cache.py), outside $OUT (GiBs).
export CCE_GATE_INPUTS_CACHE
CCE_GATE_INPUTS_CACHE=$(mktemp -d)
trap 'rm -rf "$CCE_GATE_INPUTS_CACHE"' EXIT
STEPS="$RUN_DIR/steps.md"
CAUGHT="$RUN_DIR/caught.md"
PROOF=ok
printf '| step | command | exit | expected | verdict | s |\n|---|---|---|---|---|---|\n' > "$STEPS"
if [ -n "${PRIOR_DIR:-}" ]; then  # an earlier call's finished steps: their rows and reports
    grep -v -e 'NOT RUN' -e '^| step ' -e '^|---' "$PRIOR_DIR/steps.md" >> "$STEPS"
    (cd "$PRIOR_DIR" && cp -r $(ls | grep -v -e '^steps.md$' -e '^summary.md$' -e '^caught.md$') "$RUN_DIR/")
fi
: > "$CAUGHT"

hide_module() {  # a sitecustomize.py that makes module $1 unimportable, then runs the one it shadows
    cat <<EOF
import os, sys
sys.modules["$1"] = None  # prove.sh: as if not installed (find_spec None, import fails)
_here = os.path.dirname(os.path.abspath(__file__))
for _dir in sys.path[1:]:
    _other = os.path.join(_dir or ".", "sitecustomize.py")
    if os.path.abspath(_dir or ".") != _here and os.path.isfile(_other):
        exec(compile(open(_other).read(), _other, "exec"))
        break
EOF
}

step() {  # step <name> <expected exit> <CCE_GATE_INJECT|-> <CCE_OWN_CONFIG|-> <module to hide|-> <gate args...>
    local name=$1 want=$2 inject=$3 config=$4 hide=$5; shift 5
    case " ${PROVE_ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    local t0=$SECONDS shown="" envs=(env -u CCE_GATE_INJECT -u CCE_OWN_CONFIG)
    local cmd=("$PY" -m suite gate --baseline "$BASELINE")
    [ "$name" = save ] || cmd+=(--report "$RUN_DIR/$name.report.json")
    cmd+=("$@")
    if [ "$inject" != - ]; then  # shown by name: the value is in summary.md
        envs+=("CCE_GATE_INJECT=$inject")
        shown+="CCE_GATE_INJECT=<$(tr ',' '\n' <<< "$inject" | wc -l) injections> "
    fi
    if [ "$config" != - ]; then envs+=("CCE_OWN_CONFIG=$config"); shown+="CCE_OWN_CONFIG='$config' "; fi
    if [ "$hide" != - ]; then  # as if not installed: sys.modules[name] = None fails its import
        mkdir -p "$RUN_DIR/hide-$hide"
        hide_module "$hide" > "$RUN_DIR/hide-$hide/sitecustomize.py"
        envs+=("PYTHONPATH=$RUN_DIR/hide-$hide${PYTHONPATH:+:$PYTHONPATH}")
        shown+="($hide hidden) "
    fi
    shown+="python -m suite gate"
    local arg
    for arg in "$@"; do [[ $arg == *" "* ]] && shown+=" '$arg'" || shown+=" $arg"; done
    if [ "$SECONDS" -ge "$DEADLINE_S" ]; then
        PROOF=incomplete
        echo "| $name | \`${shown//|/\\|}\` | - | $want | NOT RUN: past ${DEADLINE_S} s | 0 |" >> "$STEPS"
        return
    fi
    echo "== $name: $shown"
    "${envs[@]}" "${cmd[@]}" > "$RUN_DIR/$name.log" 2>&1
    local rc=$?
    tail -n 4 "$RUN_DIR/$name.log"
    local verdict
    verdict=$(grep -E '^gate: (PASS|FAIL|saved)' "$RUN_DIR/$name.log" | tail -1)
    [ "$rc" = "$want" ] || { PROOF=failed; verdict="UNEXPECTED EXIT; ${verdict:-no verdict}"; }
    echo "| $name | \`${shown//|/\\|}\` | $rc | $want | ${verdict:-no verdict} | $((SECONDS - t0)) |" >> "$STEPS"
}

expect() {  # expect <step> <benchmark:metric>...: each must fail in the step's report
    local name=$1; shift
    { echo; echo "**$name**: must fail: $*"; echo; } >> "$CAUGHT"
    if [ ! -f "$RUN_DIR/$name.report.json" ]; then
        echo "- **MISSED**: the step wrote no report (see $name.log)" >> "$CAUGHT"
        [ "$PROOF" = incomplete ] || PROOF=failed
        return
    fi
    "$PY" -m suite.gates.proof expect "$RUN_DIR/$name.report.json" "$@" >> "$CAUGHT" || PROOF=failed
}

if [ -n "${BASELINE_IN:-}" ]; then  # a baseline saved by an earlier call: the other steps only
    cp "$BASELINE_IN" "$BASELINE" || exit 2
    echo "| save | given: BASELINE_IN=$BASELINE_IN | - | - | copied | 0 |" >> "$STEPS"
else
    step save 0 - - - --save --processes-dir "$RUN_DIR/save-processes"
fi
step pass1 0 - - - -- "--benchmark-json=$RUN_DIR/pass1.json"
step pass2 0 - - - -- "--benchmark-json=$RUN_DIR/pass2.json"
step pass3 0 - - - -- "--benchmark-json=$RUN_DIR/pass3.json"
step pass4 0 - - - -- "--benchmark-json=$RUN_DIR/pass4.json"
step pass5 0 - - - -- "--benchmark-json=$RUN_DIR/pass5.json"
step injected 1 "$INJECTED" - cut_cross_entropy -k "$INJECTED_K"
step pointer_fwd 1 - "$POINTER_FWD" - -k own-fwd
step recompute 1 - "$RECOMPUTE" - -k small-own-loss

APPLE=gemma2-2b-apple_cce-fwd
APPLE_NOTE="$APPLE: optional in the baseline (cut-cross-entropy not installed at --save), so its skip passes; a required benchmark's skip is proven by tests/test_gate.py only"
if [ -f "$BASELINE" ] && [ "$("$PY" -m suite.gates.proof required "$BASELINE" "$APPLE")" = required ]; then
    INJECTED_EXPECT+=("$APPLE:run")
    APPLE_NOTE="$APPLE: cut_cross_entropy hidden, the baseline ran it: its skip must fail"
fi
expect injected "${INJECTED_EXPECT[@]}"
expect pointer_fwd gemma2-2b-own-fwd:min_ms gemma2-2b-own-fwd:median_ms
expect recompute small-own-loss+grad:own_path

GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
PASSES=()
for i in 1 2 3 4 5; do [ -f "$RUN_DIR/pass$i.report.json" ] && PASSES+=("$RUN_DIR/pass$i.report.json"); done
REPORTS=("${PASSES[@]}")
for s in injected pointer_fwd recompute; do
    [ -f "$RUN_DIR/$s.report.json" ] && REPORTS+=("$RUN_DIR/$s.report.json"); done
NAMED=$([ ${#REPORTS[@]} -gt 0 ] && "$PY" -m suite.gates.proof commits "${REPORTS[@]}")
[ -z "$NAMED" ] || [ "$NAMED" = "$COMMIT" ] || PROOF=failed
{
    echo "# Gate proof on $GPU"
    echo
    echo "$(date -u +%FT%TZ), commit $COMMIT; the commit every report names: ${NAMED:-no report}."
    echo
    echo -n "Baseline: "
    if [ -f "$BASELINE" ]; then "$PY" -m suite.gates.proof baseline "$BASELINE"; else echo "none (the save failed)"; fi
    echo
    cat "$STEPS"
    echo
    echo "Proof: **$PROOF** in $SECONDS s."
    echo
    echo "## The ${#PASSES[@]} unchanged runs: each check's change against the baseline"
    echo
    echo "max / limit: the largest change over the runs divided by the change that fails."
    echo
    [ ${#PASSES[@]} -gt 0 ] && "$PY" -m suite.gates.proof spread "${PASSES[@]}"
    echo
    echo "## Regressions: each must fail its benchmark"
    echo
    echo "injected: \`CCE_GATE_INJECT=$INJECTED\`, cut_cross_entropy hidden. $APPLE_NOTE."
    cat "$CAUGHT"
    for s in injected pointer_fwd recompute; do
        [ -f "$RUN_DIR/$s.log" ] || continue
        echo
        echo "### $s: the gate's table"
        echo
        echo '```'
        sed -n '/= cce-bench gate =/,/^gate: /p' "$RUN_DIR/$s.log" | tail -n +2
        echo '```'
    done
} > "$RUN_DIR/summary.md"
echo
echo "Baseline: $BASELINE; summary: $RUN_DIR/summary.md"
cat "$STEPS"
echo "Proof: $PROOF in $SECONDS s (commit $COMMIT)"
[ "$PROOF" = ok ]
