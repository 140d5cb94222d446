#!/usr/bin/env bash
# The randomized equivalence campaign (docs/reliability.md): runs BUILD/tests/campaign
# (tests/campaign.c) at P = 1, 2, 3, 4, 6 and 8 ranks (oversubscribed through
# scripts/moe-mpirun), each with its own seed, CASES split between them, in runs
# of CAMPAIGN_CHUNK cases; sums cases, mismatches and hangs and prints a table.
# A run that hangs is counted and the campaign continues after the hung case.
#
#   bash bench/campaign.sh [CASES] [BUILD]        (defaults: 2000, build)
#
# Environment: CAMPAIGN_SEED (base seed, default 1; rank count P uses seed
# 1000*CAMPAIGN_SEED + P), CAMPAIGN_RANKS (default "1 2 3 4 6 8"),
# CAMPAIGN_CHUNK (cases per mpirun, default 500), CAMPAIGN_TIMEOUT (seconds a case
# may take, default 120), CAMPAIGN_LOG (every run's output, default
# BUILD/campaign.log), CAMPAIGN_ARGS (extra campaign arguments, e.g. "--parm" for
# Parm's layer). Every MISMATCH and HANG line carries a command that
# reproduces the case. Exit: 0 when every case matched, 1 on any mismatch or
# hang, 2 on bad arguments.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
cases=${1:-2000}
build=${2:-build}
seed=${CAMPAIGN_SEED:-1}
ranks=${CAMPAIGN_RANKS:-1 2 3 4 6 8}
chunk=${CAMPAIGN_CHUNK:-500}
timeout=${CAMPAIGN_TIMEOUT:-120}
log=${CAMPAIGN_LOG:-$build/campaign.log}
read -r -a extra <<<"${CAMPAIGN_ARGS:-}"
prog="$build/tests/campaign"
[[ "$cases" =~ ^[0-9]+$ && "$seed" =~ ^[0-9]+$ && "$chunk" =~ ^[1-9][0-9]*$ ]] || {
  echo "campaign.sh: CASES, CAMPAIGN_SEED and CAMPAIGN_CHUNK must be integers (got '$cases', '$seed', '$chunk')" >&2
  exit 2
}
[[ -x "$prog" ]] || {
  echo "campaign.sh: $prog not found (build first: cmake --build $build)" >&2
  exit 2
}
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
# The rest is one function, read whole before it runs (editing this file during a
# long run cannot change the running campaign).
main() {
: >"$log"

# weights of the rank counts in the split (more cases where there are more layouts)
declare -A weight=([1]=1 [2]=2 [3]=2 [4]=3 [6]=1 [8]=1)
wsum=0
for p in $ranks; do wsum=$((wsum + ${weight[$p]:-1})); done
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "campaign: $cases cases over P = $ranks, base seed $seed, on $(nproc) cores (${cpu:-unknown CPU}); log $log"

tot_cases=0 tot_eq=0 tot_rej=0 tot_drop=0 tot_mis=0 tot_hang=0 left=$cases
rows=()
worst=""
share=""
coverage=""
start_all=$(date +%s.%N)
for p in $ranks; do
  n=$((cases * ${weight[$p]:-1} / wsum))
  [[ "$p" == "${ranks##* }" ]] && n=$left  # the last rank count takes the rounding rest
  left=$((left - n))
  pseed=$((1000 * seed + p))
  c_cases=0 c_eq=0 c_rej=0 c_drop=0 c_mis=0 c_hang=0
  t0=$(date +%s.%N)
  first=0
  while ((first < n)); do
    k=$((n - first < chunk ? n - first : chunk))
    out=$(scripts/moe-mpirun -n "$p" "$prog" "${extra[@]}" --seed "$pseed" --cases "$k" \
      --first "$first" --timeout "$timeout" 2>&1)
    rc=$?
    echo "$out" >>"$log"
    echo "$out" | grep -A1 '^MISMATCH' | grep -v '^--$'
    summary=$(echo "$out" | grep -E '^campaign( --parm)? P=')
    if [[ -n "$summary" ]]; then
      read -r cc ce cr cd cm <<<"$(echo "$summary" | sed -E \
        's/.*cases ([0-9]+), equal ([0-9]+) \(of which rejected as documented ([0-9]+), with drops ([0-9]+)\), mismatches ([0-9]+).*/\1 \2 \3 \4 \5/')"
      c_cases=$((c_cases + cc)) c_eq=$((c_eq + ce)) c_rej=$((c_rej + cr))
      c_drop=$((c_drop + cd)) c_mis=$((c_mis + cm))
      worst+=$(echo "$out" | grep '^worst relative error' | sed 's/.*tensor)://')$'\n'
      share+=$(echo "$out" | grep '^worst share' | sed 's/.*)://')$'\n'
      coverage+=$(echo "$out" | grep '^coverage' | sed 's/.*(cases)://')$'\n'
      first=$((first + k))
    else
      hang=$(echo "$out" | grep -m1 '^HANG')
      if [[ -n "$hang" ]]; then
        echo "$hang"
        idx=$(echo "$hang" | sed -E 's/.*case index ([0-9]+).*/\1/')
        c_hang=$((c_hang + 1))
        c_cases=$((c_cases + idx - first + 1))  # the cases before it passed (a mismatch prints)
        c_eq=$((c_eq + idx - first))
        c_mis=$((c_mis + $(echo "$out" | grep -c '^MISMATCH')))
        c_eq=$((c_eq - $(echo "$out" | grep -c '^MISMATCH')))
        first=$((idx + 1))
      else
        echo "campaign.sh: P=$p run at case $first ended with status $rc and no summary:" >&2
        echo "$out" | tail -5 >&2
        c_hang=$((c_hang + 1))
        first=$((first + k))
      fi
    fi
  done
  t1=$(date +%s.%N)
  rows+=("$(printf '%3d %8d %8d %9d %8d %11d %6d %9.1f' "$p" "$c_cases" "$c_eq" "$c_rej" "$c_drop" \
    "$c_mis" "$c_hang" "$(echo "$t1 - $t0" | bc)")")
  tot_cases=$((tot_cases + c_cases)) tot_eq=$((tot_eq + c_eq)) tot_rej=$((tot_rej + c_rej))
  tot_drop=$((tot_drop + c_drop)) tot_mis=$((tot_mis + c_mis)) tot_hang=$((tot_hang + c_hang))
done
t_all=$(echo "$(date +%s.%N) - $start_all" | bc)
echo
echo "  P    cases    equal  rejected*  drops** mismatches  hangs    wall_s"
for r in "${rows[@]}"; do echo "$r"; done
printf 'all %8d %8d %9d %8d %11d %6d %9.1f\n' "$tot_cases" "$tot_eq" "$tot_rej" "$tot_drop" \
  "$tot_mis" "$tot_hang" "$t_all"
echo "*  configurations the docs say the layer rejects; every rank got INVALID_ARG (counted as equal)"
echo "** cases in which the capacity dropped at least one choice"
if [[ -n "$worst" ]]; then
  echo "worst relative error per quantity over all runs (max|diff| / max|ref| of a tensor):"
  echo "$worst" | max_per_name
  echo "worst share of the tolerance (max|diff| / (2e-5 max|ref| + 1e-6); a mismatch is > 1):"
  echo "$share" | max_per_name
fi
if [[ -n "$coverage" ]]; then
  echo "coverage (cases drawing each catalogue entry or condition):"
  echo "$coverage" | awk 'NF { for (i = 1; i < NF; i += 2) { if (!($i in c)) k[++n] = $i; c[$i] += $(i + 1) } }
    END { for (j = 1; j <= n; j++) printf " %s %d", k[j], c[k[j]]; printf "\n" }'
fi
if ((tot_mis > 0 || tot_hang > 0)); then
  echo "campaign: FAILED ($tot_mis mismatches, $tot_hang hangs); reproduce lines above and in $log"
  return 1
fi
echo "campaign: passed ($tot_cases cases, 0 mismatches, 0 hangs)"
}

# "name value name value ..." lines -> the largest value per name, in first-seen order
max_per_name() {
  awk 'NF {
      for (i = 1; i < NF; i += 2) {
        if (!($i in w)) { w[$i] = $(i + 1) + 0; k[++n] = $i }
        if ($(i + 1) + 0 > w[$i]) w[$i] = $(i + 1) + 0
      }
    }
    END { for (j = 1; j <= n; j++) printf " %s %.3g", k[j], w[k[j]]; printf "\n" }'
}

main "$@"
exit
