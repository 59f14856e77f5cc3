#!/usr/bin/env bash
# call43d: kernel families in floors (suite kernel profile host --trace --csv) at the final
# kernel (a638c7e's) of the targets' misses no profile at that kernel covered yet, each beside
# torch.compile in a process of its own:
# - best/ (bash call43d.sh best): the fastest own point within torch.compile's memory
#   (frontier-h200/targets-a638c7e.csv's best_provider; the ≤ 0.97× misses) at N 8192, D 5120,
#   V 131072 (1 GiB), Qwen 2.5 (7B) (3 GiB), N 16384, D 2048, V 49152 (3 GiB) and N 4096,
#   D 7168, V 129280 (2 GiB);
# - autocast/ (bash call43d.sh autocast): under bf16 autocast with an fp32 weight, the best own
#   point within torch.compile's memory (autocast-targets-h200.csv) at D 5120 (2 GiB), D 7168
#   (the default, 1 GiB) and V 49152 (2 GiB).
# Each profile under 90 s; cells past the deadline are skipped and say so. Carry .gpu/site.
set -u
: "${CCE_BENCH_COMMIT:?the commit}"
group=${1:?best or autocast}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT/$group"
case $group in
  best) cells=(
    "8192 5120 131072|--workspace-mib 1024" "8192 5120 131072|--provider torch_compile"
    "16384 3584 152064|--workspace-mib 3072" "16384 3584 152064|--provider torch_compile"
    "16384 2048 49152|--workspace-mib 3072" "16384 2048 49152|--provider torch_compile"
    "4096 7168 129280|--workspace-mib 2048" "4096 7168 129280|--provider torch_compile") ;;
  autocast) cells=(
    "8192 5120 131072|--autocast --workspace-mib 2048"
    "8192 5120 131072|--autocast --provider torch_compile"
    "4096 7168 129280|--autocast --workspace-mib 1024"
    "4096 7168 129280|--autocast --provider torch_compile"
    "16384 2048 49152|--autocast --workspace-mib 2048"
    "16384 2048 49152|--autocast --provider torch_compile") ;;
  *) echo "group: best or autocast, not $group"; exit 2 ;;
esac
S=$SECONDS
for cell in "${cells[@]}"; do
  read -r n d v <<< "${cell%%|*}"; extra=${cell#*|}
  [ $(( SECONDS - S )) -gt 480 ] && { echo "skipped $cell: out of time"; continue; }
  echo "== --n $n --d $d --v $v --softcap 0 $extra" >> "$OUT/$group/profile.log"
  # shellcheck disable=SC2086
  timeout 90 python3 -m suite kernel profile host --n "$n" --d "$d" --v "$v" --softcap 0 \
    $extra --trace /tmp/t.json --csv "$OUT/$group/profile.csv" >> "$OUT/$group/profile.log" 2>&1
  echo "$cell: exit $? at $(( SECONDS - S )) s"
done
cut -d, -f1-3,6,10-18 "$OUT/$group/profile.csv" 2>/dev/null
