#!/usr/bin/env bash
# Packs what Liger's tensor-parallel kernel needs on the GPU machine (Python 3.12, x86-64, CUDA
# 13 driver; no network there) into .lck/ (kept out of git), for one device call:
#   liger-cute-kernels 0.8.5 (its sm_90a core and Python files; the sm_100 core and the 200 MB MoE
#   cubin are left out), NVSHMEM 3.6.5's host library and uid bootstrap from nvidia-nvshmem-cu13
#   (what its cu13 extra pins; put beside the core, where LCK looks first), libcudart.so.12 (the
#   core is linked against CUDA 12.9's runtime) and apache-tvm-ffi (LCK's FFI), packed with xz.
# Usage, from the checkout's root on a machine with PyPI: bash suite/kernel/liger_tp_pack.sh
# On the device (the checkout's root; liger_kernel's wheel in .whl/):
#   mkdir -p /tmp/lck && xz -dc .lck/lck.tar.xz | tar -C /tmp/lck -xf - &&
#   python3 -m pip install -q --no-index --no-deps --target /tmp/lck/site .whl/liger_kernel-*.whl &&
#   export PYTHONPATH=/tmp/lck/site:$PWD LD_LIBRARY_PATH=/tmp/lck/lib:${LD_LIBRARY_PATH:-}
set -euo pipefail
LIGER=${LIGER:-0.8.5}; NVSHMEM=${NVSHMEM:-3.6.5}; CUDART=${CUDART:-12.9.79}
top=$(git rev-parse --show-toplevel); cd "$top"
grep -qx /.lck/ .git/info/exclude 2>/dev/null || echo /.lck/ >> .git/info/exclude
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64; do py+=(--platform "$p"); done
python3 -m pip download -q --no-deps "${py[@]}" -d "$tmp/w" "liger-cute-kernels==$LIGER" \
  "nvidia-nvshmem-cu13==$NVSHMEM" "nvidia-cuda-runtime-cu12==$CUDART" "apache-tvm-ffi<0.2,>=0.1.6"
mkdir -p "$tmp/p/site" "$tmp/p/lib"
python3 -m pip install -q --no-index --no-deps --no-compile "${py[@]}" --target "$tmp/p/site" \
  "$tmp"/w/liger_cute_kernels-*.whl "$tmp"/w/apache_tvm_ffi-*.whl
rm -f "$tmp"/p/site/liger_cute_kernels/libliger_cute_kernels_sm100f.so \
      "$tmp"/p/site/liger_cute_kernels/liger_moe_sm90_nonrdc.cubin
(cd "$tmp" && unzip -q -o w/nvidia_nvshmem_cu13-*.whl 'nvidia/nvshmem/lib/libnvshmem_host.so.3' \
   'nvidia/nvshmem/lib/nvshmem_bootstrap_uid.so.3' -d n && unzip -q -o w/nvidia_cuda_runtime_cu12-*.whl \
   'nvidia/cuda_runtime/lib/libcudart.so.12' -d r)
cp "$tmp"/n/nvidia/nvshmem/lib/* "$tmp/p/site/liger_cute_kernels/"
cp "$tmp/r/nvidia/cuda_runtime/lib/libcudart.so.12" "$tmp/p/lib/"
rm -rf .lck && mkdir -p .lck
tar -C "$tmp/p" -cf - site lib | xz -9 -T0 > .lck/lck.tar.xz
(cd "$tmp/w" && sha256sum ./*.whl) > .lck/WHEELS
du -sb .lck/lck.tar.xz
