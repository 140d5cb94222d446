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
# ldd's output is read once into a variable: "ldd | grep -q" under pipefail
# fails at random when grep exits at its first match and ldd gets SIGPIPE.
libs=$(ldd "$build/moe")
if ! grep -q "libmpich\.so" <<<"$libs" || grep -q "libmpi\.so" <<<"$libs"; then
  echo "test-mpich: $build/moe is not linked against MPICH:" >&2
  grep -i mpi <<<"$libs" >&2
  exit 1
fi
if ! grep -q "^MPIEXEC_EXECUTABLE:FILEPATH=$mpiexec$" "$build/CMakeCache.txt"; then
  echo "test-mpich: $build runs its MPI tests with another launcher than $mpiexec" >&2
  exit 1
fi
echo "test-mpich: $("$mpiexec" --version | sed -n 's/^ *Version: *//p' | head -n 1 | sed 's/^/hydra /'), $(grep -o 'libmpich[^ ]*' <<<"$libs" | head -n 1)"

# Excluded: the MPI tests with more ranks than this machine has cores (their
# names end in _npN), unless MOE_MPICH_ALL=1. Debian's MPICH (4.0.2, device
# ch4:ucx) busy-polls in every blocking call and never yields the CPU: libmpich
# imports no sched_yield, MPIR_CVAR_POLLS_BEFORE_YIELD belongs to the ch3
# device Debian does not ship (measured: no effect), and no other MPIR_CVAR_*
# (mpivars lists them) makes waiting ranks yield, unlike Open MPI's
# mpi_yield_when_idle. With more ranks than cores every message then waits for
# a scheduler time slice. Measured on the 2-core development machine, busy with
# other jobs (load average 15-30), MPICH against Open MPI in the same hour:
# train_np4 252 s vs 8 s, ep_layer_np4 41 s vs 5 s, ep_sched_np4 over its 300 s
# limit vs 14 s, a2a_np8 182 s vs 113 s (ep_sched_np2, kept: 87 s vs 2 s). All
# of them pass under MPICH (ep_sched_np4 run by hand without the limit: 761 s,
# 54352 checks, 0 failed), so MOE_MPICH_ALL=1 is correct, only slow. They run
# under Open MPI in every other CI stage, and MPICH at 4 ranks is still run by
# tests/slurm_test.sh (moe train under srun --mpi=pmi2 and mpiexec.mpich).
cores=$(nproc)
exclude=""
if [[ "${MOE_MPICH_ALL:-0}" != 1 ]]; then
  exclude=$(ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: \(.*_np\([0-9]*\)\)$/\2 \1/p' |
    awk -v c="$cores" '$1 > c {print $2}' | paste -sd'|' -)
  # Script tests that start 4 ranks (more than the 2 cores of the CI machine)
  # for the same reason: train_bitwise (the default model on 1, 2 and 4 ranks;
  # tests/slurm_test.sh compares MPICH's 4-rank checkpoints byte for byte
  # instead), memory_rss (the default model on 4 ranks; its RSS figures are Open MPI's),
  # train_packing (the default model on 4 and 6 ranks), parm_train (the
  # default model on 4 ranks, a dozen runs), parm_bitwise (the default model
  # on 4 ranks) and parm_cli (4 ranks).
  if ((cores < 4)); then
    for t in train_bitwise memory_rss train_packing parm_train parm_bitwise parm_cli; do
      exclude="${exclude:+$exclude|}$t"
    done
  fi
fi
if [[ -n "$exclude" ]]; then
  echo "test-mpich: skipping the tests with more ranks than the $cores cores (MOE_MPICH_ALL=1 runs them):" \
    "${exclude//|/ }"
fi
# hang_cli on any machine, MOE_MPICH_ALL=1 too: when the watchdog aborts the
# job, MPICH's hydra leaves the rank the test stopped with SIGSTOP behind (a
# stopped process does not act on the SIGTERM it is sent), which the test
# rightly counts as a leftover process (docs/cluster.md). The watchdog itself
# is tested under Open MPI in the other stages.
echo "test-mpich: skipping hang_cli (hydra leaves the rank it stops with SIGSTOP behind)"
exclude="${exclude:+$exclude|}hang_cli"
# shellcheck disable=SC2086
ctest --test-dir "$build" --output-on-failure -E "^($exclude)\$" ${CTEST_ARGS:-}
