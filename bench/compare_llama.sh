#!/usr/bin/env bash
# On a GPU machine: octet in FP8, octet in BF16 and the PyTorch peer for Llama 3 shapes
# (../shared/peers/torch_llama.py: bf16 autocast, torch.compile, SDPA, fused AdamW; with TORCHAO set to a
# torchao source directory, also the peer with torchao's float8 training) train the same Llama shapes on the
# same GPU, one preset after another, on random tokens; then one table of tokens/s and device memory with the
# ratios. Shared GPUs are noisy: compare the ratios of one run, not figures from different runs.
#
#   bench/compare_llama.sh [PRESET...]        (default: llama3-1B; a preset is configs/bench/PRESET.toml and
#                                              the peer's --preset PRESET)
#
# Environment as bench/compare.sh's: OCTET, PEER (default peers/torch_llama.py beside this script, or
# ../shared/peers/torch_llama.py), PYTHON, STEPS (default 20), WARMUP (default 10), OUT (default
# compare-llama-out), TORCHAO (optional). Exit status 0 when every run succeeded; a failed run shows as "-".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
steps="${STEPS:-20}"
warmup="${WARMUP:-10}"
out="$(mkdir -p "${OUT:-compare-llama-out}" && cd "${OUT:-compare-llama-out}" && pwd)"
cudnn_lib="$("$python" -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' \
  2>/dev/null || true)"
if [[ -n "$cudnn_lib" && -d "$cudnn_lib" ]]; then export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

source "$here/common.sh"  # $octet, $config_dir
peer="${PEER:-}"
for candidate in "$here/peers/torch_llama.py" "$here/../../shared/peers/torch_llama.py"; do
  if [[ -z "$peer" && -f "$candidate" ]]; then peer="$candidate"; fi
done
if [[ -z "$peer" || ! -f "$peer" ]]; then
  echo "compare_llama.sh: no peer script found: set PEER=path/to/torch_llama.py" >&2
  exit 2
fi
presets=("$@")
if [[ ${#presets[@]} -eq 0 ]]; then presets=(llama3-1B); fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2> /dev/null ||
  echo "unknown (no nvidia-smi)" > "$out/gpu.txt"
echo "GPU: $(cat "$out/gpu.txt")"
status=0
for name in "${presets[@]}"; do
  config="$config_dir/$name.toml"
  if [[ ! -f "$config" ]]; then
    echo "compare_llama.sh: no config $config for preset $name" >&2
    status=1
    continue
  fi
  for run in fp8 bf16; do
    echo "$name: octet $run ..."
    "$octet" bench train "$config" --set train.device=cuda --set "train.mixed_precision=$run" \
      --steps "$steps" --warmup "$warmup" --json > "$out/$name-octet-$run.json" 2> "$out/$name-octet-$run.log"
    rc=$?
    if [[ $rc -ne 0 ]]; then echo "  failed (exit $rc): $(tail -1 "$out/$name-octet-$run.log")"; status=1; fi
  done
  peers=(bf16)
  if [[ -n "${TORCHAO:-}" ]]; then peers+=(fp8); fi
  for run in "${peers[@]}"; do
    echo "$name: PyTorch peer $run ..."
    extra=()
    if [[ "$run" == fp8 ]]; then extra=(--fp8); fi
    PYTHONPATH="${TORCHAO:-}${PYTHONPATH:+:$PYTHONPATH}" TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1 \
      "$python" "$peer" --preset "$name" --steps "$steps" --warmup "$warmup" "${extra[@]}" \
      > "$out/$name-peer-$run.json" 2> "$out/$name-peer-$run.log"
    rc=$?
    if [[ $rc -ne 0 ]]; then echo "  failed (exit $rc): $(tail -1 "$out/$name-peer-$run.log")"; status=1; fi
  done
done

PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$out" "$steps" "$warmup" "${presets[@]}" <<'TABLE' | tee "$out/compare.md"
import sys

from compare_table import gpu_line, load, number, ratio

out, steps, warmup, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

print(gpu_line(out, steps, warmup))
print()
print("| model | octet fp8 tok/s | octet bf16 tok/s | PyTorch bf16 tok/s | PyTorch + torchao fp8 tok/s "
      "| fp8 / peer bf16 | fp8 / peer fp8 | bf16 / peer bf16 | octet fp8 GiB | octet bf16 GiB | PyTorch GiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name in names:
    fp8, bf16 = load(f"{out}/{name}-octet-fp8.json"), load(f"{out}/{name}-octet-bf16.json")
    peer, peer8 = load(f"{out}/{name}-peer-bf16.json", True), load(f"{out}/{name}-peer-fp8.json", True)
    t = lambda r, k: r[k] if r else None
    fp8_tps, bf16_tps = t(fp8, "tokens_per_second"), t(bf16, "tokens_per_second")
    peer_tps, peer8_tps = t(peer, "tokens_per_s"), t(peer8, "tokens_per_s")
    print(f"| {name} | {number(fp8_tps)} | {number(bf16_tps)} | {number(peer_tps)} | {number(peer8_tps)} "
          f"| {ratio(fp8_tps, peer_tps)} | {ratio(fp8_tps, peer8_tps)} | {ratio(bf16_tps, peer_tps)} "
          f"| {number(t(fp8, 'device_memory_gib'), 1)} | {number(t(bf16, 'device_memory_gib'), 1)} "
          f"| {number(t(peer, 'peak_mem_gib'), 1)} |")
print()
print("octet memory: device memory in use at its largest over the run, less what was in use before the backend")
print("was made. PyTorch memory: torch.cuda.max_memory_allocated. '-': the run failed or was not run (see the")
print("logs next to this file; the torchao column needs TORCHAO=path/to/ao's source).")
TABLE
exit $status
