#!/usr/bin/env bash
# Installs every build and run dependency of libmoe on Debian 12 (idempotent).
#   bash scripts/setup-debian.sh            build + run + test dependencies
#   bash scripts/setup-debian.sh --torch    also python3-torch/numpy (only needed to
#                                           regenerate tests/data reference files)
set -euo pipefail

pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-dev git
      openmpi-bin libopenmpi-dev libopenblas-dev libzfp-dev libcjson-dev
      gnuplot-nox iproute2 fortunes)
if [[ "${1:-}" == "--torch" ]]; then
  pkgs+=(python3-torch python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup-debian: all dependencies already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup-debian: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup-debian: done"
