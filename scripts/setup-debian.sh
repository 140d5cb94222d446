#!/usr/bin/env bash
# Installs every build and run dependency of libmoe on Debian 12 (idempotent).
#   bash scripts/setup-debian.sh            build + run + test dependencies
#   bash scripts/setup-debian.sh --torch    also python3-torch/numpy (only needed to
#                                           regenerate tests/data reference files)
#   bash scripts/setup-debian.sh --slurm    also slurm-wlm and munge (scripts/slurm-local.sh,
#                                           tests/slurm_test.sh); the options combine
# Open MPI is the MPI of the default build; MPICH (mpich, libmpich-dev) is installed
# beside it for scripts/test-mpich.sh. Debian ranks Open MPI's alternatives (mpicc,
# mpirun, mpi.h) above MPICH's, and this script keeps it so: if one of them points
# elsewhere it is set back to Open MPI (docs/cluster.md).
set -euo pipefail

pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-dev git
      openmpi-bin libopenmpi-dev mpich libmpich-dev libopenblas-dev libzfp-dev libcjson-dev libdnnl-dev
      ocl-icd-opencl-dev
      libmicrohttpd-dev libcurl4-openssl-dev curl gnuplot-nox iproute2 fortunes)
for a in "$@"; do
  case "$a" in
    --torch) pkgs+=(python3-torch python3-numpy) ;;
    --slurm) pkgs+=(slurm-wlm munge) ;;
    *)
      echo "setup-debian: unknown option '$a' (valid: --torch, --slurm)" >&2
      exit 2
      ;;
  esac
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

# Open MPI stays the default MPI (mpicc, mpirun/mpiexec, mpi.h and libmpi.so).
pin_openmpi() {
  local arch name target
  arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
  for name in mpi mpirun "mpi-$arch"; do
    target=$(update-alternatives --query "$name" 2>/dev/null |
      sed -n 's/^Alternative: \(.*openmpi.*\)$/\1/p' | head -n 1)
    [[ -n "$target" ]] || continue
    if [[ "$(update-alternatives --query "$name" | sed -n 's/^Value: //p')" != "$target" ]]; then
      echo "setup-debian: the '$name' alternative pointed away from Open MPI; setting it to $target"
      $SUDO update-alternatives --set "$name" "$target"
    fi
  done
}

missing=()
for p in "${pkgs[@]}"; do
  if ! grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  pin_openmpi
  echo "setup-debian: all dependencies already installed"
  exit 0
fi

echo "setup-debian: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
pin_openmpi
echo "setup-debian: done"
