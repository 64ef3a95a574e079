#!/usr/bin/env bash
# On a GPU machine: octet in FP8, octet in BF16 and the PyTorch peer (bf16 autocast, torch.compile, flash
# attention, fused AdamW: peers/torch_gpt2.py) train the same GPT-2 shapes on the same GPU, one model size
# after another, on random tokens; then one table of tokens/s and device memory per model with the ratios.
# Shared GPUs are noisy: compare the ratios of one run, not figures from different runs.
#
#   bench/compare.sh [CONFIG...]        (default: configs/bench/gpt2-124M.toml, gpt2-350M.toml, gpt2-1.5B.toml)
#
# Works from a checkout (the octet binary of build/ or build-gpu/) and from the directory scripts/gpu_bundle.sh
# makes (octet, compare.sh, configs/bench/, peers/ side by side). Environment: OCTET (the octet binary), PEER
# (the peer script), PYTHON (default python3, with PyTorch), STEPS (timed steps, default 20), WARMUP (default
# 10: torch.compile compiles during the peer's first steps), OUT (raw results and logs, default
# compare-out), RECOMPUTE (default 1: also octet in FP8 with every fp8.recompute_* key on, the memory-saving
# settings, a second table; 0 skips it).
# Exit status 0 when every run succeeded; a failed run (out of memory, say) shows as "-".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
steps="${STEPS:-20}"
warmup="${WARMUP:-10}"
out="$(mkdir -p "${OUT:-compare-out}" && cd "${OUT:-compare-out}" && pwd)"
# octet loads cuDNN at run time for attention (train.attention = "auto"); PyTorch's wheel ships a copy.
cudnn_lib="$("$python" -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' \
  2>/dev/null || true)"
if [[ -n "$cudnn_lib" && -d "$cudnn_lib" ]]; then export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

source "$here/common.sh"  # $octet, $config_dir
peer="${PEER:-$here/peers/torch_gpt2.py}"
if [[ ! -f "$peer" ]]; then
  echo "compare.sh: no peer script at $peer: set PEER=path/to/torch_gpt2.py" >&2
  exit 2
fi
configs=("$@")
if [[ ${#configs[@]} -eq 0 && -n "$config_dir" ]]; then
  configs=("$config_dir/gpt2-124M.toml" "$config_dir/gpt2-350M.toml" "$config_dir/gpt2-1.5B.toml")
fi
if [[ ${#configs[@]} -eq 0 ]]; then
  echo "compare.sh: no configs given and no configs/bench directory found" >&2
  exit 2
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2> /dev/null ||
  echo "unknown (no nvidia-smi)" > "$out/gpu.txt"
echo "GPU: $(cat "$out/gpu.txt")"
status=0
names=()
for config in "${configs[@]}"; do
  name="$(basename "$config" .toml)"
  names+=("$name")
  # The shapes, for the peer, as octet resolves them.
  if ! "$octet" config show "$config" > "$out/$name-config.toml" 2> "$out/$name-config.log"; then
    cat "$out/$name-config.log" >&2
    status=1
    continue
  fi
  read -r layers heads channels batch seq vocab padded < <(awk -F' = ' '
    /^\[/ { section = $0; next }
    section == "[model]" && $1 == "layers" { layers = $2 }
    section == "[model]" && $1 == "heads" { heads = $2 }
    section == "[model]" && $1 == "channels" { channels = $2 }
    section == "[model]" && $1 == "vocab_size" { vocab = $2 }
    section == "[model]" && $1 == "padded_vocab_size" { padded = $2 }
    section == "[train]" && $1 == "batch_size" { batch = $2 }
    section == "[train]" && $1 == "seq_len" { seq = $2 }
    END { print layers, heads, channels, batch, seq, vocab, padded }' "$out/$name-config.toml")
  if [[ "$padded" == "0" ]]; then padded=$(( (vocab + 63) / 64 * 64 )); fi

  runs=(fp8 bf16)
  if [[ "${RECOMPUTE:-1}" != 0 ]]; then runs+=(fp8-recompute); fi
  for run in "${runs[@]}"; do
    echo "$name: octet $run ..."
    extra=()
    if [[ "$run" == fp8-recompute ]]; then
      extra=(--set fp8.recompute_mlp=true --set fp8.recompute_qkv=true --set fp8.recompute_residual=true
             --set fp8.recompute_weight_transposes=true)
    fi
    "$octet" bench train "$config" --set train.device=cuda --set "train.mixed_precision=${run%-recompute}" \
      "${extra[@]}" --steps "$steps" --warmup "$warmup" --json > "$out/$name-octet-$run.json" \
      2> "$out/$name-octet-$run.log"
    rc=$?
    if [[ $rc -ne 0 ]]; then echo "  failed (exit $rc): $(tail -1 "$out/$name-octet-$run.log")"; status=1; fi
  done
  echo "$name: PyTorch peer (L=$layers C=$channels NH=$heads B=$batch T=$seq Vp=$padded) ..."
  "$python" "$peer" --layers "$layers" --width "$channels" --heads "$heads" --batch "$batch" --seq "$seq" \
    --vocab "$padded" --steps "$steps" --warmup "$warmup" > "$out/$name-peer.json" 2> "$out/$name-peer.log"
  rc=$?
  if [[ $rc -ne 0 ]]; then echo "  failed (exit $rc): $(tail -1 "$out/$name-peer.log")"; status=1; fi
done

PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$out" "$steps" "$warmup" "${names[@]}" <<'TABLE' | tee "$out/compare.md"
import sys

from compare_table import gpu_line, load, number, ratio

out, steps, warmup, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]


def octet_result(name, mode):
    return load(f"{out}/{name}-octet-{mode}.json")


def peer_result(name):
    return load(f"{out}/{name}-peer.json", last_line=True)


print(gpu_line(out, steps, warmup))
print()
print("| model | octet fp8 tok/s | octet bf16 tok/s | PyTorch bf16 tok/s | fp8 / peer | bf16 / peer "
      "| octet fp8 GiB | octet bf16 GiB | PyTorch GiB | fp8 / bf16 memory | octet fp8 MFU (BF16 peak) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name in names:
    fp8, bf16, peer = octet_result(name, "fp8"), octet_result(name, "bf16"), peer_result(name)
    fp8_tps = fp8["tokens_per_second"] if fp8 else None
    bf16_tps = bf16["tokens_per_second"] if bf16 else None
    peer_tps = peer["tokens_per_s"] if peer else None
    fp8_mem = fp8["device_memory_gib"] if fp8 else None
    bf16_mem = bf16["device_memory_gib"] if bf16 else None
    peer_mem = peer["peak_mem_GiB"] if peer else None
    mfu = fp8["mfu_bf16"] if fp8 and fp8.get("mfu_bf16") is not None else None
    print(f"| {name} | {number(fp8_tps)} | {number(bf16_tps)} | {number(peer_tps)} | {ratio(fp8_tps, peer_tps)} "
          f"| {ratio(bf16_tps, peer_tps)} | {number(fp8_mem, 1)} | {number(bf16_mem, 1)} | {number(peer_mem, 1)} "
          f"| {ratio(fp8_mem, bf16_mem)} | {'-' if mfu is None else f'{mfu * 100:.1f}%'} |")
recomputed = [(name, octet_result(name, "fp8-recompute")) for name in names]
if any(r for _, r in recomputed):
    print()
    keys = sorted({k for _, r in recomputed if r for k in (r.get("fp8") or {}).get("recompute", [])})
    print("octet fp8 with the memory-saving settings (" + ", ".join(f"fp8.recompute_{k}" for k in keys) + " = true):")
    print("mlp.c_fc, attn.c_attn and attn.c_proj keep their FP8 input codes instead of their outputs (GELU's")
    print("input, q/k/v, the residual stream after attention) and run their forward GEMMs again in the backward;")
    print("the FP8 weight copies keep W's codes only, transposed before each input-gradient GEMM.")
    print()
    print("| model | tok/s | / peer | / octet fp8 | GiB | / octet bf16 memory | / PyTorch memory |")
    print("|---|---|---|---|---|---|---|")
    for name, r in recomputed:
        fp8, bf16, peer = octet_result(name, "fp8"), octet_result(name, "bf16"), peer_result(name)
        tps = r["tokens_per_second"] if r else None
        mem = r["device_memory_gib"] if r else None
        print(f"| {name} | {number(tps)} | {ratio(tps, peer['tokens_per_s'] if peer else None)} "
              f"| {ratio(tps, fp8['tokens_per_second'] if fp8 else None)} | {number(mem, 1)} "
              f"| {ratio(mem, bf16['device_memory_gib'] if bf16 else None)} "
              f"| {ratio(mem, peer['peak_mem_GiB'] if peer else None)} |")
print()
print("octet memory: device memory in use (cudaMemGetInfo) at its largest over the run, less what was in use")
print("before the backend was made (CUDA context excluded; cuBLASLt workspace included). PyTorch memory:")
print("torch.cuda.max_memory_allocated (tensors only). MFU: 6N + 12LCT FLOPs per token against the dense")
print("BF16 datasheet peak. '-': the run failed or was not possible (see the logs next to this file).")
TABLE
exit $status
