#!/usr/bin/env bash
# Decode throughput of the inference engine against `moe sample` (one sequence,
# the whole forward recomputed per token), on one rank, interleaved rounds.
#   bash bench/serve/decode_vs_sample.sh CHECKPOINT [ROUNDS] [TOKENS] [MOE]
# Prints a table: tokens/s of moe sample (1 sequence), of moe generate with 1
# slot (the KV cache alone) and with 32 prompts in 32 slots (continuous
# batching), medians over the rounds, and the ratios. moe sample's time is
# its wall time for TOKENS tokens minus that for 1 token (start-up and
# checkpoint load excluded); moe generate's is its own summary's.
set -euo pipefail
ckpt=${1:?usage: decode_vs_sample.sh CHECKPOINT [ROUNDS] [TOKENS] [MOE]}
rounds=${2:-3}
tokens=${3:-200}
moe=${4:-build/moe}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq 0 31); do
  printf '{"prompt":"Q: question %d?\\nA:","max_tokens":%d}\n' "$i" "$tokens"
done >"$tmp/p32.jsonl"
head -1 "$tmp/p32.jsonl" >"$tmp/p1.jsonl"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
: >"$tmp/sample" ; : >"$tmp/g1" ; : >"$tmp/g32"
for r in $(seq "$rounds"); do
  t0=$(now); "$moe" sample --checkpoint "$ckpt" --prompt "Q: question 0?" --length 1 >/dev/null 2>&1; t1=$(now)
  "$moe" sample --checkpoint "$ckpt" --prompt "Q: question 0?" --length "$tokens" >/dev/null 2>&1; t2=$(now)
  echo "$t0 $t1 $t2" | awk -v n="$tokens" '{print (n - 1) / (($3 - $2) - ($2 - $1))}' >>"$tmp/sample"
  "$moe" generate --checkpoint "$ckpt" --input "$tmp/p1.jsonl" --output /dev/null --slots 1 2>&1 |
    sed -n 's/.* in \([0-9.]*\) s: \([0-9.]*\) tokens\/s.*/\2/p' >>"$tmp/g1"
  "$moe" generate --checkpoint "$ckpt" --input "$tmp/p32.jsonl" --output /dev/null --slots 32 2>&1 |
    sed -n 's/.* in \([0-9.]*\) s: \([0-9.]*\) tokens\/s.*/\2/p' >>"$tmp/g32"
done
s=$(median <"$tmp/sample"); g1=$(median <"$tmp/g1"); g32=$(median <"$tmp/g32")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "decode throughput, $tokens tokens per sequence, medians of $rounds rounds, one rank ($cpu)"
echo
echo "| | tokens/s | vs moe sample |"
echo "|---|---|---|"
awk -v s="$s" -v g1="$g1" -v g32="$g32" 'BEGIN {
  printf "| moe sample, 1 sequence (full recompute per token) | %.0f | 1.00x |\n", s
  printf "| moe generate, 1 sequence (KV cache) | %.0f | %.2fx |\n", g1, g1 / s
  printf "| moe generate, 32 sequences in 32 slots | %.0f | %.2fx |\n", g32, g32 / s }'
