#!/usr/bin/env bash
# Sets up what octet needs (Debian packages), builds everything and runs the whole test suite under CTest.
# GPU tests (label gpu) skip cleanly on a machine without an NVIDIA GPU.
#   scripts/test.sh              all tests
#   scripts/test.sh -L numerics  extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
octet_configure
jobs="$(nproc)"
cmake --build "$OCTET_BUILD_DIR" -j "$jobs"
ctest --test-dir "$OCTET_BUILD_DIR" --output-on-failure -j "$jobs" "$@"
