#!/usr/bin/env bash
# `moe generate` end to end: help and exit codes; the same JSONL bytes run to
# run and at 1, 2 and 4 ranks with other slot counts and prefill chunks
# (greedy and sampled lines, stop strings, ids echoed); greedy output equal to
# `moe sample --top-k 1` (the full recomputation) while the context fits;
# a missing or corrupt checkpoint, bad lines and bad options refused with exit 2
# and the output file not written.
# Usage: generate_cli_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: generate_cli_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: generate_cli_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"

python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(5)
w = ["the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran ", "far ", "away!\n"]
open(sys.argv[1], "w").write("".join(random.choice(w) for _ in range(20000)))
PY
# a tiny model trained a little (so that its text has structure), seq_len 32
"$MOE" train --data "$tmp/text.txt" --layers 2 --d-model 32 --heads 2 --seq-len 32 --experts 4 \
  --expert-hidden 32 --batch 8 --steps 60 --eval-every 0 --quiet \
  --checkpoint "$tmp/m.ckpt" >"$tmp/train.log" 2>&1 || { bad "training the test model: $(tail -3 "$tmp/train.log")"; }

cat >"$tmp/p.jsonl" <<'J'
{"prompt":"the cat ","max_tokens":20,"temperature":0}
{"prompt":"","max_tokens":12,"seed":5}
{"prompt":"a dog ran far away!\nthe ","max_tokens":80,"temperature":0.9,"top_k":8,"id":"long"}

{"prompt":"on a mat. ","max_tokens":40,"stop":["!", "\n"],"top_p":0.9,"id":7}
{"prompt":"x","max_tokens":0}
{"prompt":"the dog sat on the cat, the cat sat on the dog, the mat ran away","max_tokens":30,"temperature":0.5}
J

expect 0 "usage: moe generate" -- "$MOE" generate --help
expect 2 "--checkpoint FILE and --input FILE are required" -- "$MOE" generate --input "$tmp/p.jsonl"
expect 2 "unknown option '--frob'" -- "$MOE" generate --frob
expect 2 "--slots.*must be in" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --slots 0
expect 2 "prefill-chunk \(300\) must be at most --step-rows \(256\)" -- "$MOE" generate \
  --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --prefill-chunk 300

expect 0 "6 prompts" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --output "$tmp/o1.jsonl"
expect 0 "6 prompts" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --output "$tmp/o1b.jsonl" --slots 1
if cmp -s "$tmp/o1.jsonl" "$tmp/o1b.jsonl"; then ok; else bad "run to run (1 slot vs 32) differs"; fi
expect 0 "6 prompts.*2 ranks" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" \
  --output "$tmp/o2.jsonl" --slots 2 --prefill-chunk 3
if cmp -s "$tmp/o1.jsonl" "$tmp/o2.jsonl"; then ok; else bad "2 ranks differ from 1: $(diff "$tmp/o1.jsonl" "$tmp/o2.jsonl" | head -4)"; fi
expect 0 "6 prompts.*4 ranks" -- mpi 4 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" \
  --output "$tmp/o4.jsonl" --slots 1 --step-rows 16 --prefill-chunk 7 --a2a pairwise
if cmp -s "$tmp/o1.jsonl" "$tmp/o4.jsonl"; then ok; else bad "4 ranks differ from 1: $(diff "$tmp/o1.jsonl" "$tmp/o4.jsonl" | head -4)"; fi
# expert placement: eplb moves expert copies (re-planned every 2 steps) and
# the text stays the same; a bad name or too many slots: exit 2
expect 0 "placement eplb: balance ratio .* [1-9][0-9]* plans, [1-9][0-9]* copies sent" -- mpi 4 "$MOE" generate \
  --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --output "$tmp/o4e.jsonl" --slots 2 --placement eplb \
  --place-slots 3 --place-every 2 --place-window 2
if cmp -s "$tmp/o1.jsonl" "$tmp/o4e.jsonl"; then ok; else bad "eplb placement changed the text: $(diff "$tmp/o1.jsonl" "$tmp/o4e.jsonl" | head -4)"; fi
expect 2 "--placement 'frob' is unknown \(valid: uniform, eplb, lina\)" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --placement frob
expect 2 "placement lina estimates each MoE block's popularity from a path profile" -- "$MOE" generate \
  --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --placement lina
expect 2 "placement slots \(4\) must be in \[1, 2\]" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --placement eplb --place-slots 4

# Lina's path profiles: recorded at 1 and 4 ranks, the same profile (the same
# tokens, routed alike; only the order of first sight differs); a recorded
# profile estimates each step's popularity (the report); bad input: exit 2
expect 0 "path profile .*p1.json: [1-9][0-9]* tokens, [1-9][0-9]* paths" -- "$MOE" generate \
  --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --output "$tmp/op1.jsonl" --record-paths "$tmp/p1.json" --path-len 2
expect 0 "path profile .*p4.json" -- mpi 4 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" \
  --output "$tmp/op4.jsonl" --slots 2 --record-paths "$tmp/p4.json" --path-len 2
python3 - "$tmp/p1.json" "$tmp/p4.json" <<'PY' && ok || bad "path profiles at 1 and 4 ranks differ"
import json, sys
def canon(f):
    d = json.load(open(f))
    assert d["format"] == "libmoe-paths" and d["path_len"] == 2 and d["num_experts"] == 4
    blocks = [(b["tokens"], b["unkept"], b["marginal"],
               sorted((tuple(p["path"]), p["tokens"], tuple(p["counts"])) for p in b["paths"]))
              for b in d["blocks"]]
    # every token's choices: the block's marginal sums to tokens x top_k (dropless)
    for b in d["blocks"]:
        assert sum(b["marginal"]) == b["tokens"] * d["top_k"], b
        assert sum(p["tokens"] for p in b["paths"]) == b["tokens"]
    return blocks
a, b = canon(sys.argv[1]), canon(sys.argv[2])
assert a == b, (a, b)
PY
expect 0 "lina phase 2: [0-9]+ re-plans" -- mpi 4 "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --output "$tmp/o4l.jsonl" --slots 2 --placement lina --paths "$tmp/p1.json" --place-slots 3
if cmp -s "$tmp/o1.jsonl" "$tmp/o4l.jsonl"; then ok; else bad "lina placement changed the text: $(diff "$tmp/o1.jsonl" "$tmp/o4l.jsonl" | head -4)"; fi
# a serving trace with the estimates, replayed by moe simulate --lina
expect 0 "placement time per MoE block: [0-9]+: [0-9.]+ ms" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --output /dev/null --slots 2 --placement lina --paths "$tmp/p1.json" --place-slots 1 \
  --routing-trace "$tmp/rt.jsonl"
python3 - "$tmp/rt.jsonl" "$tmp/p1.json" <<'PY' && ok || bad "serving trace: $(head -c 300 "$tmp/rt.jsonl")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
h, body = lines[0], lines[1:]
prof = json.load(open(sys.argv[2]))
assert h["format"] == "libmoe-routing-trace" and h["ranks"] == 2, h
nb = len(h["moe_layers"])
assert len(body) % nb == 0 and len(body) > 0, len(body)
for l in body:
    assert len(l["counts"]) == 2 and all(len(r) == h["experts"] for r in l["counts"]), l
    assert len(l["estimate"]) == h["experts"], l
    # the estimate counts every top_k choice of the step's tokens, as the rows do
    rows = sum(map(sum, l["counts"]))
    assert abs(sum(l["estimate"]) - rows) <= 1e-3 * max(1, rows), (sum(l["estimate"]), rows)
PY
expect 0 "\| lina \(two phases\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|" -- "$MOE" simulate \
  --lina "$tmp/rt.jsonl" --tokens 256 --model 64 --hidden 128
expect 0 "fine-tune rate [0-9.]+%" -- "$MOE" simulate --lina "$tmp/rt.jsonl" --lina-from-block 1
expect 2 "--lina: cannot open the routing trace '/nonexistent.jsonl'" -- "$MOE" simulate --lina /nonexistent.jsonl
expect 2 "--lina and --balance are two different simulations" -- "$MOE" simulate --lina "$tmp/rt.jsonl" \
  --balance all
# phase 1 only (no re-plan after the gate): the same text, no re-plan reported
expect 0 "placement lina: balance ratio .* [1-9][0-9]* plans" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --output "$tmp/o2l.jsonl" --slots 2 --placement lina --paths "$tmp/p1.json" \
  --place-slots 1 --place-replan off
if cmp -s "$tmp/o1.jsonl" "$tmp/o2l.jsonl"; then ok; else bad "lina phase 1 changed the text"; fi
expect 2 "--place-replan.*on.*off" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" \
  --placement lina --paths "$tmp/p1.json" --place-replan maybe
expect 0 "paths .*p1.json, all MoE blocks: accuracy [0-9.]+%, fine-tune rate [0-9.]+%" -- mpi 2 "$MOE" generate \
  --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --output /dev/null --paths "$tmp/p1.json"
expect 2 "--path-len.*must be in \[1, 8\]" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" \
  --record-paths "$tmp/px.json" --path-len 9
python3 - "$tmp/p1.json" "$tmp/p8.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["num_experts"] = 8
for b in d["blocks"]:
    b["marginal"] = b["marginal"] + [0] * 4
    for p in b["paths"]:
        p["counts"] = p["counts"] + [0] * 4
json.dump(d, open(sys.argv[2], "w"))
PY
expect 2 "path profile .*p8.json: of [0-9]+ MoE blocks of 8 experts, top_k 2; this model has [0-9]+, 4, 2" -- \
  mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --paths "$tmp/p8.json"
printf '{"format":"libmoe-paths","version":1}' >"$tmp/pbad.json"
expect 2 "pbad.json: path profile: \"moe_blocks\" is missing" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --paths "$tmp/pbad.json"

# the output's shape: one line per prompt (the blank line skipped), in order, ids echoed
python3 - "$tmp/o1.jsonl" <<'PY' && ok || bad "output lines malformed: $(head -c 600 "$tmp/o1.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert [r["index"] for r in rows] == list(range(6)), rows
assert rows[2]["id"] == "long" and rows[3]["id"] == 7 and "id" not in rows[0]
assert rows[0]["completion_tokens"] == 20 and rows[0]["finish_reason"] == "length"
assert rows[4]["completion_tokens"] == 0 and rows[4]["text"] == ""
assert rows[1]["prompt_tokens"] == 0 and rows[5]["prompt_tokens"] == 64
r = rows[3]
assert "!" not in r["text"] and "\n" not in r["text"]
assert (r["finish_reason"] == "stop") == (r["completion_tokens"] < 40), r
PY

# greedy = moe sample's argmax while prompt + output fit in seq_len (32)
g=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["text"], end="")' "$tmp/o1.jsonl")
s=$("$MOE" sample --checkpoint "$tmp/m.ckpt" --prompt "the cat " --length 20 --top-k 1 2>/dev/null)
if [[ "$s" == "the cat $g" ]]; then ok; else bad "greedy '$g' vs moe sample '$s'"; fi

# bad input: exit 2, the message names the line, nothing written
printf '{"prompt":"a"}\n{"prompt":"b","temperature":-1}\n' >"$tmp/bad1.jsonl"
expect 2 "bad1.jsonl line 2: .*temperature" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/bad1.jsonl" --output "$tmp/ob.jsonl"
printf '{"prompt":"a","colour":"red"}\n' >"$tmp/bad2.jsonl"
expect 2 "line 1: request: unrecognized key 'colour'" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/bad2.jsonl" --output "$tmp/ob.jsonl"
printf 'not json\n' >"$tmp/bad3.jsonl"
expect 2 "line 1" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/bad3.jsonl" --output "$tmp/ob.jsonl"
# "id" echoed exactly or refused: a string (invalid UTF-8 as U+FFFD, as all
# output) or an integer below 2^53; a larger one (it would come back rounded) is refused
printf '{"prompt":"a","max_tokens":1,"id":"\xff\xfe"}\n{"prompt":"b","max_tokens":1,"id":-9007199254740991}\n' \
  >"$tmp/ids.jsonl"
"$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/ids.jsonl" --output "$tmp/ids.out" --quiet
python3 - "$tmp/ids.out" <<'PY' && ok || bad "ids not echoed exactly: $(cat "$tmp/ids.out")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert rows[0]["id"] == "\ufffd\ufffd" and rows[1]["id"] == -9007199254740991, rows
PY
for id in 9007199254740993 1e400 true '[1]'; do
  printf '{"prompt":"a","id":%s}\n' "$id" >"$tmp/badid.jsonl"
  expect 2 "badid.jsonl line 1: 'id' must be a string or an integer in \[-\(2\^53 - 1\), 2\^53 - 1\]" -- \
    "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/badid.jsonl" --output "$tmp/ob.jsonl"
done
# --record-paths is written at the end: a path that cannot be is refused before any work
expect 2 "output '$tmp' is a directory" -- mpi 2 "$MOE" generate --checkpoint "$tmp/m.ckpt" \
  --input "$tmp/p.jsonl" --output "$tmp/ob.jsonl" --record-paths "$tmp"
printf '\n\n' >"$tmp/empty.jsonl"
expect 2 "holds no prompt" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/empty.jsonl"
expect 2 "cannot open --input" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/nope.jsonl"
expect 2 "nope.ckpt" -- mpi 2 "$MOE" generate --checkpoint "$tmp/nope.ckpt" --input "$tmp/p.jsonl" --output "$tmp/ob.jsonl"
cp "$tmp/m.ckpt" "$tmp/bad.ckpt"
printf 'XXXX' | dd of="$tmp/bad.ckpt" bs=1 seek=2000 conv=notrunc 2>/dev/null
expect 2 "checksum|corrupt|bad" -- "$MOE" generate --checkpoint "$tmp/bad.ckpt" --input "$tmp/p.jsonl" --output "$tmp/ob.jsonl"
expect 2 "generate: rank 0 of 1 needs more memory than it may use: .*activations .* but the limit is 64\.0 MiB \(--max-memory, per rank\); use fewer --slots" -- "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl" --slots 4096 --max-memory 64M
if [[ ! -e "$tmp/ob.jsonl" ]]; then ok; else bad "a refused run wrote its output"; fi
# experts not divisible by the ranks: every rank fails, no hang
expect 2 "experts \(4\) must be divisible by EP ranks \(3\)" -- mpi 3 "$MOE" generate --checkpoint "$tmp/m.ckpt" --input "$tmp/p.jsonl"

finish generate_cli
