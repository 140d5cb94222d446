#!/usr/bin/env bash
# Issue 15 (Lina in training): MoE-GPT step time with the dense gradients
# summed in one packed all-reduce after the backward (today) against buckets
# started and advanced during the backward (--grad-bucket-mb), in micro-ops
# (--micro-op-kb), first come first served or with Lina's priority
# (--comm-priority), on the emulated cluster (results in docs/lina.md).
#
#   sudo bash bench/lina_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]
#
# Every round runs every variant once (interleaved, so a slow period of the
# shared machine hits them all); a run's figure is the median over its steps
# after the first; the table gives the median over rounds, and checks that every
# variant ends in the packed run's checkpoint byte for byte (deterministic mode:
# the sums are elementwise in one fixed order).
# Environment: CLUSTER (cluster.sh flags, default "--nodes 2 --ranks-per-node 2
# --inter-gbit 1"), VARIANTS (a list of MB:KB:PRIORITY[:PACKING], the bucket
# MiB, the micro-op KiB, fifo|lina and an --expert-packing degree from step
# 3; the packed run is always first; default "0.5:0:fifo 0.5:256:fifo
# 0.5:256:lina 0.5:256:lina:2"), TRAIN (extra moe train flags, default none:
# the default demo model), PREFIX (cluster name). A packing variant's
# checkpoint is not compared (its bits differ once EP < P: docs/lina.md).
set -euo pipefail
build=${1:?usage: lina_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]}
out=${2:?usage: lina_train.sh BUILD_DIR OUT_DIR [ROUNDS] [STEPS]}
rounds=${3:-5}
steps=${4:-20}
here=$(cd "$(dirname "$0")" && pwd)
moe=$(realpath "$build/moe")
read -r -a cluster <<<"${CLUSTER:---nodes 2 --ranks-per-node 2 --inter-gbit 1}"
read -r -a specs <<<"${VARIANTS:-0.5:0:fifo 0.5:256:fifo 0.5:256:lina 0.5:256:lina:2}"
read -r -a train <<<"${TRAIN:-}"
prefix=${PREFIX:-moelt}
mkdir -p "$out"
cl() { bash "$here/cluster/cluster.sh" "$1" --prefix "$prefix" "${@:2}"; }
trap 'cl down >/dev/null 2>&1 || true' EXIT
cl down >/dev/null 2>&1 || true
cl up "${cluster[@]}" >/dev/null
variants=(packed "${specs[@]}")
args() {  # a variant's moe train flags
  if [[ $1 == packed ]]; then echo "--grad-bucket-mb 0"; return; fi
  IFS=: read -r mb kb prio pack <<<"$1"
  echo "--grad-bucket-mb $mb --micro-op-kb $kb --comm-priority $prio" \
    "${pack:+--expert-packing $pack --packing-start 3}"
}
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    id=${v//:/_}
    read -r -a flags <<<"$(args "$v")"
    cl run "${cluster[@]}" --timeout 900 -- "$moe" train --steps "$steps" --eval-every 0 \
      --eval-batches 1 --quiet "${train[@]}" "${flags[@]}" \
      --metrics "$out/r$r-$id.jsonl" --checkpoint "$out/r$r-$id.ckpt" >"$out/r$r-$id.log" 2>&1 ||
      { echo "lina_train: round $r, $v failed:" >&2; tail -5 "$out/r$r-$id.log" >&2; exit 1; }
    if [[ $(tr -cd : <<<"$v" | wc -c) -lt 3 ]] && ! cmp -s "$out/r$r-packed.ckpt" "$out/r$r-$id.ckpt"; then
      echo "lina_train: round $r: $v ends in another checkpoint than the packed run" >&2
      exit 1
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
    return tuple(st.median(x[k] for x in rows) for k in ("step_ms", "grad_wait_ms", "moe_pass_ms"))
res = {mb: [run(r, mb) for r in range(1, rounds + 1)] for mb in variants}
med = {mb: [st.median(x[i] for x in res[mb]) for i in range(3)] for mb in variants}
base = med["packed"][0]
print("| dense gradients | step (ms) | sum not hidden (ms) | MoE pass (ms) | step vs packed | steps per round (ms) |")
print("|---|---|---|---|---|---|")
for mb in variants:
    s, w, p = med[mb]
    if mb == "packed":
        name = "one packed all-reduce after the backward"
    else:
        b, kb, prio, *pack = mb.split(":")
        ops = "a bucket per operation" if kb == "0" else f"{kb} KiB micro-ops"
        name = f"buckets of {b} MiB, {ops}, {prio}" + (f", packing x{pack[0]} from step 3" if pack else "")
    rng = f"{min(x[0] for x in res[mb]):.0f}-{max(x[0] for x in res[mb]):.0f}"
    print(f"| {name} | {s:.1f} | {w:.2f} | {p:.1f} | {base / s:.2f}x | {rng} |")
print(f"\nmedians over {rounds} interleaved rounds of each run's median step after the first; "
      "every variant's checkpoint but packing's equals the packed run's byte for byte")
PY
