# Sourced by the device scripts that measure the packed peers (peers_gpu.sh, headline_gpu.sh):
# the site-packages folder that suite/kernel/peers_pack.sh packed (QuACK, the CuTe DSL, Liger,
# verl), unpacked from call 1's part (/tmp/cute/peers.tar.xz.aa) and .cute-b's, checked against
# .cute-b/SHA256. QuACK's import needs the folder's name site-packages; a --target install skips
# the DSL's .pth file, so its dsl_packages folder goes on PYTHONPATH too (peers_pythonpath).

PEERS_SITE=/tmp/peers/site-packages

unpack_peers() {
  [ -f /tmp/cute/peers.tar.xz.aa ] || { echo "no /tmp/cute/peers.tar.xz.aa: run call 1 first"; return 3; }
  mkdir -p "$(dirname "$PEERS_SITE")"
  cat /tmp/cute/peers.tar.xz.aa .cute-b/peers.tar.xz.a[b-z] > /tmp/cute/peers.tar.xz
  echo "$(cat .cute-b/SHA256)  /tmp/cute/peers.tar.xz" | sha256sum -c || return 4
  xz -d < /tmp/cute/peers.tar.xz | tar -x -C "$(dirname "$PEERS_SITE")"
}

peers_pythonpath() { echo "$PEERS_SITE:$PEERS_SITE/nvidia_cutlass_dsl/dsl_packages"; }
