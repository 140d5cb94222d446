#!/usr/bin/env bash
# Fails if any tracked C source or header differs from .clang-format.
# Fix with: clang-format -i $(git ls-files '*.c' '*.h')
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h')
clang-format --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
