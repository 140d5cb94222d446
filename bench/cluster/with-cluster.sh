#!/usr/bin/env bash
# with-cluster.sh [cluster flags] -- CMD...
#
# Brings up an emulated cluster (bench/cluster/cluster.sh up [cluster flags]),
# runs CMD under mpirun on it (cluster.sh run [cluster flags] -- CMD...), and
# always tears the cluster down again, also on failure or Ctrl-C. Exits with
# CMD's status (124/137 when the --timeout hit), or with cluster.sh's status
# when the cluster could not be brought up.
#
# Example:
#   sudo bench/cluster/with-cluster.sh --nodes 2 --ranks-per-node 2 --inter-gbit 1 \
#     -- build/bench/moe_p2p_bw
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/cluster.sh

flags=()
while [[ $# -gt 0 && $1 != -- ]]; do
  flags+=("$1")
  shift
done
if [[ $# -eq 0 ]]; then
  echo "usage: with-cluster.sh [cluster flags] -- CMD..." >&2
  exit 2
fi
shift # --
if [[ $# -eq 0 ]]; then
  echo "with-cluster.sh: no command after --" >&2
  exit 2
fi

# The prefix decides what `down` deletes; take it the way cluster.sh does.
prefix=${MOECL_PREFIX:-moecl}
for ((i = 0; i < ${#flags[@]}; i++)); do
  case ${flags[i]} in
    --prefix) if ((i + 1 < ${#flags[@]})); then prefix=${flags[i + 1]}; fi ;;
    --prefix=*) prefix=${flags[i]#--prefix=} ;;
  esac
done

# Refuse to take over (and later delete) a cluster that someone else brought up.
st=0
out=$("$cluster" status --prefix "$prefix" 2>&1) || st=$?
case $st in
  3) ;; # down: ours to create
  0)
    echo "with-cluster.sh: cluster '$prefix' is already up; use another --prefix or bring it down" >&2
    exit 1
    ;;
  *)
    echo "$out" >&2
    exit "$st"
    ;;
esac

up_done=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if ((up_done)); then
    "$cluster" down --prefix "$prefix" || {
      echo "with-cluster.sh: teardown of '$prefix' failed" >&2
      ((rc != 0)) || rc=1
    }
  fi
  exit "$rc"
}
# The run goes in the background so that a signal to this script is handled at
# once (bash defers traps while a foreground command runs); the signal is passed
# on as TERM, which cluster.sh run turns into stopping mpirun.
child=
on_signal() {
  if [[ -n $child ]]; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

up_done=1 # a failed `up` cleans up after itself; `down` is harmless then
"$cluster" up "${flags[@]}"
rc=0
"$cluster" run "${flags[@]}" -- "$@" &
child=$!
wait "$child" || rc=$?
child=
exit "$rc"
