#!/usr/bin/env bash
# Builds libmoe with warnings as errors and runs the whole test suite.
# Usage: bash scripts/test.sh   (after bash scripts/setup-debian.sh)
# Environment: MOE_TEST_JOBS (tests run at once, default the number of cores;
# a test that starts N ranks counts N: ctest's PROCESSORS property).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DMOE_WERROR=ON
cmake --build build -j2
ctest --test-dir build --output-on-failure -j "${MOE_TEST_JOBS:-$(nproc)}"
