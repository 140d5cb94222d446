#!/usr/bin/env bash
# Builds libmoe against MPICH, beside the default Open MPI build, and runs the
# whole test suite with MPICH's mpiexec (hydra):
#   cmake -S . -B build-mpich -DMOE_WERROR=ON -DMPI_C_COMPILER=mpicc.mpich \
#         -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich
# The default build (scripts/test.sh, build/) keeps using Open MPI: MPICH is
# named explicitly here and nowhere else (docs/cluster.md).
# Usage: bash scripts/test-mpich.sh   (after bash scripts/setup-debian.sh)
# Environment: BUILD (build folder, default build-mpich), CTEST_ARGS (extra ctest options).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-mpich}
mpicc=$(command -v mpicc.mpich) || {
  echo "test-mpich: mpicc.mpich not found (Debian: apt-get install mpich libmpich-dev)" >&2
  exit 1
}
mpiexec=$(command -v mpiexec.mpich) || {
  echo "test-mpich: mpiexec.mpich not found (Debian: apt-get install mpich)" >&2
  exit 1
}

cmake -S . -B "$build" -DMOE_WERROR=ON -DMPI_C_COMPILER="$mpicc" -DMPIEXEC_EXECUTABLE="$mpiexec"
cmake --build "$build" -j2

# The build must really be MPICH's (FindMPI could have kept an Open MPI from a
# cache): moe links libmpich, not libmpi, and the tests' launcher is hydra.
if ! ldd "$build/moe" | grep -q "libmpich\.so" || ldd "$build/moe" | grep -q "libmpi\.so"; then
  echo "test-mpich: $build/moe is not linked against MPICH:" >&2
  ldd "$build/moe" | grep -i mpi >&2
  exit 1
fi
if ! grep -q "^MPIEXEC_EXECUTABLE:FILEPATH=$mpiexec$" "$build/CMakeCache.txt"; then
  echo "test-mpich: $build runs its MPI tests with another launcher than $mpiexec" >&2
  exit 1
fi
echo "test-mpich: $("$mpiexec" --version | sed -n 's/^ *Version: *//p' | head -n 1 | sed 's/^/hydra /'), $(ldd "$build/moe" | grep -o 'libmpich[^ ]*' | head -n 1)"

# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure ${CTEST_ARGS:-}
