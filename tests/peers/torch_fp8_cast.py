#!/usr/bin/env python3
"""Golden comparison of `octet fp8 quantize --no-saturate` against PyTorch's float8 casts, an independent
implementation (PyTorch's float8_e4m3fn and float8_e5m2 conversions round to nearest even and do not
saturate). Exit 0 when every code agrees, 1 on any disagreement, 77 (skipped) when torch is not importable.

  torch_fp8_cast.py OCTET_BINARY"""
import math
import random
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    print("torch is not importable: skipped")
    sys.exit(77)


def values():
    rng = random.Random(20240520)
    xs = [0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028234663852886e38, -3.4028234663852886e38,
          1.1754943508222875e-38, 1e-45, -1e-45, 448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 61439.0]
    for _ in range(500000):  # many orders of magnitude, both signs
        xs.append(math.copysign(2.0 ** rng.uniform(-40, 40), rng.random() - 0.5))
    for _ in range(100000):  # arbitrary bit patterns (NaNs excluded: their sign is not part of the contract)
        x = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        if not math.isnan(x):
            xs.append(x)
    return [struct.unpack("<f", struct.pack("<f", x))[0] for x in xs]  # exactly float32


def main():
    octet = sys.argv[1]
    xs = values()
    text = "\n".join(repr(x) if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
                     for x in xs)
    t = torch.tensor(xs, dtype=torch.float32)
    failures = 0
    for fmt, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        run = subprocess.run([octet, "fp8", "quantize", "--format", fmt, "--no-saturate"], input=text,
                             capture_output=True, text=True, check=True)
        ours = [int(line.split()[0], 16) for line in run.stdout.splitlines()]
        theirs = t.to(dtype).view(torch.uint8).tolist()
        assert len(ours) == len(theirs) == len(xs), (len(ours), len(theirs), len(xs))
        bad = [(x, o, p) for x, o, p in zip(xs, ours, theirs) if o != p]
        print(f"{fmt}: {len(xs)} values, {len(bad)} differ from torch {torch.__version__}")
        for x, o, p in bad[:10]:
            print(f"  x={x!r}: octet 0x{o:02x}, torch 0x{p:02x}")
        failures += len(bad)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
