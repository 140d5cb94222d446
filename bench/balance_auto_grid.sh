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
# Environment: GRID_ITERS (timed iterations per variant, 7), GRID_REPEATS
# (runs of the whole grid, 1; the summary takes each policy's median over
# them: one run's noise moves the same plan by 5-10% here), GRID_SKEWS
# (space-separated --skew specs), GRID_SHAPES (space-separated T:M:H:E).
# The points' JSON files are OUT_DIR/pointI_rJ.json (point I, repeat J).
set -euo pipefail
build=${1:?usage: balance_auto_grid.sh BUILD_DIR OUT_DIR}
out=${2:?usage: balance_auto_grid.sh BUILD_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
moe=$(realpath "$build/moe")
mkdir -p "$out"
iters=${GRID_ITERS:-7}
repeats=${GRID_REPEATS:-1}
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || {
  echo "balance_auto_grid.sh: GRID_REPEATS must be a positive integer (got '$repeats')" >&2
  exit 2
}
skews=${GRID_SKEWS:-"zipf:1.2 hot:0.5 zipf:0.6 trace:$here/../docs/results/demo_routing_trace_aux0.jsonl#0@151-300"}
shapes=${GRID_SHAPES:-"1024:512:1024:8 512:256:512:8"}

for rep in $(seq "$repeats"); do
  i=0
  for shape in $shapes; do
    IFS=: read -r T M H E <<<"$shape"
    for skew in $skews; do
      i=$((i + 1))
      json="$out/point${i}_r$rep.json"
      echo "repeat $rep, point $i: T $T M $M H $H E $E, skew $skew" >&2
      timeout 900 bash "$here/cluster/with-cluster.sh" --nodes 2 --ranks-per-node 2 --inter-gbit 1 -- \
        "$moe" bench layer --tokens "$T" --model "$M" --hidden "$H" --experts "$E" \
        --capacity-factor 0 --schedule sequential --chunks 1 --iters "$iters" --skew "$skew" \
        --balance all --json "$json" >"$out/point${i}_r$rep.log" 2>&1 ||
        echo "point $i (repeat $rep) failed (see $out/point${i}_r$rep.log)" >&2
    done
  done
done

python3 - "$out" <<'PY'
import glob, json, os, re, statistics, sys
POL = ("none", "shadow", "prophet", "eplb")
points = {}
for path in glob.glob(os.path.join(sys.argv[1], "point*_r*.json")):
    m = re.search(r"point(\d+)_r(\d+)\.json$", path)
    points.setdefault(int(m.group(1)), []).append(json.load(open(path)))
rows, within, same = [], 0, 0
for i in sorted(points):
    runs = points[i]
    c0 = runs[0]["configs"][0]
    cfg = c0["config"]
    per = {}  # policy -> [variant of each run]
    for d in runs:
        for x in d["configs"][0]["variants"]:
            per.setdefault(x["balance"], []).append(x)
    med = {p: statistics.median(x["total_ms"] for x in per[p]) for p in per}
    best = min((p for p in med if p != "auto"), key=lambda p: med[p])
    ratio = med["auto"] / med[best]
    # auto's plan in each run: the policy of the same run with its copies and busiest rank
    picks = []
    for d in runs:
        v = {x["balance"]: x for x in d["configs"][0]["variants"]}
        a = v["auto"]
        picks.append("/".join(p for p in POL if p in v and v[p]["copies"] == a["copies"]
                              and v[p]["max_rank_rows"] == a["max_rank_rows"]) or "?")
    took_best = sum(best in p.split("/") for p in picks)
    pred = [x["balance_pred_none_ms"] / x["balance_pred_ms"] for x in per["auto"]
            if x.get("balance_pred_ms") and x.get("balance_pred_none_ms")]
    ok = ratio <= 1.05
    within += ok
    same += took_best * 2 > len(runs)
    rows.append("| %d:%d:%d:%d | %s | %.2f | %s | %s | %s | %s | %.3f | %.3f | %s |" % (
        c0["tokens_per_rank"], cfg["model_dim"], cfg["hidden_dim"], cfg["num_experts"],
        re.sub(r"trace:.*/", "trace:", runs[0]["skew"]),
        statistics.median(x["balance_ratio"] for x in per["none"]),
        " / ".join("%s %.0f" % (p, med[p]) for p in POL if p in med), best,
        ", ".join(picks), "%.2fx" % statistics.median(pred) if pred else "-",
        med["none"] / med["auto"], ratio, "yes" if ok else "no"))
print("%d repeat(s) of the grid; total ms: each policy's median over the repeats of its per-run median" % max(len(r) for r in points.values()))
print()
print("| T:M:H:E | skew | ratio without copies | total ms (median) | best | auto took (per run) | auto predicted vs none | auto measured vs none | auto / best | within 5% |")
print("|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
print("\nauto within 5%% of the best on %d of %d points; it took the best policy's plan in most runs on %d" % (within, len(rows), same))
# the noise: two policies of one run that placed the same plan (same copies and
# busiest rank), measured apart
gaps = []
for runs in points.values():
    for d in runs:
        vs = [x for x in d["configs"][0]["variants"]]
        for a in range(len(vs)):
            for b in range(a + 1, len(vs)):
                x, y = vs[a], vs[b]
                if x["copies"] == y["copies"] and x["max_rank_rows"] == y["max_rank_rows"]:
                    gaps.append(abs(x["total_ms"] - y["total_ms"]) / min(x["total_ms"], y["total_ms"]))
if gaps:
    gaps.sort()
    print("noise: %d pairs of variants of one run with the same plan differ by %.1f%% (median), %.1f%% (largest)" % (
        len(gaps), 100 * statistics.median(gaps), 100 * gaps[-1]))
PY
