#!/usr/bin/env bash
# call37g: where the portable pointer forward's time goes at N 16384, D 2048, V 49152: ncu
# (--clock-control none) over one launch of the cuBLAS floor (nvjet) and of the pointer forward
# (cce_fwd_kernel) at the autotuner's pick (call37d: 128 x 256 x 64, 8 warps, 3 stages, pinned
# with autotune off), plain logits; Speed of Light, warp states, launch and occupancy sections,
# the tensor pipe's active cycles and the SMs' active-cycle spread. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD CCE_OWN_TARGET=portable
export CCE_OWN_CONFIG='{"autotune":false,"forward":{"tiles":{"block_n":128,"block_v":256,"block_d":64,"num_warps":8,"num_stages":3}}}'
mkdir -p "$OUT"
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__cycles_active.avg,sm__cycles_active.max,gpc__cycles_elapsed.max,launch__grid_size
M=$M,launch__waves_per_multiprocessor,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
timeout -k 5 200 ncu --clock-control none -k regex:"cce_fwd_kernel|nvjet" --launch-count 3 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --metrics "$M" python3 -m suite kernel profile fwd --n 16384 --d 2048 --v 49152 --softcap 0 \
  > "$OUT/ncu-16384x2048x49152-portable.txt" 2>&1
echo "ncu: exit $?"
grep -E "^  [a-z_]|cce_fwd|nvjet|Duration|gpu__time|hmma|sm__cycles|gpc__|Grid Size|Waves|Registers|Achieved Occ|Theoretical Occ|Compute \(SM\) Thr|Memory Thr|Stall|dram__|lts__" \
  "$OUT/ncu-16384x2048x49152-portable.txt" | cut -c1-150 | head -n 90
