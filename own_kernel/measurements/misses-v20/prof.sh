#!/bin/bash
# Where the time goes at the grid cells that miss issue 3's targets, and at Gemma 2 (2B): Python's
# profile, the GPU's busy time, its time by operation and (per call, in floors) by kernel family
# for loss+grad calls, one file per cell (softcap none as in the grid, lm inputs unless the name
# says uniform; --filter = filter_eps="auto" as own_filter; gemma: softcap 30, V 256000).
# Run from the repository root on the GPU machine; writes $OUT/profiles.tar and $OUT/summary.txt.
mkdir -p /tmp/p
P="python -m own_kernel.profile host --d 2304"
prof() { name=$1; shift; timeout 150 $P "$@" --trace /tmp/$name.json > /tmp/p/$name.txt 2>&1; }
prof host-n8192v32000 --softcap 0 --n 8192 --v 32000
prof host-n8192v20000-uniform --softcap 0 --n 8192 --v 20000 --dist uniform
prof host-n32768v32000 --softcap 0 --n 32768 --v 32000
prof host-n8192v151936-uniform --softcap 0 --n 8192 --v 151936 --dist uniform
prof host-n8192v256000-uniform --softcap 0 --n 8192 --v 256000 --dist uniform
prof host-n2048v32000--filter --softcap 0 --n 2048 --v 32000 --filter
prof host-n8192v50257--filter --softcap 0 --n 8192 --v 50257 --filter
prof host-gemma --softcap 30 --n 8192 --v 256000
prof host-gemma--filter --softcap 30 --n 8192 --v 256000 --filter
prof host-n8192v32000--low-memory --softcap 0 --n 8192 --v 32000 --low-memory
for f in /tmp/p/*.txt; do echo "== $(basename $f)"; grep -E "host .* to queue|GPU busy" $f; grep -A8 "Per call, in floors" $f; done > $OUT/summary.txt
tar -C /tmp -cf $OUT/profiles.tar p
