#!/usr/bin/env bash
# Parm in deterministic mode (the default; docs/parm.md "Deterministic mode")
# on the DEFAULT demo model, 20 steps: MP 2 on 2 ranks, and MP 2 x EP 2 with
# s2 (SAA), s1 and the baseline, and MP 2 x DP 2 on 4 ranks, each end in the
# 1-rank run's checkpoint byte for byte, with the same loss and gradient norm
# at every step (compared as printed in the metrics).
# Usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: parm_bitwise_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
RUN=(train --steps 20 --seed 1 --eval-every 0 --quiet)

run() {  # run NAME RANKS ARGS...: checkpoint $tmp/NAME.ckpt, metrics $tmp/NAME.jsonl
  local name=$1 n=$2
  shift 2
  local cmd=("$MOE" "${RUN[@]}" --checkpoint "$tmp/$name.ckpt" --metrics "$tmp/$name.jsonl" "$@")
  [[ $n -gt 1 ]] && cmd=("$MPIEXEC" -n "$n" $OVERSUB "${cmd[@]}")
  if ! timeout 600 "${cmd[@]}" >"$tmp/$name.out" 2>&1; then
    bad "$name: moe train failed"
    tail -5 "$tmp/$name.out" >&2
    return 1
  fi
  ok
}

run one 1
grep -q "deterministic" "$tmp/one.out" && ok || bad "the 1-rank summary does not name deterministic mode"
for layout in "mp2 2 --mp 2" "mp2ep2 4 --mp 2 --ep 2" "mp2ep2s1 4 --mp 2 --ep 2 --parm s1" \
  "mp2ep2b 4 --mp 2 --ep 2 --parm baseline" "mp2dp2 4 --mp 2 --ep 1"; do
  # shellcheck disable=SC2086
  set -- $layout
  name=$1 n=$2
  shift 2
  run "$name" "$n" "$@" || continue
  if cmp -s "$tmp/one.ckpt" "$tmp/$name.ckpt"; then ok; else bad "$name: checkpoint differs from 1 rank's"; fi
  if python3 - "$tmp/one.jsonl" "$tmp/$name.jsonl" <<'PY'; then ok; else bad "$name: losses differ"; fi
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "aux"):
        assert x[k] == y[k], f"step {x['step']}: {k} {y[k]!r} vs {x[k]!r}"
print(f"{sys.argv[2].split('/')[-1]}: 20 steps, losses, norms and aux equal")
PY
done
grep -q "deterministic" "$tmp/mp2ep2.out" && ok || bad "the Parm summary does not name deterministic mode"
finish parm_bitwise
