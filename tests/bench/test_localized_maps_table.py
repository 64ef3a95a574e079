#!/usr/bin/env python3
"""bench/localized_maps_table.py on results written here, against numbers worked out by hand. Exit 0 pass,
1 fail.

  test_localized_maps_table.py TABLE_SCRIPT WORK_DIR

Hand counts: two seeds; each run's steps 1..10 with tokens/s 1000 for the first five (left out) and then
100, 200, 300, 400, 500 (bf16: median 300) or twice that (fp8: median 600), so fp8 is 2.000x; validation
losses bf16 4.0 and 6.0 (mean 5.0), fp8 5.0 and 6.0 (mean 5.5: +10.00% against bf16, bf16 -9.09% against
fp8). A run without a validation loss, or a NaN loss, is an error, never a row.
"""
import json
import os
import subprocess
import sys

script, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
failures = []


def write_run(directory, name, seed, speed_factor, val_loss, layers_line, validation=True):
    with open(os.path.join(directory, f"{name}-{seed}.jsonl"), "w") as f:
        for step in range(1, 11):
            tps = 1000.0 if step <= 5 else 100.0 * (step - 5) * speed_factor
            f.write(json.dumps({"step": step, "loss": 7.0, "tokens_per_second": tps}) + "\n")
        if validation:
            f.write(json.dumps({"step": 10, "val_loss": val_loss}) + "\n")
    with open(os.path.join(directory, f"{name}-{seed}.log"), "w") as f:
        f.write(layers_line + "\n")


def table(directory):
    return subprocess.run([sys.executable, script, directory], capture_output=True, text=True)


good = os.path.join(work, "good")
os.makedirs(good, exist_ok=True)
fp8_line = "FP8 training enabled: recipe=delayed; 48 of 49 linear layers in FP8; lm_head: excluded by config"
bf16_line = "octet 0.1.0: GPT-2: ...; bf16 on the cuda backend"
for seed, (b, f) in {"1": (4.0, 5.0), "2": (6.0, 6.0)}.items():
    write_run(good, "bf16", seed, 1, b, bf16_line)
    write_run(good, "fp8", seed, 2, f, fp8_line)
r = table(good)
rows = [line for line in r.stdout.splitlines() if line.startswith("| ")]
expected_bf16 = "| bf16 mode | 0 | 300 | 1.000x | 4.0000 / 6.0000 (mean 5.0000) | +0.00% | -9.09% |"
expected_fp8 = ("| fp8 mode, every eligible layer | 48 of 49 | 600 | 2.000x | 5.0000 / 6.0000 (mean 5.5000) "
                "| +10.00% | +0.00% |")
if r.returncode != 0:
    failures.append(f"good results: exit {r.returncode}: {r.stderr}")
if expected_bf16 not in rows:
    failures.append(f"bf16 row: {rows}")
if expected_fp8 not in rows:
    failures.append(f"fp8 row: {rows}")
if "seed 1 / 2" not in r.stdout:
    failures.append(f"the header names the seeds: {r.stdout}")

missing = os.path.join(work, "missing")
os.makedirs(missing, exist_ok=True)
write_run(missing, "bf16", "1", 1, 4.0, bf16_line)
write_run(missing, "fp8", "1", 2, 5.0, fp8_line, validation=False)
r = table(missing)
if r.returncode == 0 or "no validation loss" not in r.stderr:
    failures.append(f"a run without a validation loss: exit {r.returncode}, {r.stderr}")

nan = os.path.join(work, "nan")
os.makedirs(nan, exist_ok=True)
write_run(nan, "bf16", "1", 1, 4.0, bf16_line)
write_run(nan, "fp8", "1", 2, float("nan"), fp8_line)
r = table(nan)
if r.returncode == 0 or "not finite" not in r.stderr:
    failures.append(f"a NaN validation loss: exit {r.returncode}, {r.stderr} {r.stdout}")

for failure in failures:
    print("FAIL:", failure)
print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
