#!/usr/bin/env bash
# How far the training losses of the same run drift apart across world sizes
# (docs/reliability.md): trains the default MoE-GPT for STEPS steps with seed
# SEED on 1, 2 and 4 ranks with --deterministic MODE (on: the default) and
# prints, per rank count, the relative difference of each step's loss to the
# 1-rank run (step 1, the maximum and where, the first non-zero, how many
# steps print equal losses) and whether the final checkpoints (parameters and
# AdamW state) are byte-identical to the 1-rank one.
#
#   bash bench/world_size_divergence.sh [BUILD] [STEPS] [SEED] [on|off]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-30}
seed=${3:-3}
mode=${4:-on}
moe="$build/moe"
[[ -x "$moe" ]] || { echo "world_size_divergence: $moe not found (build first)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OPENBLAS_NUM_THREADS=1
for p in 1 2 4; do
  scripts/moe-mpirun -n "$p" "$moe" train --steps "$steps" --seed "$seed" --eval-every 0 \
    --eval-batches 1 --quiet --deterministic "$mode" --metrics "$out/p$p.jsonl" \
    --checkpoint "$out/c$p.bin" >/dev/null
done
python3 - "$out" "$steps" "$seed" "$mode" <<'PY'
import filecmp, json, sys
out, steps, seed, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def losses(p):
    return [json.loads(l)["loss"] for l in open(f"{out}/p{p}.jsonl") if '"loss"' in l]
ref = losses(1)
print(f"default model, {steps} steps, seed {seed}, --deterministic {mode}: "
      "relative loss difference to 1 rank")
for p in (2, 4):
    d = [abs(a - b) / abs(a) for a, b in zip(ref, losses(p))]
    first = next((i + 1 for i, x in enumerate(d) if x > 0), None)
    worst = max(range(len(d)), key=lambda i: d[i])
    print(f"  {p} ranks: step 1 {d[0]:.2e}, max {d[worst]:.2e} (step {worst + 1}), "
          f"first non-zero at step {first}, {sum(1 for x in d if x == 0)} of {len(d)} steps "
          f"equal as printed (9 digits); final checkpoint byte-identical to 1 rank's: "
          f"{'yes' if filecmp.cmp(f'{out}/c1.bin', f'{out}/c{p}.bin', shallow=False) else 'no'}")
PY
