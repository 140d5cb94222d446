#!/usr/bin/env bash
# The layering check (scripts/check-layers.sh) passes on this tree and fails,
# naming the offence, on a copy with one bad include planted at a time.
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"

out=$(bash "$src/scripts/check-layers.sh" "$src" 2>&1)
if [[ $? -eq 0 ]]; then ok; else bad "the tree itself: $out"; fi

# plant LINE FILE PATTERN: a fresh copy, LINE appended to FILE; the check must
# exit 1 and print PATTERN.
plant() {
  local line=$1 file=$2 pattern=$3
  rm -rf "$tmp/t" && mkdir -p "$tmp/t"
  cp -r "$src/src" "$src/include" "$src/cli" "$tmp/t/"
  [[ -d "$src/examples" ]] && cp -r "$src/examples" "$tmp/t/"
  printf '%s\n' "$line" >>"$tmp/t/$file"
  local o
  o=$(bash "$src/scripts/check-layers.sh" "$tmp/t" 2>&1)
  local rc=$?
  if [[ $rc -eq 1 && "$o" == *"$pattern"* ]]; then ok; else bad "$line in $file: rc $rc, output: $o"; fi
}

plant '#include "moe/parallel.h"' src/kernels/gemm.c "kernels includes moe/parallel.h of parallel, a layer above it"
plant '#include "train/train_internal.h"' src/core/log.c "core includes train/train_internal.h, the private header of train"
plant '#include "parallel/parallel_internal.h"' src/train/trainer.c "the private header of parallel"
plant '#include "sched/sched_internal.h"' src/perf/fit.c "the private header of sched"
plant '#include "perf/fit.h"' src/layer/route.c "layer includes perf/fit.h of perf, a layer above it"
plant '#include "moe/train.h"' include/moe/model.h "model includes moe/train.h of train, a layer above it"
plant '#include "kernels/kernels_internal.h"' include/moe/kernels.h "which is not installed"
plant '#include "moe/secret.h"' src/model/gpt.c "a public header no layer owns"
plant '#include "layer/layer_internal.h"' cli/main.c "only public headers"
plant '#include "nowhere.h"' src/core/log.c "not found next to it"
# A new module folder or public header must be placed in the order first.
rm -rf "$tmp/t" && mkdir -p "$tmp/t" && cp -r "$src/src" "$src/include" "$src/cli" "$tmp/t/"
mkdir "$tmp/t/src/newmod" && echo 'int x;' >"$tmp/t/src/newmod/a.c"
o=$(bash "$src/scripts/check-layers.sh" "$tmp/t" 2>&1)
if [[ $? -eq 1 && "$o" == *"src/newmod/: a module folder no layer names"* ]]; then ok; else bad "new module: $o"; fi

finish layers_test
