#!/usr/bin/env bash
# The 2026 peer measurements on one H100, in one device call (after a first call that only
# copies a part of the packed peers): Liger's SM90 scaled CE, Liger's fused linear CE on its
# CuTe backend, verl's fused log-prob kernel, Liger's tensor-parallel variant (a row saying why
# it cannot run here), against the own kernel.
#
# The GPU machine has no network and a call carries at most 64 MiB with the working tree, so
# the peers come packed by suite/kernel/peers_pack.sh (on a machine with PyPI) as one xz'd
# site-packages folder split in two: .cute-a/ and .cute-b/ (both git-ignored).
#   call 1, carry [".cute-a"]:  mkdir -p /tmp/cute && cp .cute-a/* /tmp/cute/
#   call 2, carry [".cute-b"]:  CCE_BENCH_COMMIT=<commit> bash suite/kernel/peers_gpu.sh
# (call 2 must follow while the machine is warm: it reads call 1's /tmp/cute.)
#
# Steps, each under what is left of a deadline (PEERS_DEADLINE_S, default 510 s from the start)
# so one slow step cannot take the others' rows with it:
#   1. unpack the peers into /tmp/peers/site-packages (QuACK's import needs a folder of that
#      name), print their versions and `python -m suite list`, and run verl's gradient probe
#      (suite.providers.verl.probe_expanded_grads) into verl-probe.json;
#   2. the loss+grad cell of Gemma 2 (2B) (N 8192, D 2304, V 256000, softcap 30, bf16, lm
#      inputs) for own, own_filter, liger_flce, liger_flce_cute and the rest (the scaled CE and
#      verl have no softcap: unsupported rows);
#   3. `python -m suite kernel rl` at Liger's published shape (N 16384, D 4096, V 131072) and
#      at Llama 3 (8B) with N 8192, every method (rl/rl.csv);
#   4. the loss+grad cell at Liger's published shape (no softcap) for the same providers.
# Writes RUN (default /tmp/run/peers-2026-h100: results.csv, env*.json, plan.json, rl/,
# verl-probe.json, suite-list.txt, versions.txt) and, after every step, $OUT/peers-2026-h100.tar
# of it and $OUT/peers.log; prints the who-has-what table last. Commit the folder as
# results/peers-2026-h100 and regenerate the tables: python -m suite report --all
set -uo pipefail
: "${OUT:?OUT: the folder whose files come back}"
START=$SECONDS
DEADLINE=${PEERS_DEADLINE_S:-510}
RUN=${RUN:-/tmp/run/peers-2026-h100}
# shellcheck source=suite/kernel/peers_site.sh
source "$(dirname "${BASH_SOURCE[0]}")/peers_site.sh"
LOG=$OUT/peers.log
PROVIDERS=own,own_filter,liger_flce,liger_flce_cute,liger_scaled_ce,liger_scaled_ce_tp,verl_lce
RL_METHODS=own_loss_grad,own_logp_entropy,naive,compiled,liger_flce_logp,liger_scaled_ce,verl_lce,liger_scaled_ce_tp
mkdir -p "$RUN"
PACK=$OUT/peers-2026-h100.tar
STEP_MIN_S=20
# shellcheck source=suite/kernel/deadline_steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/deadline_steps.sh"
warn_commit_unset

preflight() {
  python3 - <<'PY' > "$RUN/versions.txt" 2>&1
import importlib, importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for dist in ("triton", "liger-kernel", "verl", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13",
             "quack-kernels", "apache-tvm-ffi", "cuda-bindings", "protobuf", "einops"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "not installed")
for module in ("cutlass.cute", "liger_kernel.ops.cutedsl.ops.cross_entropy",
               "liger_kernel.ops.cutedsl.ops.fused_scaled_cross_entropy_sm90",
               "quack.linear_cross_entropy"):
    try:
        print("import", module, "ok:", importlib.import_module(module).__file__)
    except Exception as err:  # noqa: BLE001 - reported, the rows then say what failed
        print("import", module, "failed:", type(err).__name__, str(err).splitlines()[:1])
from suite.providers.verl import load_kernel
print("verl kernel:", load_kernel().__file__)
PY
  cat "$RUN/versions.txt"
  python3 -m suite list > "$RUN/suite-list.txt" 2>&1
  python3 - "$RUN/verl-probe.json" <<'PY'
import json, sys
from suite.providers.verl import probe_expanded_grads
out = probe_expanded_grads()
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
PY
}

export RUN PEERS_SITE
export -f unpack_peers preflight
capped_step unpack 90 bash -c unpack_peers  # a function runs as `bash -c NAME`
export PYTHONPATH=$(peers_pythonpath):$PWD
capped_step preflight 120 bash -c preflight
capped_step "bench gemma2-2b" 150 python3 -m suite bench --preset gemma2-2b --dist lm --phases loss+grad \
  --reps 7 --warmup 2 --isolate --providers "$PROVIDERS" --out "$RUN" --quiet
capped_step "rl" 240 python3 -m suite kernel rl --out "$RUN/rl" --models liger-readme,llama3-8b --n 8192 \
  --methods "$RL_METHODS" --reps 7
capped_step "bench liger-readme" 200 python3 -m suite bench --preset llama3-8b --n 16384 --v 131072 \
  --dist lm --phases loss+grad --reps 7 --warmup 2 --isolate --providers "$PROVIDERS" \
  --out "$RUN" --resume --quiet
echo "== done in $(( SECONDS - START )) s"
python3 -m suite report "$RUN" --who-has-what
