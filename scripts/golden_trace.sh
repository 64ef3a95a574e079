#!/usr/bin/env bash
# The CPU golden trace: every step's loss and gradient norm over 30 steps of configs/quickstart.toml, in each
# precision mode (fp32, bf16, fp16) and each FP8 recipe (delayed, current, static, block, mxfp8), trained by
# `octet train` on the CPU backend. Changes to octet's internals that are meant to change nothing a user sees
# must keep this trace bit for bit.
#   scripts/golden_trace.sh record   writes tests/golden/quickstart-trace-cpu.tsv
#   scripts/golden_trace.sh check    trains again and compares every value with that file, exactly
# The values depend on the BLAS kernels OpenBLAS picks for the CPU and on the compiler, so the file names the
# machine it was recorded on; `check` on another kind of machine exits 77 (skipped) and says why.
# Needs a built octet ($OCTET_BUILD_DIR, default build/) and the Brown corpus (scripts/fetch_corpus.sh) and
# GPT-2 tokenizer files (scripts/fetch_tokenizer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
action="${1:-check}"
build="${OCTET_BUILD_DIR:-build}"
octet="$build/tools/octet/octet"
golden="tests/golden/quickstart-trace-cpu.tsv"
steps=30
[[ -x "$octet" ]] || { echo "golden_trace.sh: no octet binary at $octet; build first" >&2; exit 2; }
corpus="${OCTET_DATA_DIR:-.cache/data}/brown/text"
[[ -d "$corpus" ]] || { echo "golden_trace.sh: no Brown corpus in $corpus; run scripts/fetch_corpus.sh" >&2; exit 2; }

# What decides the bits besides octet's code: the CPU and the OpenBLAS kernels chosen for it, the compiler.
machine() {
  local cpu blas compiler
  cpu="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  blas="$(OPENBLAS_VERBOSE=2 "$octet" --version 2>&1 | grep -o "Core: [A-Za-z0-9_]*" | head -1 | sed "s/Core: //")"
  compiler="$(${CXX:-c++} -dumpfullversion 2>/dev/null || echo unknown)"
  local isa
  isa="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|fma)$' | sort | tr '\n' ' ')"
  echo "cpu=${cpu}; isa=${isa% }; openblas=${blas:-unknown}; g++=${compiler}"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="$work/brown-gpt2"
"$octet" data prepare --tokenizer gpt2 --out "$data" "$corpus"/*.txt >/dev/null

trace="$work/trace.tsv"
{
  echo "# machine: $(machine)"
  printf 'mode\trecipe\tstep\tloss\tgrad_norm\n'
} >"$trace"
for variant in fp32:- bf16:- fp16:- fp8:delayed fp8:current fp8:static fp8:block fp8:mxfp8; do
  mode="${variant%%:*}" recipe="${variant#*:}"
  run="$work/run-$mode-$recipe"
  args=(--set "train.mixed_precision=$mode" --set "train.steps=$steps" --set "data.dir=$data"
        --set "logging.run_dir=$run" --set train.device=cpu --set checkpoint.every=0 --set data.eval_every=0)
  [[ "$recipe" == - ]] || args+=(--set "fp8.recipe=$recipe")
  if ! "$octet" train configs/quickstart.toml "${args[@]}" >"$work/log-$mode-$recipe" 2>&1; then
    echo "golden_trace.sh: octet train failed for $mode $recipe:" >&2
    tail -5 "$work/log-$mode-$recipe" >&2
    exit 1
  fi
  # Each step's line of metrics.jsonl; the numbers are printed with enough digits to give back their bits.
  python3 - "$run/metrics.jsonl" "$mode" "$recipe" >>"$trace" <<'EOF'
import json, sys
path, mode, recipe = sys.argv[1:4]
for line in open(path):
    record = json.loads(line)
    if "loss" in record:
        print(f"{mode}\t{recipe}\t{record['step']}\t{record['loss']!r}\t{record['grad_norm']!r}")
EOF
done

case "$action" in
  record)
    cp "$trace" "$golden"
    echo "golden_trace.sh: wrote $golden ($(grep -vc '^[#m]' "$golden") steps)"
    ;;
  check)
    [[ -f "$golden" ]] || { echo "golden_trace.sh: no $golden; run 'record' first" >&2; exit 2; }
    recorded="$(head -1 "$golden")" here="$(head -1 "$trace")"
    if [[ "$recorded" != "$here" ]]; then
      echo "golden_trace.sh: skipped: the trace was recorded on another kind of machine"
      echo "  recorded: ${recorded#\# machine: }"
      echo "  here:     ${here#\# machine: }"
      exit 77
    fi
    if ! diff -u "$golden" "$trace" >"$work/diff"; then
      echo "golden_trace.sh: the CPU trace differs from $golden:" >&2
      head -40 "$work/diff" >&2
      exit 1
    fi
    echo "golden_trace.sh: $(grep -vc '^[#m]' "$golden") steps in 8 modes and recipes identical to $golden, bit for bit"
    ;;
  *)
    echo "golden_trace.sh: unknown action '$action'; valid: record, check" >&2
    exit 2
    ;;
esac
