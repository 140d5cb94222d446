#!/usr/bin/env bash
# Compute backends and precisions side by side (tables in docs/benchmarks.md
# and docs/reliability.md): the same work on every backend / precision, runs
# interleaved (variant A, B, C, ... then again) so that a change in the
# machine's load hits all of them, medians of REPS.
#
#   bash bench/compute_bench.sh BUILD_DIR [REPS]
#
# Tables:
#   layer   `moe bench layer` forward+backward ms and expert-GEMM GFLOP/s at the
#           issue's shapes (T M H E k): 4096 1024 2048 8 2 (the default),
#           2048 512 1024 4 2, 1024 256 512 8 1
#   train   `moe train` default model, 30 steps, median tokens/s, 1 and 2 ranks
# Variants: fixed fp32 (deterministic, the default), openblas fp32, onednn fp32,
# fixed bf16 (deterministic). OpenBLAS runs with the kernels this CPU selects
# (OPENBLAS_CORETYPE is unset). Environment: LAYER_ITERS (5), TRAIN_STEPS (30).
set -euo pipefail
build=${1:?usage: compute_bench.sh BUILD_DIR [REPS]}
reps=${2:-3}
moe=$(realpath "$build/moe")
unset OPENBLAS_CORETYPE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
iters=${LAYER_ITERS:-5}
steps=${TRAIN_STEPS:-30}
variants=("fixed fp32" "openblas fp32" "onednn fp32" "fixed bf16")
have_bf16=1
grep -q "bf16=native" <<<"$("$moe" version)" || {
  have_bf16=0
  echo "(no AVX512_BF16 on this CPU: the bf16 variant is skipped)"
}
grep -q "onednn=yes" <<<"$("$moe" version)" || echo "(no oneDNN in this build: the onednn variant fails)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; $("$moe" version | sed -n 2p)"

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo
echo "| shape T M H E k | variant | fwd+bwd ms | expert GEMM GFLOP/s | layer / GEMM time | ratio to fixed fp32 (time) |"
echo "|---|---|---|---|---|---|"
for shape in "4096 1024 2048 8 2" "2048 512 1024 4 2" "1024 256 512 8 1"; do
  read -r T M H E K <<<"$shape"
  for r in $(seq "$reps"); do
    for v in "${variants[@]}"; do
      read -r be prec <<<"$v"
      [[ $prec == bf16 && $have_bf16 == 0 ]] && continue
      f="$tmp/layer_${T}_${be}_${prec}"
      "$moe" bench layer --tokens "$T" --model "$M" --hidden "$H" --experts "$E" --topk "$K" \
        --iters "$iters" --peak-size 256 --backend "$be" --precision "$prec" 2>/dev/null |
        awk '/^forward\+backward ms/ {t=$3} /^expert GEMM GFLOP\/s/ {g=$4} /^layer time \/ GEMM time/ {l=$6}
             END {print t, g, l}' >>"$f"
    done
  done
  base=$(awk '{print $1}' "$tmp/layer_${T}_fixed_fp32" | median)
  for v in "${variants[@]}"; do
    read -r be prec <<<"$v"
    f="$tmp/layer_${T}_${be}_${prec}"
    [[ -s $f ]] || continue
    t=$(awk '{print $1}' "$f" | median)
    g=$(awk '{print $2}' "$f" | median)
    l=$(awk '{print $3}' "$f" | median)
    echo "| $T $M $H $E $K | $be $prec | $t | $g | $l | $(awk -v a="$t" -v b="$base" 'BEGIN {printf "%.2f", a / b}') |"
  done
done

echo
echo "| ranks | variant | tokens/s (median of run medians) | ratio to fixed fp32 |"
echo "|---|---|---|---|"
for p in 1 2; do
  for r in $(seq "$reps"); do
    for v in "${variants[@]}"; do
      read -r be prec <<<"$v"
      [[ $prec == bf16 && $have_bf16 == 0 ]] && continue
      det=on
      [[ $be != fixed ]] && det=off
      mpiexec -n "$p" --oversubscribe "$moe" train --steps "$steps" --eval-every 0 --eval-batches 1 \
        --quiet --deterministic "$det" --backend "$be" --precision "$prec" 2>/dev/null |
        awk '/median tokens\/s/ {print $3}' | tr -d , >>"$tmp/train_${p}_${be}_${prec}"
    done
  done
  base=$(median <"$tmp/train_${p}_fixed_fp32")
  for v in "${variants[@]}"; do
    read -r be prec <<<"$v"
    f="$tmp/train_${p}_${be}_${prec}"
    [[ -s $f ]] || continue
    t=$(median <"$f")
    echo "| $p | $be $prec | $t | $(awk -v a="$t" -v b="$base" 'BEGIN {printf "%.2f", a / b}') |"
  done
done
