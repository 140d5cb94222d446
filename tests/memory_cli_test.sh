#!/usr/bin/env bash
# The memory bound end to end (docs/reliability.md, "Memory bound"): shapes
# that do not fit are refused before anything is allocated, with exit status 2,
# one message naming the rank, the need by category and the limit, no hang
# (every run under a timeout) and no output file; bad --max-memory values are
# usage errors; a run that fits trains and prints its estimate next to its RSS.
# Usage: memory_cli_test.sh path/to/moe MPIEXEC
set -u
MOE=${1:?usage: memory_cli_test.sh path/to/moe MPIEXEC}
MPIEXEC=${2:?usage: memory_cli_test.sh path/to/moe MPIEXEC}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
# The layer shape of the issue: tokens = model_dim = hidden_dim = 65536, E = 2
# (about 0.4 TiB in one process): it used to grow until the machine ran out.
echo '{"tokens": 65536, "model_dim": 65536, "hidden_dim": 65536, "num_experts": 2}' >"$tmp/huge.json"

# check NAME CODE PATTERN COUNT -- COMMAND...: exit status CODE, output matching
# PATTERN, the refusal printed COUNT times (0: not checked), within 120 s.
check() {
  local name=$1 code=$2 pattern=$3 count=$4
  shift 5
  local out rc n
  out=$(timeout 120 "$@" 2>&1)
  rc=$?
  n=$(grep -c "needs more memory than it may use" <<<"$out")
  if [[ $rc -eq $code ]] && grep -qE -- "$pattern" <<<"$out" && [[ $count -eq 0 || $n -eq $count ]]; then
    ok
  else
    bad "$name: exit $rc (want $code; 124 = timed out), refusals $n (want $count), output:"
    echo "$out" | head -20 >&2
    echo "  (wanted pattern: $pattern)" >&2
  fi
}

limit='the limit is [0-9.]+ [KMGT]iB \((MemAvailable|cgroup memory.max)'
# one process
check "bench layer, huge shape" 2 "this process needs more memory .*params 64.0 GiB .*$limit" 1 -- \
  "$MOE" bench layer --config "$tmp/huge.json" --json "$tmp/out.json"
check "bench layer, --max-memory 64M" 2 \
  "params [0-9.]+ MiB \+ grads .*activations .*baseline .*limit is 64.0 MiB \(--max-memory\); use fewer --tokens" 1 -- \
  "$MOE" bench layer --tokens 4096 --max-memory 64M
check "bench layer, --max-memory 12X" 2 "--max-memory: size '12X' is not a size" 0 -- \
  "$MOE" bench layer --max-memory 12X
check "bench layer, --max-memory 0" 2 "--max-memory: size '0' must be between 1 byte" 0 -- \
  "$MOE" bench layer --max-memory 0
check "bench layer, --max-memory -1G" 2 "--max-memory: size '-1G' is not" 0 -- \
  "$MOE" bench layer --max-memory -1G
check "bench layer, fits" 0 "forward ms" 0 -- \
  "$MOE" bench layer --tokens 64 --model 32 --hidden 32 --iters 1 --peak-size 64 --max-memory 1G
check "bench compress, --max-memory 256M" 2 \
  "this process needs .*activations 3.00 GiB .*limit is 256.0 MiB \(--max-memory\); use fewer --rows" 1 -- \
  "$MOE" bench compress --rows 16384 --cols 16384 --max-memory 256M
if [[ -e "$tmp/out.json" || -e "$tmp/out.json.tmp" ]]; then
  bad "a refused bench layer left $tmp/out.json(.tmp)"
else ok; fi

# 2 ranks: every rank refuses, rank 0 prints once
check "bench layer -n 2, huge shape" 2 \
  "memory: rank 0 of 2 needs more memory .*$limit.* / 2 ranks on its node\)" 1 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" bench layer --config "$tmp/huge.json"
check "bench layer -n 2, --max-memory 32M" 2 \
  "rank 0 of 2 needs .*all-to-all .*limit is 32.0 MiB \(--max-memory, per rank\)" 1 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" bench layer --tokens 2048 --model 256 --hidden 512 --max-memory 32M
check "bench a2a -n 2, --max-memory 512M" 2 \
  "rank 0 of 2 needs .*all-to-all [0-9.]+ GiB .*limit is 512.0 MiB \(--max-memory, per rank\); lower --max-bytes" 1 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" bench a2a --max-bytes 536870912 --max-memory 512M
check "train -n 2, --max-memory 8M" 2 \
  "train: rank 0 of 2 needs .*optimizer .*limit is 8.00 MiB \(--max-memory, per rank\); use a smaller model" 1 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" train --steps 2 --max-memory 8M --checkpoint "$tmp/ck.bin" --quiet
check "train -n 2, huge model" 2 "train: rank 0 of 2 needs .*$limit" 1 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" train --steps 2 --d-model 8192 --expert-hidden 65536 --quiet
check "train -n 2, --max-memory 2x" 2 "--max-memory: size '2x' is not" 0 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" train --steps 2 --max-memory 2x --quiet
if ls "$tmp"/ck.bin* >/dev/null 2>&1; then bad "a refused train left a checkpoint"; else ok; fi
check "train -n 2, fits" 0 \
  "memory bound, rank 0 \(the memory check's figure: worst-case routing\): params .*baseline .*RSS/bound [0-9.]+" 0 -- \
  "$MPIEXEC" -n 2 $OVERSUB "$MOE" train --steps 2 --layers 1 --d-model 32 --heads 2 --seq-len 16 \
  --experts 4 --expert-hidden 32 --eval-every 0 --eval-batches 1 --quiet --max-memory 1G \
  --checkpoint "$tmp/small.ckpt"
check "sample, --max-memory 1M" 2 "this process needs .*params .*limit is 1.00 MiB \(--max-memory\)" 1 -- \
  "$MOE" sample --checkpoint "$tmp/small.ckpt" --max-memory 1M
check "sample, fits" 0 "^the" 0 -- "$MOE" sample --checkpoint "$tmp/small.ckpt" --prompt the \
  --length 4 --max-memory 1G

finish memory_cli_test
