#!/usr/bin/env bash
# Runs the convergence test (four precision modes trained on the Brown corpus) and writes its table of
# results between the markers in docs/precision.md. Needs the Brown corpus (scripts/fetch_corpus.sh) and python3.
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
python3 - "$results/convergence.md" <<'PY'
import re, sys, datetime
table = open(sys.argv[1]).read().rstrip()
body = f"Measured {datetime.date.today().isoformat()} with `scripts/convergence_table.sh`.\n\n{table}"
doc = open("docs/precision.md").read()
doc = re.sub(r"(<!-- convergence:begin -->\n).*?(\n<!-- convergence:end -->)", lambda m: m.group(1) + body + m.group(2),
             doc, flags=re.S)
open("docs/precision.md", "w").write(doc)
print(body)
PY
