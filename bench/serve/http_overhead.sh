#!/usr/bin/env bash
# A request's latency through `moe serve` (HTTP, streamed) against the same
# generation through `moe generate`, one request at a time, interleaved rounds.
#   bash bench/serve/http_overhead.sh CHECKPOINT [ROUNDS] [TOKENS] [MOE]
# moe generate: each line's total_ms (--timings; one slot, so one at a time,
# its queue time subtracted). moe serve, not streamed: curl's time_total for
# the same 10 requests one after another. moe serve, streamed: moe bench serve,
# closed loop, one in flight, end-to-end latency (sending to the last byte).
set -euo pipefail
ckpt=${1:?usage: http_overhead.sh CHECKPOINT [ROUNDS] [TOKENS] [MOE]}
rounds=${2:-5}
tokens=${3:-128}
moe=${4:-build/moe}
tmp=$(mktemp -d)
srv=""
cleanup() {
  if [[ -n "$srv" ]]; then kill -TERM "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
for i in $(seq 0 9); do
  printf '{"prompt":"%s","max_tokens":%d,"temperature":0.8,"seed":%d}\n' \
    "$(head -c 32 /dev/zero | tr '\0' 'a')" "$tokens" "$i"
done >"$tmp/p.jsonl"
"$moe" serve --checkpoint "$ckpt" --port 0 --slots 1 >"$tmp/srv.log" 2>&1 &
srv=$!
for _ in $(seq 1 600); do grep -q listening "$tmp/srv.log" && break; sleep 0.1; done
port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/srv.log" | grep -o '[0-9]*$')
: >"$tmp/gen"; : >"$tmp/http"; : >"$tmp/plain"
for r in $(seq "$rounds"); do
  "$moe" generate --checkpoint "$ckpt" --input "$tmp/p.jsonl" --output "$tmp/o.jsonl" --slots 1 --timings --quiet
  python3 -c 'import json,sys
for l in open(sys.argv[1]): j=json.loads(l); print(j["total_ms"]-j["queue_ms"])' "$tmp/o.jsonl" >>"$tmp/gen"
  while read -r line; do
    curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port/v1/completions" -d "$line" |
      awk '{print 1000 * $1}' >>"$tmp/plain"
  done <"$tmp/p.jsonl"
  "$moe" bench serve --url "http://127.0.0.1:$port" --requests 10 --concurrency 1 \
    --prompt-len 32 --output-len "$tokens" --json "$tmp/b.json" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["latency_ms"][0])' "$tmp/b.json" >>"$tmp/http"
done
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
g=$(median <"$tmp/gen"); h=$(median <"$tmp/http"); pl=$(median <"$tmp/plain")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "one request of $tokens tokens at a time, medians over $rounds rounds x 10 requests ($cpu)"
echo
echo "| path | latency ms | vs moe generate |"
echo "|---|---|---|"
awk -v g="$g" -v h="$h" -v pl="$pl" 'BEGIN { printf "| moe generate (in process) | %.1f | 1.000 |\n| moe serve (HTTP, one JSON answer, curl) | %.1f | %.3f |\n| moe serve (HTTP, streamed, moe bench serve) | %.1f | %.3f |\n", g, pl, pl / g, h, h / g }'
