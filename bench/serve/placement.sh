#!/usr/bin/env bash
# Expert placement while serving: `moe generate` on P ranks with every
# placement (uniform, eplb; with PATHS lina, and lina-p1: lina with phase 1
# only, --place-replan off), interleaved rounds, the same prompts; the text
# must be byte-identical under every placement (the script fails otherwise).
#   bash bench/serve/placement.sh CHECKPOINT [ROUNDS] [PROMPTS] [TOKENS] [MOE]
# Environment:
#   RANKS=4              ranks (mpirun -n)
#   CLUSTER="--nodes 2 --ranks-per-node 2 --inter-gbit 1"
#                        run on the emulated cluster (bench/cluster/cluster.sh,
#                        root; brought up once, always torn down); empty: plain
#                        mpirun on this host [empty]
#   PLACE="--place-slots 2 --place-every 16 --place-window 16"  eplb's options
#   PATHS=FILE           a path profile (moe generate --record-paths): adds
#                        lina and lina-p1 (--paths FILE and PLACE's --place-slots)
# Prints a table of medians over the rounds: tokens/s, the MoE layer
# forward's p50 / p95 (rank 0, one sample per step and MoE block), its
# all-to-alls' p50 / p95, the balance ratio without copies and as placed, and
# the ratios against uniform.
set -euo pipefail
ckpt=${1:?usage: placement.sh CHECKPOINT [ROUNDS] [PROMPTS] [TOKENS] [MOE]}
rounds=${2:-5}
prompts=${3:-64}
tokens=${4:-64}
moe=$(realpath "${5:-build/moe}")
ranks=${RANKS:-4}
cluster_flags=${CLUSTER:-}
place=${PLACE:---place-slots 2 --place-every 16 --place-window 16}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
chmod 755 "$tmp" # the cluster's ranks run in other namespaces, as root
cleanup() {
  # shellcheck disable=SC2086 # flags split on purpose
  if [[ -n $cluster_flags ]]; then "$here/../cluster/cluster.sh" down $cluster_flags >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
python3 - "$tmp/p.jsonl" "$prompts" "$tokens" <<'PY'
import json, sys
starts = ["Once upon a time", "The king said", "Q: What is", "In the beginning",
          "A long time ago in a", "She looked at the", "It was a dark", "Hello, my"]
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"prompt": starts[i % 8] + " " * (i // 8), "max_tokens": int(sys.argv[3]),
                            "seed": i}) + "\n")
PY
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ -n $cluster_flags ]]; then
  # shellcheck disable=SC2086
  "$here/../cluster/cluster.sh" up $cluster_flags >/dev/null
fi
run() { # run OUT LOG ARGS...: moe generate on the ranks
  local out=$1 log=$2
  shift 2
  if [[ -n $cluster_flags ]]; then
    # shellcheck disable=SC2086
    "$here/../cluster/cluster.sh" run $cluster_flags -- "$moe" generate --checkpoint "$ckpt" \
      --input "$tmp/p.jsonl" --output "$out" "$@" >"$log" 2>&1
  else
    mpirun --oversubscribe -n "$ranks" "$moe" generate --checkpoint "$ckpt" \
      --input "$tmp/p.jsonl" --output "$out" "$@" >"$log" 2>&1
  fi
}
placements=(uniform eplb)
[[ -z ${PATHS:-} ]] || placements+=(lina lina-p1)
slots=$(echo "$place" | sed -n 's/.*--place-slots \([0-9]*\).*/\1/p')
for _ in $(seq "$rounds"); do
  for pl in "${placements[@]}"; do
    extra=()
    # shellcheck disable=SC2206 # options split on purpose
    [[ $pl != eplb ]] || extra=($place)
    [[ $pl != lina* ]] || extra=(--paths "$(realpath "$PATHS")" --place-slots "${slots:-2}")
    [[ $pl != lina-p1 ]] || extra+=(--place-replan off)
    run "$tmp/out.$pl" "$tmp/log" --placement "${pl%-p1}" "${extra[@]}" ||
      { echo "placement.sh: moe generate --placement $pl failed:" >&2; tail -5 "$tmp/log" >&2; exit 1; }
    if ! cmp -s "$tmp/out.uniform" "$tmp/out.$pl"; then
      echo "placement.sh: the text under $pl differs from uniform's" >&2
      exit 1
    fi
    awk -v pl="$pl" '
      / tokens\/s, / { for (i = 1; i <= NF; i++) if ($(i + 1) == "tokens/s,") tps = $i }
      /MoE layer forward p50/ { gsub(/[,;]/, ""); lp50 = $6; lp95 = $9; ap50 = $14; ap95 = $17 }
      /placement .*: balance ratio/ { gsub(/[,;]/, ""); un = $6; pd = $9 }
      /lina phase 2: / { for (i = 1; i <= NF; i++) if ($(i + 1) == "re-plans") rp = $i }
      END { if (un == "") { un = "-"; pd = "-" }
            if (rp == "") rp = "-"
            print pl, tps, lp50, lp95, ap50, ap95, un, pd, rp }' "$tmp/log" >>"$tmp/rows"
  done
done
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
where="plain mpirun on this host"
[[ -z $cluster_flags ]] || where="the emulated cluster ($cluster_flags)"
echo "moe generate, $prompts prompts x $tokens tokens, $ranks ranks on $where; eplb: $place;"
[[ -z ${PATHS:-} ]] || echo "lina: --paths $PATHS --place-slots ${slots:-2} (lina-p1: --place-replan off);"
echo "medians of $rounds interleaved rounds ($cpu); the text is identical under every placement"
echo
echo "| placement | tokens/s | MoE layer p50 ms | p95 ms | all-to-all p50 ms | p95 ms | balance ratio (none -> placed) | re-plans | p95 vs uniform |"
echo "|---|---|---|---|---|---|---|---|---|"
declare -A med
for pl in "${placements[@]}"; do
  for c in 2 3 4 5 6 7 8 9; do
    med[$pl.$c]=$(awk -v pl="$pl" -v c="$c" '$1 == pl && $c != "-" {print $c}' "$tmp/rows" | median)
  done
done
for pl in "${placements[@]}"; do
  awk -v pl="$pl" -v t="${med[$pl.2]}" -v l50="${med[$pl.3]}" -v l95="${med[$pl.4]}" \
    -v a50="${med[$pl.5]}" -v a95="${med[$pl.6]}" -v un="${med[$pl.7]}" -v pd="${med[$pl.8]}" \
    -v rp="${med[$pl.9]}" -v u95="${med[uniform.4]}" 'BEGIN {
      ratio = (un == "") ? "-" : sprintf("%.2f -> %.2f", un, pd)
      if (rp == "") rp = "-"
      printf "| %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s | %s | %.2fx |\n", pl, t, l50, l95, a50, a95, ratio, rp, u95 / l95 }'
done
