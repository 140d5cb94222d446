#!/usr/bin/env bash
# Installs libmoe like a C library and uses the installed copy only:
#   1. configures a Release build (library and `moe` only) in a temporary folder,
#   2. cmake --install into a fresh temporary prefix P, checks the tree
#      (P/bin/moe, P/bin/moe-mpirun, P/include/moe/*.h, P/lib/libmoe.a,
#      P/lib/pkgconfig/libmoe.pc),
#   3. builds examples/ against P with `pkg-config --cflags --libs libmoe` only
#      (PKG_CONFIG_PATH=P/lib/pkgconfig; both a plain cc line and examples/Makefile),
#      outside the source tree,
#   4. runs layer_single, `mpirun -n 2 --oversubscribe` layer_ep (through
#      P/bin/moe-mpirun, which adds --oversubscribe and the root variables),
#      and `P/bin/moe version`,
#   5. removes the temporary folders (also on failure).
#
#   bash scripts/install-check.sh             (CI: .ci/run, "== install + examples")
#   KEEP=1 bash scripts/install-check.sh      keeps the temporary folders and prints them
# Environment: CC (compiler for the examples, default cc), CMAKE_ARGS (extra configure options).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moe-install-check.XXXXXX")
cleanup() {
  if [[ "${KEEP:-0}" == 1 ]]; then
    echo "install-check: kept $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
build=$tmp/build
prefix=$tmp/prefix
work=$tmp/examples
cc=${CC:-cc}
export OPENBLAS_NUM_THREADS=1

fail() {
  echo "install-check: FAIL: $*" >&2
  exit 1
}

echo "-- configure + build (Release) in $build"
# shellcheck disable=SC2086
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_WERROR=ON ${CMAKE_ARGS:-} >"$tmp/configure.log" ||
  {
    cat "$tmp/configure.log"
    fail "cmake configure"
  }
cmake --build "$build" -j2 --target moe moe_cli >"$tmp/build.log" || {
  tail -50 "$tmp/build.log"
  fail "build"
}

echo "-- install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install"
}
(cd "$prefix" && find . -type f | sort | sed 's|^\./|   |')
for f in bin/moe bin/moe-mpirun lib/pkgconfig/libmoe.pc include/moe/moe.h include/moe/layer.h; do
  [[ -f "$prefix/$f" ]] || fail "$prefix/$f was not installed"
done
[[ -f "$prefix/lib/libmoe.a" || -f "$prefix/lib/libmoe.so" ]] || fail "no libmoe.a or libmoe.so in $prefix/lib"
for h in "$src"/include/moe/*.h; do
  cmp -s "$h" "$prefix/include/moe/$(basename "$h")" || fail "include/moe/$(basename "$h") not installed as is"
done

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
pkg-config --exists libmoe || fail "pkg-config does not find libmoe in $PKG_CONFIG_PATH"
cflags=$(pkg-config --cflags libmoe)
libs=$(pkg-config --libs libmoe)
mpi=$(pkg-config --variable=mpi libmoe)
echo "-- pkg-config --modversion libmoe: $(pkg-config --modversion libmoe) (mpi=$mpi)"
echo "   --cflags: $cflags"
echo "   --libs:   $libs"
[[ "$cflags" == *"-I$prefix/include"* ]] || fail "cflags lack -I$prefix/include"
if [[ "$(pkg-config --variable=shared libmoe)" == 1 ]]; then
  # MOE_SHARED: the examples find libmoe.so at run time (the .pc sets no rpath).
  export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

echo "-- build the examples against $prefix (outside the source tree, in $work)"
mkdir -p "$work"
cp "$src"/examples/*.c "$src"/examples/Makefile "$work"/
# The README's one-liner, verbatim but for warnings as errors.
# shellcheck disable=SC2046,SC2086
(cd "$work" && set -x && $cc -O2 -Wall -Wextra -Werror layer_single.c -o layer_single_cc $(pkg-config --cflags --libs libmoe))
make -C "$work" CC="$cc" CFLAGS="-O2 -Wall -Wextra -Werror" PKG_CONFIG_PATH="$PKG_CONFIG_PATH"

echo "-- run layer_single"
(cd "$work" && ./layer_single && ./layer_single_cc >/dev/null) || fail "layer_single"
if [[ "$mpi" == 1 ]]; then
  [[ -x "$work/layer_ep" ]] || fail "examples/Makefile did not build layer_ep although mpi=1"
  echo "-- run layer_ep on 2 ranks: $prefix/bin/moe-mpirun -n 2 ./layer_ep (--oversubscribe when ranks > cores)"
  (cd "$work" && MOE_MPIRUN_VERBOSE=1 "$prefix/bin/moe-mpirun" -n 2 ./layer_ep) || fail "layer_ep under mpirun -n 2"
  # And with --oversubscribe spelled out, as a user without the wrapper would.
  if grep -q "Open MPI\|OpenRTE" <<<"$(mpirun --version 2>&1)"; then
    (cd "$work" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -n 2 --oversubscribe ./layer_ep >/dev/null) || fail "mpirun -n 2 --oversubscribe ./layer_ep"
  fi
else
  echo "-- layer_ep skipped: libmoe was built without MPI (mpi=0 in libmoe.pc)"
fi

echo "-- $prefix/bin/moe version"
"$prefix/bin/moe" version || fail "installed moe version"
"$prefix/bin/moe-mpirun" --help >/dev/null || fail "moe-mpirun --help"
echo "install-check: OK (installed tree, pkg-config, examples built and run against the installed library)"
