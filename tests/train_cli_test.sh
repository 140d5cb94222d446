#!/usr/bin/env bash
# `moe train` and `moe sample` end to end: help and exit codes, a tiny run on 2
# ranks with metrics, plot, trace (tasks named per block) and checkpoint,
# sampling from it, the --profile predictions' labels, resuming (bitwise equal
# metrics, the summary's first validation at the resumed step, the
# checkpoint's lr schedule kept with more --steps, another one refused), a
# corrupted checkpoint (clear error, file unchanged), and a killed rank (the
# job ends with an error within a bounded time).
# Usage: train_cli_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: train_cli_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: train_cli_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
bg=""
# the job in the background (the killed-rank check) and its ranks
on_exit() {
  if [[ -n "$bg" ]]; then
    local tree
    tree=$(descendants "$bg")
    # shellcheck disable=SC2086 # one pid per word
    kill -9 "$bg" $tree 2>/dev/null
  fi
}

# A small text with structure (the default corpus would do too; this keeps the test fast).
python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(5)
w = ["the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away!\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(20000)))
PY
TINY=(--data "$tmp/text.txt" --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4
      --expert-hidden 32 --batch 8 --eval-every 5 --eval-batches 2 --progress line)

expect 0 "usage: mpirun -n P moe train" -- "$MOE" train --help
expect 0 "usage: moe sample" -- "$MOE" sample --help
expect 2 "unknown option '--frobnicate'" -- "$MOE" train --frobnicate
expect 2 "--layers.*must be in" -- "$MOE" train --layers 0
expect 2 "divide|divisible" -- "$MOE" train --d-model 30 --heads 4
expect 2 "--plot needs --metrics" -- "$MOE" train --plot x.png
expect 2 "deterministic mode needs a batch-invariant compute backend: .openblas. is not" -- "$MOE" train --backend openblas --steps 1
expect 2 "--backend: unknown compute backend .nope." -- "$MOE" train --backend nope
expect 2 "--precision: unknown precision .half." -- "$MOE" train --precision half
expect 2 "precision bf16: the openblas backend has no bf16 GEMM" -- "$MOE" train --deterministic off --backend openblas --precision bf16 --steps 1
expect 2 "checkpoint FILE is required" -- "$MOE" sample
expect 2 "divisible by the number of ranks" -- mpi 2 "$MOE" train "${TINY[@]}" --batch 3 --steps 2
expect 2 "--data: cannot open .*missing.txt.*No such file" -- "$MOE" train --data "$tmp/missing.txt" --steps 2
# a directory is bad input like a missing file (exit 2, as for --model-config)
expect 2 "--data: .* is not a regular file" -- "$MOE" train --data "$tmp" --steps 2
expect 2 "--model-config: .* is not a regular file" -- "$MOE" train --model-config "$tmp" --steps 2
# the generated text, as docs/data.md lists it
tiny_gen=("${TINY[@]:2}")
expect 0 "data: generated: [0-9]+ bytes" -- "$MOE" train "${tiny_gen[@]}" --data generated: --steps 2 \
  --eval-every 0 --eval-batches 1 --quiet

# A run with every output, then sampling from its checkpoint.
expect 0 "val loss" -- mpi 2 "$MOE" train "${TINY[@]}" --steps 12 --metrics "$tmp/m.jsonl" \
  --plot "$tmp/loss.txt" --trace "$tmp/trace.json" --trace-step 3 --checkpoint "$tmp/c.ckpt"
if python3 - "$tmp/m.jsonl" "$tmp/trace.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 13)), rows
for r in rows:
    for k in ("loss", "tokens_per_s", "a2a_share", "lr"):
        assert k in r, k
assert "val_loss" in rows[4] and "val_loss" not in rows[5]
assert rows[-1]["loss"] < rows[0]["loss"]
t = json.load(open(sys.argv[2]))
assert len(t["traceEvents"]) > 0
# the tasks of the two MoE blocks are told apart: "h0.E^1", "h1.A1'^1", ...
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
blocks = {e["name"].split(".", 1)[0] for e in x}
assert blocks == {"h0", "h1"}, blocks
for e in x:
    assert e["args"]["pass"] == e["name"].split(".", 1)[0], e
for pid in (0, 1):
    names = [e["name"] for e in x if e["pid"] == pid]
    assert len(names) == len(set(names)) > 0, (pid, names)  # one pass per block and direction
    assert "h0.E^1" in names and "h1.E^1" in names and "h1.E'^1" in names, names
PY
then ok; else bad "metrics or trace content"; fi
if [[ -s "$tmp/c.ckpt" ]]; then ok; else bad "no checkpoint written"; fi

# The routing trace: a header, then one (rank x expert) matrix per step and MoE
# layer; each rank's row holds its kept choices (at most tokens x K, and
# tokens x K minus its dropped ones: here checked against the metrics' drops).
expect 0 "val loss" -- mpi 2 "$MOE" train "${TINY[@]}" --steps 3 --routing-trace "$tmp/r.jsonl" \
  --metrics "$tmp/rm.jsonl" --eval-every 0 --eval-batches 1
if python3 - "$tmp/r.jsonl" "$tmp/rm.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
h = lines[0]
assert h["format"] == "libmoe-routing-trace" and h["version"] == 1, h
P, E, K, T = h["ranks"], h["experts"], h["top_k"], h["tokens_per_rank"]
assert P == 2 and E == 4 and h["moe_layers"] == [0, 1], h
body = lines[1:]
assert [(l["step"], l["layer"]) for l in body] == [(s, b) for s in (1, 2, 3) for b in (0, 1)], body
drops = {m["step"]: m["dropped"] for m in map(json.loads, open(sys.argv[2]))}
for l in body:
    c = l["counts"]
    assert len(c) == P and all(len(row) == E for row in c), c
    assert all(0 <= v <= T for row in c for v in row), c
    assert all(sum(row) <= T * K for row in c), c
for s in (1, 2, 3):
    kept = sum(sum(sum(r) for r in l["counts"]) for l in body if l["step"] == s)
    assert kept + drops[s] == 2 * P * T * K, (s, kept, drops[s])
PY
then ok; else bad "routing trace content"; fi
# load balancing: the summary's balance line; bad policy; one rank (EP 1)
expect 0 "balance: eplb \(load window 10 steps, re-plan every 1, 2 copy slots per rank\), mean over steps and MoE layers: balance ratio" -- mpi 2 "$MOE" train "${TINY[@]}" \
  --steps 3 --balance eplb --eval-every 0 --eval-batches 1
expect 0 "balance overhead not hidden, ms per step: [0-9.]+ load, plan and Trans posting, [0-9.]+ Trans wait, [0-9.]+ Agg \([0-9.]+% of the step; block-wise scheduler off\)" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 3 --balance eplb --balance-blockwise off --eval-every 0 \
  --eval-batches 1 --metrics "$tmp/bal.jsonl"
if grep -q '"balance_ms":' "$tmp/bal.jsonl" && grep -q '"trans_wait_ms":' "$tmp/bal.jsonl" &&
  grep -q '"agg_ms":' "$tmp/bal.jsonl"; then ok; else bad "balanced metrics lack balance_ms, trans_wait_ms or agg_ms"; fi
expect 2 "--balance-blockwise: 'maybe' is not one of on, off" -- "$MOE" train "${TINY[@]}" --steps 1 \
  --balance-blockwise maybe
expect 2 "--balance: policy 'magic' is unknown \(valid: none, shadow, prophet, eplb, auto\)" -- mpi 2 "$MOE" train \
  "${TINY[@]}" --steps 1 --balance magic
expect 2 "needs an EP size of at least 2 \(got 1\)" -- "$MOE" train "${TINY[@]}" --steps 1 --balance shadow
# what acts on MoE layers only, on a dense model: refused, not a silent no-op
expect 2 "load balancing \(--balance\) needs MoE layers; this model has none \(moe_every 0\)" -- mpi 2 \
  "$MOE" train "${TINY[@]}" --steps 1 --moe-every 0 --balance shadow
expect 2 "a routing trace \(--routing-trace\) needs MoE layers" -- "$MOE" train "${TINY[@]}" --steps 1 \
  --moe-every 0 --routing-trace "$tmp/dense.jsonl"
if [[ ! -e "$tmp/dense.jsonl" ]]; then ok; else bad "a refused routing trace was written"; fi
# Trans and Agg of load balancing in the Chrome trace (the default model without
# the aux loss: its router skews within a few steps, so copies are placed)
expect 0 "balance: shadow \(load window 1 steps, re-plan every 1, 4 copy slots per rank\), mean over steps" -- mpi 2 "$MOE" train --steps 12 --aux-coef 0 \
  --balance shadow --batch 8 --eval-every 0 --eval-batches 1 --trace "$tmp/bal.trace"
if python3 - "$tmp/bal.trace" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
names = {e.get("name", "") for e in ev}
assert any(n.endswith(".Trans") for n in names) and any(n.endswith(".Agg") for n in names), names
PY
then ok; else bad "no Trans/Agg events in the balanced run's trace"; fi
# the topology-aware gate: 2 ranks as 2 nodes; its summary line; a bad spec
expect 0 "gate topo:0.25: [0-9.]+% of the choices re-selected" -- mpi 2 "$MOE" train "${TINY[@]}" \
  --steps 2 --gate topo --ranks-per-node 1 --eval-every 0 --eval-batches 1
expect 2 "--gate: gate 'topo:2': the ratio W_net/W_local must be a number in \(0, 1\]" -- "$MOE" \
  train "${TINY[@]}" --steps 1 --gate topo:2
expect 0 "topology: [0-9]+ of [0-9]+ rows crossed nodes \([0-9.]+%\); the topology-aware gate re-selected [1-9]" -- \
  mpi 2 "$MOE" bench layer --gate topo --ranks-per-node 1 --tokens 64 --model 32 --hidden 64 \
  --experts 4 --capacity-factor 0 --iters 1 --warmup 0
# --balance compares balanced iterations only: the first (the rates) is a warm-up
expect 2 "--balance needs --warmup 1 or more \(got 0\)" -- mpi 2 "$MOE" bench layer --balance shadow \
  --tokens 64 --model 32 --hidden 64 --experts 4 --iters 1 --warmup 0
# a balanced variant's JSON says what it planned with: slots, period, window, rates
expect 0 "eplb +mpi" -- mpi 2 "$MOE" bench layer --balance none,eplb --tokens 64 --model 32 \
  --hidden 64 --experts 4 --schedule sequential --chunks 1 --iters 1 --skew zipf:1.2 \
  --json "$tmp/bal_bench.json"
if python3 - "$tmp/bal_bench.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))["configs"][0]["variants"]
e = [x for x in v if x["balance"] == "eplb"]
assert e and all(x["balance_slots"] == 2 and x["replan_every"] == 1 and x["balance_window"] == 10 for x in e), e
assert all(x["plan_gemm_flops_per_s"] > 0 and x["plan_net_bytes_per_s"] > 0 for x in e), e
assert all("balance_window" not in x for x in v if x["balance"] == "none"), v
PY
then ok; else bad "bench layer --balance --json lacks the plan's slots, period, window or rates"; fi
# an output that is a directory is refused before the benchmark runs
expect 2 "output '$tmp' is a directory: give a file path" -- mpi 2 "$MOE" bench layer --balance shadow \
  --tokens 64 --model 32 --hidden 64 --experts 4 --iters 1 --json "$tmp"
# the router-bias update: its summary line; a rate out of range
expect 0 "router-bias update 0.01: expert load ratio" -- "$MOE" train "${TINY[@]}" --steps 2 \
  --router-bias-update 0.01 --eval-every 0 --eval-batches 1
expect 2 "--router-bias-update \(2\) must be in \[0, 1\]" -- "$MOE" train "${TINY[@]}" --steps 1 \
  --router-bias-update 2
expect 2 "cannot open the routing trace '/nonexistent/r.jsonl'" -- mpi 2 "$MOE" train "${TINY[@]}" \
  --steps 1 --routing-trace /nonexistent/r.jsonl
# gradient buckets: the summary names them, the metrics carry the wait; sizes out of range
expect 0 "dense gradients' sum \([0-9]+ buckets of 0.001 MiB during the backward, fifo\): median [0-9.]+ ms" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 2 --grad-bucket-mb 0.001 --eval-every 0 --eval-batches 1 \
  --metrics "$tmp/gb.jsonl"
if grep -qE '"grad_wait_ms":[0-9.e+-]+' "$tmp/gb.jsonl"; then ok; else bad "no grad_wait_ms in the metrics"; fi
expect 0 "dense gradients' sum \(one packed all-reduce after the backward\)" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 1 --eval-every 0 --eval-batches 1
expect 2 "--grad-bucket-mb \(5000\) must be in \[0, 4096\]" -- "$MOE" train "${TINY[@]}" --steps 1 \
  --grad-bucket-mb 5000
expect 2 "--grad-bucket-mb" -- "$MOE" train "${TINY[@]}" --steps 1 --grad-bucket-mb -1
expect 2 "--grad-bucket-mb" -- "$MOE" train "${TINY[@]}" --steps 1 --grad-bucket-mb lots
# Lina's priority and micro-ops act on the buckets: refused without them
expect 2 "Lina's priority \(--comm-priority lina\) orders the gradient buckets' all-reduce micro-ops: give --grad-bucket-mb > 0 too" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 1 --comm-priority lina
expect 2 "--micro-op-kb cuts the gradient buckets' sums: give --grad-bucket-mb > 0 too" -- \
  "$MOE" train "${TINY[@]}" --steps 1 --micro-op-kb 4
expect 0 "dense gradients' sum \([0-9]+ buckets of 0.001 MiB during the backward, lina priority\)" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 2 --grad-bucket-mb 0.001 --micro-op-kb 1 \
  --comm-priority lina --eval-every 0 --eval-batches 1
expect 2 "--comm-priority: comm priority 'first' is unknown \(valid: fifo, lina\)" -- "$MOE" train \
  "${TINY[@]}" --steps 1 --comm-priority first
expect 2 "--micro-op-kb \(2000000\) must be in \[0, 1048576\]" -- "$MOE" train "${TINY[@]}" \
  --steps 1 --micro-op-kb 2000000
expect 2 "--micro-op-kb" -- "$MOE" train "${TINY[@]}" --steps 1 --micro-op-kb -5
# bench contention (Lina's Table 1 question): the three modes, the sums
# checked exact, the JSON; bad values
expect 0 "^lina .* ok$" -- mpi 2 "$MOE" bench contention --a2a-bytes 64K --layers 2 --gap-ms 1 \
  --sum-bytes 256K --micro-op-kb 16 --rounds 2 --warmup 0 --json "$tmp/ct.json"
if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m = {x["mode"]: x for x in d["modes"]}
assert set(m) == {"alone", "fifo", "lina"}, m
assert m["fifo"]["sum"] == "ok" and m["lina"]["sum"] == "ok"
assert m["lina"]["micro_ops"] == 16 and m["fifo"]["micro_ops"] == 1, m
' "$tmp/ct.json"; then ok; else bad "bench contention JSON: modes, sums or micro-op counts wrong"; fi
expect 0 "^fifo .* ok$" -- mpi 2 "$MOE" bench contention --a2a-bytes 4K --layers 1 --gap-ms 0 \
  --sum-bytes 8K --deterministic off --rounds 1 --warmup 0
expect 2 "--layers \(0\) must be in \[1, 1000\]" -- "$MOE" bench contention --layers 0
# 0 bytes to sum, as the help allows: only the all-to-alls alone
expect 0 "^alone " -- "$MOE" bench contention --a2a-bytes 4K --layers 1 --gap-ms 0 --sum-bytes 0 \
  --bucket-bytes 0 --rounds 1 --warmup 0
expect 2 "--micro-op-kb \(0\) must be in \[1, 1048576\]" -- "$MOE" bench contention --micro-op-kb 0
expect 2 "--gap-ms" -- "$MOE" bench contention --gap-ms -1
expect 2 "--deterministic" -- "$MOE" bench contention --deterministic maybe
expect 2 "'nope' is unknown" -- "$MOE" bench contention --algo nope
expect 2 "unknown option '--bogus' for 'moe bench contention'" -- "$MOE" bench contention --bogus
expect 2 "lower --a2a-bytes or --sum-bytes, or raise --max-memory" -- mpi 2 "$MOE" bench contention \
  --sum-bytes 1G --max-memory 64M
if command -v gnuplot >/dev/null; then
  if [[ -s "$tmp/loss.txt" ]]; then ok; else bad "no loss plot"; fi
fi
# stdout only: stderr may carry a warning (e.g. about OPENBLAS_CORETYPE set in the environment)
out=$("$MOE" sample --checkpoint "$tmp/c.ckpt" --prompt "the cat" --length 40 2>"$tmp/sample.err")
if [[ $? -eq 0 && "$out" == "the cat"* && ${#out} -ge 47 ]]; then ok; else bad "sample: $out $(cat "$tmp/sample.err")"; fi
out2=$("$MOE" sample --checkpoint "$tmp/c.ckpt" --prompt "the cat" --length 40 2>/dev/null)
if [[ "$out" == "$out2" ]]; then ok; else bad "sample is not deterministic"; fi

# --profile: two predictions, each under its own label. The plan line gives the
# whole layer time and its pass makespans; the summary compares the measured
# pass makespans with the same predicted pass makespans.
SRC=$(cd "$(dirname "$0")/.." && pwd)
out=$(mpi 2 "$MOE" train "${TINY[@]}" --steps 3 --quiet --schedule auto --chunks auto \
  --profile "$SRC/docs/results/profile_2x1_1g_adaptive.json" 2>&1)
plan_pass=$(grep -oE "^plan: .*predicted per MoE layer, forward \+ backward: layer time [0-9.]+ ms = pass makespans [0-9.]+ ms \+ outside the passes \(gate, routing\) [0-9.]+ ms$" <<<"$out" |
  sed -E 's/.*pass makespans ([0-9.]+) ms.*/\1/')
sum_pass=$(grep -oE "^  pass makespans per MoE layer \(forward \+ backward\): measured [0-9.]+ ms \(median, rank 0\), predicted [0-9.]+ ms" <<<"$out" |
  sed -E 's/.*predicted ([0-9.]+) ms/\1/')
if [[ -n $plan_pass && $plan_pass == "$sum_pass" ]] && ! grep -q "MoE layer passes" <<<"$out"; then ok; else
  bad "--profile: plan's pass makespans '$plan_pass' vs summary's predicted '$sum_pass':"
  echo "$out" | tail -4 >&2
fi

# Resume: 12 steps stopped at 6 then resumed equal the uninterrupted run's metrics.
mpi 2 "$MOE" train "${TINY[@]}" --steps 12 --metrics "$tmp/full.jsonl" --quiet >/dev/null 2>&1
mpi 2 "$MOE" train "${TINY[@]}" --steps 12 --stop-at 6 --checkpoint "$tmp/r.ckpt" \
  --metrics "$tmp/part.jsonl" --quiet >/dev/null 2>&1
# (no --steps: the checkpoint's schedule, 12 steps, is kept and run to its end)
mpi 2 "$MOE" train "${TINY[@]}" --resume "$tmp/r.ckpt" --metrics "$tmp/part.jsonl" \
  --quiet >"$tmp/resume.out" 2>&1
# The resumed run's summary starts its validation at the checkpoint (step 6,
# the stopped run's last value), not at its own first validation (step 10).
v6=$(python3 -c 'import json,sys; print("%.4f" % [r for r in map(json.loads, open(sys.argv[1])) if r["step"] == 6][0]["val_loss"])' "$tmp/part.jsonl")
if grep -qE "^  val loss: +$v6 -> [0-9.]+ nats .* at steps 6 -> 12 \(the first: the resumed checkpoint\)" \
  "$tmp/resume.out"; then ok; else
  bad "resumed summary's val loss does not start at step 6 ($v6):"
  grep "val loss" "$tmp/resume.out" >&2
fi
if python3 - "$tmp/full.jsonl" "$tmp/part.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 12, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"] and x["loss"] == y["loss"], (x, y)
    if "val_loss" in x:  # the stopped run also validates at its last step
        assert x["val_loss"] == y.get("val_loss"), (x, y)
PY
then ok; else bad "resumed metrics differ from the uninterrupted run"; fi

# Resuming with more --steps keeps the checkpoint's lr schedule (warm-up and
# cosine to step 12): steps 7..12 have the uninterrupted run's lr and losses,
# steps 13..20 run at min_lr; rank 0 says where it resumed and which schedule
# it kept. Another --lr, or fewer --steps, is refused.
out=$(mpi 2 "$MOE" train "${TINY[@]}" --steps 20 --resume "$tmp/r.ckpt" --metrics "$tmp/ext.jsonl" \
  --quiet 2>&1)
if grep -qE "^resume: $tmp/r.ckpt at step 6 \(continuing at step 7\); lr schedule kept from the checkpoint: warm-up 2 steps to lr 0.003, cosine decay to min_lr 0.0003 at step 12; steps 13..20 \(past its end\) at min_lr 0.0003$" <<<"$out" &&
  python3 - "$tmp/full.jsonl" "$tmp/ext.jsonl" <<'PY'
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert sorted(b) == list(range(7, 21)), sorted(b)
for s in range(7, 13):
    assert a[s]["lr"] == b[s]["lr"] and a[s]["loss"] == b[s]["loss"], (a[s], b[s])
for s in range(13, 21):
    assert abs(b[s]["lr"] - 3e-4) < 1e-10, b[s]
PY
then ok; else bad "resume with more --steps: schedule not kept, output:"; echo "$out" | head -3 >&2; fi
expect 2 "schedule is kept on resume .*asks for lr 0.01" -- mpi 2 "$MOE" train "${TINY[@]}" \
  --resume "$tmp/r.ckpt" --lr 0.01 --quiet
expect 2 "--steps 10 would end it early: use --stop-at 10" -- mpi 2 "$MOE" train "${TINY[@]}" \
  --resume "$tmp/r.ckpt" --steps 10 --quiet
# Resumed with balancing the checkpoint did not have: a warning (seen by
# default) that the copies are planned afresh
expect 0 "r.ckpt: 2 of 2 MoE blocks plan their copies afresh from step 7 \(block 0 has no balancer state\)" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --resume "$tmp/r.ckpt" --balance eplb --eval-every 0 \
  --checkpoint "$tmp/rb.ckpt"
# A resumed run appends to a routing trace of its own shape only: another
# run's trace or a file that is no trace is refused and left as it was; an
# empty file gets the header
printf '%s\n' '{"format": "libmoe-routing-trace", "version": 1, "ranks": 1, "experts": 8, "top_k": 2, "tokens_per_rank": 256, "moe_layers": [0]}' \
  >"$tmp/other.jsonl"
printf 'not a trace\n' >"$tmp/junk.jsonl"
cp "$tmp/other.jsonl" "$tmp/other.snap"
cp "$tmp/junk.jsonl" "$tmp/junk.snap"
expect 2 "the routing trace '.*other.jsonl' was written by another run \(ranks 1, experts 8, top_k 2, tokens per rank 256, 1 MoE layers\); this run has 2, 4, " -- \
  mpi 2 "$MOE" train "${TINY[@]}" --resume "$tmp/r.ckpt" --routing-trace "$tmp/other.jsonl" --quiet
expect 2 "appends to the routing trace '.*junk.jsonl', which cannot be read" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --resume "$tmp/r.ckpt" --routing-trace "$tmp/junk.jsonl" --quiet
if cmp -s "$tmp/other.jsonl" "$tmp/other.snap" && cmp -s "$tmp/junk.jsonl" "$tmp/junk.snap"; then ok; else
  bad "a refused routing trace was changed"
fi
# A run killed mid-write after its checkpoint (steps 5-6 written, the last
# line cut): resumed from the checkpoint, the trace keeps the checkpoint's
# steps, drops the rest with a warning, and ends byte for byte as the
# uninterrupted run's
mpi 2 "$MOE" train "${TINY[@]}" --steps 8 --stop-at 4 --checkpoint "$tmp/rt4.ckpt" --quiet >/dev/null 2>&1
mpi 2 "$MOE" train "${TINY[@]}" --steps 8 --stop-at 6 --routing-trace "$tmp/rtk.jsonl" --quiet \
  >/dev/null 2>&1
head -c -20 "$tmp/rtk.jsonl" >"$tmp/rtp.jsonl"
expect 0 "rtp.jsonl: kept 8 lines through step 4 \(the checkpoint's\); dropped 3 after it and a partial last line" -- \
  mpi 2 "$MOE" train "${TINY[@]}" --steps 8 --resume "$tmp/rt4.ckpt" --routing-trace "$tmp/rtp.jsonl"
mpi 2 "$MOE" train "${TINY[@]}" --steps 8 --routing-trace "$tmp/rtfull.jsonl" --quiet >/dev/null 2>&1
if cmp -s "$tmp/rtfull.jsonl" "$tmp/rtp.jsonl"; then ok; else
  bad "a resumed routing trace differs from the uninterrupted run's"
fi
: >"$tmp/empty.jsonl"
mpi 2 "$MOE" train "${TINY[@]}" --resume "$tmp/r.ckpt" --routing-trace "$tmp/empty.jsonl" --quiet \
  >/dev/null 2>&1
if head -1 "$tmp/empty.jsonl" | grep -q '"format": *"libmoe-routing-trace".*"ranks": *2'; then ok; else
  bad "an empty routing trace got no header on resume"
fi

# A corrupted checkpoint: clear error from sample and train; the file is not touched.
cp "$tmp/c.ckpt" "$tmp/bad.ckpt"
printf '\xff\xff\xff\xff' | dd of="$tmp/bad.ckpt" bs=1 seek=5000 conv=notrunc status=none
cp "$tmp/bad.ckpt" "$tmp/bad.snap"
expect 2 "checksum" -- "$MOE" sample --checkpoint "$tmp/bad.ckpt"
expect 2 "checksum" -- mpi 2 "$MOE" train "${TINY[@]}" --steps 20 --resume "$tmp/bad.ckpt" \
  --checkpoint "$tmp/bad.ckpt"
if cmp -s "$tmp/bad.ckpt" "$tmp/bad.snap"; then ok; else bad "corrupted checkpoint was modified"; fi
head -c 3000 "$tmp/c.ckpt" >"$tmp/trunc.ckpt"
expect 2 "truncated" -- "$MOE" sample --checkpoint "$tmp/trunc.ckpt"

# A killed rank: the job must end with an error, not hang.
"$MPIEXEC" -n 2 $OVERSUB "$MOE" train "${TINY[@]}" --steps 1000000 --eval-every 0 \
  --metrics "$tmp/k.jsonl" --quiet >"$tmp/kill.log" 2>&1 &
bg=$!
for _ in $(seq 1 150); do  # up to 30 s for the job to start stepping
  [[ -s "$tmp/k.jsonl" ]] && break
  sleep 0.2
done
victim=""  # the newest rank: a process below the launcher running moe train
for p in $(descendants "$bg"); do
  if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$MOE train"; then victim=$p; fi
done
if [[ -z "$victim" ]]; then
  bad "no rank of the job to kill (did it start?)"
else
  t0=$(date +%s)
  kill -9 "$victim"
  ended=0
  for _ in $(seq 1 300); do  # up to 60 s
    if ! kill -0 "$bg" 2>/dev/null; then ended=1; break; fi
    sleep 0.2
  done
  if [[ $ended -eq 1 ]]; then
    wait "$bg"
    rc=$?
    if [[ $rc -ne 0 ]]; then ok; else bad "killed job exited 0"; fi
    echo "killed rank: job ended after $(( $(date +%s) - t0 )) s with exit $rc"
  else
    bad "job still running 60 s after a rank was killed"
  fi
  bg=""
fi

finish train_cli_test
