#!/usr/bin/env bash
# Runs octet's tests on a GPU machine against a build directory that may have been made on another machine:
# shows the GPU, checks that every test program finds its shared libraries, runs the CTest labels gpu,
# numerics and cli, and leaves the logs and a short summary in the output directory.
#
#   scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]     (from the repository root)
#   BUILD_DIR defaults to build-gpu, OUT_DIR to $OUT or /tmp/octet-gpu. Exit status 0 only if all passed.
set -euo pipefail

build=${1:-build-gpu}
out=${2:-${OUT:-/tmp/octet-gpu}}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
fail() { note "FAIL: $*"; exit 1; }

[[ -f "$build/CMakeCache.txt" ]] || fail "no configured build in '$build' (CMakeCache.txt missing)"
build=$(cd "$build" && pwd -P)
note "octet GPU check: build $build, logs in $out, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt" || note "nvidia-smi failed (see nvidia-smi.txt)"
  note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1)"
else
  note "nvidia-smi not found: the gpu tests will skip, which this check counts as a failure"
fi

# CTest files name the build directory by the absolute path it was configured in. When the build was made
# elsewhere and that path does not exist here, point it at this build with a symbolic link.
configured=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$build/CMakeCache.txt")
if [[ -n "$configured" && "$configured" != "$build" && ! -e "$configured" ]]; then
  if mkdir -p "$(dirname "$configured")" && ln -s "$build" "$configured"; then
    note "build was configured in $configured: linked that path to $build"
  else
    fail "build was configured in $configured, which CTest needs; could not link it to $build"
  fi
fi

echo "== shared libraries"
mapfile -t programs < <(find "$build/tests" "$build/tools" -type f -perm -u+x \( -name 'test_*' -o -name octet \) \
                          2>/dev/null | sort)
[[ ${#programs[@]} -gt 0 ]] || fail "no test programs under $build/tests (build the tests first)"
missing=0
for program in "${programs[@]}"; do
  log="$out/ldd-$(basename "$program").txt"
  ldd "$program" >"$log" 2>&1 || true
  if grep -q "not found" "$log"; then
    note "missing libraries for $program:"
    grep "not found" "$log" | tee -a "$summary"
    missing=1
  fi
done
[[ $missing -eq 0 ]] || fail "shared libraries are missing (see ldd-*.txt)"
note "shared libraries: all found for ${#programs[@]} programs"

command -v ctest >/dev/null 2>&1 || fail "ctest not found: install CMake (3.25 or later)"

status=0
for label in gpu numerics cli peer; do
  echo "== ctest -L $label"
  log="$out/ctest-$label.log"
  if ctest --test-dir "$build" -L "^${label}\$" --output-on-failure 2>&1 | tee "$log"; then
    result=PASS
  else
    result=FAIL
    status=1
  fi
  counts=$(grep -E "tests passed|No tests were found" "$log" | tail -n1 || true)
  skipped=$(grep -c "(Skipped)" "$log" || true)
  if [[ $label == gpu && $skipped -gt 0 ]]; then
    result=FAIL  # on the GPU machine a skipped GPU test means CUDA saw no device
    status=1
    note "gpu tests skipped: CUDA saw no device. If nvidia-smi lists one, the driver may be older than the" \
         "CUDA runtime linked into the tests (CUDA 13 needs driver 580 or later); see hardware-conversions.log"
  fi
  note "$result label $label: ${counts:-no result line}; skipped $skipped"
done

# The exhaustive conversion test prints which NaN codes the hardware writes; ctest shows output only for
# failures, so run it once more on its own and keep what it printed.
test_cuda="$build/tests/cuda/test_cuda"
if [[ -x "$test_cuda" ]]; then
  echo "== hardware conversion report"
  if "$test_cuda" --gtest_filter='CudaDevice.CountNeverThrows:CudaDevice.InfoDescribesARealDevice:HardwareConversions.*' \
      2>&1 | tee "$out/hardware-conversions.log"; then :; else status=1; fi
  grep -E "^cudaGetDeviceCount|^device 0|mismatches|first numbers|^  input" "$out/hardware-conversions.log" \
    >>"$summary" || true
fi

if [[ $status -eq 0 ]]; then note "RESULT: PASS"; else note "RESULT: FAIL"; fi
exit $status
