#!/usr/bin/env python3
"""Summarises a routing trace of `moe train --routing-trace FILE`.

    python3 bench/routing_trace_summary.py FILE [STEP ...]

For the given steps (default: the first, the middle and the last), prints per
MoE layer the experts' shares of the kept rows (over all source ranks), the
most popular expert's share over the uniform 1/E, and the balance ratio (the
busiest rank's rows over the mean) that block placement of the E experts
would give on P' = every divisor of E ranks, assuming each rank's tokens route
like the trace's total (the recorded ranks are one sample of the same router).
Standard library only.
"""
import json
import sys


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    lines = [json.loads(l) for l in open(sys.argv[1])]
    head, body = lines[0], lines[1:]
    if head.get("format") != "libmoe-routing-trace":
        print("not a libmoe routing trace: %s" % sys.argv[1], file=sys.stderr)
        return 2
    E = head["experts"]
    steps = sorted({l["step"] for l in body})
    if not steps:
        print("the trace has no steps", file=sys.stderr)
        return 2
    want = [int(a) for a in sys.argv[2:]] or sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    divisors = [p for p in range(2, E + 1) if E % p == 0]
    print("trace: %d ranks, E=%d, K=%d, %d tokens per rank, MoE layers %s, steps %d..%d" % (
        head["ranks"], E, head["top_k"], head["tokens_per_rank"], head["moe_layers"], steps[0],
        steps[-1]))
    print("%5s %5s  %-48s %8s  %s" % ("step", "layer", "expert shares (%)", "max/unif",
                                     "  ".join("ratio@P=%d" % p for p in divisors)))
    for s in want:
        for l in (x for x in body if x["step"] == s):
            tot = [sum(row[e] for row in l["counts"]) for e in range(E)]
            n = sum(tot) or 1
            shares = [100.0 * t / n for t in tot]
            ratios = []
            for p in divisors:
                per = E // p
                rows = [sum(tot[r * per:(r + 1) * per]) for r in range(p)]
                ratios.append(max(rows) * p / n)
            print("%5d %5d  %-48s %8.2f  %s" % (
                s, l["layer"], " ".join("%4.1f" % x for x in shares), max(shares) / (100.0 / E),
                "  ".join("%9.3f" % r for r in ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
