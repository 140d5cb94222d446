#!/usr/bin/env python3
"""Summarises the JSON of `moe bench layer --grid --json FILE` against the
task-engine targets: per config, the speedup of each variant over sequential
r=1, the overlap efficiencies of optsche r=2 (against (comm+comp)/max and
against ScheMoE's r-chunk task model), and whether optsche is slower than
pipeline beyond noise (its interquartile range of the total lies entirely
above pipeline's). Standard library only.

usage: bench/grid_summary.py GRID.json [--a2a NAME] [--compress SPEC]
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--a2a", default="mpi")
    ap.add_argument("--compress", default="none")
    a = ap.parse_args()
    with open(a.json) as f:
        d = json.load(f)
    rows = []
    for c in d["configs"]:
        vs = {(v["schedule"], v["chunks"]): v for v in c["variants"]
              if v["a2a"] == a.a2a and v["compress"] == a.compress}
        seq = vs.get(("sequential", 1))
        opt = next((v for k, v in vs.items() if k[0] == "optsche"), None)
        pip = next((v for k, v in vs.items() if k[0] == "pipeline"), None)
        sma = next((v for k, v in vs.items() if k[0] == "smart"), None)
        if not (seq and opt and pip):
            continue
        cfg = c["config"]
        ratio = seq["comm_ms"] / seq["comp_ms"] if seq["comp_ms"] > 0 else float("inf")
        slower = opt.get("total_ms_q1", opt["total_ms"]) > pip.get("total_ms_q3", pip["total_ms"])
        rows.append((c["tokens_per_rank"], cfg["model_dim"], cfg["hidden_dim"],
                     cfg["capacity_factor"], seq["total_ms"], ratio, pip["speedup"],
                     opt["speedup"], sma["speedup"] if sma else float("nan"),
                     opt["overlap_efficiency"], opt["model_efficiency"], slower))
    if not rows:
        sys.exit("no config with sequential r=1, pipeline and optsche for this a2a/compress")
    print("%6s %5s %5s %8s %8s %9s %9s %9s %9s %7s %7s %s" % (
        "T/rank", "M", "H", "f", "seq ms", "comm/comp", "pipeline", "optsche", "smart",
        "eff", "eff_r", "optsche slower"))
    for r in rows:
        f = "dropless" if r[3] <= 0 else "%g" % r[3]
        print("%6d %5d %5d %8s %8.2f %9.2f %9.3f %9.3f %9.3f %6.1f%% %6.1f%% %s" % (
            r[0], r[1], r[2], f, r[4], r[5], r[6], r[7], r[8], 100 * r[9], 100 * r[10],
            "yes" if r[11] else "no"))
    within = [r for r in rows if 0.5 <= r[5] <= 2.0]
    print()
    print("configs: %d; optsche slower than pipeline beyond noise: %d (%.0f%% not slower)" % (
        len(rows), sum(r[11] for r in rows), 100.0 * (1 - sum(r[11] for r in rows) / len(rows))))
    if within:
        print("comm and comp within 2x (%d configs), optsche r=2: median speedup %.3f, "
              "median eff %.1f%% of (comm+comp)/max, median eff_r %.1f%% of the r-chunk model" % (
                  len(within), statistics.median(r[7] for r in within),
                  100 * statistics.median(r[9] for r in within),
                  100 * statistics.median(r[10] for r in within)))
    print("median speedups: pipeline %.3f, optsche %.3f, smart %.3f" % (
        statistics.median(r[6] for r in rows), statistics.median(r[7] for r in rows),
        statistics.median(r[8] for r in rows)))


if __name__ == "__main__":
    main()
