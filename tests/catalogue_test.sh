#!/usr/bin/env bash
# The catalogue check (scripts/check-catalogue.sh) passes on this tree and
# fails, naming the offence, on a copy with one name list or special case
# planted at a time; a marker comment allows a single use.
#
#   bash tests/catalogue_test.sh MOE      (MOE: the built moe binary)
set -uo pipefail
moe=${1:?usage: catalogue_test.sh MOE}
src="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"

# The names come from the binary: every kind must be there.
cat=$("$moe" version --catalogue)
for kind in a2a compress schedule expert backend; do
  if grep -q "^$kind: [a-z0-9]" <<<"$cat"; then ok; else bad "moe version --catalogue has no $kind line: $cat"; fi
done
echo "$cat"

out=$(bash "$src/scripts/check-catalogue.sh" "$moe" "$src" 2>&1)
rc=$?
echo "$out"
if [[ $rc -eq 0 ]]; then ok; else bad "the tree itself (rc $rc)"; fi

# plant LINE FILE RC PATTERN: a fresh copy of src/ and cli/, LINE appended to
# FILE; the check must exit RC and print PATTERN.
plant() {
  local line=$1 file=$2 want=$3 pattern=$4
  rm -rf "$tmp/t" && mkdir -p "$tmp/t"
  cp -r "$src/src" "$src/cli" "$tmp/t/"
  printf '%s\n' "$line" >>"$tmp/t/$file"
  local o
  o=$(bash "$src/scripts/check-catalogue.sh" "$moe" "$tmp/t" 2>&1)
  local rc=$?
  if [[ $rc -eq $want && "$o" == *"$pattern"* ]]; then
    ok
    echo "planted in $file: exit $rc, as expected: $(grep -m1 -F "$pattern" <<<"$o")"
  else
    bad "$line in $file: rc $rc (want $want), output: $o"
  fi
}

# (a) lists of names of one kind, outside the kind's folder
plant 'static const char *const k_a2a[] = {"mpi", "pairwise", "pipe"};' src/perf/plan.c 1 \
  "src/perf/plan.c:"
plant 'static const char *k_all = "none,fp16,int8";' cli/cmd_simulate.c 1 "a list of 3 compress names"
plant '  const char *s[] = {"sequential", "smart"};' src/perf/layer_sim.c 1 "a list of 2 schedule names"
plant 'static const char *k_kinds = "ffn, ffn-ref";' cli/cmd_bench_layer.c 1 "a list of 2 expert names"
plant '    "  --a2a NAME   one of mpi, 1dh, 2dh\n"' cli/cmd_train.c 1 "a list of 3 a2a names"
# (b) special cases of one name
plant 'static int is_pipe(const char *a) { return strcmp(a, "pipe") == 0; }' src/perf/model.c 1 \
  'compares with the a2a name "pipe"'
plant 'static int z(const char *c) { return strncmp(c, "zfp", 3) == 0; }' src/perf/layer_sim.c 1 \
  'compares with the compress name "zfp"'
plant 'static int sm(const char *s) { return !strcmp(s, "smart"); }' cli/cmd_simulate.c 1 \
  'compares with the schedule name "smart"'
# ...allowed with a marker saying why, and printed
plant 'static int d(const char *a) { return strcmp(a, "mpi") == 0; }  // catalogue: the default' \
  src/perf/plan.c 0 "allowed: src/perf/plan.c:"
# inside the kind's own folder a list is its catalogue; comments are not code
plant 'static const char *k_own[] = {"mpi", "pipe"};' src/comm/alltoall_registry.c 0 "no name lists"
plant '// the shipped ones: "mpi", "pairwise", "pipe"' src/perf/model.c 0 "no name lists"

finish catalogue_test
