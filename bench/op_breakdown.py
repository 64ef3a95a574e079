#!/usr/bin/env python3
"""Device time by kind of op, per phase, from `octet bench train --json` results (the "device_ms_by_kind" of
the synchronised phase pass), as one markdown table per file.

    bench/op_breakdown.py RESULT.json [RESULT.json ...]
"""
import json
import sys

for path in sys.argv[1:]:
    with open(path) as f:
        r = json.load(f)
    kinds = (r.get("phases") or {}).get("device_ms_by_kind")
    print(f"{r['model']}; {r['mode']}, batch {r['batch_size']} x {r['seq_len']}: "
          f"{r['ms_per_step']:.1f} ms/step timed ({r['device']['name']})")
    print()
    if not kinds:
        print("(no device times: the backend does not time its ops)\n")
        continue
    print("| kind of op | forward ms | backward ms | optimizer ms | total ms | share |")
    print("|---|---|---|---|---|---|")
    total = sum(k["forward_ms"] + k["backward_ms"] + k["optimizer_ms"] for k in kinds)
    for k in kinds:
        t = k["forward_ms"] + k["backward_ms"] + k["optimizer_ms"]
        print(f"| {k['kind']} | {k['forward_ms']:.1f} | {k['backward_ms']:.1f} | {k['optimizer_ms']:.1f} "
              f"| {t:.1f} | {100 * t / total:.0f}% |")
    print(f"| sum | | | | {total:.1f} | |")
    print()
