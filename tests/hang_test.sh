#!/usr/bin/env bash
# Bounded failure for a hung rank (docs/reliability.md#hung-ranks), end to end:
#   - --hang-timeout is checked (exit 2 naming the valid range) and documented
#     by every MPI command's --help;
#   - `moe train` on 4 ranks with --hang-timeout 3: one rank SIGSTOPped after
#     training has started ends the job non-zero within 30 s, with a line
#     naming the stopped rank and the operation the others waited in, and no
#     process of the job left behind;
#   - `moe generate` on 2 ranks with --hang-timeout 3: rank 1 SIGSTOPped while
#     generating ends the job non-zero within 30 s, naming rank 1, no output;
#   - a rank slower than the timeout (test hook MOE_TEST_SLOW_RANK: rank 1
#     sleeps 5 s before step 2's gradient all-reduce, where the others wait;
#     --hang-timeout 1) does not abort: exit 0 with a warning naming it; with
#     --hang-timeout 0 not even the warning.
# Usage: hang_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: hang_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: hang_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
bg=""
# the launcher of the job in the background, and its ranks (continued first: a stopped
# process dies of SIGKILL at once, but its launcher may wait on it)
cleanup_bg() {
  if [[ -n "$bg" ]]; then
    for p in $(descendants "$bg"); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    kill -9 "$bg" 2>/dev/null
  fi
  bg=""
}
on_exit() { cleanup_bg; }

python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(5)
w = ["the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away!\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(20000)))
PY
TINY=(--data "$tmp/text.txt" --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4
      --expert-hidden 32 --batch 8 --eval-every 0 --eval-batches 1 --quiet)

# ---- the option ----------------------------------------------------------------------
# (each command consumes the option; the range check and the help lines are shared)
for cmd in "train" "bench a2a" "calibrate --out $tmp/p.json" "bench layer --a2a mpi" "generate" "serve"; do
  # shellcheck disable=SC2086
  expect 2 "--hang-timeout \(-1\) must be in \[0, 86400\]" -- "$MOE" $cmd --hang-timeout -1
done
expect 2 "--hang-timeout expects a finite number, got 'soon'" -- "$MOE" bench a2a --hang-timeout soon
for cmd in "train" "bench a2a" "generate" "serve"; do
  # shellcheck disable=SC2086
  expect 0 "--hang-timeout S +when a rank has waited S seconds" -- "$MOE" $cmd --help
done

# ---- a stopped rank ------------------------------------------------------------------------
"$MPIEXEC" -n 4 $OVERSUB "$MOE" train "${TINY[@]}" --steps 1000000 --hang-timeout 3 \
  --metrics "$tmp/s.jsonl" >"$tmp/stop.log" 2>&1 &
bg=$!
for _ in $(seq 1 300); do  # up to 60 s for the job to have done two steps
  [[ -s "$tmp/s.jsonl" && $(wc -l <"$tmp/s.jsonl") -ge 2 ]] && break
  sleep 0.2
done
victim=""
for p in $(descendants "$bg"); do  # world rank 2: its launcher's rank variable
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxE "(OMPI_COMM_WORLD_RANK|PMI_RANK)=2"; then
    victim=$p
  fi
done
if [[ -z "$victim" ]]; then
  bad "no rank 2 to stop (did the job start? log: $(tail -3 "$tmp/stop.log"))"
else
  t0=$(date +%s.%N)
  kill -STOP "$victim"
  ended=0
  for _ in $(seq 1 150); do  # up to 30 s
    if ! kill -0 "$bg" 2>/dev/null; then ended=1; break; fi
    sleep 0.2
  done
  if [[ $ended -eq 1 ]]; then
    wait "$bg"
    rc=$?
    secs=$(python3 -c "import sys, time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$t0")
    echo "stopped rank 2: the job ended after $secs s with exit $rc"
    if [[ $rc -ne 0 ]]; then ok; else bad "the job with a stopped rank exited 0"; fi
    if grep -qE "hang watchdog \(no answer\): rank [013] of 4 has waited [0-9.]+ s in '.+' \(step [0-9]+\); rank 2 did not answer a probe within [0-9.]+ s \(stopped, or hung with all its threads\): aborting the job; --hang-timeout SECONDS sets this limit" "$tmp/stop.log"; then
      ok
      grep -m1 "hang watchdog" "$tmp/stop.log"
    else
      bad "no line naming rank 2 and an operation; log:"
      tail -8 "$tmp/stop.log" >&2
    fi
    # the launcher has returned; its ranks must be gone too (a stopped process
    # dies of SIGKILL at once, of SIGTERM only once continued: allow 10 s)
    for _ in $(seq 1 50); do kill -0 "$victim" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$victim" 2>/dev/null; then bad "the stopped rank $victim is still there"; else ok; fi
  else
    bad "the job with a stopped rank still runs 30 s later"
    tail -5 "$tmp/stop.log" >&2
  fi
  left=$(descendants "$bg")
  [[ -z "$left" ]] || bad "processes left behind: $left"
fi
cleanup_bg

# ---- a stopped rank in inference (moe generate, 2 ranks) -------------------------------------
"$MOE" train "${TINY[@]}" --steps 3 --checkpoint "$tmp/tiny.ckpt" >/dev/null 2>&1 || bad "training the inference model"
for i in $(seq 0 31); do printf '{"prompt":"q %d","max_tokens":100000}\n' "$i"; done >"$tmp/long.jsonl"
"$MPIEXEC" -n 2 $OVERSUB "$MOE" generate --checkpoint "$tmp/tiny.ckpt" --input "$tmp/long.jsonl" \
  --output "$tmp/long.out" --hang-timeout 3 >"$tmp/gen.log" 2>&1 &
bg=$!
for _ in $(seq 1 300); do  # up to 60 s for the first progress line (2 s into generating)
  grep -q "generate: .* done" "$tmp/gen.log" && break
  sleep 0.2
done
victim=""
for p in $(descendants "$bg"); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxE "(OMPI_COMM_WORLD_RANK|PMI_RANK)=1"; then
    victim=$p
  fi
done
if [[ -z "$victim" ]]; then
  bad "no rank 1 of moe generate to stop (log: $(tail -3 "$tmp/gen.log"))"
else
  kill -STOP "$victim"
  ended=0
  for _ in $(seq 1 150); do  # up to 30 s
    if ! kill -0 "$bg" 2>/dev/null; then ended=1; break; fi
    sleep 0.2
  done
  if [[ $ended -eq 1 ]]; then
    wait "$bg"
    rc=$?
    if [[ $rc -ne 0 ]]; then ok; else bad "moe generate with a stopped rank exited 0"; fi
    if grep -qE "hang watchdog \(no answer\): rank 0 of 2 has waited [0-9.]+ s in '.+'; rank 1 did not answer a probe" "$tmp/gen.log"; then
      ok
    else
      bad "moe generate's hang message: $(grep -i hang "$tmp/gen.log" | head -3)"
    fi
    if [[ ! -e "$tmp/long.out" ]]; then ok; else bad "an aborted moe generate left its output"; fi
  else
    bad "moe generate with a stopped rank did not end within 30 s"
  fi
  cleanup_bg
fi

# ---- a slow rank ------------------------------------------------------------------------------
# Slower than the timeout plus the probe's grace (2 s): every probe finds it busy.
out=$(MOE_TEST_SLOW_RANK=1:5 mpi 3 "$MOE" train "${TINY[@]}" --batch 6 \
  --experts 6 --steps 3 --hang-timeout 1 2>&1)
rc=$?
if [[ $rc -eq 0 ]] && grep -qE "moe: warning: hang watchdog \(slow\): rank [02] of 3 has waited [0-9.]+ s in '(agreement: )?all-reduce of the dense gradients' \(step 2\); every rank answers and rank 1 is busy outside communication: still waiting" <<<"$out" &&
  ! grep -qE "no answer|deadlock|aborting" <<<"$out"; then
  ok
  grep -m1 "hang watchdog" <<<"$out"
else
  bad "slow rank: exit $rc (want 0 and a warning naming rank 1); output:"
  echo "$out" | tail -6 >&2
fi
out=$(MOE_TEST_SLOW_RANK=1:2.5 mpi 3 "$MOE" train "${TINY[@]}" --batch 6 \
  --experts 6 --steps 3 --hang-timeout 0 2>&1)
rc=$?
if [[ $rc -eq 0 ]] && ! grep -q "hang watchdog" <<<"$out"; then ok; else
  bad "--hang-timeout 0: exit $rc or a watchdog line; output:"
  echo "$out" | tail -4 >&2
fi

finish hang_test
