#!/usr/bin/env bash
# Latency against offered load of `moe serve` at several rank counts: for each
# P, a server under mpirun -n P, then `moe bench serve` open loop at each rate.
#   bash bench/serve/curve.sh CHECKPOINT "1 2 4" "2 5 10 20" [REQUESTS] [MOE] [MPIRUN]
# Prints one table row per (P, rate): achieved requests/s and tokens/s, TTFT,
# inter-token and end-to-end latency p50/p95, and the all-to-all share of the
# server's step time. Requests: prompts 16-64 bytes, outputs 32-96 tokens.
set -euo pipefail
ckpt=${1:?usage: curve.sh CHECKPOINT "RANKS..." "RATES..." [REQUESTS] [MOE] [MPIRUN]}
ranks=${2:-"1 2 4"}
rates=${3:-"2 5 10 20"}
requests=${4:-60}
moe=${5:-build/moe}
mpirun=${6:-mpirun}
tmp=$(mktemp -d)
srv=""
cleanup() {
  if [[ -n "$srv" ]]; then kill -USR1 "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "moe serve under load: $requests requests per point, prompts 16-64 bytes, outputs 32-96 tokens, open loop ($cpu, $(nproc) cores)"
echo
echo "| ranks | offered req/s | achieved req/s | tokens/s | TTFT p50 / p95 ms | ITL p50 / p95 ms | latency p50 / p95 ms | a2a share |"
echo "|---|---|---|---|---|---|---|---|"
for p in $ranks; do
  "$mpirun" -n "$p" --oversubscribe "$moe" serve --checkpoint "$ckpt" --port 0 --slots 32 >"$tmp/srv.log" 2>&1 &
  srv=$!
  port=""
  for _ in $(seq 1 600); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/srv.log" | grep -o '[0-9]*$' || true)
    [[ -n "$port" ]] && break
    sleep 0.1
  done
  [[ -n "$port" ]] || { echo "server did not start: $(cat "$tmp/srv.log")" >&2; exit 1; }
  for r in $rates; do
    "$moe" bench serve --url "http://127.0.0.1:$port" --requests "$requests" --rate "$r" \
      --concurrency 256 --prompt-len 16-64 --output-len 32-96 --json "$tmp/r.json" >/dev/null
    python3 - "$p" "$r" "$tmp/r.json" <<'PY'
import json, sys
p, rate, f = sys.argv[1], sys.argv[2], sys.argv[3]
j = json.load(open(f))
print(f"| {p} | {rate} | {j['requests_per_s']:.2f} | {j['tokens_per_s']:.0f} | "
      f"{j['ttft_ms'][0]:.0f} / {j['ttft_ms'][1]:.0f} | {j['itl_ms'][0]:.1f} / {j['itl_ms'][1]:.1f} | "
      f"{j['latency_ms'][0]:.0f} / {j['latency_ms'][1]:.0f} | {100 * j['a2a_share']:.1f}% |")
PY
  done
  kill -USR1 "$srv"
  wait "$srv" || true
  srv=""
done
