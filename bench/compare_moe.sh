#!/usr/bin/env bash
# On a GPU machine: octet's mixture-of-experts preset in BF16, in FP8 with the experts in BF16 (the default
# policy) and in FP8 with the experts in FP8 (fp8.experts = true), one after another on the same GPU, on
# random tokens; then one table of tokens/s, device memory and the FP8 runs' ratios to BF16. Shared GPUs are
# noisy: compare the ratios of one run, not figures from different runs.
#
#   bench/compare_moe.sh [PRESET...]          (default: llama3-moe-350M, configs/bench/PRESET.toml)
#
# Environment: OCTET (the binary; default: beside this script or in ../build), STEPS (default 30), WARMUP
# (default 30: each expert's row count, and so its GEMMs' shapes, changes every step, and the first steps
# plan GEMMs for shapes not seen before), OUT (default compare-moe-out), PYTHON (for the table). Exit status 0 when every run
# succeeded; a failed run shows as "-".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
steps="${STEPS:-30}"
warmup="${WARMUP:-30}"
out="$(mkdir -p "${OUT:-compare-moe-out}" && cd "${OUT:-compare-moe-out}" && pwd)"
source "$here/common.sh"  # $octet, $config_dir
presets=("$@")
if [[ ${#presets[@]} -eq 0 ]]; then presets=(llama3-moe-350M); fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2> /dev/null ||
  echo "unknown (no nvidia-smi)" > "$out/gpu.txt"
echo "GPU: $(cat "$out/gpu.txt")"
status=0
for name in "${presets[@]}"; do
  config="$config_dir/$name.toml"
  if [[ ! -f "$config" ]]; then
    echo "compare_moe.sh: no config $config for preset $name" >&2
    status=1
    continue
  fi
  for run in bf16 fp8 fp8-experts; do
    settings=(--set "train.mixed_precision=${run%-experts}")
    if [[ "$run" == fp8-experts ]]; then settings+=(--set fp8.experts=true); fi
    echo "$name: octet $run ..."
    "$octet" bench train "$config" --set train.device=cuda "${settings[@]}" --steps "$steps" --warmup "$warmup" \
      --json > "$out/$name-$run.json" 2> "$out/$name-$run.log"
    rc=$?
    if [[ $rc -ne 0 ]]; then echo "  failed (exit $rc): $(tail -1 "$out/$name-$run.log")"; status=1; fi
  done
done

PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$out" "$steps" "$warmup" "${presets[@]}" <<'TABLE' | tee "$out/compare.md"
import sys

from compare_table import gpu_line, load, number, ratio

out, steps, warmup, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

print(gpu_line(out, steps, warmup))
print()
print("| model | bf16 tok/s | fp8 tok/s (experts BF16) | fp8 tok/s (experts FP8) | fp8 / bf16 | fp8 experts / bf16 "
      "| bf16 GiB | fp8 GiB | fp8 experts GiB |")
print("|---|---|---|---|---|---|---|---|---|")
for name in names:
    runs = [load(f"{out}/{name}-{run}.json") for run in ("bf16", "fp8", "fp8-experts")]
    tps = [r["tokens_per_second"] if r else None for r in runs]
    mem = [r.get("device_memory_gib") if r else None for r in runs]
    print(f"| {name} | {number(tps[0])} | {number(tps[1])} | {number(tps[2])} | {ratio(tps[1], tps[0])} "
          f"| {ratio(tps[2], tps[0])} | {number(mem[0], 1)} | {number(mem[1], 1)} | {number(mem[2], 1)} |")
print()
print("Device memory in use at its largest over the run, less what was in use before the backend was made.")
print("'-': the run failed (see the logs next to this file).")
TABLE
exit $status
