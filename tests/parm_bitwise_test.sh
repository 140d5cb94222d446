#!/usr/bin/env bash
# Parm in deterministic mode (the default; docs/parm.md "Deterministic mode")
# on the DEFAULT demo model: MP 2 on 2 ranks and MP 2 x EP 2 (s2 with SAA)
# on 4 ranks over 20 steps; MP 2 x EP 2 with s1 and the baseline, MP 2 x DP 2,
# MP 2 x ESP 2 (s2 and the baseline) and ESP 2 x EP 2 on 4 ranks over 8: each
# ends in the 1-rank run's checkpoint (of as many steps) byte for byte, with
# the same loss, aux loss and gradient norm at every step (as the metrics
# print them).
# Usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
RUN=(train --seed 1 --eval-every 0 --quiet)

run() {  # run NAME RANKS STEPS ARGS...: checkpoint $tmp/NAME.ckpt, metrics $tmp/NAME.jsonl
  local name=$1 n=$2 steps=$3
  shift 3
  local cmd=("$MOE" "${RUN[@]}" --steps "$steps" --checkpoint "$tmp/$name.ckpt"
    --metrics "$tmp/$name.jsonl" "$@")
  [[ $n -gt 1 ]] && cmd=("$MPIEXEC" -n "$n" $OVERSUB "${cmd[@]}")
  if ! timeout 600 "${cmd[@]}" >"$tmp/$name.out" 2>&1; then
    bad "$name: moe train failed"
    tail -5 "$tmp/$name.out" >&2
    return 1
  fi
  ok
}

# the issue's two layouts over 20 steps, the others over 8 (bits either way)
run one20 1 20
run one8 1 8
grep -q "deterministic" "$tmp/one20.out" && ok || bad "the 1-rank summary does not name deterministic mode"
for layout in "mp2 2 20 --mp 2" "mp2ep2 4 20 --mp 2 --ep 2" "mp2ep2s1 4 8 --mp 2 --ep 2 --parm s1" \
  "mp2ep2b 4 8 --mp 2 --ep 2 --parm baseline" "mp2dp2 4 8 --mp 2 --ep 1" \
  "mp2esp2 4 8 --mp 2 --esp 2" "mp2esp2b 4 8 --mp 2 --esp 2 --parm baseline" \
  "esp2ep2 4 8 --esp 2 --ep 2"; do
  # shellcheck disable=SC2086
  set -- $layout
  name=$1 n=$2 steps=$3
  shift 3
  run "$name" "$n" "$steps" "$@" || continue
  ref=one$steps
  if cmp -s "$tmp/$ref.ckpt" "$tmp/$name.ckpt"; then ok; else bad "$name: checkpoint differs from 1 rank's"; fi
  if python3 - "$tmp/$ref.jsonl" "$tmp/$name.jsonl" "$steps" <<'PY'; then ok; else bad "$name: losses differ"; fi
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
n = int(sys.argv[3])
assert len(a) == len(b) == n, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "aux"):
        assert x[k] == y[k], f"step {x['step']}: {k} {y[k]!r} vs {x[k]!r}"
print(f"{sys.argv[2].split('/')[-1]}: {n} steps, losses, norms and aux equal")
PY
done
grep -q "deterministic" "$tmp/mp2ep2.out" && ok || bad "the Parm summary does not name deterministic mode"
finish parm_bitwise
