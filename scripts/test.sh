#!/usr/bin/env bash
# Sets up what octet needs (Debian packages), builds everything and runs the whole test suite under CTest.
# GPU tests (label gpu) skip cleanly on a machine without an NVIDIA GPU. The model's golden tests compare with
# PyTorch (Debian's python3-torch, installed here), and the convergence test trains on the Brown corpus
# (fetched here by scripts/fetch_corpus.sh).
#   scripts/test.sh              all tests
#   scripts/test.sh -L numerics  extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
# npm ships with Node.js on some machines; install Debian's only where there is none.
if command -v npm >/dev/null; then
  wanted=()
  for p in "${OCTET_TEST_PACKAGES[@]}"; do [ "$p" = npm ] || wanted+=("$p"); done
  OCTET_TEST_PACKAGES=("${wanted[@]}")
fi
octet_install_packages "${OCTET_TEST_PACKAGES[@]}"
bash scripts/fetch_corpus.sh
bash scripts/fetch_tokenizer.sh
octet_configure
jobs="$(nproc)"
cmake --build "$OCTET_BUILD_DIR" -j "$jobs"
ctest --test-dir "$OCTET_BUILD_DIR" --output-on-failure -j "$jobs" "$@"
