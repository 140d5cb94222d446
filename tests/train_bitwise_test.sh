#!/usr/bin/env bash
# Deterministic mode on the DEFAULT demo model (no model flags): the same run on
# 1, 2 and 4 ranks gives byte-identical checkpoints (parameters and AdamW
# state) and identical per-step losses and gradient norms, also with the
# router-bias update; the summary says so,
# also with the dense gradients summed in buckets during the backward
# (--grad-bucket-mb: a tensor per bucket, several, one; --micro-op-kb and
# --comm-priority fifo|lina);
# and names the reason when a run cannot be bitwise (B/P not a power of two,
# --deterministic off).
# Usage: train_bitwise_test.sh path/to/moe path/to/mpiexec [STEPS]
set -u
MOE=${1:?usage: train_bitwise_test.sh path/to/moe path/to/mpiexec [STEPS]}
MPIEXEC=${2:?usage: train_bitwise_test.sh path/to/moe path/to/mpiexec [STEPS]}
STEPS=${3:-3}
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
RUN=(train --steps "$STEPS" --seed 3 --eval-every 0 --eval-batches 1 --quiet)

for p in 1 2 4; do
  if ! timeout 900 "$MPIEXEC" -n "$p" $OVERSUB "$MOE" "${RUN[@]}" --metrics "$tmp/m$p.jsonl" \
    --checkpoint "$tmp/c$p.bin" >"$tmp/out$p" 2>&1; then
    bad "P=$p: moe train failed"
    cat "$tmp/out$p" >&2
    continue
  fi
  grep -q "deterministic: on; bitwise the same" "$tmp/out$p" ||
    bad "P=$p: the summary does not say the run is bitwise across rank counts"
done
for p in 2 4; do
  cmp -s "$tmp/c1.bin" "$tmp/c$p.bin" || bad "P=$p: checkpoint differs from 1 rank's"
  # losses and norms as printed (9 digits) and the whole JSON lines minus timings
  strip() { sed -E 's/"(tokens_per_s|a2a_share|time_s|exposed_share|step_ms|moe_pass_ms|grad_wait_ms)":[^,}]*,?//g' "$1"; }
  diff <(strip "$tmp/m1.jsonl") <(strip "$tmp/m$p.jsonl") >/dev/null ||
    bad "P=$p: per-step metrics (loss, aux, grad_norm, lr) differ from 1 rank's"
done
# Gradient buckets overlapped with the backward: the same bits (the fixed-order
# sum is elementwise), at 2 and 4 ranks, from a tensor per bucket to one
# bucket, with micro-ops smaller than a tensor (1 KiB), in between, a bucket
# per operation (0) and larger than the whole model (1 GiB), FIFO and Lina's
# priority: 20 steps each, against 1 rank's 20 steps.
G=(train --steps 20 --seed 3 --eval-every 0 --eval-batches 1 --quiet)
timeout 900 "$MOE" "${G[@]}" --checkpoint "$tmp/c1_20.bin" >"$tmp/out1_20" 2>&1 ||
  { bad "P=1, 20 steps: moe train failed"; cat "$tmp/out1_20" >&2; }
for spec in "2 0.000001 256 fifo" "2 0.05 1 lina" "4 0.02 64 lina" "4 0.5 0 fifo" \
  "4 4096 1048576 lina"; do
  read -r p mb kb prio <<<"$spec"
  id="$p-$mb-$kb-$prio"
  timeout 900 "$MPIEXEC" -n "$p" $OVERSUB "$MOE" "${G[@]}" --grad-bucket-mb "$mb" \
    --micro-op-kb "$kb" --comm-priority "$prio" --checkpoint "$tmp/g$id.bin" >"$tmp/gout$id" 2>&1 ||
    { bad "buckets $id: moe train failed"; cat "$tmp/gout$id" >&2; continue; }
  cmp -s "$tmp/c1_20.bin" "$tmp/g$id.bin" || bad "buckets $id: checkpoint differs from 1 rank's"
  nb=$(grep -oE "dense gradients' sum \(([0-9]+) buckets? of [0-9.e+-]+ MiB during the backward, $prio( priority)?\)" \
    "$tmp/gout$id" | grep -oE '[0-9]+ bucket' | grep -oE '[0-9]+')
  # buckets really used: a tensor per bucket gives many, 4096 MiB one
  case $mb in
    0.000001) [[ ${nb:-0} -gt 10 ]] ;;
    4096) [[ ${nb:-0} -eq 1 ]] ;;
    *) [[ ${nb:-0} -ge 2 ]] ;;
  esac || bad "buckets $id: the summary names ${nb:-no} buckets"
done
# DeepSeek-V3's router-bias update at its paper's rate: also bitwise across
# rank counts (checkpoints hold the biases), and not the plain run.
for p in 1 4; do
  timeout 900 "$MPIEXEC" -n "$p" $OVERSUB "$MOE" "${RUN[@]}" --router-bias-update 0.001 \
    --checkpoint "$tmp/r$p.bin" >"$tmp/rout$p" 2>&1 || { bad "router bias P=$p: moe train failed"; cat "$tmp/rout$p" >&2; }
done
cmp -s "$tmp/r1.bin" "$tmp/r4.bin" || bad "router bias P=4: checkpoint differs from 1 rank's"
cmp -s "$tmp/r1.bin" "$tmp/c1.bin" && bad "router bias: the checkpoint equals the plain run's (no update ran)"
grep -q "router-bias update 0.001: expert load ratio" "$tmp/rout1" || bad "router bias: no summary line"
# Load balancing (eplb, 4 ranks): stopped half way and resumed with the same
# balancing, the run ends in the uninterrupted run's checkpoint byte for byte
# (the balancers' state is in the checkpoint), and copies were really placed.
H=$((STEPS * 2))
BAL=(train --steps "$H" --seed 3 --eval-every 0 --eval-batches 1 --quiet --balance eplb)
timeout 900 "$MPIEXEC" -n 4 $OVERSUB "$MOE" "${BAL[@]}" --checkpoint "$tmp/e_whole.bin" \
  --metrics "$tmp/e_whole.jsonl" >"$tmp/eout" 2>&1 || { bad "eplb: moe train failed"; cat "$tmp/eout" >&2; }
timeout 900 "$MPIEXEC" -n 4 $OVERSUB "$MOE" "${BAL[@]}" --checkpoint "$tmp/e_part.bin" \
  --stop-at "$STEPS" >"$tmp/eout1" 2>&1 || { bad "eplb: first half failed"; cat "$tmp/eout1" >&2; }
timeout 900 "$MPIEXEC" -n 4 $OVERSUB "$MOE" "${BAL[@]}" --checkpoint "$tmp/e_part.bin" \
  --resume "$tmp/e_part.bin" >"$tmp/eout2" 2>&1 || { bad "eplb: resumed half failed"; cat "$tmp/eout2" >&2; }
cmp -s "$tmp/e_whole.bin" "$tmp/e_part.bin" ||
  bad "eplb: stopped at $STEPS and resumed, the checkpoint differs from the uninterrupted run's"
grep -q '"copies":[1-9]' "$tmp/e_whole.jsonl" || bad "eplb: no step placed a copy"
# bf16 mixed precision: also bitwise across rank counts (the bf16 GEMM is
# batch-invariant too), and not the fp32 run (bf16 really ran).
if "$MOE" version | grep -q "bf16=native"; then
  for p in 1 2 4; do
    timeout 900 "$MPIEXEC" -n "$p" $OVERSUB "$MOE" "${RUN[@]}" --precision bf16 \
      --checkpoint "$tmp/b$p.bin" >"$tmp/bout$p" 2>&1 || { bad "bf16 P=$p: moe train failed"; cat "$tmp/bout$p" >&2; }
  done
  for p in 2 4; do cmp -s "$tmp/b1.bin" "$tmp/b$p.bin" || bad "bf16 P=$p: checkpoint differs from 1 rank's"; done
  cmp -s "$tmp/b1.bin" "$tmp/c1.bin" && bad "bf16: the checkpoint equals the fp32 run's (bf16 did not run)"
else
  echo "train_bitwise: bf16 runs skipped: this CPU has no AVX512_BF16 ($("$MOE" version | grep -o 'bf16=[a-z]*'))"
fi

n=$(grep -c '"loss"' "$tmp/m1.jsonl" 2>/dev/null || echo 0)
[[ "$n" == "$STEPS" ]] || bad "expected $STEPS metrics lines, got $n"

# Not bitwise: said, with the reason.
timeout 600 "$MPIEXEC" -n 4 $OVERSUB "$MOE" train --steps 1 --batch 12 --eval-every 0 \
  --eval-batches 1 --quiet >"$tmp/b12" 2>&1 || bad "batch 12 on 4 ranks failed"
grep -q "bits vary with the rank count (B/P = 12/4 is not a power of two)" "$tmp/b12" ||
  { bad "batch 12 on 4 ranks: no reason given"; cat "$tmp/b12" >&2; }
timeout 600 "$MPIEXEC" -n 2 $OVERSUB "$MOE" train --steps 1 --deterministic off --eval-every 0 \
  --eval-batches 1 --quiet >"$tmp/off" 2>&1 || bad "--deterministic off failed"
grep -q "deterministic: off; bits vary with the rank count (deterministic mode is off)" "$tmp/off" ||
  { bad "--deterministic off: not reported"; cat "$tmp/off" >&2; }

if ((fail)); then
  echo "train_bitwise: $fail failure(s)"
  exit 1
fi
echo "train_bitwise: checkpoints and metrics identical on 1, 2, 4 ranks ($STEPS steps, default model)"
