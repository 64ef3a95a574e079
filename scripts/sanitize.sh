#!/usr/bin/env bash
# Builds octet for the CPU with AddressSanitizer and UndefinedBehaviorSanitizer (build-sanitize/) and runs
# the fuzz tests and the io, checkpoint, config and telemetry tests under them. Any report fails the run.
#   scripts/sanitize.sh [-jN]          (default -j2)
# OCTET_FUZZ_SCALE (default 0.5 here) scales the fuzz cases; the sanitizers make each case a few times slower.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:--j2}"
build=build-sanitize
# -O1 -g1: what the sanitizers' authors recommend (usable speed, line numbers in reports), and quicker to
# build than an optimised build with full debug information.
flags="-O1 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DOCTET_CUDA=OFF "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
targets=(octet_cli test_io test_checkpoint test_config test_fuzz_config test_fuzz_files test_fuzz_commands
         test_reader_commands test_telemetry test_telemetry_fuzz)
ninja -C "$build" "$jobs" "${targets[@]}"
# detect_leaks=0: LeakSanitizer needs ptrace, which containers often deny; leaks are not what this hunts.
# allocator_may_return_null=1: an allocation beyond memory fails as it does without the sanitizer (octet
# refuses a model too large to allocate), rather than AddressSanitizer's own report of an oversized request.
# AddressSanitizer writes its reports to $build/asan.PID files (its warning about that refused allocation
# would otherwise be a second line on the standard error of a command that must print one); any ERROR there
# fails the run, as does the abort that comes with it.
rm -f "$build"/asan.*
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=0:detect_stack_use_after_return=0:allocator_may_return_null=1:log_path=$PWD/$build/asan}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OCTET_FUZZ_SCALE="${OCTET_FUZZ_SCALE:-0.5}"
status=0
ctest --test-dir "$build" "$jobs" -L 'fuzz|io|checkpoint|config|telemetry' \
  --output-on-failure --timeout 1200 || status=$?
if grep -l "ERROR: AddressSanitizer" "$build"/asan.* 2>/dev/null; then
  cat $(grep -l "ERROR: AddressSanitizer" "$build"/asan.*) >&2
  status=1
fi
exit "$status"
