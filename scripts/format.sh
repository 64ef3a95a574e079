#!/usr/bin/env bash
# Formats octet's C++ and CUDA sources with the repository's .clang-format (Debian package clang-format).
#   scripts/format.sh          rewrite files in place
#   scripts/format.sh --check  list files that differ and exit 1 if any do
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu')
if [[ "${1:-}" == "--check" ]]; then
  status=0
  for f in "${files[@]}"; do
    clang-format --style=file "$f" | diff -q - "$f" >/dev/null || { echo "$f"; status=1; }
  done
  exit $status
fi
clang-format -i --style=file "${files[@]}"
