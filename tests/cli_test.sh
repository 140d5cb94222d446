#!/usr/bin/env bash
# CLI behaviour: help, version, exit codes (0 ok, 2 invalid input) and the
# messages that name the bad option, and a tiny `moe bench layer --json` run.
# Usage: cli_test.sh path/to/moe
set -u
MOE=${1:?usage: cli_test.sh path/to/moe}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
cat >"$tmp/bad_profile.json" <<'JSON'
{"profile_version": 1, "colour": "blue"}
JSON
cat >"$tmp/bad_cluster.json" <<'JSON'
{"name": "bad", "device": "d", "nodes": 0, "devices_per_node": 4, "gemm_tflops": 10,
 "intra": {"gbit_per_s": 96, "latency_us": 5}, "inter": {"gbit_per_s": 100, "latency_us": 5}}
JSON
expect 0 "bench layer" -- "$MOE" --help
expect 0 "version" -- "$MOE" help
expect 2 "usage: moe" -- "$MOE"
expect 0 "features: mpi=(yes|no) blas=.* zfp=(yes|no) onednn=(yes|no) bf16=(native|emulated) cuda=(yes|no)" -- "$MOE" version
expect 2 "unknown command 'frobnicate'" -- "$MOE" frobnicate
expect 0 "--capacity-factor" -- "$MOE" bench layer --help
expect 2 "unknown benchmark 'nope'" -- "$MOE" bench nope
expect 2 "unknown option '--bogus'" -- "$MOE" bench layer --bogus
expect 2 "--tokens \(-5\) must be in \[1, " -- "$MOE" bench layer --tokens -5
expect 2 "--experts \(0\) must be in \[1, 65536\]" -- "$MOE" bench layer --experts 0
expect 2 "--model expects an integer, got 'abc'" -- "$MOE" bench layer --model abc
expect 2 "--hidden \(0\) must be in" -- "$MOE" bench layer --hidden 0
expect 2 "--topk \(9\) must be in \[1, 8\] \(the number of experts\)" -- "$MOE" bench layer --experts 8 --topk 9
expect 2 "--seed \(-1\) must be an integer in \[0, " -- "$MOE" bench layer --seed -1
expect 2 "--seed \(99999999999999999999999\) must be" -- "$MOE" bench layer --seed 99999999999999999999999
expect 2 "--threads \(0\) must be in \[1, 256\]" -- "$MOE" bench layer --threads 0
expect 2 "version takes no arguments" -- "$MOE" version extra
# skew of the router (a fitted bias): bad specs name the valid forms; a skewed run reports its fit
expect 2 "--skew: skew 'zipf:0' needs|zipf needs an exponent S in \(0, 10\]" -- "$MOE" bench layer --skew zipf:0
expect 2 "skew 'gauss' is unknown \(valid: none, uniform, zipf:S" -- "$MOE" bench layer --skew gauss
expect 2 "hot needs the fraction F in \(0, 1\]" -- "$MOE" bench layer --skew hot:2
expect 0 "skew: hot:0.5 \(router bias fitted to total variation 0\.0" -- "$MOE" bench layer --skew hot:0.5 --tokens 256 --model 32 --hidden 32 --iters 1 --peak-size 64
# a skew replayed from a routing trace: fitted; another shape and a missing file are usage errors
printf '%s\n' '{"format": "libmoe-routing-trace", "version": 1, "ranks": 1, "experts": 4, "top_k": 2, "tokens_per_rank": 64, "moe_layers": [0]}' \
  '{"step": 1, "layer": 0, "counts": [[40, 40, 30, 18]]}' >"$tmp/trace.jsonl"
expect 0 "skew: trace:$tmp/trace.jsonl \(router bias fitted to total variation 0\.0" -- "$MOE" bench layer --experts 4 \
  --skew "trace:$tmp/trace.jsonl" --tokens 256 --model 32 --hidden 32 --iters 1 --peak-size 64
expect 2 "recorded with 4 experts and top_k 2; this layer has 8 experts" -- "$MOE" bench layer --experts 8 \
  --skew "trace:$tmp/trace.jsonl" --tokens 256 --model 32 --hidden 32 --iters 1
expect 2 "cannot open the routing trace '$tmp/none.jsonl'" -- "$MOE" bench layer --skew "trace:$tmp/none.jsonl"
# load balancing: unknown policy, one rank (EP 1), too many slots
expect 2 "--balance: policy 'magic' is unknown \(valid: none, shadow, prophet, eplb, auto, all\)" -- "$MOE" bench layer --balance magic
expect 2 "--balance needs an EP size of at least 2 \(got 1\)" -- "$MOE" bench layer --balance shadow --tokens 64 --model 32 --hidden 32
expect 2 "--replan-every \(0\) must be in \[1, 1000000\]" -- "$MOE" bench layer --balance eplb --replan-every 0
expect 0 "prophet +[0-9]+ +[0-9.]+ +[0-9.]+" -- "$MOE" simulate --balance all --cluster proprophet-4x4-rtx3090 --tokens 1024 --model 256 --hidden 512 --experts 16
expect 2 "--balance: policy 'x' is unknown" -- "$MOE" simulate --balance x
# --balance's JSON; a policy named twice is planned once; the options of other
# simulations are refused with it, and its own without it
expect 0 "wrote $tmp/bal.json" -- "$MOE" simulate --balance shadow,eplb,shadow --cluster \
  proprophet-4x4-rtx3090 --tokens 1024 --model 256 --hidden 512 --experts 16 --json "$tmp/bal.json"
if /usr/bin/env python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
p = d["policies"]
assert d["cluster"] == "proprophet-4x4-rtx3090" and d["skew"] == "zipf:1.2" and d["slots"] == 1, d
assert [x["policy"] for x in p] == ["shadow", "eplb"], p
assert all(x["ratio_after"] <= x["ratio_before"] and x["prophet_ms"] <= x["prophet_none_ms"] for x in p), p
assert p[0]["fastermoe_ms"] <= p[0]["fastermoe_none_ms"] and p[0]["copies"] > 0, p
' "$tmp/bal.json" 2>/dev/null; then
  ok
else
  bad "moe simulate --balance --json wrote no valid JSON"
fi
expect 2 "--skew belongs to --balance" -- "$MOE" simulate --skew zipf:2
expect 2 "--balance-slots belongs to --balance" -- "$MOE" simulate --balance-slots 3
expect 2 "--schedule belongs to the schedules' simulation; --balance simulates without it" -- \
  "$MOE" simulate --balance all --schedule sequential
expect 2 "--a2a belongs to the schedules' simulation; --parm simulates without it" -- \
  "$MOE" simulate --parm --a2a pipe
expect 2 "--capacity-factor does not apply to --balance" -- "$MOE" simulate --balance all \
  --capacity-factor 0.1
expect 2 "--lina-pack belongs to --lina" -- "$MOE" simulate --lina-pack 3
expect 2 "--skew none is the router as initialised" -- "$MOE" simulate --balance all --skew none
expect 2 "--json is not written by --lina-train" -- "$MOE" simulate --lina-train --json "$tmp/lt.json"
# Lina's training step: four policies on Lina's testbed; bad options
expect 0 "^packing +8 .* 1\.[0-9]{2}x$" -- "$MOE" simulate --lina-train --layers 4
expect 0 "lina-4x4-a100 \(4 x 4 A100-40GB\), 4 blocks \(2 MoE\)" -- "$MOE" simulate --lina-train --layers 4
expect 2 "packing \(3\) must divide the devices" -- "$MOE" simulate --lina-train --packing 3
expect 2 "--contention \(0.5\) must be in" -- "$MOE" simulate --lina-train --contention 0.5
expect 2 "different simulations" -- "$MOE" simulate --lina-train --balance eplb
expect 2 "--layers belongs to --lina-train" -- "$MOE" simulate --layers 4
expect 2 "moe_every \(13\) must be in \[1, 12\] \(the layers: else no block is MoE\)" -- "$MOE" \
  simulate --lina-train --moe-every 13
# Parm's schedules: a row of the grid on testbed A, testbed B at 16 devices, JSON; bad layouts
expect 0 "^ +2048 +1024 +1024 +1\.2 +1 +2 +2 +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+x +s[12] +s[12] +yes$" -- \
  "$MOE" simulate --parm --tokens 2048 --model 1024 --hidden 1024 --capacity-factor 1.2
expect 0 "s1 +[0-9.]+-[0-9.]+x +\(paper: 2\.1-4\.19x testbed A, 2\.46-5\.77x testbed B\)" -- "$MOE" simulate --parm
expect 0 "parm-8x4-rtx2080ti-100g \(4 x 4 RTX 2080 Ti" -- "$MOE" simulate --parm \
  --cluster parm-8x4-rtx2080ti-100g --devices 16 --mp 2 --esp 2,4 --tokens 2048 --json "$tmp/parm.json"
if /usr/bin/env python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d["rows"]
assert d["cluster"] == "parm-8x4-rtx2080ti-100g" and len(r) == 16
assert all(x["mp"] == 2 and x["ep"] * x["esp"] == 8 for x in r)
assert all(x["schedules"]["baseline"]["speedup"] == 1 and x["schedules"]["s1"]["total_ms"] > 0 for x in r)
' "$tmp/parm.json" 2>/dev/null; then
  ok
else
  bad "moe simulate --parm --json wrote no valid JSON"
fi
expect 2 "MP x EP x ESP \(4 x 1 x 4 = 16\) must divide the devices \(8\)" -- "$MOE" simulate --parm --mp 4 --esp 4
expect 2 "hidden dimension H \(1002\) must be divisible by ESP \(4\)" -- "$MOE" simulate --parm --hidden 1002 --mp 1 --esp 4
expect 2 "experts \(3\) must be divisible by EP \(2\)" -- "$MOE" simulate --parm --experts 3 --mp 2 --esp 2
expect 2 "--esp: '0' must be an integer in \[1, " -- "$MOE" simulate --parm --esp 0
expect 2 "--mp belongs to --parm" -- "$MOE" simulate --mp 2
expect 2 "different simulations" -- "$MOE" simulate --parm --lina-train
# the topology-aware gate: a bad spec; 2 ranks as 2 nodes report the rows that crossed nodes
expect 2 "--gate: gate 'topo:0' ?: the ratio W_net/W_local must be a number in \(0, 1\]" -- "$MOE" bench layer --gate topo:0
# compute backend and precision: unknown names, and bf16 on a backend without a bf16 GEMM
expect 2 "--backend: unknown compute backend 'cublas' \(valid: fixed, openblas" -- "$MOE" bench layer --backend cublas
expect 2 "--precision: unknown precision 'fp16' \(valid: fp32, bf16\)" -- "$MOE" bench layer --precision fp16
expect 2 "precision bf16: the openblas backend has no bf16 GEMM" -- "$MOE" bench layer --precision bf16 --backend openblas --tokens 64 --model 32 --hidden 32
if ! "$MOE" version | grep -q "bf16=native"; then
  expect 2 "precision bf16: this CPU has no AVX512_BF16" -- "$MOE" bench layer --precision bf16 --tokens 64 --model 32 --hidden 32
fi
expect 2 "usage: moe bench" -- "$MOE" bench
expect 2 "activation 'tanh' is unknown \(valid: gelu, relu\)" -- "$MOE" bench layer --act tanh
expect 2 "option --iters needs a value" -- "$MOE" bench layer --iters
expect 2 "--capacity-factor expects a finite number" -- "$MOE" bench layer --capacity-factor nan
echo '{"num_experts": 4, "colour": "blue"}' >"$tmp/bad.json"
expect 2 "unknown key 'colour'" -- "$MOE" bench layer --config "$tmp/bad.json"
echo '{"num_experts": ' >"$tmp/broken.json"
expect 2 "malformed JSON" -- "$MOE" bench layer --config "$tmp/broken.json"
expect 2 "cannot open '$tmp/missing.json'" -- "$MOE" bench layer --config "$tmp/missing.json"
expect 2 "'$tmp' is not a regular file" -- "$MOE" bench layer --config "$tmp"
echo '{"num_experts": 4} trailing' >"$tmp/trailing.json"
expect 2 "malformed JSON" -- "$MOE" bench layer --config "$tmp/trailing.json"
echo '{"num_experts": 4, "num_experts": 8}' >"$tmp/dup.json"
expect 2 "key 'num_experts' appears twice" -- "$MOE" bench layer --config "$tmp/dup.json"
expect 2 "cannot write '$tmp/no/such/dir/out.json.tmp'" -- "$MOE" bench layer --tokens 8 --json "$tmp/no/such/dir/out.json"

# A tiny real run: table on stdout, JSON with the documented keys.
expect 0 "expert GEMM GFLOP/s" -- "$MOE" bench layer --tokens 64 --model 16 --hidden 32 --experts 4 \
  --topk 2 --iters 2 --warmup 1 --peak-size 64 --json "$tmp/out.json"
for key in fwd_ms bwd_ms expert_gflops peak_gflops tokens_per_s config; do
  if grep -q "\"$key\"" "$tmp/out.json" 2>/dev/null; then
    ok
  else
    bad "JSON lacks \"$key\""
  fi
done
# Dropless and relu also run.
expect 0 "routing: dropless" -- "$MOE" bench layer --tokens 32 --model 8 --hidden 8 --experts 2 \
  --topk 1 --capacity-factor 0 --act relu --iters 1 --warmup 0 --peak-size 64

# bench compress
expect 0 "int8" -- "$MOE" bench compress --rows 64 --cols 96 --iters 2
expect 2 "'lz4'" -- "$MOE" bench compress --compress lz4
expect 2 "--rows" -- "$MOE" bench compress --rows 0

# bench a2a (MPI singleton: one rank, no mpirun needed).
if "$MOE" version | grep -q "mpi=yes"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  expect 0 "--counts uniform\|skewed" -- "$MOE" bench a2a --help
  expect 2 "'nope' is unknown \(valid: mpi, pairwise, 1dh, 2dh, pipe, grouped\)" -- "$MOE" bench a2a --algo nope
  expect 2 "--counts 'zipf' is unknown" -- "$MOE" bench a2a --counts zipf
  expect 2 "'nope' is unknown" -- "$MOE" bench a2a --algo mpi,nope
  expect 0 "^bare .* ok" -- "$MOE" bench a2a --algo mpi,bare --min-bytes 64 --max-bytes 64 --iters 1 --check
  expect 2 "--min-bytes \(9\) must be <= --max-bytes \(8\)" -- "$MOE" bench a2a --min-bytes 9 --max-bytes 8
  expect 2 "--max-bytes \(-1\) must be an integer" -- "$MOE" bench a2a --max-bytes -1
  expect 0 "grouped +4096 .* ok" -- "$MOE" bench a2a --min-bytes 1024 --max-bytes 4096 --iters 2 --check \
    --counts skewed --json "$tmp/a2a.json"
  if grep -q '"algo": "bare"' "$tmp/a2a.json" 2>/dev/null; then
    ok
  else
    bad "bench a2a JSON lacks the bare rows"
  fi
fi

# The distributed bench layer (moe_ep_layer with the schedules), as an MPI
# singleton: table, JSON with every variant, merged Chrome trace.
if "$MOE" version | grep -q "mpi=yes"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  expect 0 "--schedule LIST" -- "$MOE" bench layer --help
  expect 0 "^mpi +none +smart " -- "$MOE" bench layer --schedule all --chunks 2 --tokens 64 --model 32 \
    --hidden 64 --iters 1 --warmup 0 --json "$tmp/ep.json" --trace "$tmp/ep.trace"
  if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = d["configs"][0]["variants"]
assert d["benchmark"] == "layer_ep" and len(v) >= 4, len(v)
assert v[0]["schedule"] == "sequential" and v[0]["chunks"] == 1
for x in v:
    for k in ("fwd_ms", "bwd_ms", "total_ms", "speedup", "comm_ms", "comp_ms",
              "exposed_comm_ms", "bound", "overlap_efficiency", "fwd_pass", "bwd_pass"):
        assert k in x, k
assert {x["schedule"] for x in v} >= {"sequential", "pipeline", "optsche", "smart"}
' "$tmp/ep.json" 2>/dev/null; then
    ok
  else
    bad "distributed bench layer JSON lacks variants or keys"
  fi
  if python3 -c '
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
assert {"compute", "comm"} <= names, names
assert any(e["ph"] == "X" and e["tid"] == 1 for e in ev)
assert any(e["ph"] == "X" and e["tid"] == 0 for e in ev)
' "$tmp/ep.trace" 2>/dev/null; then
    ok
  else
    bad "distributed bench layer trace lacks compute/comm threads or events"
  fi
  expect 2 "--schedule: unknown schedule 'nope' \(valid: sequential, pipeline, optsche, smart\)" \
    -- "$MOE" bench layer --schedule nope
  expect 2 "--chunks \(0\) must be in \[1, 64\]" -- "$MOE" bench layer --chunks 0
  expect 2 "--compress: unknown compressor 'lz4' \(valid: none" -- "$MOE" bench layer --compress lz4
  expect 2 "--a2a: .*'nope' is unknown" -- "$MOE" bench layer --a2a nope
  expect 2 "--ep \(2\) must divide the number of ranks \(1\)" -- "$MOE" bench layer --ep 2
  expect 2 "--grid sets the tokens" -- "$MOE" bench layer --grid --tokens 64
  expect 2 "cannot write '$tmp/no/dir/t.json.tmp'" -- "$MOE" bench layer --tokens 8 --model 8 \
    --hidden 8 --iters 1 --trace "$tmp/no/dir/t.json"
fi

# moe simulate (no MPI): shipped clusters, a JSON file, JSON output, errors
here=$(cd "$(dirname "$0")" && pwd)
expect 0 "schemoe-8x4-rtx2080ti +8 +4" -- "$MOE" simulate --list-clusters
expect 0 "emulated-2x1-1g .*  1 CPU core \(OpenBLAS SGEMM, 1 thread\)" -- "$MOE" simulate --list-clusters
expect 0 "--cluster NAME\|FILE" -- "$MOE" simulate --help
expect 0 "optsche +2 .* 1\.[0-9]{3}" -- "$MOE" simulate --chunks 2 --json "$tmp/sim.json"
if /usr/bin/env python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = d["variants"]
assert d["cluster"] == "schemoe-8x4-rtx2080ti" and len(v) >= 8
base = [x for x in v if x["schedule"] == "sequential" and x["chunks"] == 1]
assert all(x["speedup"] == 1 for x in base)
assert all(x["total_ms"] > 0 for x in v)
' "$tmp/sim.json" 2>/dev/null; then
  ok
else
  bad "moe simulate --json wrote no valid JSON"
fi
expect 0 "lina-4x4-a100 \(4 x 4 A100" -- "$MOE" simulate --cluster "$here/../clusters/lina-4x4-a100.json" \
  --schedule optsche --a2a pipe
expect 0 "16 x 4|64 x 4" -- "$MOE" simulate --devices 256 --schedule optsche --a2a mpi
expect 2 "cluster 'nope' is not a shipped description \(shipped: .*schemoe" -- "$MOE" simulate --cluster nope
expect 2 "cluster: .*nodes \(0\) must be in" -- "$MOE" simulate --cluster "$tmp/bad_cluster.json"
expect 2 "devices \(6\) must be at most one node \(4\) or a multiple of 4" -- "$MOE" simulate --devices 6
expect 2 "--chunks: '0' must be an integer in \[1, 64\]" -- "$MOE" simulate --chunks 0
expect 2 "experts \(33\) must be divisible by the devices \(32\)" -- "$MOE" simulate --experts 33
expect 2 "algorithm 'nccl' is unknown" -- "$MOE" simulate --a2a nccl
expect 2 "unknown option '--bogus'" -- "$MOE" simulate --bogus
# moe roofline: sequential sits on the semi-ideal curve (no overlap), a text plot
expect 0 "--plot FILE" -- "$MOE" roofline --help
expect 0 "sequential +1 +[0-9.]+ +(0\.[0-9]+) +[0-9.]+ +\1 " -- "$MOE" roofline --a2a mpi \
  --schedule sequential
expect 0 "plotted|gnuplot is not installed" -- "$MOE" roofline --a2a mpi --schedule optsche \
  --plot "$tmp/roof.txt"
expect 2 "unknown option '--plot'" -- "$MOE" simulate --plot "$tmp/x.txt"
# labels do not overprint: numbered points, near ones share a label ("1,2"),
# and the numbers are listed with their variants beside the plot
expect 0 "plotted|gnuplot is not installed" -- "$MOE" roofline --a2a mpi --plot "$tmp/roof2.txt"
if grep -q "^set label 1 '1: sequential/mpi r=1' at screen" "$tmp/roof2.txt.gp" &&
  grep -qE '^[0-9.e+-]+ [0-9.e+-]+ "1,2' "$tmp/roof2.txt.dat"; then
  ok
else
  bad "roofline labels: $(head -5 "$tmp/roof2.txt.dat")"
fi

# moe calibrate (an MPI singleton) -> profile -> simulate --profile and bench layer auto
if "$MOE" version | grep -q "mpi=yes"; then
  expect 0 "--out FILE" -- "$MOE" calibrate --help
  expect 2 "--out FILE is required" -- "$MOE" calibrate
  expect 2 "--layers: '64:32' is not T:M:H:f" -- "$MOE" calibrate --out "$tmp/p2.json" --layers 64:32
  expect 2 "--layers: '64:32:64:-1' is not T:M:H:f" -- "$MOE" calibrate --out "$tmp/p2.json" \
    --layers 64:32:64:1.1,64:32:64:-1
  # the memory bound, before anything is measured or written: the expert fit's
  # buffers, and the all-to-all buffers held beside the later steps
  expect 2 "rank 0 of 1 needs more memory than it may use: workspace 160\.0 MiB \+ baseline .* the limit is 16\.0 MiB \(--max-memory, per rank\); lower --max-bytes" -- \
    "$MOE" calibrate --out "$tmp/p2.json" --max-memory 16M --no-layers
  expect 2 "needs more memory than it may use: all-to-all 2\.00 GiB \+ workspace 64\.0 MiB \+ baseline .* the limit is 1\.00 GiB" -- \
    "$MOE" calibrate --out "$tmp/p2.json" --max-bytes 1073741824 --no-layers --a2a mpi \
    --compress none --max-memory 1G
  expect 2 "--max-memory: size '0' must be between 1 byte" -- "$MOE" calibrate --out "$tmp/p2.json" \
    --max-memory 0
  expect 2 "--refit measures nothing, so '--max-memory' does not apply" -- "$MOE" calibrate \
    --refit "$tmp/x.json" --profile "$tmp/y.json" --out "$tmp/p2.json" --max-memory 1G
  if [[ -e "$tmp/p2.json" ]]; then bad "a refused calibrate wrote"; fi
  expect 0 "layer fit over 12 runs: compute x" -- "$MOE" calibrate --out "$tmp/prof.json" \
    --max-bytes 262144 --iters 1 --a2a mpi --compress none,int8 --layers 64:32:64:1.1,128:32:64:0 \
    --samples "$tmp/runs.json"
  if grep -q '"layer_fit": {"samples": 12' "$tmp/prof.json"; then ok; else
    bad "the profile has no layer_fit of 12 samples"; fi
  # --refit: the same runs give the same corrections. The profile prints every
  # number exactly (%.17g), so a refit of calibrate's own profile is calibrate's
  # profile byte for byte, and so is a refit of the refit.
  expect 0 "--refit: 12 layer runs from" -- "$MOE" calibrate --refit "$tmp/runs.json" \
    --profile "$tmp/prof.json" --out "$tmp/prof_re.json"
  expect 0 "wrote $tmp/prof_re2.json" -- "$MOE" calibrate --refit "$tmp/runs.json" \
    --profile "$tmp/prof_re.json" --out "$tmp/prof_re2.json"
  for f in prof_re prof_re2; do
    if cmp -s "$tmp/prof.json" "$tmp/$f.json"; then ok; else
      bad "--refit ($f) differs from calibrate's own fit"
      diff "$tmp/prof.json" "$tmp/$f.json" | head -10 >&2; fi
  done
  expect 2 "--refit FILE needs --profile IN" -- "$MOE" calibrate --refit "$tmp/runs.json" --out "$tmp/p2.json"
  expect 2 "'--iters' does not apply" -- "$MOE" calibrate --refit "$tmp/runs.json" \
    --profile "$tmp/prof.json" --iters 3 --out "$tmp/p2.json"
  expect 2 "--profile IN only goes with --refit" -- "$MOE" calibrate --profile "$tmp/prof.json" \
    --out "$tmp/p2.json"
  expect 2 "--no-layers skips it" -- "$MOE" calibrate --samples "$tmp/r2.json" --no-layers --out "$tmp/p2.json"
  sed 's/"total_ms"/"totl_ms"/' "$tmp/runs.json" > "$tmp/bad_runs.json"
  expect 1 "samples\[0\] has unknown key 'totl_ms'" -- "$MOE" calibrate --refit "$tmp/bad_runs.json" \
    --profile "$tmp/prof.json" --out "$tmp/p2.json"
  if [[ -e "$tmp/p2.json" || -e "$tmp/r2.json" ]]; then
    bad "a refused calibrate wrote"; fi
  expect 0 "wrote $tmp/prof_nl.json" -- "$MOE" calibrate --out "$tmp/prof_nl.json" --max-bytes 262144 \
    --iters 1 --a2a mpi --compress none --no-layers
  if grep -q layer_fit "$tmp/prof_nl.json"; then bad "--no-layers"
  else ok; fi
  expect 0 "optsche +2 " -- "$MOE" simulate --profile "$tmp/prof.json" \
    --tokens 64 --model 32 --hidden 64 --experts 2 --chunks 2
  expect 2 "cannot be combined with --cluster" -- "$MOE" simulate --profile "$tmp/prof.json" \
    --cluster lina-4x4-a100
  expect 2 "profile: .*unknown key 'colour'" -- "$MOE" simulate --profile "$tmp/bad_profile.json"
  expect 0 "plan \(config 1\): a2a mpi, compress none, .*predicted .* ms, best of [0-9]+ candidates" \
    -- "$MOE" bench layer --tokens 64 --model 32 --hidden 64 --experts 2 --schedule auto --chunks auto \
    --a2a auto --compress auto --profile "$tmp/prof.json" --iters 1 --warmup 0
  expect 0 "<- planned" -- "$MOE" bench layer --tokens 64 --model 32 --hidden 64 --experts 2 \
    --schedule auto --chunks auto --profile "$tmp/prof.json" --iters 1 --warmup 0
  expect 2 "'auto' needs a calibrated profile" -- "$MOE" bench layer --schedule auto
  # moe train with the planner: the same plan as bench layer's for the MoE
  # layer's shape (B/P x S = 4 x 16 = 64 tokens, M 32, H 64, E 4, dropless),
  # and the measured passes next to the predicted ones
  tiny=(--steps 3 --batch 4 --layers 2 --d-model 32 --heads 2 --seq-len 16 --experts 4
    --expert-hidden 64 --eval-every 0 --eval-batches 1 --quiet)
  expect 2 "'auto' needs a calibrated profile" -- "$MOE" train "${tiny[@]}" --chunks auto
  expect 2 "--allow-lossy only applies to --compress auto" -- "$MOE" train "${tiny[@]}" \
    --profile "$tmp/prof.json" --allow-lossy
  expect 2 "--profile: cannot open" -- "$MOE" train "${tiny[@]}" --profile "$tmp/none.json"
  auto=(--schedule auto --chunks auto --a2a auto --compress auto --profile "$tmp/prof.json")
  train_out=$("$MOE" train "${tiny[@]}" "${auto[@]}" 2>&1)
  bench_out=$("$MOE" bench layer --tokens 64 --model 32 --hidden 64 --experts 4 \
    --capacity-factor 0 "${auto[@]}" --iters 1 --warmup 0 2>&1)
  train_plan=$(grep -oE "^plan: a2a [a-z0-9]+, compress [a-z0-9:]+, schedule [a-z]+, r=[0-9]+" \
    <<<"$train_out" | sed 's/^plan: //')
  bench_plan=$(grep -oE "^plan \(config 1\): a2a [a-z0-9]+, compress [a-z0-9:]+, schedule [a-z]+, r=[0-9]+" \
    <<<"$bench_out" | sed 's/^plan (config 1): //')
  if [[ -n $train_plan && $train_plan == "$bench_plan" ]] &&
    grep -qE "pass makespans per MoE layer \(forward \+ backward\): measured [0-9.]+ ms .* predicted [0-9.]+ ms .* error [-+][0-9.]+%" \
      <<<"$train_out"; then
    ok
  else
    bad "train auto plan '$train_plan' vs bench layer '$bench_plan', output:"
    echo "$train_out" | tail -6 >&2
  fi
fi

finish cli_test
