#!/usr/bin/env bash
# Builds what a GPU machine needs to check octet's CUDA code (the GPU test program and the octet command, for
# the PyTorch peer) and copies them with the peer script into gpu-bundle/: a small folder that travels to a
# GPU machine where the full build directory would be too large. Run there: bash gpu-bundle/check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
OCTET_BUILD_DIR="${OCTET_BUILD_DIR:-$PWD/build-gpu}" octet_configure -DOCTET_CUDA=ON -DOCTET_BUILD_BENCHMARKS=OFF
cmake --build "$OCTET_BUILD_DIR" --target test_cuda octet_cli -j "$(nproc)"
rm -rf gpu-bundle && mkdir -p gpu-bundle
cp "$OCTET_BUILD_DIR/tests/cuda/test_cuda" "$OCTET_BUILD_DIR/tools/octet/octet" tests/peers/torch_fp8_cast.py gpu-bundle/
cat > gpu-bundle/check.sh <<'CHECK'
#!/usr/bin/env bash
# On the GPU machine: the GPU tests (every CUDA op against the CPU reference, the codec against the hardware
# conversions over all 2^32 inputs) and octet's FP8 casts against PyTorch's. Logs go to $1 (default .).
set -uo pipefail
cd "$(dirname "$0")"
out="${1:-.}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if ldd ./test_cuda ./octet | grep "not found"; then echo "missing shared libraries" >&2; exit 1; fi
./test_cuda 2>&1 | tee "$out/test_cuda.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|mismatches"
status=${PIPESTATUS[0]}
python3 torch_fp8_cast.py ./octet 2>&1 | tee "$out/peer.log"
peer=${PIPESTATUS[0]}
[[ $status -eq 0 && ($peer -eq 0 || $peer -eq 77) ]]
CHECK
chmod +x gpu-bundle/check.sh
du -sh gpu-bundle
