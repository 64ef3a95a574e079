#!/usr/bin/env bash
# Runs the convergence tests (GPT-2 in four precision modes and Llama in three, trained on the Brown corpus)
# and writes their tables of results between the markers in docs/precision.md. Needs the Brown corpus (scripts/fetch_corpus.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
bash scripts/fetch_corpus.sh
octet_configure
cmake --build "$OCTET_BUILD_DIR" --target test_convergence -j "$(nproc)"
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
OCTET_RESULTS_DIR="$results" "$OCTET_BUILD_DIR/tests/convergence/test_convergence"
python3 - "$results" <<'PY'
import re, sys, datetime
doc = open("docs/precision.md").read()
for file, marker in (("convergence.md", "convergence"), ("convergence-llama.md", "convergence-llama")):
    table = open(f"{sys.argv[1]}/{file}").read().rstrip()
    body = f"Measured {datetime.date.today().isoformat()} with `scripts/convergence_table.sh`.\n\n{table}"
    doc = re.sub(rf"(<!-- {marker}:begin -->\n).*?(\n<!-- {marker}:end -->)",
                 lambda m: m.group(1) + body + m.group(2), doc, flags=re.S)
    print(body)
open("docs/precision.md", "w").write(doc)
PY
