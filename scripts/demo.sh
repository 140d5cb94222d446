#!/usr/bin/env bash
# The default demo (the README's main command): trains a tiny MoE-GPT (4 blocks,
# d = 128, 8 experts, top-2) on 4 local ranks (DP x EP = 1 x 4) on the fortunes
# corpus for a few minutes, shows the loss falling (progress line, metrics,
# gnuplot plot when gnuplot is installed), then generates a sample.
#
#   bash scripts/demo.sh [BUILD_DIR] [extra moe train options...]
#
# Outputs go to demo-out/ (metrics.jsonl, loss.png or loss.txt, model.ckpt).
# Environment: RANKS (default 4), STEPS (default 3000), OUT (default demo-out).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
moe="$build/moe"
if [[ ! -x "$moe" ]]; then
  echo "demo: $moe not found; build first: cmake -S . -B $build && cmake --build $build -j2" >&2
  exit 2
fi
ranks=${RANKS:-4}
steps=${STEPS:-3000}
out=${OUT:-demo-out}
mkdir -p "$out"
if ! command -v mpirun >/dev/null && ! command -v mpiexec >/dev/null; then
  echo "demo: mpirun not found (bash scripts/setup-debian.sh installs Open MPI)" >&2
  exit 2
fi
# scripts/moe-mpirun: mpirun, allowed to run as root, with --oversubscribe when
# the ranks outnumber the cores (Open MPI); see scripts/moe-mpirun --help.
launch=(scripts/moe-mpirun -n "$ranks")
# Ranks may share cores with each other here: let idle ranks yield the CPU (Open MPI).
export OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=1
plot="$out/loss.png"
if ! command -v gnuplot >/dev/null; then plot=""; fi

echo "== training MoE-GPT on $ranks ranks for $steps steps (outputs in $out/)"
args=(train --steps "$steps" --batch 16 --layers 4 --d-model 128 --heads 4 --experts 8 --topk 2
      --eval-every 200 --eval-batches 16 --log-every 20 --metrics "$out/metrics.jsonl"
      --checkpoint "$out/model.ckpt" --save-every 200)
if [[ -n "$plot" ]]; then args+=(--plot "$plot"); fi
"${launch[@]}" "$moe" "${args[@]}" "$@"

echo
echo "== a sample from the trained model (moe sample --checkpoint $out/model.ckpt)"
"$moe" sample --checkpoint "$out/model.ckpt" --prompt "Q: What is " --length 300 --seed 3
