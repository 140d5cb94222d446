#!/usr/bin/env bash
# selftest.sh [--bin PATH] [--inter-gbit R] [--intra-gbit R2] [--timeout S]
#
# Manual check of the emulated cluster (needs root and network namespaces, so CI
# does not run it). For each intra mode (shm, then shaped) it brings up a
# 2 nodes x 2 ranks cluster under a unique prefix, runs moe_p2p_bw, and checks:
#   - every inter-node pair at the largest size: [70%, 105%] of the inter rate;
#   - shaped mode: intra-node pair bandwidth >= 1.4x the inter-node bandwidth;
#   - the alltoall data check printed "ok";
#   - afterwards no namespace of the prefix is left and the congestion-control
#     sysctl is back to its value from before.
# A bandwidth check that fails is measured once more (the machine is shared).
# Exits 0 when every check passes, 1 otherwise, 2 on bad usage.
#
#   cmake -S . -B build && cmake --build build --target moe_p2p_bw
#   sudo bench/cluster/selftest.sh            # uses build/bench/moe_p2p_bw
# shellcheck disable=SC2317 # functions run from traps
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=
inter=1
intra=2
timeout_s=240
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin=${2:?--bin needs a path}; shift 2 ;;
    --inter-gbit) inter=${2:?}; shift 2 ;;
    --intra-gbit) intra=${2:?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "selftest.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ -z $bin ]]; then
  for c in "$root/build/bench/moe_p2p_bw" "$root/build-lead/bench/moe_p2p_bw"; do
    if [[ -x $c ]]; then bin=$c; break; fi
  done
fi
[[ -n $bin && -x $bin ]] || {
  echo "selftest.sh: moe_p2p_bw not found; build it (cmake --build build --target moe_p2p_bw) or pass --bin" >&2
  exit 2
}
[[ $(id -u) -eq 0 ]] || { echo "selftest.sh: must run as root" >&2; exit 2; }

logdir=$(mktemp -d /tmp/moe-cluster-selftest.XXXXXX)
cc_before=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
fails=0
declare -a summary=()

check() { # description ok(0/1)
  if (($2)); then
    summary+=("PASS  $1")
  else
    summary+=("FAIL  $1")
    fails=$((fails + 1))
  fi
}

# p2p rows (pair same bytes size iters median_us min_us Gbit/s cfg %cfg) at the
# largest size with same == yes|no, printed as "pair Gbit/s".
rows() { # log same
  awk -v same="$2" '
    $1 ~ /^[0-9]+-[0-9]+$/ && NF >= 10 { if ($3 + 0 > max) max = $3 + 0; n++; p[n] = $1; s[n] = $2; b[n] = $3 + 0; g[n] = $8 }
    END { for (i = 1; i <= n; i++) if (b[i] == max && s[i] == same) print p[i], g[i] }' "$1"
}

measure() { # mode prefix log -> runs with-cluster; returns its status
  local mode=$1 prefix=$2 log=$3
  local -a flags=(--prefix "$prefix" --nodes 2 --ranks-per-node 2 --inter-gbit "$inter" --intra-mode "$mode" --timeout "$timeout_s")
  if [[ $mode == shaped ]]; then flags+=(--intra-gbit "$intra"); fi
  echo "== $mode: with-cluster.sh ${flags[*]} -- $bin" >&2
  local rc=0
  "$here/with-cluster.sh" "${flags[@]}" -- "$bin" --sizes 8,64k,4m,16m >"$log" 2>&1 || rc=$?
  cat "$log" >&2
  return "$rc"
}

evaluate() { # mode log final -> 0 when the bandwidth checks pass; records them when final=1
  local mode=$1 log=$2 final=$3 ok=1 pair g
  local lo hi
  lo=$(awk -v r="$inter" 'BEGIN { print 0.70 * r }')
  hi=$(awk -v r="$inter" 'BEGIN { print 1.05 * r }')
  local inter_rows intra_rows
  inter_rows=$(rows "$log" no)
  intra_rows=$(rows "$log" yes)
  if [[ -z $inter_rows || -z $intra_rows ]]; then
    ((final)) && check "$mode: p2p table has intra- and inter-node rows" 0
    return 1
  fi
  while read -r pair g; do
    local in_range
    in_range=$(awk -v g="$g" -v lo="$lo" -v hi="$hi" 'BEGIN { print (g >= lo && g <= hi) ? 1 : 0 }')
    ((final)) && check "$mode: inter-node pair $pair: $g Gbit/s in [$lo, $hi]" "$in_range"
    ((in_range)) || ok=0
  done <<<"$inter_rows"
  if [[ $mode == shaped ]]; then
    local max_inter
    max_inter=$(awk '{ if ($2 > m) m = $2 } END { print m }' <<<"$inter_rows")
    while read -r pair g; do
      local above
      above=$(awk -v g="$g" -v i="$max_inter" 'BEGIN { print (g >= 1.4 * i) ? 1 : 0 }')
      ((final)) && check "$mode: intra-node pair $pair: $g Gbit/s >= 1.4 x inter $max_inter" "$above"
      ((above)) || ok=0
    done <<<"$intra_rows"
  fi
  ((ok))
}

n=0
for mode in shm shaped; do
  n=$((n + 1))
  prefix="s$(($$ % 1000000))$n" # unique per run and mode, at most 8 characters
  log=$logdir/$mode.log
  rc=0
  measure "$mode" "$prefix" "$log" || rc=$?
  if ((rc == 0)) && ! evaluate "$mode" "$log" 0; then
    echo "== $mode: bandwidth outside the bounds, measuring once more" >&2
    log=$logdir/$mode.retry.log
    rc=0
    measure "$mode" "$prefix" "$log" || rc=$?
  fi
  check "$mode: cluster up, moe_p2p_bw and teardown exited 0 (status $rc)" "$((rc == 0))"
  if ((rc == 0)); then
    evaluate "$mode" "$log" 1 || true
    check "$mode: alltoall data check ok" "$(grep -q '^alltoall data check: ok' "$log" && echo 1 || echo 0)"
  fi
  left=$(ip netns list | awk '{ print $1 }' | grep -E "^${prefix}-" || true)
  check "$mode: no namespace of prefix $prefix left" "$([[ -z $left ]] && echo 1 || echo 0)"
done

cc_after=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
others=$(find /run/moe-cluster/users -mindepth 1 -printf '%f ' 2>/dev/null || true)
if [[ -n $others ]]; then # another cluster still needs cubic allowed
  check "tcp_allowed_congestion_control: not checked, other clusters up: $others" 1
else
  check "tcp_allowed_congestion_control restored ('$cc_after')" "$([[ $cc_after == "$cc_before" ]] && echo 1 || echo 0)"
fi

echo
printf '%s\n' "${summary[@]}"
echo "logs: $logdir"
if ((fails)); then
  echo "selftest: $fails check(s) FAILED"
  exit 1
fi
echo "selftest: all checks passed"
