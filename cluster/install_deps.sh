#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages hydra builds against, only those missing (idempotent).
# Needs root or sudo for apt-get; does nothing when everything is present.
set -euo pipefail
packages=(cmake g++ make pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev
          libopenblas-dev nlohmann-json3-dev libfmt-dev libgtest-dev libxxhash-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all build dependencies present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
