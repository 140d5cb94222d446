#!/usr/bin/env bash
# The memory computed from the config against the measured peak RSS
# (docs/reliability.md, "Memory bound"): the default demo model trained for a
# few steps on 1, 2 and 4 ranks (EP = P). The summary's expected figure (the
# prediction) must be within 25% of the peak RSS, both the max over the ranks
# (which rank receives the most rows depends on the routing); the memory
# check's upper bound must not be exceeded by more than 5% (the C library's
# and MPI's own growth after the check is not counted). Memory is
# deterministic enough for this: the measured ratios were 1.00, 1.03 and 0.94
# at 5 steps (0.99-1.13 at 60), so each side has 10-20% of margin.
# Usage: memory_rss_test.sh path/to/moe path/to/mpiexec [STEPS]
set -u
MOE=${1:?usage: memory_rss_test.sh path/to/moe path/to/mpiexec [STEPS]}
MPIEXEC=${2:?usage: memory_rss_test.sh path/to/moe path/to/mpiexec [STEPS]}
STEPS=${3:-5}
fail=0
OVERSUB=""
if "$MPIEXEC" --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then OVERSUB=--oversubscribe; fi

for p in 1 2 4; do
  out=$(timeout 600 "$MPIEXEC" -n "$p" $OVERSUB "$MOE" train --steps "$STEPS" --batch 16 \
    --eval-every 0 --eval-batches 1 --quiet 2>&1)
  rc=$?
  if [[ $rc -ne 0 ]]; then
    fail=$((fail + 1))
    echo "FAIL: P=$p: moe train exited $rc:" >&2
    echo "$out" | tail -20 >&2
    continue
  fi
  OUT="$out" python3 - "$p" <<'PY' || fail=$((fail + 1))
import os, re, sys
p, t = sys.argv[1], os.environ["OUT"]
m = re.search(r"memory, rank 0: peak RSS [\d.]+ MiB \(max over ranks ([\d.]+) MiB\); expected from "
              r"the config [\d.]+ MiB \(max over ranks ([\d.]+) MiB\)", t)
b = re.search(r"memory bound, rank 0 \(the memory check's figure: worst-case routing\): params .*"
              r"baseline [\d.]+ \w+ = [\d.]+ \w+ \(max over ranks ([\d.]+) MiB\)", t)
if not m or not b:
    sys.exit(f"FAIL: P={p}: no memory lines in the summary:\n{t[-2000:]}")
rss, expect = float(m.group(1)), float(m.group(2))
bound = float(b.group(1))
print(f"P={p}: peak RSS {rss:.1f} MiB, expected {expect:.1f} MiB (RSS/expected {rss / expect:.2f}), "
      f"bound {bound:.1f} MiB (RSS/bound {rss / bound:.2f})")
ok = True
if not 0.75 <= rss / expect <= 1.25:
    print(f"FAIL: P={p}: RSS/expected {rss / expect:.2f} is outside [0.75, 1.25]", file=sys.stderr)
    ok = False
if not expect <= bound:
    print(f"FAIL: P={p}: expected {expect:.1f} MiB above the bound {bound:.1f} MiB", file=sys.stderr)
    ok = False
if rss > 1.05 * bound:
    print(f"FAIL: P={p}: RSS {rss:.1f} MiB more than 5% above the bound {bound:.1f} MiB",
          file=sys.stderr)
    ok = False
sys.exit(0 if ok else 1)
PY
done
echo "memory_rss_test: $fail failure(s)"
[[ $fail -eq 0 ]]
