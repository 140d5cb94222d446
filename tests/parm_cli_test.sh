#!/usr/bin/env bash
# moe bench parm (docs/parm.md) end to end on 4 ranks: the table of the
# four variants for the default layouts, s2's outputs and input gradients the
# baseline's (the command's own check, printed "ok"), the JSON; the same with
# s1 and s2's EP&ESP pass in chunks (--chunks, --schedule); bad input
# refused on every rank with exit 2 and a message naming the problem; moe
# calibrate's Parm terms and moe train --parm auto reading them.
# Usage: parm_cli_test.sh path/to/moe path/to/mpiexec
set -u
MOE=${1:?usage: parm_cli_test.sh path/to/moe path/to/mpiexec}
MPIEXEC=${2:?usage: parm_cli_test.sh path/to/moe path/to/mpiexec}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
SMALL=(--tokens 64 --model 32 --hidden 64 --rounds 1 --warmup 0)

out="$tmp/grid.out"
if timeout 300 "$MPIEXEC" -n 4 $OVERSUB "$MOE" bench parm "${SMALL[@]}" --capacity 0,1.2 \
  --json "$tmp/grid.json" >"$out" 2>&1; then
  ok
else
  bad "bench parm failed"
  tail -5 "$out" >&2
fi
# four default layouts on 4 ranks (MP, ESP in {1, 2}) x 2 capacities = 8 rows
rows=$(grep -cE '^[0-9]+x[0-9]+x[0-9]+ ' "$out")
[[ $rows -eq 8 ]] && ok || bad "expected 8 table rows, got $rows"
for lay in 1x4x1 1x2x2 2x2x1 2x1x2; do
  grep -qE "^$lay " "$out" && ok || bad "layout $lay missing from the table"
done
grep -qE "max relative difference .* \(ok\)" "$out" && ok || bad "s2 against the baseline not ok"
grep -q "^speedup over baseline: s1 " "$out" && ok || bad "no speedup summary"
if python3 - "$tmp/grid.json" <<'PY'; then ok; else bad "the JSON does not hold 8 configs of 4 variants"; fi
import json, sys
d = json.load(open(sys.argv[1]))
assert d["benchmark"] == "parm" and d["ranks"] == 4
c = d["configs"]
assert len(c) == 8, len(c)
for x in c:
    v = [w["variant"] for w in x["variants"]]
    assert v == ["baseline", "s1", "s2", "s2+saa"], v
    assert all(w["total_ms"] > 0 for w in x["variants"])
    # s2 keeps the baseline's math
    assert x["variants"][2]["max_rel_diff"] <= 1e-4 and x["variants"][3]["max_rel_diff"] <= 1e-4
PY
# s1 and s2 in chunks on the executor: named in the header and the JSON, s2
# and s2+saa still the baseline's math
out="$tmp/chunks.out"
if timeout 300 "$MPIEXEC" -n 4 $OVERSUB "$MOE" bench parm "${SMALL[@]}" --capacity 0 \
  --layouts 2x2x1,2x1x2 --chunks 3 --schedule optsche --json "$tmp/chunks.json" >"$out" 2>&1; then
  ok
else
  bad "bench parm --chunks failed"
  tail -5 "$out" >&2
fi
grep -q "s1, s2 and s2+saa: the EP&ESP pass in 3 chunks on the executor (task schedule optsche)" \
  "$out" && ok || bad "the header does not name the chunks"
grep -qE "max relative difference .* \(ok\)" "$out" && ok || bad "chunked s2 against the baseline not ok"
if python3 - "$tmp/chunks.json" <<'PY'; then ok; else bad "the chunked JSON"; fi
import json, sys
d = json.load(open(sys.argv[1]))
assert d["chunks"] == 3 and d["task_schedule"] == "optsche", (d["chunks"], d["task_schedule"])
assert d["compress"] == "none" and d["compress_backward"] == 0, (d["compress"], d["compress_backward"])
assert len(d["configs"]) == 2
for x in d["configs"]:
    assert x["variants"][2]["max_rel_diff"] <= 1e-4 and x["variants"][3]["max_rel_diff"] <= 1e-4
PY
# a lossy compressor of the EP&ESP payloads: reported, not held to the baseline's math
expect 0 "max relative difference [0-9.e+-]+ \(not checked: the lossy compressor changes them\)" -- \
  mpi 4 "$MOE" bench parm "${SMALL[@]}" --capacity 0 --layouts 2x2x1 --chunks 2 --compress bf16
expect 2 "--compress: unknown or malformed compressor 'zzz'" -- "$MOE" bench parm --compress zzz
expect 2 "--schedule smart cuts a pass by peer groups" -- "$MOE" bench parm --schedule smart
expect 2 "--schedule: unknown task schedule 'nope' \(valid: " -- "$MOE" bench parm --schedule nope
expect 2 "--chunks \(65\) must be in \[1, 64\]" -- "$MOE" bench parm --chunks 65
# one given layout with DP: 2 x 1 x 1 on 4 ranks is DP = 2
expect 0 "^2x1x1 " -- mpi 4 "$MOE" bench parm "${SMALL[@]}" --capacity 0 --model 32 \
  --hidden 64 --layouts 2x1x1
# moe calibrate measures Parm's terms per layout (2 ranks per node: MP 2 x EP 2 x
# ESP 1 only), and moe train --parm auto takes them from the profile when it
# holds its layout and all-to-all, else measures them at the start
expect 0 "Parm's terms, MP 2 x EP 2 x ESP 1 with mpi \(seconds \+ per element\): EP&ESP" -- \
  mpi 4 "$MOE" calibrate --out "$tmp/prof.json" --ranks-per-node 2 --a2a mpi --compress none \
  --max-bytes 65536 --iters 2 --no-layers
if python3 - "$tmp/prof.json" <<'PY'; then ok; else bad "the profile does not hold MP 2 x EP 2's terms"; fi
import json, sys
p = json.load(open(sys.argv[1]))["parm"]
assert [(t["mp"], t["ep"], t["esp"], t["a2a"]) for t in p] == [(2, 2, 1, "mpi")], p
PY
T=(train --steps 2 --quiet --eval-every 0 --parm auto --profile "$tmp/prof.json")
expect 0 "schedule s[12].*Algorithm 1 on alpha-beta terms from the profile" -- \
  mpi 4 "$MOE" "${T[@]}" --mp 2
expect 0 "schedule s[12].*Algorithm 1 on alpha-beta terms measured at the start" -- \
  mpi 4 "$MOE" "${T[@]}" --mp 2 --ep 1
# bad input: every rank refuses, exit 2
expect 2 "MP x EP x ESP = 3 x 1 x 1 = 3 does not divide the 4 ranks" -- \
  mpi 4 "$MOE" bench parm "${SMALL[@]}" --layouts 3x1x1
expect 2 "hidden size H = 63 is not divisible by ESP = 2" -- \
  mpi 4 "$MOE" bench parm "${SMALL[@]}" --hidden 63 --layouts 1x2x2
expect 2 "3 experts do not divide over EP = 2" -- \
  mpi 4 "$MOE" bench parm "${SMALL[@]}" --experts 3 --top-k 1 --layouts 2x2x1
expect 2 "--layouts: '2x2' is not a list" -- mpi 2 "$MOE" bench parm --layouts 2x2
expect 2 "--layouts: ',' is empty: give MPxEPxESP triples" -- "$MOE" bench parm --layouts ,
expect 2 "option --layouts needs a value" -- "$MOE" bench parm --layouts
# an option's error once, not once per rank
n=$(mpi 2 "$MOE" bench parm --chunks 0 2>&1 | grep -c "must be in \[1, 64\]")
[[ $n -eq 1 ]] && ok || bad "bench parm --chunks 0 under 2 ranks: the error printed $n times"
expect 2 "--tokens: 'a' is not a list" -- mpi 2 "$MOE" bench parm --tokens a
expect 2 "unknown all-to-all|nope" -- mpi 2 "$MOE" bench parm "${SMALL[@]}" --a2a nope
expect 2 "rank 0 of 2 needs more memory than it may use: params 1\.00 GiB .* but the limit is 64\.0 MiB \(--max-memory, per rank\); lower --tokens" -- \
  mpi 2 "$MOE" bench parm --tokens 4096 --model 4096 --hidden 16384 --layouts 1x2x1 \
  --max-memory 64M
expect 0 "usage: mpirun -n P moe bench parm" -- "$MOE" bench parm --help
finish parm_cli
