#!/usr/bin/env bash
# `moe serve` end to end, driven over HTTP (tests/serve_client.py and curl): the
# API and its answers equal to `moe generate`'s for the same requests,
# streaming, 40 concurrent requests, bad requests, a client that disconnects
# mid-stream, metrics; the curl examples of README.md and docs/inference.md
# run as written (their JSON, the streams' "data: [DONE]" and concatenation);
# SIGTERM while requests are in flight (each ends with its answer or as
# "cancelled" at the drain timeout, exit 0, no process left); under mpirun -n 2
# the same answers and a full queue (503), then SIGUSR1 to mpirun with
# requests running and waiting (the same checks, no rank left); bad options
# and checkpoints (exit 2).
# Usage: serve_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: serve_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: serve_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
srv=""
on_exit() {
  if [[ -n "$srv" ]]; then
    local tree
    tree=$(descendants "$srv")
    # shellcheck disable=SC2086 # one pid per word
    kill -9 "$srv" $tree 2>/dev/null
  fi
}

if ! "$MOE" version | grep -q "http=yes"; then
  expect 1 "no HTTP server" -- "$MOE" serve --checkpoint x
  finish serve "(built without libmicrohttpd: only the refusal checked)"
  exit $?
fi

python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(5)
w = ["the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away!\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(20000)))
PY
"$MOE" train --data "$tmp/text.txt" --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4 \
  --expert-hidden 32 --batch 8 --steps 40 --eval-every 0 --quiet \
  --checkpoint "$tmp/tiny" >"$tmp/train.log" 2>&1 || bad "training the test model: $(tail -3 "$tmp/train.log")"

cat >"$tmp/p.jsonl" <<'J'
{"prompt":"the cat ","max_tokens":20,"temperature":0,"top_k":0,"top_p":1,"seed":0}
{"prompt":"a dog ran far away!\nthe ","max_tokens":70,"temperature":0.9,"top_k":8,"top_p":1,"seed":3}
{"prompt":"on a mat. ","max_tokens":40,"stop":["!","\n"],"temperature":0.8,"top_k":0,"top_p":0.9,"seed":5}
{"prompt":"","max_tokens":10,"temperature":1,"top_k":0,"top_p":1,"seed":7}
J
"$MOE" generate --checkpoint "$tmp/tiny" --input "$tmp/p.jsonl" --output "$tmp/gen.jsonl" --quiet ||
  bad "moe generate failed"

# start_server LOG ARGS...: the server in the background ($srv), its port in $port
start_server() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  srv=$!
  port=""
  for _ in $(seq 1 600); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$')
    [[ -n "$port" ]] && return 0
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.1
  done
  bad "the server did not start: $(cat "$log")"
  return 1
}

# stop_server LOG SIGNAL: the signal, then it must exit 0 within 120 s with no
# process left (Open MPI's singleton helper, orted, goes within seconds)
stop_server() {
  local tree rc
  tree=$(descendants "$srv")
  kill "-$2" "$srv"
  for _ in $(seq 1 1200); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$srv" 2>/dev/null; then
    bad "the server did not exit within 120 s of SIG$2"
    return
  fi
  wait "$srv"
  rc=$?
  srv=""
  if [[ $rc -eq 0 ]]; then ok; else bad "the server exited $rc after SIG$2: $(tail -3 "$1")"; fi
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086 # one pid per word
    if [[ -z "$tree" ]] || ! ps -p "$(echo $tree | tr ' ' ,)" >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  # shellcheck disable=SC2086 # one pid per word
  if [[ -z "$tree" ]] || ! ps -p "$(echo $tree | tr ' ' ,)" >/dev/null 2>&1; then ok; else bad "processes left after SIG$2: $(ps -o pid,cmd -p "$(echo $tree | tr ' ' ,)")"; fi
}

# stop_mpich LOG: MPICH's hydra: SIGTERM to the ranks themselves (not to its
# proxy), then stop_server's checks on mpiexec
stop_mpich() {
  local p
  for p in $(descendants "$srv"); do
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == "moe" ]] && kill -TERM "$p" 2>/dev/null
  done
  stop_server "$1" CONT
}

# under_load LOG N HUGE STAGGER STOP...: N requests to the server on $port
# (serve_client.py load: the first HUGE of 2^20 tokens, which cannot end before
# the shutdown cancels them; STAGGER 1: one at a time, for a queue of 1); once
# all N are accepted and a sequence runs (moe_running_sequences in /metrics),
# the command STOP... (stop_server: the signal, exit 0, no process left). Then
# every request has ended with a well-formed 200 answer, "length" at its
# max_tokens or "cancelled" below it (docs/inference.md: in flight finish
# within --drain-timeout, then end as cancelled), the HUGE ones cancelled, and
# the server's summary counts as many cancelled at shutdown as the clients saw.
under_load() {
  local log=$1 n=$2 huge=$3 stagger=$4 base client res out=$1.load.txt
  shift 4
  base=$(python3 "$here/serve_client.py" "$port" accepted) || base=0
  python3 "$here/serve_client.py" "$port" load "$n" "$huge" "$base" "$stagger" "$out" &
  client=$!
  if python3 "$here/serve_client.py" "$port" inflight "$base" "$n"; then ok; else bad "no $n requests in flight"; fi
  "$@"
  wait "$client"
  if res=$(python3 "$here/serve_client.py" - ended "$out" "$n" "$huge"); then
    ok
  else
    bad "requests in flight at the signal: $(tr '\n' ';' <"$out")"
  fi
  if [[ $res =~ ^cancelled\ ([0-9]+)$ ]] &&
    grep -q "moe serve: stopped: .* requests done (${BASH_REMATCH[1]} cancelled at shutdown)" "$log"; then
    ok
  else
    bad "summary vs the clients' $res: $(tail -2 "$log")"
  fi
}

expect 0 "usage: moe serve" -- "$MOE" serve --help
expect 0 "^SIGUSR1 \(under mpirun: SIGUSR1 to Open MPI's mpirun" -- "$MOE" serve --help
expect 2 "--checkpoint FILE is required" -- "$MOE" serve
expect 2 "unknown option '--frob'" -- "$MOE" serve --frob
expect 2 "--port.*must be in" -- "$MOE" serve --checkpoint "$tmp/tiny" --port 70000
expect 2 "nope" -- "$MOE" serve --checkpoint "$tmp/nope"
expect 2 "--output-len: length '0' must be N or A-B with 1 <= A <= B <= 65536" -- "$MOE" bench serve --output-len 0
expect 2 "--prompt-len: length '5-2'" -- "$MOE" bench serve --prompt-len 5-2
expect 1 "GET http://127.0.0.1:1/metrics: .*is the server running" -- "$MOE" bench serve --url http://127.0.0.1:1
expect 2 "host 'localhost' must be an IPv4 address" -- "$MOE" serve --checkpoint "$tmp/tiny" --host localhost --port 0

# one process: the API
if start_server "$tmp/s1.log" "$MOE" serve --checkpoint "$tmp/tiny" --port 0 --max-body 4K --slots 8 \
  --drain-timeout 3; then
  if python3 "$here/serve_client.py" "$port" api "$tmp/gen.jsonl" "$tmp/p.jsonl"; then ok; else bad "HTTP checks (1 rank)"; fi
  # the curl examples of README.md and docs/inference.md as written (the port
  # replaced), and a greedy stream; a streamed one is asked again without
  # "stream" to compare the texts
  if ! command -v curl >/dev/null; then
    bad "curl is not installed (scripts/setup-debian.sh installs it)"
  else
    mkdir -p "$tmp/curl"
    i=0
    while IFS= read -r cmd; do
      i=$((i + 1))
      cmd=${cmd//localhost:8080/localhost:$port}
      printf '%s\n' "$cmd" >"$tmp/curl/$i.cmd"
      bash -c "$cmd" >"$tmp/curl/$i.out" || bad "curl failed: $cmd"
      if [[ $cmd == *'"stream": true'* ]]; then
        plain=${cmd/curl -sN /curl -s }
        bash -c "${plain/\"stream\": true/\"stream\": false}" >"$tmp/curl/$i.plain.out" ||
          bad "curl failed: $plain"
      fi
    done < <(grep -h '^curl -sN\? localhost:8080/' "$here/../README.md" "$here/../docs/inference.md"
      echo "curl -sN localhost:8080/v1/completions -d '{\"prompt\": \"Once\", \"max_tokens\": 32, \"temperature\": 0, \"stream\": true}'")
    # README.md's 2 and docs/inference.md's 6, and the greedy one
    if [[ $i -eq 9 ]]; then ok; else bad "$i curl commands (README.md and docs/inference.md changed?)"; fi
    if python3 "$here/serve_client.py" - curl "$tmp/curl"; then ok; else bad "the curl examples' answers"; fi
  fi
  # the load generator against it: every request answered, the table and the JSON
  expect 0 "\| 8 \| 0 \|" -- "$MOE" bench serve --url "http://127.0.0.1:$port" --requests 8 \
    --concurrency 4 --output-len 6-10 --prompt-len 4-40 --json "$tmp/bench.json"
  python3 - "$tmp/bench.json" <<'PY' && ok || bad "bench serve JSON: $(cat "$tmp/bench.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] == 8 and r["failed"] == 0 and r["output_len"] == [6, 10]
assert 0 < r["ttft_ms"][0] <= r["ttft_ms"][1] <= r["ttft_ms"][2] <= r["latency_ms"][2]
assert r["tokens_per_s"] > 0 and 0 < r["moe_share"] <= 1.0 and 0 <= r["a2a_share"] <= r["moe_share"]
PY
  # (a URL with a trailing slash names the same server)
  expect 0 "open loop at 20 requests/s" -- "$MOE" bench serve --url "http://127.0.0.1:$port/" \
    --requests 6 --rate 20 --output-len 4 --chat
  # every request refused (413: prompts over --max-body): exit 1, and the JSON
  # holds null where nothing was measured
  expect 1 "2 x HTTP 413" -- "$MOE" bench serve --url "http://127.0.0.1:$port" --requests 2 \
    --prompt-len 5000 --output-len 2 --json "$tmp/fail.json"
  python3 - "$tmp/fail.json" <<'PY' && ok || bad "bench serve JSON of failed requests: $(cat "$tmp/fail.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] == 0 and r["failed"] == 2 and r["ttft_ms"] == [None] * 3 and r["latency_ms"] == [None] * 3, r
PY
  # a second server on the same port: refused
  expect 2 "cannot listen on 127.0.0.1:$port" -- "$MOE" serve --checkpoint "$tmp/tiny" --port "$port"
  # SIGTERM during load: 12 requests (8 slots: some wait), 4 of them too long
  # to end before the drain timeout (3 s) cancels them
  under_load "$tmp/s1.log" 12 4 0 stop_server "$tmp/s1.log" TERM
fi

# two ranks, expert copies placed by eplb (re-planned every 2 steps): the same
# answers, the placement's metrics, a full queue answers 503; then stopped
# under load as docs/inference.md prescribes (SIGUSR1 to Open MPI's mpirun)
# shellcheck disable=SC2086 # OVERSUB is empty or one flag
if start_server "$tmp/s2.log" "$MPIEXEC" -n 2 $OVERSUB "$MOE" serve --checkpoint "$tmp/tiny" --port 0 --slots 1 --queue 1 \
  --placement eplb --place-slots 1 --place-every 2 --place-window 2 --drain-timeout 2; then
  python3 - "$port" "$tmp/gen.jsonl" "$tmp/p.jsonl" <<'PY' && ok || bad "2 ranks: answers differ from moe generate's"
import http.client, json, sys
port, gen, prompts = int(sys.argv[1]), sys.argv[2], sys.argv[3]
for g, q in zip([json.loads(l) for l in open(gen)], [json.loads(l) for l in open(prompts)]):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(q))
    r = json.loads(c.getresponse().read())
    assert r["choices"][0]["text"] == g["text"], (r, g)
PY
  python3 - "$port" <<'PY' && ok || bad "2 ranks: placement metrics"
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
c.request("GET", "/metrics")
m = dict(l.rsplit(" ", 1) for l in c.getresponse().read().decode().splitlines() if l and l[0] != "#")
assert int(m["moe_placement_plans_total"]) > 0, m
assert float(m['moe_placement_balance_ratio{copies="none"}']) >= 1.0, m
assert float(m['moe_placement_balance_ratio{copies="placed"}']) >= 1.0, m
assert int(m["moe_placement_copies_sent_total"]) >= 0 and float(m["moe_placement_seconds_total"]) > 0, m
place = [float(v) for k, v in m.items() if k.startswith("moe_engine_place_seconds_total{block=")]
assert place and all(v >= 0 for v in place) and sum(place) > 0, place
# the MoE layer summary: _count every sample (a step's MoE block), _sum their seconds
moe = [float(v) for k, v in m.items() if k.startswith("moe_engine_moe_seconds_total{block=")]
n = int(m["moe_engine_moe_layer_seconds_count"])
assert n > 0 and n == int(m["moe_engine_steps_total"]) * len(moe), (n, m["moe_engine_steps_total"], moe)
assert abs(float(m["moe_engine_moe_layer_seconds_sum"]) - sum(moe)) <= 1e-4 + 1e-3 * sum(moe), m
assert int(m["moe_engine_a2a_layer_seconds_count"]) == n and "moe_engine_a2a_layer_seconds_sum" in m, m
PY
  if python3 "$here/serve_client.py" "$port" busy; then ok; else bad "queue full (2 ranks)"; fi
  # under load: a slot on each rank held by a request of 2^20 tokens, a third
  # request waiting (the queue of 1), sent one at a time; all three end as
  # "cancelled" when the drain timeout (2 s) runs out
  if [[ "$OVERSUB" == "--oversubscribe" ]]; then
    under_load "$tmp/s2.log" 3 2 1 stop_server "$tmp/s2.log" USR1  # Open MPI's mpirun forwards SIGUSR1
  else
    under_load "$tmp/s2.log" 3 2 1 stop_mpich "$tmp/s2.log"
  fi
fi

# moe bench serve --placement: a fresh 2-rank server per placement (--launch),
# the same load against each, one table; bad arguments refused
bport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086 # OVERSUB is empty or one flag
out=$("$MOE" bench serve --url "http://127.0.0.1:$bport" --requests 6 --concurrency 3 --output-len 8 \
  --placement uniform,eplb --launch "$MPIEXEC -n 2 $OVERSUB $MOE serve --checkpoint $tmp/tiny --port $bport \
  --slots 2 --place-slots 1 --place-every 2 --place-window 2" --json "$tmp/place.json" 2>"$tmp/place.log")
rc=$?
if [[ $rc -eq 0 ]] && grep -qE '^\| uniform \| [0-9]+ .*\| 1\.00x \|$' <<<"$out" &&
  grep -qE '^\| eplb \| [0-9]+ .*\| [0-9.]+ -> [0-9.]+ \| - \| [0-9.]+x \|$' <<<"$out" &&
  [[ $(grep -c '"placement"' "$tmp/place.json") -eq 2 ]]; then
  ok
else
  bad "bench serve --placement (exit $rc): $out $(tail -5 "$tmp/place.log")"
fi
if python3 -c "import socket; socket.create_connection(('127.0.0.1', $bport), 1)" 2>/dev/null; then
  bad "bench serve --placement left a server on port $bport"
else
  ok
fi
# ... nor any of its processes (the launcher exits before its ranks: bench
# serve waits for all of them)
if pgrep -f -- "--port $bport" >/dev/null; then
  bad "bench serve --placement returned while processes of its servers ran: $(pgrep -af -- "--port $bport")"
else
  ok
fi
expect 2 "--placement 'frob' is unknown \(valid: uniform, eplb, lina\)" -- "$MOE" bench serve \
  --placement uniform,frob --launch true
expect 2 "--placement and --launch go together" -- "$MOE" bench serve --placement uniform
expect 2 "--rounds belongs to --placement and --launch" -- "$MOE" bench serve --rounds 2
expect 2 "output '$tmp' is a directory" -- "$MOE" bench serve --json "$tmp"
expect 2 "the model name must be under 128 bytes of valid UTF-8 with no quote, backslash or control" -- \
  "$MOE" serve --checkpoint "$tmp/tiny" --port 0 --model $'a\tb'
expect 2 "cannot write '$tmp/no/dir/p.json.tmp'" -- "$MOE" serve --checkpoint "$tmp/tiny" --port 0 \
  --record-paths "$tmp/no/dir/p.json"
expect 1 "exited \(status 3\) before answering" -- "$MOE" bench serve --url "http://127.0.0.1:$bport" \
  --placement uniform --launch "exit 3; :"

finish serve
