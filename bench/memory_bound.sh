#!/usr/bin/env bash
# The memory bound's estimate against measured RSS (docs/reliability.md,
# "Memory bound"): the default demo model at 1, 2 and 4 ranks (EP = P) after
# 5 and 60 steps; peak RSS (VmHWM) and the estimate, each the max over the
# ranks, and the estimate with balanced routing; then the baseline of a model
# of a few hundred parameters.
#
#   bash bench/memory_bound.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: memory_bound.sh BUILD_DIR}
moe=$(realpath "$build/moe")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=1
launch() { mpiexec -n "$1" --oversubscribe "${@:2}"; }
echo "| ranks | steps | peak RSS, max over ranks (MiB) | estimate, max over ranks (MiB) | RSS/estimate | estimate at balanced routing, rank 0 (MiB) | RSS/balanced |"
echo "|---|---|---|---|---|---|---|"
for steps in 5 60; do
  for p in 1 2 4; do
    out=$(launch "$p" "$moe" train --steps "$steps" --batch 16 --eval-every 0 --eval-batches 1 --quiet 2>&1)
    OUT="$out" python3 - "$p" "$steps" <<'PY'
import os, re, sys
t = os.environ["OUT"]
m = re.search(r"max over ranks ([\d.]+) MiB\); from the config: [\d.]+ MiB \(max over ranks ([\d.]+) MiB\).*?config gives ([\d.]+) MiB", t)
rss, est, bal = map(float, m.groups())
print(f"| {sys.argv[1]} | {sys.argv[2]} | {rss:.1f} | {est:.1f} | {rss / est:.2f} | {bal:.1f} | {rss / bal:.2f} |")
PY
  done
done
echo
echo "baseline (1 block, d = 8, 4 experts of width 8; peak RSS max over ranks, MiB):"
for p in 1 2 4; do
  out=$(launch "$p" "$moe" train --steps 3 --batch 16 --layers 1 --d-model 8 --heads 1 --seq-len 8 \
    --experts 4 --expert-hidden 8 --dense-hidden 8 --eval-every 0 --eval-batches 1 --quiet 2>&1)
  echo "  $p rank(s): $(grep -oE 'max over ranks [0-9.]+ MiB\); from' <<<"$out" | grep -oE '[0-9.]+' | head -1)"
done
