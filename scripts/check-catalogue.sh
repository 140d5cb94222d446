#!/usr/bin/env bash
# No list of plug-in names outside the catalogues: a new all-to-all algorithm,
# compressor, schedule or expert kind is one file plus one registry line, so no
# other file may repeat the names (docs/extending.md).
#
#   bash scripts/check-catalogue.sh MOE [ROOT]
#
# MOE is a built `moe` binary: `moe version --catalogue` prints each kind's
# registered names. ROOT is the source tree (default: this one). Scans src/ and
# cli/ (not tests/ or docs/), comments left out, and fails (exit 1, one line per
# offence) on
#   (a) a line whose string literals hold two or more distinct names of one
#       kind (a list: "mpi,pipe", {"none", "fp16"}, a help text naming several),
#       outside that kind's own folder;
#   (b) strcmp/strncmp or a *_find lookup against a quoted name of a kind,
#       outside that kind's own folder (code that special-cases one entry).
# A rare legitimate use (a default value, a comparison a paper defines between
# two named algorithms) is allowed with a marker comment on its line saying
# why: `// catalogue: <reason>`. The allowed lines are printed too.
set -uo pipefail
moe=${1:?usage: check-catalogue.sh MOE [ROOT]}
root="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
[[ "$moe" == /* ]] || moe="$PWD/$moe"
cd "$root" || exit 2

cat=$("$moe" version --catalogue) || {
  echo "check-catalogue: '$moe version --catalogue' failed"
  exit 2
}
# kind -> the folder whose files are its catalogue (the entries and the registry)
declare -A home=([a2a]=src/comm/ [compress]=src/compress/ [schedule]=src/sched/ [expert]=src/layer/
  [backend]=src/kernels/)
spec=""
while IFS= read -r line; do
  kind=${line%%:*}
  names=${line#*: }
  [[ -n "${home[$kind]:-}" ]] || {
    echo "check-catalogue: unknown kind '$kind' in moe version --catalogue"
    exit 2
  }
  spec+="$kind:${home[$kind]}:$names;"
done <<<"$cat"
[[ -n "$spec" ]] || {
  echo "check-catalogue: no catalogue printed"
  exit 2
}

files=$(find src cli -type f \( -name '*.c' -o -name '*.h' \) | sort)
nfiles=$(echo "$files" | wc -l)
# shellcheck disable=SC2086
out=$(awk -v spec="$spec" '
BEGIN {
  nk = split(spec, rows, ";")
  for (i = 1; i <= nk; i++) {
    if (rows[i] == "") continue
    split(rows[i], f, ":")
    kind = f[1]; kinds[kind] = 1; home[kind] = f[2]
    n = split(f[3], nm, " ")
    for (j = 1; j <= n; j++) name_kind[nm[j]] = name_kind[nm[j]] " " kind
  }
}
FNR == 1 { in_block = 0 }
{
  raw = $0
  allowed = index(raw, "catalogue:") > 0
  # strip comments (block and line), keep string literals
  code = ""; lits_n = 0; i = 1; L = length(raw)
  while (i <= L) {
    c = substr(raw, i, 1); c2 = substr(raw, i, 2)
    if (in_block) {
      if (c2 == "*/") { in_block = 0; i += 2 } else i++
      continue
    }
    if (c2 == "/*") { in_block = 1; i += 2; continue }
    if (c2 == "//") break
    if (c == "\x27") {  # a character literal: skip it
      j = i + 1
      while (j <= L && substr(raw, j, 1) != "\x27") j += (substr(raw, j, 1) == "\\") ? 2 : 1
      code = code substr(raw, i, j - i + 1); i = j + 1; continue
    }
    if (c == "\"") {
      j = i + 1; s = ""
      while (j <= L && substr(raw, j, 1) != "\"") {
        if (substr(raw, j, 1) == "\\") { s = s " "; j += 2 } else { s = s substr(raw, j, 1); j++ }
      }
      lits[++lits_n] = s; code = code "\"\""; i = j + 1; continue
    }
    code = code c; i++
  }
  if (lits_n == 0) next
  delete seen
  delete count
  cmp = code ~ /(strn?cmp|_find)[ \t]*\(/
  for (k = 1; k <= lits_n; k++) {
    n = split(lits[k], tok, /[^A-Za-z0-9_-]+/)
    for (t = 1; t <= n; t++) {
      if (!(tok[t] in name_kind)) continue
      m = split(name_kind[tok[t]], ks, " ")
      for (q = 1; q <= m; q++) {
        if (!((ks[q] SUBSEP tok[t]) in seen)) { seen[ks[q], tok[t]] = 1; count[ks[q]]++ }
      }
    }
    # (b): the whole literal (or its part before ":") is a name
    whole = lits[k]; sub(/:.*/, "", whole)
    if (cmp && (whole in name_kind)) {
      m = split(name_kind[whole], ks, " ")
      for (q = 1; q <= m; q++) {
        if (index(FILENAME, home[ks[q]]) == 1) continue
        report(allowed, FILENAME ":" FNR ": compares with the " ks[q] " name \"" whole "\" (special-cases one catalogue entry)", raw)
      }
    }
  }
  for (kd in count) {
    if (count[kd] < 2 || index(FILENAME, home[kd]) == 1) continue
    lst = ""
    for (key in seen) { split(key, kk, SUBSEP); if (kk[1] == kd) lst = lst (lst == "" ? "" : ", ") kk[2] }
    report(allowed, FILENAME ":" FNR ": a list of " count[kd] " " kd " names (" lst ") outside " home[kd], raw)
  }
}
function report(ok, msg, line) {
  gsub(/^[ \t]+/, "", line)
  if (ok) print "allowed: " msg "\n    " line
  else print "OFFENCE: " msg "\n    " line
}
' $files)
echo "$out" | grep -v '^$' || true
offences=$(echo "$out" | grep -c '^OFFENCE:' || true)
allowed=$(echo "$out" | grep -c '^allowed:' || true)
if ((offences > 0)); then
  echo "check-catalogue: $offences offence(s), $allowed allowed use(s) in $nfiles files: names belong in the catalogues (docs/extending.md); mark a legitimate single use with '// catalogue: <reason>'"
  exit 1
fi
echo "check-catalogue: no name lists outside the catalogues in $nfiles files ($allowed marked use(s))"
