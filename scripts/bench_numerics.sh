#!/usr/bin/env bash
# Runs the CPU numerics benchmarks and records their figures: the raw Google Benchmark JSON in
# docs/bench/numerics-cpu.json and a table between the markers in docs/benchmarks.md. Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
octet_install_packages
octet_configure
cmake --build "$OCTET_BUILD_DIR" --target bench_numerics -j "$(nproc)"
"$OCTET_BUILD_DIR/bench/bench_numerics" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out=docs/bench/numerics-cpu.json --benchmark_out_format=json
python3 - <<'PY'
import json, re, datetime
run = json.load(open("docs/bench/numerics-cpu.json"))
ctx = run["context"]
rows = ["| benchmark | elements | median time | median throughput |", "|---|---|---|---|"]
for b in run["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    name = b["run_name"]
    n = name.split("/")[1] if "/" in name else "4096 per iteration"
    t = f'{b["real_time"]:.1f} {b["time_unit"]}'
    rate = f'{b["items_per_second"] / 1e6:.1f} M values/s' if "items_per_second" in b else ""
    rows.append(f"| {name.split('/')[0]} | {n} | {t} | {rate} |")
cpu = f'{ctx.get("num_cpus")} CPUs at {ctx.get("mhz_per_cpu")} MHz'
body = "\n".join([f"Measured {ctx['date']} on a {cpu} x86-64 machine, "
                  f"octet Release build (the Google Benchmark library reports a {ctx.get('library_build_type', '?')} build of itself), median of 5 runs.", "", *rows])
doc = open("docs/benchmarks.md").read()
doc = re.sub(r"(<!-- numerics-bench:begin -->\n).*?(\n<!-- numerics-bench:end -->)", lambda m: m.group(1) + body + m.group(2), doc, flags=re.S)
open("docs/benchmarks.md", "w").write(doc)
print(body)
PY
