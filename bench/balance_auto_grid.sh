#!/usr/bin/env bash
# The load-balancing policy `auto` against the best measured policy on a grid
# of skews x layer shapes (issue "Load balancing": auto within 5% of the best
# on at least 80% of the grid; results in docs/balance.md "auto").
#
# Each grid point runs `moe bench layer --balance all` on the emulated
# cluster (2 nodes x 2 ranks, 1 Gbit/s between them; needs root for the
# network namespaces, see bench/cluster/cluster.sh), writes its JSON, and the
# summary prints per point every policy's median total, the best one, auto's
# pick (the copies it placed) and auto's time over the best's.
#
#   bash bench/balance_auto_grid.sh BUILD_DIR OUT_DIR
# Environment: GRID_ITERS (timed iterations per variant, 7), GRID_SKEWS
# (space-separated --skew specs), GRID_SHAPES (space-separated T:M:H:E).
set -euo pipefail
build=${1:?usage: balance_auto_grid.sh BUILD_DIR OUT_DIR}
out=${2:?usage: balance_auto_grid.sh BUILD_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
moe=$(realpath "$build/moe")
mkdir -p "$out"
iters=${GRID_ITERS:-7}
skews=${GRID_SKEWS:-"zipf:1.2 hot:0.5 zipf:0.6 trace:$here/../docs/results/demo_routing_trace_aux0.jsonl#0@151-300"}
shapes=${GRID_SHAPES:-"1024:512:1024:8 512:256:512:8"}

i=0
for shape in $shapes; do
  IFS=: read -r T M H E <<<"$shape"
  for skew in $skews; do
    i=$((i + 1))
    json="$out/point$i.json"
    echo "point $i: T $T M $M H $H E $E, skew $skew" >&2
    timeout 900 bash "$here/cluster/with-cluster.sh" --nodes 2 --ranks-per-node 2 --inter-gbit 1 -- \
      "$moe" bench layer --tokens "$T" --model "$M" --hidden "$H" --experts "$E" \
      --capacity-factor 0 --schedule sequential --chunks 1 --iters "$iters" --skew "$skew" \
      --balance all --json "$json" >"$out/point$i.log" 2>&1 || echo "point $i failed (see $out/point$i.log)" >&2
  done
done

python3 - "$out" <<'PY'
import glob, json, os, sys
rows, within = [], 0
for path in sorted(glob.glob(os.path.join(sys.argv[1], "point*.json")), key=lambda p: int(p.split("point")[-1][:-5])):
    d = json.load(open(path))
    c = d["configs"][0]
    cfg = c["config"]
    v = {x["balance"]: x for x in c["variants"]}
    best = min((p for p in v if p != "auto"), key=lambda p: v[p]["total_ms"])
    auto = v["auto"]
    ratio = auto["total_ms"] / v[best]["total_ms"]
    # auto's plan: the policy whose copies and busiest rank it matched
    pick = [p for p in ("none", "shadow", "prophet", "eplb") if p in v and v[p]["copies"] == auto["copies"] and v[p]["max_rank_rows"] == auto["max_rank_rows"]]
    ok = ratio <= 1.05
    within += ok
    rows.append("| %d:%d:%d:%d | %s | %.2f | %s | %s | %s (%d copies) | %.3f | %s |" % (
        c["tokens_per_rank"], cfg["model_dim"], cfg["hidden_dim"], cfg["num_experts"], d["skew"],
        v["none"]["balance_ratio"],
        " / ".join("%s %.0f" % (p, v[p]["total_ms"]) for p in ("none", "shadow", "prophet", "eplb") if p in v),
        best, "/".join(pick) or "?", auto["copies"], ratio, "yes" if ok else "no"))
print("| T:M:H:E | skew | ratio without copies | total ms (median) | best | auto took | auto / best | within 5% |")
print("|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
print("\nauto within 5%% of the best on %d of %d points" % (within, len(rows)))
PY
