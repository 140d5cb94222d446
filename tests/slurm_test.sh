#!/usr/bin/env bash
# The launcher path under a real Slurm (scripts/slurm-local.sh: munged,
# slurmctld and slurmd on this machine, one node on localhost):
#   1. `srun -n 4 moe train` (Open MPI started by srun through PMIx, the
#      local slurm.conf's MpiDefault)
#      is one 4-rank job, and its losses and final checkpoint equal those of
#      `moe-mpirun -n 4` of the same command bitwise (same code, same rank count);
#      `srun -n 2 moe bench layer` is one 2-rank distributed benchmark;
#   2. with an MPICH build (optional second argument): `srun -n 4 --mpi=pmi2`
#      is one 4-rank job whose losses and checkpoint equal `mpiexec.mpich -n 4`'s, and under
#      --mpi=pmix (which MPICH does not speak) moe refuses to run as singletons;
#   3. `sbatch --wait examples/slurm/train.sbatch` (the docs' script) as two
#      jobs: the first stops at step 2 (as a job cut short), the second resumes
#      from its checkpoint; together their metrics, and the final checkpoint,
#      equal one uninterrupted `moe-mpirun -n 4` run bitwise. Both jobs emulate 2 nodes x 2 ranks
#      (MOE_RANKS_PER_NODE=2) with the topology-aware `2dh` all-to-all;
#   4. Open MPI's mpirun inside `sbatch --wrap` starts 4 ranks from the allocation.
# Slurm is stopped on every exit (trap). Needs root, slurm-wlm and munge
# (bash scripts/setup-debian.sh --slurm).
# Usage: slurm_test.sh path/to/moe [path/to/moe-built-with-mpich]
set -u
MOE=$(realpath "${1:?usage: slurm_test.sh path/to/moe [path/to/moe-built-with-mpich]}")
MOE_MPICH=${2:+$(realpath "$2")}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
export MOE_SLURM_DIR=$tmp/slurm
on_exit() {
  bash "$root/scripts/slurm-local.sh" stop >/dev/null || echo "slurm_test: stopping Slurm failed" >&2
}
T=300 # seconds any one launch may take

start=$(date +%s)
if ! bash "$root/scripts/slurm-local.sh" start; then
  echo "slurm_test: cannot start the local Slurm (above)" >&2
  exit 1
fi
export SLURM_CONF=$MOE_SLURM_DIR/slurm.conf
echo "slurm_test: Slurm up in $(($(date +%s) - start)) s"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1

# same_losses A.jsonl B.jsonl STEPS: the per-step loss, aux, grad_norm and
# val_loss fields are the same numbers as printed (9 significant digits), for
# steps 1..STEPS; same_ckpt checks the bits.
same_losses() {
  python3 - "$@" <<'PY'
import json, sys
a, b, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ra = [json.loads(l) for l in open(a)]
rb = [json.loads(l) for l in open(b)]
steps = list(range(1, n + 1))
assert [r["step"] for r in ra] == steps, (a, [r["step"] for r in ra])
assert [r["step"] for r in rb] == steps, (b, [r["step"] for r in rb])
for x, y in zip(ra, rb):
    for k in ("loss", "aux", "grad_norm", "val_loss"):
        assert (k in x) == (k in y), (x["step"], k)
        if k in x and x[k] != y[k]:
            sys.exit(f"step {x['step']} {k}: {x[k]!r} ({a}) != {y[k]!r} ({b})")
print(f"same losses over {n} steps: {[r['loss'] for r in ra]}")
PY
}

# same_ckpt A B: the two runs' final checkpoints (parameters, AdamW state,
# step) are the same bytes: bitwise the same training.
same_ckpt() {
  if [[ -s "$1" ]] && cmp -s "$1" "$2"; then ok; else bad "checkpoints $1 and $2 differ (or are missing)"; fi
}

# one_job_of LOG P: the log says the run had P ranks, once (P singletons would
# each print "1 rank(s)").
one_job_of() {
  local n
  n=$(grep -c "rank(s)" "$1")
  if [[ "$n" == 1 ]] && grep -q ", $2 rank(s)," "$1"; then ok; else
    bad "$1: wanted one run of $2 ranks, got:"
    grep "rank(s)" "$1" >&2
  fi
}

# 1. Open MPI: plain srun -n 4 (slurm.conf's MpiDefault=pmix) vs moe-mpirun -n 4,
#    the default model.
RUN=(train --steps 3 --eval-every 0 --eval-batches 1 --quiet)
t0=$(date +%s)
if timeout $T srun -n 4 "$MOE" "${RUN[@]}" --metrics "$tmp/srun.jsonl" --checkpoint "$tmp/srun.ckpt" \
  >"$tmp/srun.log" 2>&1; then
  ok
else
  bad "srun -n 4 moe train: exit $?"
  tail -20 "$tmp/srun.log" >&2
fi
one_job_of "$tmp/srun.log" 4
echo "slurm_test: srun -n 4 moe train (default model, 3 steps) in $(($(date +%s) - t0)) s"
if timeout $T "$root/scripts/moe-mpirun" -n 4 "$MOE" "${RUN[@]}" --metrics "$tmp/mpirun.jsonl" \
  --checkpoint "$tmp/mpirun.ckpt" >"$tmp/mpirun.log" 2>&1; then ok; else
  bad "moe-mpirun -n 4 moe train: exit $?"
  tail -20 "$tmp/mpirun.log" >&2
fi
if same_losses "$tmp/srun.jsonl" "$tmp/mpirun.jsonl" 3; then ok; else bad "srun and moe-mpirun losses differ"; fi
same_ckpt "$tmp/srun.ckpt" "$tmp/mpirun.ckpt"

# moe bench layer picks its distributed benchmark when the launcher announces
# more than one rank; srun --mpi=pmix announces none of MPI's variables, only
# SLURM_STEP_NUM_TASKS: one distributed table of 2 ranks, not 2 single-process runs.
if timeout $T srun -n 2 --mpi=pmix "$MOE" bench layer --tokens 64 --model 32 --hidden 64 --experts 4 \
  --iters 1 --warmup 0 >"$tmp/bench.log" 2>&1 &&
  [[ $(grep -c "^moe bench layer" "$tmp/bench.log") == 1 ]] &&
  grep -q "^moe bench layer (distributed): 2 ranks" "$tmp/bench.log"; then ok; else
  bad "srun -n 2 moe bench layer: wanted one distributed run on 2 ranks, got:"
  grep "^moe bench layer" "$tmp/bench.log" >&2
fi

TINY=(train --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4 --expert-hidden 32 --batch 8
      --eval-every 2 --eval-batches 1 --quiet)

# 2. MPICH: srun -n 4 --mpi=pmi2 vs mpiexec.mpich -n 4 (a small model: MPICH
#    busy-polls, slow with 4 ranks on 2 cores).
if [[ -n "$MOE_MPICH" ]]; then
  if timeout $T srun -n 4 --mpi=pmi2 "$MOE_MPICH" "${TINY[@]}" --steps 4 --metrics "$tmp/mpich-srun.jsonl" \
    --checkpoint "$tmp/mpich-srun.ckpt" >"$tmp/mpich-srun.log" 2>&1; then ok; else
    bad "srun -n 4 --mpi=pmi2 (MPICH) moe train: exit $?"
    tail -20 "$tmp/mpich-srun.log" >&2
  fi
  one_job_of "$tmp/mpich-srun.log" 4
  if timeout $T mpiexec.mpich -n 4 "$MOE_MPICH" "${TINY[@]}" --steps 4 --metrics "$tmp/mpich-exec.jsonl" \
    --checkpoint "$tmp/mpich-exec.ckpt" >"$tmp/mpich-exec.log" 2>&1; then ok; else
    bad "mpiexec.mpich -n 4 moe train: exit $?"
    tail -20 "$tmp/mpich-exec.log" >&2
  fi
  if same_losses "$tmp/mpich-srun.jsonl" "$tmp/mpich-exec.jsonl" 4; then ok; else
    bad "MPICH: srun and mpiexec losses differ"
  fi
  same_ckpt "$tmp/mpich-srun.ckpt" "$tmp/mpich-exec.ckpt"
  # MPICH under srun --mpi=pmix (a PMI it does not speak) would be 2 singletons:
  # refused with exit 2 and a message naming --mpi=pmi2.
  timeout $T srun -n 2 --mpi=pmix "$MOE_MPICH" "${TINY[@]}" --steps 1 >"$tmp/mpich-pmix.log" 2>&1
  rc=$?
  if [[ $rc -eq 2 ]] && grep -q "started 2 processes (SLURM_STEP_NUM_TASKS=2) but MPI_COMM_WORLD has 1 rank.*--mpi=pmi2 for MPICH" \
    "$tmp/mpich-pmix.log" && ! grep -q "rank(s)" "$tmp/mpich-pmix.log"; then ok; else
    bad "MPICH under srun --mpi=pmix: exit $rc (want 2) and the launch error, got:"
    tail -5 "$tmp/mpich-pmix.log" >&2
  fi
fi

# 3. The docs' sbatch script, twice (cut short at step 2, then resumed), on
#    "2 nodes x 2 ranks" with 2dh, against one uninterrupted run.
export MOE="$MOE" MOE_CKPT=$tmp/sb.ckpt MOE_STEPS=4 MOE_SAVE_EVERY=1 MOE_RANKS_PER_NODE=2
common="${TINY[*]:1} --a2a 2dh"
SB=(sbatch --wait --nodes=1 --ntasks-per-node=4 --time=5 --chdir="$tmp")
if MOE_TRAIN_ARGS="$common --stop-at 2" timeout $T "${SB[@]}" --output="$tmp/job1.out" \
  "$root/examples/slurm/train.sbatch" >/dev/null; then ok; else
  bad "sbatch --wait train.sbatch (job 1): exit $?"
  tail -20 "$tmp/job1.out" >&2
fi
if [[ -f "$tmp/sb.ckpt" ]] && ! grep -q "resuming" "$tmp/job1.out"; then ok; else
  bad "job 1: wanted a fresh run that leaves $tmp/sb.ckpt"
fi
one_job_of "$tmp/job1.out" 4
if MOE_TRAIN_ARGS="$common" timeout $T "${SB[@]}" --output="$tmp/job2.out" \
  "$root/examples/slurm/train.sbatch" >/dev/null; then ok; else
  bad "sbatch --wait train.sbatch (job 2): exit $?"
  tail -20 "$tmp/job2.out" >&2
fi
if grep -q "(resuming)" "$tmp/job2.out" && grep -q "^resume: .* at step 2 (continuing at step 3)" "$tmp/job2.out"; then
  ok
else
  bad "job 2 did not resume from step 2:"
  head -5 "$tmp/job2.out" >&2
fi
one_job_of "$tmp/job2.out" 4
# shellcheck disable=SC2086
if timeout $T "$root/scripts/moe-mpirun" -n 4 "$MOE" train ${common} --steps 4 --metrics "$tmp/ref.jsonl" \
  --checkpoint "$tmp/ref.ckpt" >"$tmp/ref.log" 2>&1; then ok; else
  bad "reference moe-mpirun -n 4: exit $?"
  tail -20 "$tmp/ref.log" >&2
fi
if same_losses "$tmp/sb.jsonl" "$tmp/ref.jsonl" 4; then ok; else
  bad "sbatch (cut short + resumed) and one uninterrupted run differ"
fi
same_ckpt "$tmp/sb.ckpt" "$tmp/ref.ckpt"

# 4. Open MPI's mpirun inside a batch job takes its ranks and slots from the
#    allocation (no -n, no --oversubscribe: the node has 4 CPUs in slurm.conf).
unset MOE_RANKS_PER_NODE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if timeout $T sbatch --wait --nodes=1 --ntasks-per-node=4 --time=5 --chdir="$tmp" --output="$tmp/job3.out" \
  --wrap "mpirun $MOE ${TINY[*]} --steps 2" >/dev/null; then ok; else
  bad "sbatch --wrap 'mpirun moe train': exit $?"
  tail -20 "$tmp/job3.out" >&2
fi
one_job_of "$tmp/job3.out" 4

finish slurm_test "($(($(date +%s) - start)) s)"
