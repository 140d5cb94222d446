#!/usr/bin/env bash
# The memory computed from the config against measured RSS (docs/reliability.md,
# "Memory bound"): the default demo model at 1, 2 and 4 ranks (EP = P) after
# 5 and 60 steps; peak RSS (VmHWM), the expected figure (the prediction) and
# the memory check's upper bound, each the max over the ranks, and rank 0's
# own RSS / expected; then the baseline of a model of a few hundred
# parameters.
#
#   bash bench/memory_bound.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: memory_bound.sh BUILD_DIR}
moe=$(realpath "$build/moe")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=1
launch() { mpiexec -n "$1" --oversubscribe "${@:2}"; }
echo "| ranks | steps | peak RSS, max over ranks (MiB) | expected, max over ranks (MiB) | RSS / expected | bound, max over ranks (MiB) | RSS / bound | rank 0: RSS / expected |"
echo "|---|---|---|---|---|---|---|---|"
for steps in 5 60; do
  for p in 1 2 4; do
    out=$(launch "$p" "$moe" train --steps "$steps" --batch 16 --eval-every 0 --eval-batches 1 --quiet 2>&1)
    OUT="$out" python3 - "$p" "$steps" <<'PY'
import os, re, sys
t = os.environ["OUT"]
rss, exp = map(float, re.search(r"peak RSS [\d.]+ MiB \(max over ranks ([\d.]+) MiB\); expected from the config [\d.]+ MiB \(max over ranks ([\d.]+) MiB\)", t).groups())
own = float(re.search(r"RSS/expected ([\d.]+) \(max over ranks", t).group(1))
bound = float(re.search(r"memory bound, .*? = [\d.]+ MiB \(max over ranks ([\d.]+) MiB\)", t).group(1))
print(f"| {sys.argv[1]} | {sys.argv[2]} | {rss:.1f} | {exp:.1f} | {rss / exp:.2f} | {bound:.1f} | {rss / bound:.2f} | {own:.2f} |")
PY
  done
done
echo
echo "baseline (1 block, d = 8, 4 experts of width 8; peak RSS and expected, max over ranks, MiB):"
for p in 1 2 4; do
  out=$(launch "$p" "$moe" train --steps 3 --batch 16 --layers 1 --d-model 8 --heads 1 --seq-len 8 \
    --experts 4 --expert-hidden 8 --dense-hidden 8 --eval-every 0 --eval-batches 1 --quiet 2>&1)
  echo "  $p rank(s): $(grep -oE 'max over ranks [0-9.]+ MiB\)' <<<"$out" | grep -oE '[0-9.]+' | head -2 | paste -sd' ')"
done
