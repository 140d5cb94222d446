#!/usr/bin/env bash
# Issue 14 (Parm): MoE-GPT training with Parm on the emulated cluster, each
# schedule with deterministic mode on (the default: the fixed-order GEMM, the
# MP sums and the experts' gradients as fixed-order chains, docs/parm.md
# "Deterministic mode"), off with the same fixed-order GEMM (so the
# difference is the chains and ordered sums) and off with OpenBLAS (the
# default without deterministic mode); results in docs/parm.md.
#
#   sudo bash bench/parm_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]
#
# Every round runs every variant once (interleaved, so a slow period of the
# shared machine hits them all); a run's figure is the median over its steps
# after the first; the table gives the median over rounds. Deterministic runs
# of a round must end in the same checkpoint byte for byte (all of them: the
# 1-rank bits whatever the schedule).
# Environment: CLUSTER (cluster.sh flags, default "--nodes 2 --ranks-per-node 2
# --inter-gbit 1"), LAYOUT (moe train's Parm flags, default "--mp 2 --ep 2"),
# SCHEDULES (default "baseline s1 s2"), TRAIN (extra moe train flags, default
# none: the default demo model), PREFIX (cluster name).
set -euo pipefail
build=${1:?usage: parm_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]}
out=${2:?usage: parm_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]}
rounds=${3:-3}
steps=${4:-20}
here=$(cd "$(dirname "$0")" && pwd)
moe=$(realpath "$build/moe")
read -r -a cluster <<<"${CLUSTER:---nodes 2 --ranks-per-node 2 --inter-gbit 1}"
read -r -a layout <<<"${LAYOUT:---mp 2 --ep 2}"
read -r -a schedules <<<"${SCHEDULES:-baseline s1 s2}"
read -r -a train <<<"${TRAIN:-}"
prefix=${PREFIX:-moept}
mkdir -p "$out"
cl() { bash "$here/cluster/cluster.sh" "$1" --prefix "$prefix" "${@:2}"; }
trap 'cl down >/dev/null 2>&1 || true' EXIT
cl down >/dev/null 2>&1 || true
cl up "${cluster[@]}" >/dev/null
variants=()
for s in "${schedules[@]}"; do variants+=("$s:on" "$s:fixed" "$s:off"); done
mode_flags() {  # a variant's deterministic mode and backend
  case $1 in
    on) echo "--deterministic on" ;;
    fixed) echo "--deterministic off --backend fixed" ;;
    *) echo "--deterministic off" ;;
  esac
}
for ((r = 1; r <= rounds; r++)); do
  first=""
  for v in "${variants[@]}"; do
    id=${v//:/_}
    read -r -a mode <<<"$(mode_flags "${v##*:}")"
    cl run "${cluster[@]}" --timeout 900 -- "$moe" train --steps "$steps" --eval-every 0 \
      --eval-batches 1 --quiet "${train[@]}" "${layout[@]}" --parm "${v%%:*}" \
      "${mode[@]}" --metrics "$out/r$r-$id.jsonl" \
      --checkpoint "$out/r$r-$id.ckpt" >"$out/r$r-$id.log" 2>&1 ||
      { echo "parm_train: round $r, $v failed:" >&2; tail -5 "$out/r$r-$id.log" >&2; exit 1; }
    if [[ ${v##*:} == on ]]; then
      if [[ -z $first ]]; then
        first=$id
      elif ! cmp -s "$out/r$r-$first.ckpt" "$out/r$r-$id.ckpt"; then
        echo "parm_train: round $r: $v ends in another checkpoint than ${first//_/:}" >&2
        exit 1
      fi
    fi
  done
  rm -f "$out"/r"$r"-*.ckpt
done
python3 - "$out" "$rounds" "${variants[@]}" <<'PY'
import json, statistics as st, sys
out, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(r, v):
    rows = [json.loads(l) for l in open(f"{out}/r{r}-{v.replace(':', '_')}.jsonl")]
    rows = [x for x in rows if x["step"] > 1]
    return st.median(x["tokens_per_s"] for x in rows), st.median(x["step_ms"] for x in rows)
res = {v: [run(r, v) for r in range(1, rounds + 1)] for v in variants}
names = {"on": "on (fixed GEMM, chains)", "fixed": "off, fixed GEMM", "off": "off, OpenBLAS"}
print("| --parm | deterministic | tokens/s per round | median tokens/s | step (ms) | over off, OpenBLAS |")
print("|---|---|---|---|---|---|")
for v in variants:
    s, d = v.split(":")
    tps = [x[0] for x in res[v]]
    med = st.median(tps)
    off = st.median(x[0] for x in res[f"{s}:off"])
    print(f"| {s} | {names[d]} | {', '.join(f'{t:.0f}' for t in tps)} | {med:.0f} | "
          f"{st.median(x[1] for x in res[v]):.1f} | {med / off:.2f}x |")
PY
