#!/usr/bin/env bash
# Sets up what octet needs (Debian packages), builds the octet command and shows what it does today: the
# FP8 tables and a quantization with a scaling recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
octet_configure
cmake --build "$OCTET_BUILD_DIR" --target octet_cli -j "$(nproc)"
octet="$OCTET_BUILD_DIR/tools/octet/octet"

echo "== $("$octet" --version)"
echo
echo "== octet fp8 table --format e4m3   (first rows, and the top of the range)"
"$octet" fp8 table --format e4m3 | head -n 10
echo "..."
"$octet" fp8 table --format e4m3 | sed -n '124,128p'
echo
echo "== echo '0.1 1 3.14159 -2.5 1e-5 100' | octet fp8 quantize --format e4m3 --recipe current"
echo "   (the scale is 448 / amax, so the largest value lands on E4M3's largest code, 448)"
echo '0.1 1 3.14159 -2.5 1e-5 100' | "$octet" fp8 quantize --format e4m3 --recipe current
echo
echo "== echo '0.1 1 1e-6 70000 -inf nan' | octet fp8 quantize --format e5m2"
echo "   (scale 1: 1e-6 underflows to 0, 70000 and -inf saturate to +-57344, nan stays nan)"
echo '0.1 1 1e-6 70000 -inf nan' | "$octet" fp8 quantize --format e5m2
