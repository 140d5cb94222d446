#!/usr/bin/env bash
# Crash safety of checkpoint saves: a writer killed (SIGKILL) at any point of a
# save leaves the previous checkpoint at the path intact, and a later save works.
#
# Uses test_checkpoint as the driver (--write PATH SEED, --verify PATH SEED) and
# the writer's test hook MOE_CKPT_TEST_PAUSE_AFTER_BYTES=N (after N bytes of the
# temp file are written and fsynced it prints "moe_ckpt: paused" and sleeps).
# Kill points: inside the header, at its end, inside the config, inside the
# tensor data, inside the table, inside the trailer, and after the last byte
# (before the rename).
# Usage: checkpoint_kill_test.sh path/to/test_checkpoint
set -u
BIN=${1:?usage: checkpoint_kill_test.sh path/to/test_checkpoint}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
pid=""
on_exit() {  # a writer still paused
  if [[ -n $pid ]]; then
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
}

ckpt=$tmp/model.ckpt
ref2=$tmp/ref2.ckpt
if ! "$BIN" --write "$ckpt" 1 || ! "$BIN" --verify "$ckpt" 1 >/dev/null; then
  echo "FAIL: cannot write and verify seed 1" >&2
  exit 1
fi
"$BIN" --write "$ref2" 2 || exit 1  # what a complete seed-2 save writes
# Seeds only change contents, not sizes: seed 1 and 2 files have the same layout.
size=$(stat -c %s "$ckpt")
[[ $size -eq $(stat -c %s "$ref2") ]] || bad "seed 1 and 2 files differ in size"
[[ $size -gt 2000 ]] || bad "checkpoint unexpectedly small ($size bytes)"

for at in 0 10 64 100 1000 $((size / 2)) $((size - 100)) $((size - 17)) $((size - 1)) $size; do
  # A new file per kill point: the grep below may run before the writer's
  # redirection has truncated a reused one, and see the last writer's pause.
  err=$tmp/err.$at
  rm -f "$err"
  MOE_CKPT_TEST_PAUSE_AFTER_BYTES=$at "$BIN" --write "$ckpt" 2 2>"$err" &
  pid=$!
  paused=0
  for _ in $(seq 1 50); do  # at most 50 x 0.2 s
    if grep -q "moe_ckpt: paused" "$err" 2>/dev/null; then
      paused=1
      break
    fi
    kill -0 "$pid" 2>/dev/null || break  # exited without pausing
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  killed_pid=$pid
  pid=""
  if [[ $paused -ne 1 ]]; then
    bad "writer did not pause at byte $at: $(head -3 "$err" 2>/dev/null)"
    continue
  fi
  ok
  # The hook's promise: exactly the first `at` bytes of the seed-2 file are in the temp file.
  part=$ckpt.tmp.$killed_pid
  if [[ -f $part ]] && [[ $(stat -c %s "$part") -eq $at ]] && cmp -s -n "$at" "$part" "$ref2"; then
    ok
  else
    bad "killed at byte $at: temp file $part missing or not the first $at bytes of a full save"
  fi
  # The previous checkpoint is untouched.
  if "$BIN" --verify "$ckpt" 1 >/dev/null; then ok; else bad "killed at byte $at: seed 1 damaged"; fi
done

# Stale temp files are left behind; readers ignore them and the next save works.
stale=$(find "$tmp" -name 'model.ckpt.tmp.*' | wc -l)
if [[ $stale -ge 1 ]]; then ok; else bad "expected stale temp files from the killed writers"; fi
if "$BIN" --write "$ckpt" 3 && "$BIN" --verify "$ckpt" 3 >/dev/null; then ok; else bad "save after kills"; fi
# The verifier can fail: the old seed is gone now.
if "$BIN" --verify "$ckpt" 1 >/dev/null 2>&1; then bad "--verify accepts the wrong seed"; else ok; fi
# A temp file alone (no checkpoint at the path) is not a checkpoint.
rm -f "$ckpt"
if "$BIN" --verify "$ckpt" 3 >/dev/null 2>&1; then bad "verify without a checkpoint"; else ok; fi

finish checkpoint_kill_test
