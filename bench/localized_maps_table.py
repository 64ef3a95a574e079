#!/usr/bin/env python3
"""The table of bench/localized_maps.sh: per variant, the layers in FP8, the median tokens/s of the timed steps
(the first five left out) and the validation loss at the end, per seed and their mean, with the change
against bf16 mode and against fp8 mode (every eligible layer in FP8).

    bench/localized_maps_table.py RESULTS_DIR        (NAME-SEED.jsonl and NAME-SEED.log files)
"""
import glob
import json
import math
import os
import re
import statistics
import sys

VARIANTS = [
    ("bf16", "bf16 mode"),
    ("fp8", "fp8 mode, every eligible layer"),
    ("map", "fp8, localized map"),
    ("map2", "fp8, localized map, tighter budget"),
    ("firstlast", "fp8, first and last blocks in BF16"),
    ("static", "fp8, calibrated static scales"),
    ("static-recal", "fp8, static scales recalibrated every 20 steps"),
]


def run_of(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if "tokens_per_second" in r]
    if not steps:
        raise SystemExit(f"{path}: no training steps")
    validation = [r["val_loss"] for r in rows if "val_loss" in r]
    if not validation:
        raise SystemExit(f"{path}: no validation loss")
    if not math.isfinite(validation[-1]):
        raise SystemExit(f"{path}: the validation loss {validation[-1]} is not finite")
    tokens_per_s = statistics.median(r["tokens_per_second"] for r in steps[5:] or steps)
    return tokens_per_s, validation[-1]


def fp8_layers(log_path):
    if not os.path.exists(log_path):
        return "-"
    text = open(log_path).read()
    if "bf16 on the" in text or "mixed_precision = \"bf16\"" in text:
        return "0"
    m = re.search(r"(\d+) of (\d+) linear layers in FP8", text)
    return f"{m.group(1)} of {m.group(2)}" if m else "0"


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    results = {}
    for name, _ in VARIANTS:
        for path in sorted(glob.glob(os.path.join(out, f"{name}-*.jsonl"))):
            seed = path[len(os.path.join(out, name)) + 1:-len(".jsonl")]
            if not seed.isdigit():
                continue
            results.setdefault(name, {})[seed] = run_of(path) + (fp8_layers(path[:-len(".jsonl")] + ".log"),)
    if "bf16" not in results or "fp8" not in results:
        raise SystemExit(f"{out}: the bf16 and fp8 runs are needed")
    seeds = sorted(results["bf16"])

    def mean_loss(name):
        return statistics.mean(results[name][s][1] for s in seeds)

    def mean_speed(name):
        return statistics.mean(results[name][s][0] for s in seeds)

    print(f"| variant | layers in FP8 | tokens/s | vs bf16 | validation loss (seed {' / '.join(seeds)}) "
          "| loss vs bf16 | loss vs fp8 |")
    print("|---|---|---|---|---|---|---|")
    for name, label in VARIANTS:
        if name not in results or any(s not in results[name] for s in seeds):
            continue
        losses = " / ".join(f"{results[name][s][1]:.4f}" for s in seeds)
        speed = mean_speed(name)
        loss = mean_loss(name)
        mean = f" (mean {loss:.4f})" if len(seeds) > 1 else ""
        print(f"| {label} | {results[name][seeds[0]][2]} | {speed:,.0f} | {speed / mean_speed('bf16'):.3f}x "
              f"| {losses}{mean} | {100 * (loss / mean_loss('bf16') - 1):+.2f}% "
              f"| {100 * (loss / mean_loss('fp8') - 1):+.2f}% |")
    print()
    print(f"Seeds {', '.join(seeds)}; tokens/s is the mean over the seeds of each run's median step.")


main()
