#!/usr/bin/env python3
"""bench/step_model.py against numbers worked out by hand. Exit 0 pass, 1 fail.

  test_step_model.py STEP_MODEL_SCRIPT CONFIG_DIR WORK_DIR

Hand counts:
  GPT-2 124M (L 12, C 768, Vp 50304, T 1024): linear weights 12 L C^2 = 84934656; biases and norms
    13 C L + 2 C = 119808 + 1536; embedding (tied head) Vp C + T C = 38633472 + 786432 = 39419904;
    total 124475904.
  llama3-1B (L 16, C 2048, 32 heads, 8 kv heads, F 8192, V 128256, untied): linear weights
    16 (2 C^2 + 2 C 512 + 3 C F) = 16 x 60817408 = 973078528; embedding V C = 262668288, the head as much;
    norms 16 x 2 C + C = 67584; total 1498482688.
  The fit: T1 = 100 ms, two GPUs 110 ms overlapped and 120 ms serial, 5 GB of gradients of which 1 GB is the
    embedding's: B_nv = 5 GB / 20 ms = 250 GB/s; tail(2) = 1 GB / 250 GB/s = 4 ms; s = (110 - 100 - 4) /
    (20 - 4) = 0.375. Four GPUs: sums 1.5 x 20 = 30 ms, tail 6 ms, the rest 24 ms within the window of
    66.67 ms: 100 + 6 + 0.375 x 24 = 115 ms. Sixteen GPUs on 2 nodes at 50 GB/s: sums 2 x 15/16 x 5 / 50 =
    187.5 ms, tail 37.5 ms, rest 150 ms, of which 66.67 in the window: 100 + 37.5 + 25 + 83.33 = 245.83 ms.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys

script, config_dir, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
spec = importlib.util.spec_from_file_location("step_model", script)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
failures = []


def expect(what, got, want, tolerance=1e-9):
    if not (isinstance(got, (int, float)) and math.isfinite(got) and abs(got - want) <= tolerance * max(1, abs(want))):
        failures.append(f"{what}: got {got!r}, expected {want!r}")


import tomllib  # noqa: E402

with open(os.path.join(config_dir, "gpt2-124M.toml"), "rb") as f:
    total, embedding, linear = m.parameters(tomllib.load(f)["model"])
expect("gpt2-124M parameters", total, 124475904)
expect("gpt2-124M embedding", embedding, 39419904)
expect("gpt2-124M linear weights", linear, 84934656)
with open(os.path.join(config_dir, "llama3-1B.toml"), "rb") as f:
    total, embedding, linear = m.parameters(tomllib.load(f)["model"])
expect("llama3-1B parameters", total, 1498482688)
expect("llama3-1B embedding", embedding, 262668288)
expect("llama3-1B linear weights", linear, 973078528)

model = m.StepModel.fit(100.0, 110.0, 120.0, 5.0, 1.0, 50.0, 8)
expect("NVLink bandwidth", model.nv_gbps, 250.0)
expect("overlapped share", model.share, 0.375)
expect("4 GPUs", model.step_ms(4), 115.0)
expect("16 GPUs on 2 nodes", model.step_ms(16), 100 + 37.5 + 0.375 * 200 / 3 + (150 - 200 / 3))

# The command on made-up metrics: 5 untimed steps, then the times above; its fit must be the module's.
def metrics(path, ms):
    with open(path, "w") as f:
        for step in range(1, 9):
            f.write(json.dumps({"step": step, "ms": 1000.0 if step <= 5 else ms, "tokens_per_second": 1.0}) + "\n")
    return path

one, two = metrics(os.path.join(work, "g1.jsonl"), 100.0), metrics(os.path.join(work, "g2.jsonl"), 110.0)
serial = metrics(os.path.join(work, "g2s.jsonl"), 120.0)
out = subprocess.run([sys.executable, script, "--config", os.path.join(config_dir, "llama3-1B.toml"), "--one", one,
                      "--two", two, "--two-serial", serial, "--check", f"4:{one}:{two}", "--gpus", "16", "--json"],
                     capture_output=True, text=True)
if out.returncode != 0:
    failures.append(f"step_model.py failed: {out.stderr.strip()}")
else:
    r = json.loads(out.stdout)
    gb = 1498482688 * 4 / 1e9
    expect("command: one GPU", r["one_gpu_ms"], 100.0)
    expect("command: NVLink bandwidth", r["nvlink_bus_gbps"], gb / 0.020)
    fitted = m.StepModel.fit(100.0, 110.0, 120.0, gb, 262668288 * 4 / 1e9, 45.0, 8)
    expect("command: share", r["overlapped_share"], fitted.share)
    expect("command: 16 GPUs", r["predictions"][0]["data_parallel_ms"], fitted.step_ms(16))
    expect("command: check error", r["checks"][0]["error"], fitted.step_ms(4) / 110.0 - 1.0)
    fp8, bf16, rs = m.fsdp_bytes(1498482688, 973078528, 8, 4)
    expect("FSDP FP8 gathers", r["predictions"][0]["fsdp_gather_bytes_fp8"], 2 * 7 / 8 * (973078528 + 2 * 525404160))
    expect("FSDP BF16 gathers", r["predictions"][0]["fsdp_gather_bytes_bf16"], 2 * 7 / 8 * 2 * 1498482688)
# A NaN time is refused.
bad = os.path.join(work, "bad.jsonl")
with open(bad, "w") as f:
    for step in range(1, 8):
        f.write(json.dumps({"step": step, "ms": float("nan") if step == 7 else 100.0, "tokens_per_second": 1.0}) + "\n")
out = subprocess.run([sys.executable, script, "--config", os.path.join(config_dir, "llama3-1B.toml"), "--one", bad,
                      "--two", two, "--two-serial", serial], capture_output=True, text=True)
if out.returncode == 0 or "no usable time" not in out.stderr:
    failures.append(f"a NaN step time was not refused: rc {out.returncode}, {out.stderr.strip()!r}")

for f in failures:
    print("FAIL", f)
print("step_model: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
sys.exit(1 if failures else 0)
