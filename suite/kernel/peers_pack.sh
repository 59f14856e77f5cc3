#!/usr/bin/env bash
# Packs the peers that suite/kernel/peers_gpu.sh measures, for the GPU machine (Python 3.12,
# x86-64, CUDA 13; no network there): their wheels from PyPI (--no-deps: exactly these),
# installed here with `pip --target` into one folder named site-packages (QuACK's import needs
# that name), packed with xz and split in two parts, so that each device call (64 MiB with the
# working tree) carries one: .cute-a/peers.tar.xz.aa (call 1), .cute-b/peers.tar.xz.ab (call 2).
# The CuTe DSL's CUDA libraries (a 92 MB wheel, 237 MB unpacked) are most of it; xz packs the
# unpacked files to about two thirds of the wheel.
# Usage, from the checkout's root on a machine with PyPI: bash suite/kernel/peers_pack.sh
# (about 15 minutes on 2 cores, most of it xz). .cute-b/WHEELS lists what was packed,
# .cute-b/SHA256 the archive's hash.
set -euo pipefail
DSL=${DSL:-4.8.1}       # nvidia-cutlass-dsl: Liger 0.8.5's cutedsl extra asks >= 4.6.0
QUACK=${QUACK:-0.6.5}   # imports with DSL 4.8.1 from a folder named site-packages
PART_BYTES=${PART_BYTES:-35000000}
top=$(git rev-parse --show-toplevel); cd "$top"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64; do platforms+=(--platform "$p"); done
py=(--only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}")
python3 -m pip download -q --no-deps "${py[@]}" -d "$tmp/wheels" \
  liger-kernel==0.8.5 verl==0.9.1 \
  "nvidia-cutlass-dsl==$DSL" "nvidia-cutlass-dsl-libs-base==$DSL" \
  "nvidia-cutlass-dsl-libs-core==$DSL" "nvidia-cutlass-dsl-libs-cu13==$DSL" \
  "quack-kernels==$QUACK" "apache-tvm-ffi<0.2,>=0.1.6" torch-c-dlpack-ext einops
python3 -m pip install -q --no-index --no-deps --no-compile "${py[@]}" \
  --target "$tmp/peers/site-packages" "$tmp/wheels"/*.whl
tar -C "$tmp/peers" -cf - site-packages | xz -9 -T0 > "$tmp/peers.tar.xz"
rm -rf .cute-a .cute-b && mkdir -p .cute-a .cute-b
split -b "$PART_BYTES" -a 2 "$tmp/peers.tar.xz" "$tmp/peers.tar.xz."
[ ! -e "$tmp/peers.tar.xz.ac" ] || { echo "more than two parts: raise PART_BYTES" >&2; exit 1; }
mv "$tmp/peers.tar.xz.aa" .cute-a/ && mv "$tmp/peers.tar.xz.ab" .cute-b/
(cd "$tmp/wheels" && sha256sum ./*.whl) > .cute-b/WHEELS
sha256sum "$tmp/peers.tar.xz" | cut -d' ' -f1 > .cute-b/SHA256  # checked on the device
du -sb .cute-a .cute-b
echo "device calls: see suite/kernel/peers_gpu.sh (call 1 carries .cute-a, call 2 .cute-b)"
