#!/usr/bin/env bash
# MoE-GPT training benchmarks (results in docs/training.md):
#   throughput  tokens/s of the default model at 1, 2 and 4 ranks (EP = P), the
#               share of step time in all-to-all and exposed, peak RSS vs the
#               memory expected from the config (rank 0's);
#   convergence ScheMoE Table 6 at small scale: the same number of steps for a
#               dense baseline, the MoE model, and the MoE model with fp16,
#               bf16, int8 and zfp compression of the all-to-all payloads
#               (forward and backward), final train and validation loss.
#
#   bash bench/train_bench.sh BUILD_DIR OUT_DIR [throughput|convergence|all]
# Environment: TP_STEPS (throughput steps, 60), CONV_STEPS (convergence steps, 600).
set -euo pipefail
build=${1:?usage: train_bench.sh BUILD_DIR OUT_DIR [throughput|convergence|all]}
out=${2:?usage: train_bench.sh BUILD_DIR OUT_DIR [throughput|convergence|all]}
what=${3:-all}
moe=$(realpath "$build/moe")
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS=1
launch() { mpiexec -n "$1" --oversubscribe "${@:2}"; }
tp_steps=${TP_STEPS:-60}
conv_steps=${CONV_STEPS:-600}

if [[ $what == throughput || $what == all ]]; then
  # The process baseline (MPI, OpenBLAS, libraries) is the peak RSS of the same
  # command with a model of a few hundred parameters; the last column compares
  # what the model adds above it with the memory expected from the config.
  echo "| ranks | EP | tokens/s (median) | all-to-all share | exposed share | peak RSS rank 0 (MiB) | baseline RSS (MiB) | expected from config (MiB) | RSS/expected | (RSS-baseline)/expected |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for p in 1 2 4; do
    log="$out/throughput_np$p.log"
    base="$out/baseline_np$p.log"
    launch "$p" "$moe" train --steps 3 --batch 16 --layers 1 --d-model 8 --heads 1 --seq-len 8 \
      --experts 4 --expert-hidden 8 --dense-hidden 8 --eval-every 0 --eval-batches 1 --quiet \
      >"$base" 2>&1
    launch "$p" "$moe" train --steps "$tp_steps" --batch 16 --eval-every 0 --eval-batches 1 \
      --quiet --metrics "$out/throughput_np$p.jsonl" >"$log" 2>&1
    python3 - "$log" "$base" "$p" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
b = open(sys.argv[2]).read()
m = re.search(r"median tokens/s (\d+), all-to-all share ([\d.]+)%, exposed ([\d.]+)%", t)
r = re.search(r"peak RSS ([\d.]+) MiB .*?expected from the config ([\d.]+) MiB.*?RSS/expected ([\d.]+)", t)
base = float(re.search(r"peak RSS ([\d.]+) MiB", b).group(1))
rss, cfg = float(r.group(1)), float(r.group(2))
p = sys.argv[3]
print(f"| {p} | {p} | {m.group(1)} | {m.group(2)}% | {m.group(3)}% | {rss:.1f} | {base:.1f} | {cfg:.1f} | {r.group(3)} | {(rss - base) / cfg:.2f} |")
PY
  done
fi

if [[ $what == convergence || $what == all ]]; then
  echo
  echo "| variant | steps | final train loss (nats) | val loss (nats) | val bits/byte | tokens/s |"
  echo "|---|---|---|---|---|---|"
  variants=("dense:--moe-every 0 --dense-hidden 512"
            "MoE:"
            "MoE+fp16:--compress fp16 --compress-backward"
            "MoE+bf16:--compress bf16 --compress-backward"
            "MoE+int8:--compress int8 --compress-backward"
            "MoE+zfp:--compress zfp:8 --compress-backward")
  for v in "${variants[@]}"; do
    name=${v%%:*}
    opts=${v#*:}
    log="$out/conv_${name//+/_}.log"
    # shellcheck disable=SC2086
    launch 4 "$moe" train --steps "$conv_steps" --batch 16 --eval-every 0 --eval-batches 16 \
      --quiet --metrics "$out/conv_${name//+/_}.jsonl" $opts >"$log" 2>&1
    python3 - "$log" "$name" "$conv_steps" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
tl = re.search(r"train loss: [\d.]+ -> ([\d.]+) nats", t).group(1)
vl = re.search(r"val loss: +[\d.]+ -> ([\d.]+) nats \([\d.]+ -> ([\d.]+) bits", t)
tp = re.search(r"median tokens/s (\d+)", t).group(1)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {tl} | {vl.group(1)} | {vl.group(2)} | {tp} |")
PY
  done
fi
