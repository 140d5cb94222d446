#!/usr/bin/env bash
# Checkpoints on a full disk, end to end: `moe train --save-every` into a small
# tmpfs that holds one checkpoint but not a second one beside it. The save at
# step 2 fits; the one at step 4 runs out of space while it writes its
# temporary. Checked:
#   - the run fails (exit 1) with an error naming the file, the reason (no
#     space left on device) and that nothing was saved;
#   - the checkpoint on the tmpfs is byte for byte the step-2 checkpoint (the
#     one `--stop-at 2` writes), and no temporary is left beside it;
#   - resuming from it gives, byte for byte, the uninterrupted run's final
#     checkpoint;
#   - the next successful save removes a dead process's stale temporary and
#     keeps a live one's (a save in progress).
# The tmpfs is mounted in a private mount namespace (`unshare -m` as root,
# `unshare -Urm` otherwise), so nothing outside the test sees it and nothing
# is left mounted. Where neither is allowed the test says so and is skipped
# (exit 77); tests/test_checkpoint.c's test_full_disk (a file-size limit)
# still runs everywhere.
# Usage: full_disk_test.sh path/to/moe
set -u
MOE=${1:?usage: full_disk_test.sh path/to/moe}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"

if [[ $EUID -eq 0 ]]; then ns=(unshare -m); else ns=(unshare -Urm); fi
if ! "${ns[@]}" bash -c "mount -t tmpfs -o size=64k tmpfs '$tmp'" 2>/dev/null; then
  echo "full_disk: SKIP: cannot mount a tmpfs in a private mount namespace (${ns[*]})"
  exit 77
fi

python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(5)
w = ["the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away!\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(20000)))
PY
TINY=(--data "$tmp/text.txt" --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4
  --expert-hidden 32 --batch 8 --eval-every 5 --eval-batches 2 --steps 4)

# references on an ordinary file system: the state after step 2, and after 4
expect 0 "step 2/4" -- "$MOE" train "${TINY[@]}" --stop-at 2 --checkpoint "$tmp/at2.ckpt"
expect 0 "step 4/4" -- "$MOE" train "${TINY[@]}" --checkpoint "$tmp/at4.ckpt"
size=$(stat -c %s "$tmp/at2.ckpt" 2>/dev/null || echo 0)
if ((size < 4096)); then
  bad "the reference checkpoint is missing or tiny ($size bytes)"
  finish full_disk
  exit
fi
# room for one checkpoint and half of a second (whole pages)
# shellcheck disable=SC2017 # whole 4 KiB pages, rounded up
room=$(((size * 3 / 2 + 4095) / 4096 * 4))k

mkdir -p "$tmp/disk"
# shellcheck disable=SC2016 # expanded by the inner shell
"${ns[@]}" bash -c '
  mount -t tmpfs -o size="$1" tmpfs "$2" || exit 90
  shift 2
  out=$1 moe=$2
  shift 2
  "$moe" train "$@" --save-every 2 --checkpoint "$out/disk/c.ckpt" >"$out/run.log" 2>&1
  echo $? >"$out/rc"
  ls -A "$out/disk" >"$out/ls"
  cp "$out/disk/c.ckpt" "$out/kept.ckpt" 2>/dev/null
  exit 0' _ "$room" "$tmp/disk" "$tmp" "$MOE" "${TINY[@]}"
ns_rc=$?
rc=$(cat "$tmp/rc" 2>/dev/null || echo none)
if [[ $ns_rc -ne 0 ]]; then
  bad "the namespace's tmpfs (size $room) could not be set up (exit $ns_rc)"
elif [[ $rc == 1 ]] && grep -qE "checkpoint .*/disk/c\.ckpt: writing .*/disk/c\.ckpt\.tmp\.[0-9]+ failed: No space left on device; nothing saved, .*/disk/c\.ckpt unchanged" "$tmp/run.log" &&
  grep -q "step 4/4" "$tmp/run.log"; then
  ok
else
  bad "the save onto a full tmpfs (size $room, checkpoint $size bytes): exit $rc, output: $(tail -4 "$tmp/run.log" 2>/dev/null)"
fi
if [[ "$(cat "$tmp/ls" 2>/dev/null)" == "c.ckpt" ]]; then
  ok
else
  bad "after the failed save the tmpfs holds: $(tr '\n' ' ' <"$tmp/ls" 2>/dev/null) (want c.ckpt alone)"
fi
if cmp -s "$tmp/kept.ckpt" "$tmp/at2.ckpt"; then
  ok
else
  bad "the checkpoint left on the full disk is not the step-2 one"
fi
expect 0 "step 4/4" -- "$MOE" train "${TINY[@]}" --resume "$tmp/kept.ckpt" \
  --checkpoint "$tmp/resumed.ckpt"
if cmp -s "$tmp/resumed.ckpt" "$tmp/at4.ckpt"; then
  ok
else
  bad "resumed from the kept checkpoint, the final one differs from the uninterrupted run's"
fi

# stale temporaries: a dead process's goes, a live one's (this shell's) stays
mkdir -p "$tmp/s"
sleep 0 &
dead=$!
wait "$dead"
while kill -0 "$dead" 2>/dev/null; do dead=$((dead + 1)); done  # a PID nothing runs under
echo partial >"$tmp/s/c.ckpt.tmp.$dead"
echo partial >"$tmp/s/c.ckpt.tmp.$$"
expect 0 "step 4/4" -- "$MOE" train "${TINY[@]}" --checkpoint "$tmp/s/c.ckpt"
if [[ ! -e "$tmp/s/c.ckpt.tmp.$dead" && -e "$tmp/s/c.ckpt.tmp.$$" ]] &&
  cmp -s "$tmp/s/c.ckpt" "$tmp/at4.ckpt"; then
  ok
else
  bad "stale temporaries after a save: $(cd "$tmp/s" && echo ./*) (dead $dead should be gone, live $$ kept)"
fi

finish full_disk
