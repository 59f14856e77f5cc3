#!/usr/bin/env bash
# call43a: kernel families in floors (suite kernel profile host --trace --csv) at the final
# kernel (a638c7e's; this commit adds only the profile tool's --autocast) for the targets whose
# misses had no profile at that kernel:
# - misses/: the 1 GiB default at N 8192, D 8192, V 152064 (slower than torch.compile), with
#   torch.compile beside it; the zero budget at Gemma 2 (2B) and D 1152 (over 4.1 floors).
# - autocast/: under bf16 autocast with an fp32 weight, the best own point within
#   torch.compile's memory (autocast-targets-h200.csv) and torch.compile, at Llama 3 (8B),
#   Gemma 2 (2B) (no softcap, as the autocast tool runs it), D 8192 and Qwen 2.5 (7B).
# Each profile under 60 s; cells past the deadline are skipped and say so. Carry .gpu/site.
set -u
: "${CCE_BENCH_COMMIT:?the commit}"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT/misses" "$OUT/autocast"
S=$SECONDS
for cell in \
  "misses|8192 8192 152064 0|--workspace-mib 1024" \
  "autocast|8192 4096 128256 0|--autocast --workspace-mib 3072" \
  "autocast|8192 4096 128256 0|--autocast --provider torch_compile" \
  "misses|8192 2304 256000 30|" \
  "misses|16384 1152 262144 0|" \
  "autocast|8192 2304 256000 0|--autocast --workspace-mib 3072" \
  "autocast|8192 2304 256000 0|--autocast --provider torch_compile" \
  "misses|8192 8192 152064 0|--provider torch_compile" \
  "autocast|8192 8192 152064 0|--autocast --workspace-mib 4096" \
  "autocast|8192 8192 152064 0|--autocast --provider torch_compile" \
  "autocast|16384 3584 152064 0|--autocast --workspace-mib 3072" \
  "autocast|16384 3584 152064 0|--autocast --provider torch_compile"; do
  dir=${cell%%|*}; rest=${cell#*|}
  read -r n d v cap <<< "${rest%%|*}"; extra=${rest#*|}
  [ $(( SECONDS - S )) -gt 480 ] && { echo "skipped $cell: out of time"; continue; }
  echo "== --n $n --d $d --v $v --softcap $cap $extra" >> "$OUT/$dir/profile.log"
  # shellcheck disable=SC2086
  timeout 60 python3 -m suite kernel profile host --n "$n" --d "$d" --v "$v" --softcap "$cap" \
    $extra --trace /tmp/t.json --csv "$OUT/$dir/profile.csv" >> "$OUT/$dir/profile.log" 2>&1
  echo "$cell: exit $? at $(( SECONDS - S )) s"
done
for dir in misses autocast; do cut -d, -f1-12 "$OUT/$dir/profile.csv" 2>/dev/null; done
