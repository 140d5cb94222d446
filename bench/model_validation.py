#!/usr/bin/env python3
"""Checks the performance model against a measured grid: the JSON of
`moe bench layer --grid --profile PROFILE --json FILE` holds, per config and
variant, the measured total and the predicted one.

1. Prediction error: configs are split in two halves (even and odd index). A
   linear correction measured = a + b * predicted is fitted on one half and
   applied to the other (held-out) half; MAPE and R^2 are reported raw and
   corrected, both ways round.
2. The planner restricted to the measured variants (lossless only): per config
   the variant with the least predicted time, and whether its measured time is
   within 5% of the best measured variant (and, noise-aware, whether its
   first quartile reaches the best variant's third quartile).
3. With --repeat GRID2 (the same grid measured again): how reproducible the
   5% criterion itself is. The best measured variant of GRID, judged by
   GRID2's measurement (an oracle that measured every variant once), and
   the planned variant judged the same way.

Standard library only.
usage: bench/model_validation.py GRID.json [--profile PROFILE --moe PATH] [--repeat GRID2]
  with --profile, the predictions are recomputed by `moe simulate --profile`
  (for example with a profile calibrated after the grid ran)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile


def fit(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def scores(pred, meas):
    mape = 100.0 * statistics.fmean(abs(p - m) / m for p, m in zip(pred, meas))
    my = statistics.fmean(meas)
    ss_tot = sum((m - my) ** 2 for m in meas)
    ss_res = sum((m - p) ** 2 for p, m in zip(pred, meas))
    return mape, 1.0 - ss_res / ss_tot


def repredict(configs, profile, moe):
    """Replaces predicted_ms with `moe simulate --profile` for every variant."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sim.json")
        for c in configs:
            cfg = c["config"]
            vs = c["variants"]
            a2as = sorted({v["a2a"] for v in vs})
            comps = sorted({v["compress"] for v in vs})
            scheds = sorted({v["schedule"] for v in vs})
            chunks = sorted({v["chunks_requested"] for v in vs})
            cmd = [moe, "simulate", "--profile", profile, "--tokens", str(c["tokens_per_rank"]),
                   "--model", str(cfg["model_dim"]), "--hidden", str(cfg["hidden_dim"]),
                   "--experts", str(cfg["num_experts"]), "--topk", str(cfg["top_k"]),
                   "--capacity-factor", repr(cfg["capacity_factor"]), "--a2a", ",".join(a2as),
                   "--compress", ",".join(comps), "--schedule", ",".join(scheds),
                   "--chunks", ",".join(str(r) for r in chunks), "--json", out]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            sim = json.load(open(out))["variants"]
            for v in vs:
                key = (v["a2a"], v["compress"], v["schedule"])
                match = [s for s in sim if (s["a2a"], s["compress"], s["schedule"]) == key and
                         (s["chunks"] == v["chunks"] or v["schedule"] == "smart")]
                if not match:
                    sys.exit("no prediction for %s" % (key,))
                v["predicted_ms"] = match[0]["total_ms"]


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    d = json.load(open(args[0]))
    configs = d["configs"]
    if "--profile" in args:
        profile = args[args.index("--profile") + 1]
        moe = args[args.index("--moe") + 1] if "--moe" in args else "build/moe"
        repredict(configs, profile, moe)
        print("predictions recomputed with %s" % profile)
    rows = []  # (config index, variant, predicted, measured)
    for i, c in enumerate(configs):
        for v in c["variants"]:
            if v.get("predicted_ms") is None:
                sys.exit("the grid has no predicted_ms: run it with --profile")
            rows.append((i, v, v["predicted_ms"], v["total_ms"]))
    print("%d configs, %d variants with predictions" % (len(configs), len(rows)))
    p_all = [r[2] for r in rows]
    m_all = [r[3] for r in rows]
    mape, r2 = scores(p_all, m_all)
    print("raw model, all variants: MAPE %.1f%%, R^2 %.3f, mean signed error %+.1f%%" % (
        mape, r2, 100 * statistics.fmean((p - m) / m for p, m in zip(p_all, m_all))))
    for train, test in ((0, 1), (1, 0)):
        tr = [r for r in rows if r[0] % 2 == train]
        te = [r for r in rows if r[0] % 2 == test]
        a, b = fit([r[2] for r in tr], [r[3] for r in tr])
        corr = [a + b * r[2] for r in te]
        m = [r[3] for r in te]
        mape_raw, r2_raw = scores([r[2] for r in te], m)
        mape_c, r2_c = scores(corr, m)
        print("held-out %s configs (%d variants): raw MAPE %.1f%% R^2 %.3f; corrected "
              "(measured = %.2f ms + %.3f x predicted, fitted on the %s half) MAPE %.1f%% "
              "R^2 %.3f" % ("odd" if test else "even", len(te), mape_raw, r2_raw, a, b,
                            "even" if train == 0 else "odd", mape_c, r2_c))
    # bias by variant kind
    by = {}
    for r in rows:
        v = r[1]
        by.setdefault((v["a2a"], v["schedule"], v["chunks"]), []).append((r[2] - r[3]) / r[3])
    print("\nsigned error by variant (predicted / measured - 1): mean and spread over configs")
    for k in sorted(by):
        e = by[k]
        print("  %-6s %-10s r=%d  %+6.1f%%  sd %5.1f%%" % (k[0], k[1], k[2], 100 * statistics.fmean(e),
                                                        100 * statistics.pstdev(e)))
    # the planner over the measured (lossless) variants
    within = 0
    within_noise = 0
    n = 0
    print("\nplanner over the measured variants (lossless):")
    print("%6s %5s %5s %8s  %-22s %9s  %-22s %9s %7s" % (
        "T/rank", "M", "H", "f", "planned", "meas ms", "best measured", "meas ms", "gap"))
    for i, c in enumerate(configs):
        vs = [v for v in c["variants"] if v["compress"] == "none"]
        pick = min(vs, key=lambda v: v["predicted_ms"])
        best = min(vs, key=lambda v: v["total_ms"])
        gap = pick["total_ms"] / best["total_ms"] - 1.0
        n += 1
        within += gap <= 0.05
        # noise-aware: or the planned variant's interquartile range reaches
        # the best one's (the two are not told apart by the measurement)
        within_noise += gap <= 0.05 or pick.get("total_ms_q1", pick["total_ms"]) <= best.get(
            "total_ms_q3", best["total_ms"])
        cfg = c["config"]
        f = "dropless" if cfg["capacity_factor"] <= 0 else "%g" % cfg["capacity_factor"]
        label = lambda v: "%s %s r=%d" % (v["a2a"], v["schedule"], v["chunks"])
        print("%6d %5d %5d %8s  %-22s %9.2f  %-22s %9.2f %+6.1f%%" % (
            c["tokens_per_rank"], cfg["model_dim"], cfg["hidden_dim"], f, label(pick),
            pick["total_ms"], label(best), best["total_ms"], 100 * gap))
    print("planned variant within 5%% of the best measured: %d of %d configs (%.0f%%)" % (
        within, n, 100.0 * within / n))
    print("  or not told apart from it (planned q1 <= best q3): %d of %d configs (%.0f%%)" % (
        within_noise, n, 100.0 * within_noise / n))
    if "--repeat" in args:
        repeat(configs, json.load(open(args[args.index("--repeat") + 1]))["configs"])


def repeat(configs, again):
    """The 5% criterion judged on a second measurement of the same grid."""
    key = lambda v: (v["a2a"], v["compress"], v["schedule"], v["chunks"])
    if len(again) != len(configs):
        sys.exit("--repeat: the grids have %d and %d configs" % (len(configs), len(again)))
    oracle = planned = 0
    for c, c2 in zip(configs, again):
        vs = [v for v in c["variants"] if v["compress"] == "none"]
        second = {key(v): v["total_ms"] for v in c2["variants"] if v["compress"] == "none"}
        if set(second) != {key(v) for v in vs}:
            sys.exit("--repeat: the grids measured different variants")
        best2 = min(second.values())
        oracle += second[key(min(vs, key=lambda v: v["total_ms"]))] <= 1.05 * best2
        planned += second[key(min(vs, key=lambda v: v["predicted_ms"]))] <= 1.05 * best2
    n = len(configs)
    print("\njudged by the repeated measurement (within 5% of its best):")
    print("  the best measured variant of this grid: %d of %d configs (%.0f%%): the ceiling of "
          "any choice made from one measurement" % (oracle, n, 100.0 * oracle / n))
    print("  the planned variant: %d of %d configs (%.0f%%)" % (planned, n, 100.0 * planned / n))


if __name__ == "__main__":
    main()
