#!/usr/bin/env bash
# On a GPU machine: `octet localize` on one bench model, then the same short training run (validation loss and
# tokens/s) with every layer in BF16 (bf16 mode), every eligible layer in FP8 (fp8 mode, delayed scaling),
# the localized map, a second map chosen with a tighter budget (BUDGET2), the first and last blocks kept in
# BF16, and static scales from `octet calibrate` (as calibrated, and recalibrated every 20 steps), once per
# seed; then bench/localized_maps_table.py turns the results into the table of docs/precision.md.
# Shared GPUs are noisy and short runs differ by seed: compare runs of one call, and look at the seeds.
#
#   MODEL=gpt2-124M DATA=data/brown-gpt2 SEEDS="1337 1338" BUDGET2=0.02 bench/localized_maps.sh
#   MODEL=llama3-350M DATA=data/brown-llama3 BATCH=4 LOCALIZE_BATCHES=1 CALIBRATE=0 bench/localized_maps.sh
#
# Environment: MODEL (a configs/bench preset, default gpt2-124M), DATA (token shards of `octet data prepare`;
# llama presets take llama3 shards), BATCH (micro-batch size of every run, default 16), STEPS (default 120),
# SEEDS (default 1337), LOCALIZE_BATCHES (default 2), BUDGET2 (empty: no second map), CALIBRATE (default 1),
# OUT (results, default localized-maps-out), OCTET (the octet binary), CONFIG (a configuration file in place of
# the preset), DEVICE (default cuda). Exit status 0 when every run succeeded.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/common.sh"  # $octet, $config_dir
model="${MODEL:-gpt2-124M}"; data="${DATA:-data/brown-gpt2}"; batch="${BATCH:-16}"; steps="${STEPS:-120}"
out="$(mkdir -p "${OUT:-localized-maps-out}" && cd "${OUT:-localized-maps-out}" && pwd)"
config="${CONFIG:-$config_dir/$model.toml}"
tokenizer=(); [[ "$model" == llama* ]] && tokenizer=(--set data.tokenizer=llama3)
device=(--set "train.device=${DEVICE:-cuda}" --set "data.dir=$data" "${tokenizer[@]}" --set "train.batch_size=$batch")
status=0
localize() {  # output map, extra options
  local map=$1; shift
  "$octet" localize "$config" --batches "${LOCALIZE_BATCHES:-2}" "$@" "${device[@]}" \
    --set train.gemm_algorithms=heuristic --out "$out/$map.json" > "$out/localize-$map.log" 2>&1 || status=1
  tail -n 2 "$out/localize-$map.log"
}
localize map
[[ -n "${BUDGET2:-}" ]] && localize map2 --budget "$BUDGET2"
train() {  # name, extra settings; once per seed
  local name=$1; shift
  for seed in ${SEEDS:-1337}; do
    rm -rf "$out/run-$name-$seed"
    "$octet" train "$config" "${device[@]}" --set "train.steps=$steps" --set scheduler.warmup_steps=10 \
      --set "data.eval_every=$steps" --set data.eval_batches=16 --set checkpoint.every=100000 \
      --set logging.log_every=10 --set "train.seed=$seed" "$@" --set "logging.run_dir=$out/run-$name-$seed" \
      > "$out/$name-$seed.log" 2>&1 || status=1
    cp "$out/run-$name-$seed/metrics.jsonl" "$out/$name-$seed.jsonl" 2>/dev/null
    rm -rf "$out/run-$name-$seed"
  done
}
train bf16 --set train.mixed_precision=bf16
train fp8
train map --set "fp8.precision_map=$out/map.json"
[[ -n "${BUDGET2:-}" ]] && train map2 --set "fp8.precision_map=$out/map2.json"
train firstlast --set fp8.first_last_blocks_bf16=true
if [[ "${CALIBRATE:-1}" == 1 ]]; then
  "$octet" calibrate "$config" --batches 8 "${device[@]}" --out "$out/calibration.json" > "$out/calibrate.log" 2>&1 ||
    status=1
  train static --set fp8.recipe=static --set "fp8.calibration=$out/calibration.json"
  train static-recal --set fp8.recipe=static --set "fp8.calibration=$out/calibration.json" \
    --set fp8.recalibrate_every=20 --set telemetry.enabled=true
fi
python3 "$here/localized_maps_table.py" "$out" > "$out/table.md" || status=1
cat "$out/table.md"
exit $status
