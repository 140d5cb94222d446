# Helpers shared by the script tests (tests/*_test.sh). A script sets its
# arguments (MOE, MPIEXEC, ...) and then sources this file:
#     . "$(dirname "$0")/lib.sh"
# It then has:
#   $tmp           a fresh temporary folder, removed on exit (an EXIT trap); a script with
#                  more to clean up (a background job, a service) defines on_exit, which
#                  the trap calls first;
#   ok, bad MSG    count a passed / failed check (bad prints "FAIL: MSG" on stderr);
#   finish NAME [NOTE]  prints "NAME: P passed, F failed [NOTE]" and returns non-zero when a
#                  check failed (a script's last command, so its exit status);
#   expect CODE PATTERN -- CMD...  runs CMD: a check that it exits CODE and its output
#                  (stdout and stderr) matches the extended regex PATTERN;
#   mpi N CMD...   CMD on N ranks: "$MPIEXEC" -n N $OVERSUB CMD...;
#   $OVERSUB       --oversubscribe when MPIEXEC is Open MPI's (MPICH's hydra
#                  oversubscribes without it, and refuses the flag); empty otherwise;
#   descendants PID  every process below PID, one per line (Open MPI's mpirun starts
#                  the ranks as its children; MPICH's hydra as children of its proxy).
# shellcheck shell=bash

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moe-$(basename "$0" .sh).XXXXXX") || exit 1
lib_exit() {
  if declare -F on_exit >/dev/null; then on_exit; fi
  rm -rf "$tmp"
}
trap lib_exit EXIT

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  echo "FAIL: $*" >&2
}
finish() {
  echo "$1: $pass passed, $fail failed${2:+ $2}"
  [[ $fail -eq 0 ]]
}

expect() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -eq $code ]] && grep -qE -- "$pattern" <<<"$out"; then
    ok
    return
  fi
  bad "$* -> exit $rc (want $code), output:"
  # the first lines name the run, the last ones its error
  if [[ $(wc -l <<<"$out") -le 10 ]]; then
    echo "$out" >&2
  else
    echo "$out" | head -4 >&2
    echo "  ..." >&2
    echo "$out" | tail -6 >&2
  fi
  echo "  (wanted pattern: $pattern)" >&2
}

OVERSUB=""
if [[ -n "${MPIEXEC:-}" ]] && "$MPIEXEC" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then
  OVERSUB=--oversubscribe
fi
# shellcheck disable=SC2086 # OVERSUB: no word or one
mpi() { "$MPIEXEC" -n "$1" $OVERSUB "${@:2}"; }

descendants() {
  local c
  for c in $(pgrep -P "$1"); do
    echo "$c"
    descendants "$c"
  done
}
