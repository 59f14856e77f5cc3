#!/usr/bin/env bash
# Run as call36a (written after call35g; call36a added the SMs' active-cycle spread, waves per
# SM, DRAM writes and N 12288, D 4096, V 32000, the other grid slower in one process). Counters
# of the TMA forward at grids forward.program_overhead_tiles 2 moves, default against ov2: the two N 4096
# heads where it was faster or level (D 3584, V 152064: 21 splits to 8; D 7168, V 129280: 21 to
# 12) and N 2048, D 8192, V 152064 (33 to 16), slower in one process. Whether C's DRAM reads
# and L2's hit rate order them as the times do (forward-grid.md, "Two tiles of overhead a
# program"). ncu with --clock-control none (the device README: leave the clocks alone); one
# launch of each forward under suite kernel profile fwd, plain logits (--softcap 0).
# Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
R=$(mktemp -d); mkdir -p "$OUT"
METRICS=launch__grid_size,gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
METRICS=$METRICS,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg
METRICS=$METRICS,sm__cycles_active.max,sm__cycles_active.min,launch__waves_per_multiprocessor
METRICS=$METRICS,dram__bytes_write.sum,gpc__cycles_elapsed.max
for head in 4096x3584x152064 4096x7168x129280 2048x8192x152064 12288x4096x32000; do
  IFS=x read -r n d v <<< "$head"
  for cfg in default ov2; do
    over='{}'; [ "$cfg" = ov2 ] && over='{"forward":{"program_overhead_tiles":2}}'
    CCE_OWN_CONFIG="$over" timeout -k 5 120 ncu --clock-control none --metrics "$METRICS" \
      -k regex:cce_fwd_tma python3 -m suite kernel profile fwd --n "$n" --d "$d" --v "$v" \
      --softcap 0 > "$R/ncu-$head-$cfg.txt" 2>&1
    echo "$head $cfg: exit $?"
  done
done
tar -C "$R" -czf "$OUT/ncu-ov2.tgz" .
for f in "$R"/ncu-*.txt; do
  echo "== $(basename "$f" .txt)"
  grep -E "launch__|gpu__time|gpc__|dram__bytes|lts__t_sector|sm__throughput|sm__cycles" "$f" \
    | tail -n 12
done
