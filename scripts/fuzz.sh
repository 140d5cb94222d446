#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, MOE_FUZZ=ON, clang) and runs each for
# a bounded time on a copy of its seed corpus (fuzz/corpus/<harness>/).
#
#   bash scripts/fuzz.sh [SECONDS_PER_HARNESS] [BUILD_DIR]      (defaults: 15, build-fuzz)
#
# Environment: FUZZ_HARNESSES="layer_config text ..." runs only those;
# FUZZ_JOBS=N runs N harnesses at a time (default 1; each uses one core);
# FUZZ_TIMEOUT=S is libFuzzer's per-input limit (default 10 s: an input
# slower than that is a finding); FUZZ_RUN_DIR keeps the run's corpora, logs
# and findings there (default BUILD_DIR/fuzz-run; emptied first, and only if
# an earlier run of this script made it); FUZZ_CPU_SECONDS=N also stops a
# harness once its process has used N s of CPU time (user + system), so that
# a long campaign beside other work gives each harness the same fuzzing
# effort whatever the machine's load (the wall limit SECONDS_PER_HARNESS
# still applies: make it large enough).
#
# Fails (exit 1) if any harness finds a crash, a failed invariant, a leak, a
# timeout or an out-of-memory input; prints, for each, the input libFuzzer
# saved and the command that reproduces it. Prints a table: harness, runs
# (inputs executed), cov and ft (libFuzzer's coverage counters: code edges and
# features reached, from its final stats), CPU minutes the harness used,
# corpus size and result.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-15}"
build="${2:-build-fuzz}"
jobs="${FUZZ_JOBS:-1}"
timeout_s="${FUZZ_TIMEOUT:-10}"
cpu_s="${FUZZ_CPU_SECONDS:-0}"
[[ "$secs" =~ ^[0-9]+$ && "$secs" -ge 1 ]] || {
  echo "fuzz.sh: SECONDS_PER_HARNESS must be a positive integer (got '$secs')" >&2
  exit 2
}
[[ "$cpu_s" =~ ^[0-9]+$ ]] || {
  echo "fuzz.sh: FUZZ_CPU_SECONDS must be a non-negative integer (got '$cpu_s')" >&2
  exit 2
}
[[ "$jobs" =~ ^[0-9]+$ && "$jobs" -ge 1 ]] || {
  echo "fuzz.sh: FUZZ_JOBS must be a positive integer (got '$jobs')" >&2
  exit 2
}

run="${FUZZ_RUN_DIR:-$build/fuzz-run}"
# emptied first, but only a folder an earlier run made (it holds .fuzz-run)
if [[ -e "$run" && ! -f "$run/.fuzz-run" && -n "$(ls -A "$run" 2>/dev/null)" ]]; then
  echo "fuzz.sh: $run exists and is not a fuzz.sh run folder; choose another FUZZ_RUN_DIR" >&2
  exit 2
fi

# ---- build: the library and the harnesses only, no MPI -------------------------
CC=clang cmake -S . -B "$build" -DMOE_FUZZ=ON -DMOE_WERROR=ON -DMOE_WITH_MPI=OFF \
  -DMOE_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"${FUZZ_BUILD_JOBS:-2}" --target moe_fuzz >/dev/null

build_abs="$(cd "$build" && pwd)"  # BUILD_DIR may be relative or absolute
harnesses=(${FUZZ_HARNESSES:-$(cd fuzz/corpus && ls -d */ | tr -d /)})
rm -rf "$run"
mkdir -p "$run"
touch "$run/.fuzz-run"
run="$(cd "$run" && pwd)"
json_dict="$PWD/fuzz/json.dict"

# One harness: libFuzzer on a copy of its seeds; the log keeps the final stats.
run_one() {
  local h=$1 bin="$build_abs/fuzz/fuzz_$h" d="$run/$1"
  mkdir -p "$d/corpus" "$d/findings"
  [[ -x "$bin" ]] || {
    echo "fuzz.sh: no harness $bin" >"$d/log"
    echo 127 >"$d/rc"
    return
  }
  cp -r "fuzz/corpus/$h/." "$d/corpus/"
  local dict=()
  case "$h" in
    layer_config | gpt_config | cluster | profile | layer_samples | gpt_ckpt | trace | paths) dict=(-dict="$json_dict") ;;
  esac
  local rc=0 pid used=0 stopped=0 tck
  tck=$(getconf CLK_TCK)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -max_total_time="$secs" -timeout="$timeout_s" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$d/findings/" "${dict[@]}" "$d/corpus" >"$d/log" 2>&1 &
  pid=$!
  # CPU time from /proc/PID/stat (fields 14 and 15, clock ticks), every 5 s
  while kill -0 "$pid" 2>/dev/null; do
    used=$(awk -v t="$tck" '{sub(/^.*\) /, ""); print int(($12 + $13) / t)}' "/proc/$pid/stat" \
      2>/dev/null || echo "$used")
    echo "$used" >"$d/cpu"
    if ((cpu_s > 0 && used >= cpu_s)); then
      stopped=1
      kill -INT "$pid" 2>/dev/null || true
      break
    fi
    sleep 5
  done
  wait "$pid" || rc=$?
  # libFuzzer exits 72 when interrupted: the stop asked for, not a finding
  if ((stopped)) && [[ $rc == 72 ]]; then
    if grep -q 'run interrupted' "$d/log"; then rc=0; fi
  fi
  echo "$rc" >"$d/rc"
}

echo "fuzz.sh: ${#harnesses[@]} harnesses x ${secs} s, ${jobs} at a time, in $run"
for h in "${harnesses[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$h" &
done
wait

# ---- report ---------------------------------------------------------------------
failed=0
printf '\n| %-14s | %10s | %6s | %7s | %7s | %6s | %-8s |\n' harness runs cov ft "CPU min" corpus result
printf '|%s|%s|%s|%s|%s|%s|%s|\n' ---------------- ------------ -------- --------- --------- -------- ----------
for h in "${harnesses[@]}"; do
  d="$run/$h"
  rc=$(cat "$d/rc")
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$d/log" | grep -o '[0-9]*$' | tail -1)
  last=$(grep -E '^#[0-9]+' "$d/log" | grep 'cov: ' | tail -1 || true)
  cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(find "$d/corpus" -type f | wc -l)
  cpu_min=$(awk '{printf "%.1f", $1 / 60}' "$d/cpu" 2>/dev/null || echo "?")
  findings=$(find "$d/findings" -type f | sort)
  result=ok
  if [[ "$rc" != 0 || -n "$findings" ]]; then
    result=FAIL
    failed=1
  fi
  printf '| %-14s | %10s | %6s | %7s | %7s | %6s | %-8s |\n' "$h" "${runs:-?}" "${cov:-?}" "${ft:-?}" \
    "$cpu_min" "$corp" "$result"
done
for h in "${harnesses[@]}"; do
  d="$run/$h"
  rc=$(cat "$d/rc")
  findings=$(find "$d/findings" -type f | sort)
  [[ "$rc" == 0 && -z "$findings" ]] && continue
  echo
  echo "== $h: exit status $rc; log $d/log (last lines below)"
  grep -E 'fuzz invariant failed|ERROR: |SUMMARY: |runtime error' "$d/log" | head -5 || true
  tail -n 25 "$d/log"
  for f in $findings; do
    echo "reproduce: $build_abs/fuzz/fuzz_$h $f"
  done
done
if ((failed)); then
  echo "fuzz.sh: FAILED (a harness found a crash, invariant failure, leak or timeout)"
  exit 1
fi
limit="${secs} s"
((cpu_s > 0)) && limit="${secs} s wall or ${cpu_s} s of CPU"
echo "fuzz.sh: ${#harnesses[@]} harnesses, up to ${limit} each, no finding"
