#!/usr/bin/env bash
# On a machine with several GPUs: weak scaling of octet's data-parallel training. Each preset trains the same
# per-GPU batch on 1 GPU and on N (`octet train --gpus N`, the gradients' sums overlapped with the backward),
# on real tokens, and the table gives tokens/s per GPU and N GPUs' per-GPU speed over one GPU's. With
# PEER=1, PyTorch's Llama peer (../shared/peers/torch_llama.py: FSDP2 under torchrun, bf16) trains the same
# preset on 1 GPU and on N in the same invocation, and the table gives its weak scaling and octet's speed
# per GPU over the peer's.
#
#   bench/scaling.sh [PRESET...]          (default: llama3-1B; a preset is configs/bench/PRESET.toml)
#
# Environment: OCTET (the binary; see common.sh), GPUS (default 4), STEPS (default 16; the first 5 are not
# timed), DATA (a data directory for the preset's tokenizer; default data/brown-llama3 for llama3 presets and
# data/brown-gpt2 otherwise, relative to the working directory), OUT (default scaling-out), EXTRA (more --set
# options), PEER (1: run the peer too; a llama3 preset), PYTHON, TORCHRUN. The runs are data parallel without
# a sharded optimizer state (dp_shard = 1), with the preset's weight gradients (BF16 in the benchmark
# configurations, summed in BF16). Run directories go to /dev/shm.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gpus="${GPUS:-4}"
steps="${STEPS:-16}"
out="$(mkdir -p "${OUT:-scaling-out}" && cd "${OUT:-scaling-out}" && pwd)"
source "$here/common.sh"  # $octet, $config_dir
presets=("$@")
if [[ ${#presets[@]} -eq 0 ]]; then presets=(llama3-1B); fi
nvidia-smi --query-gpu=name --format=csv,noheader > "$out/gpu.txt" 2> /dev/null || echo unknown > "$out/gpu.txt"
status=0
for name in "${presets[@]}"; do
  data="${DATA:-data/brown-gpt2}"; tokenizer=gpt2
  if [[ "$name" == llama3* ]]; then data="${DATA:-data/brown-llama3}"; tokenizer=llama3; fi
  for n in 1 "$gpus"; do
    launch=(); if [[ "$n" -gt 1 ]]; then launch=(--gpus "$n"); fi
    run="/dev/shm/octet-scaling-$name-$n"
    rm -rf "$run"
    # shellcheck disable=SC2086
    "$octet" train "$config_dir/$name.toml" "${launch[@]}" --set train.device=cuda --set "train.steps=$steps" \
      --set scheduler.warmup_steps=2 --set data.eval_every=0 --set data.eval_batches=1 \
      --set checkpoint.every=1000 --set "data.dir=$data" --set "data.tokenizer=$tokenizer" \
      --set distributed.dp_shard=1 --set distributed.dp_replicate=-1 \
      --set "logging.run_dir=$run" ${EXTRA:-} > "$out/$name-$n.log" 2>&1
    rc=$?
    cp "$run/metrics.jsonl" "$out/$name-$n.jsonl" 2> /dev/null
    rm -rf "$run"
    if [[ $rc -ne 0 ]]; then echo "$name on $n GPU(s) failed (exit $rc): $(tail -1 "$out/$name-$n.log")"; status=1; fi
  done
  if [[ "${PEER:-0}" == 1 && "$name" == llama3* ]]; then
    peer=""
    for candidate in "$here/peers/torch_llama.py" "$here/../../shared/peers/torch_llama.py"; do
      if [[ -z "$peer" && -f "$candidate" ]]; then peer="$candidate"; fi
    done
    warm=$((steps < 10 ? steps : 10))
    "${PYTHON:-python3}" "$peer" --preset "$name" --steps "$steps" --warmup "$warm" \
      > "$out/$name-peer-1.json" 2> "$out/$name-peer-1.log" || { echo "the peer failed on 1 GPU"; status=1; }
    "${TORCHRUN:-torchrun}" --standalone --nproc_per_node "$gpus" "$peer" --preset "$name" --steps "$steps" \
      --warmup "$warm" > "$out/$name-peer-$gpus.json" 2> "$out/$name-peer-$gpus.log" ||
      { echo "the peer failed on $gpus GPUs"; status=1; }
  fi
done
python3 - "$out" "$gpus" "${presets[@]}" <<'PY'
import json, os, statistics, sys
out, n, presets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"GPU: {open(os.path.join(out, 'gpu.txt')).readline().strip()}")
print(f"| preset | 1 GPU tok/s | {n} GPUs tok/s | per GPU | ms/step 1 -> {n} | weak scaling |")
print("|---|---|---|---|---|---|")
for name in presets:
    speed, ms = {}, {}
    for k in (1, n):
        path = os.path.join(out, f"{name}-{k}.jsonl")
        rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
        rows = [r for r in rows if "tokens_per_second" in r][5:]
        if rows:
            speed[k] = statistics.mean(r["tokens_per_second"] for r in rows)
            ms[k] = statistics.mean(r["ms"] for r in rows)
    if len(speed) < 2:
        print(f"| {name} | - | - | - | - | - |")
        continue
    print(f"| {name} | {speed[1]:,.0f} | {speed[n]:,.0f} | {speed[n] / n:,.0f} | {ms[1]:.1f} -> {ms[n]:.1f} "
          f"| {speed[n] / n / speed[1] * 100:.1f}% |")
    peer = {}
    for k in (1, n):
        path = os.path.join(out, f"{name}-peer-{k}.json")
        lines = [l for l in open(path) if l.startswith("{")] if os.path.exists(path) else []
        if lines:
            peer[k] = json.loads(lines[-1])
    if len(peer) == 2:
        p1, pn = peer[1]["tokens_per_s"], peer[n]["tokens_per_s"]
        print(f"| {name}, PyTorch FSDP2 bf16 | {p1:,.0f} | {pn:,.0f} | {pn / n:,.0f} | "
              f"{peer[1]['ms_per_step']:.1f} -> {peer[n]['ms_per_step']:.1f} | {pn / n / p1 * 100:.1f}% |")
        print(f"\noctet per GPU over the peer per GPU: {speed[n] / pn:.3f} on {n} GPUs, {speed[1] / p1:.3f} on 1")
PY
exit $status
