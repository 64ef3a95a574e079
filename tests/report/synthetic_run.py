#!/usr/bin/env python3
"""Writes a run directory's telemetry.sqlite with the schema of docs/telemetry.md and realistic rows, for the
report's tests of inputs that a real run rarely produces (NULLs, empty tables, alerts, layers moved to BF16).

  synthetic_run.py RUN_DIR [--mode fp8|bf16] [--steps N] [--layers L] [--interval K] [--nulls] [--empty]
                           [--alerts] [--phases] [--from-run DIR] [--checks | --checks-empty]

Without --checks or --checks-empty the database is one of an earlier version, without the tables of the FP8
checks (shadow_loss, shadow, recalibrations, localization). --checks writes them with rows (NULLs where the store
writes them: an excluded layer's measurements, a cosine of two zero gradients, a non-finite shadow loss, an
operand that saw no value), a precision schedule's switch to fp8 and the run keys of a precision map and a
calibration file; --checks-empty creates them without rows.

--from-run takes the step and validation losses from a real run's metrics.jsonl and its precision_map.json.
Prints a JSON object with what it wrote (counts the tests compare the page with)."""
import argparse
import json
import math
import os
import random
import sqlite3
import sys

SCHEMA = """
CREATE TABLE run(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE steps(step INTEGER PRIMARY KEY, loss REAL, learning_rate REAL, grad_norm REAL, loss_scale REAL,
  skipped INTEGER NOT NULL, skip_reason TEXT, tokens INTEGER, step_ms REAL, tokens_per_s REAL,
  fp8_gemms INTEGER, other_gemms INTEGER);
CREATE TABLE validation(step INTEGER PRIMARY KEY, loss REAL);
CREATE TABLE tensor_stats(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,
  amax REAL, scale REAL, saturated_fraction REAL, underflow_fraction REAL, sqnr_db REAL,
  PRIMARY KEY(step, layer, tensor));
CREATE TABLE gemms(layer TEXT NOT NULL, gemm TEXT NOT NULL, mode TEXT NOT NULL, reason TEXT, since_step INTEGER NOT NULL);
CREATE TABLE phases(step INTEGER NOT NULL, phase TEXT NOT NULL, ms REAL, PRIMARY KEY(step, phase));
CREATE TABLE events(id INTEGER PRIMARY KEY, step INTEGER, kind TEXT NOT NULL, layer TEXT, tensor TEXT,
  value REAL, threshold REAL, message TEXT NOT NULL);
"""
CHECKS_SCHEMA = """
CREATE TABLE shadow_loss(step INTEGER PRIMARY KEY, fp8_loss REAL, bf16_loss REAL, relative_difference REAL);
CREATE TABLE shadow(step INTEGER NOT NULL, layer TEXT NOT NULL, cosine REAL, PRIMARY KEY(step, layer));
CREATE TABLE recalibrations(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,
  scale_before REAL NOT NULL, scale_after REAL NOT NULL, amax REAL, reason TEXT NOT NULL,
  PRIMARY KEY(step, layer, tensor));
CREATE TABLE localization(layer TEXT PRIMARY KEY, position INTEGER NOT NULL, choice TEXT NOT NULL,
  reason TEXT NOT NULL, fp8_loss_change REAL, bf16_loss_change REAL, fp8_gradient_cosine REAL,
  bf16_gradient_cosine REAL, bf16_ms REAL, fp8_ms REAL, activation_sqnr_db REAL, weight_sqnr_db REAL,
  gradient_sqnr_db REAL);
"""
GEMMS = ("forward", "input_gradient", "weight_gradient")
TENSORS = {"activation": (4.0, 448.0), "weight": (0.12, 448.0), "gradient": (3e-3, 57344.0)}


def layer_names(layers):
    names = []
    for b in range(layers):
        names += [f"h.{b}.attn.c_attn", f"h.{b}.attn.c_proj", f"h.{b}.mlp.c_fc", f"h.{b}.mlp.c_proj"]
    return names + ["lm_head"]


def write_checks(db, a, steps, fp8_layers, pmap, rng):
    """The FP8 checks' tables and events; returns the counts the page must show."""
    c = {"localization_rows": 0, "localization_fp8": 0, "shadow_checks": 0, "shadow_cosines": 0, "recalibration_rows": 0}
    for i, e in enumerate(pmap):
        excluded = e["forward"] != "fp8" and e["layer"] == "lm_head"
        choice = "excluded" if excluded else "fp8" if e["forward"] == "fp8" else "bf16"
        measured = None if excluded else 1.0
        m = lambda v: None if measured is None else v  # noqa: E731
        db.execute("INSERT INTO localization VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (e["layer"], i, choice, e["reason"], m(1e-4 * (i - 2)), m(-2e-4 * i), m(0.999), m(0.998), m(2e-3),
                    m(1.2e-3), m(31.5), m(29.0), None if a.nulls and i == 1 else m(25.0)))
        c["localization_rows"] += 1
        c["localization_fp8"] += choice == "fp8"
    checked = [r["step"] for r in steps if r["step"] % 20 == 0]
    for k, s in enumerate(checked):
        not_finite = k == 1
        db.execute("INSERT INTO shadow_loss VALUES (?,?,?,?)", (s, None if not_finite else 3.0 + 1e-3 * k, 3.0,
                                                                None if not_finite else 1e-3 * k / 3.0))
        c["shadow_checks"] += not not_finite
        for li, layer in enumerate(fp8_layers):
            cosine = None if (k == 2 and li == 0) else 0.999 - 0.02 * li * rng.random()
            db.execute("INSERT INTO shadow VALUES (?,?,?)", (s, layer, cosine))
            c["shadow_cosines"] += cosine is not None
    c["shadow_layers"] = len(fp8_layers) if checked else 0
    recalibrated = [s for s in (50, 100) if any(r["step"] == s for r in steps)]
    for s in recalibrated:
        for li, layer in enumerate(fp8_layers):
            for t, (base, fmax) in TENSORS.items():
                seen = not (li == 0 and t == "gradient")
                db.execute("INSERT INTO recalibrations VALUES (?,?,?,?,?,?,?)",
                           (s, layer, t, fmax / base, fmax / (base * 1.5) if seen else fmax / base, base * 1.5 if seen else None,
                            "every 50 steps"))
                c["recalibration_rows"] += 1
    c["recalibration_steps"] = len(recalibrated)
    events = [(s, "recalibration", None, None, 3.0 * len(fp8_layers) - 1, None,
               f"step {s}: FP8 scales recalibrated (every 50 steps)") for s in recalibrated]
    events.append((30, "mode_change", None, None, None, None, "mode fp8 from step 31 (bf16 before): precision schedule"))
    db.executemany("INSERT INTO events(step, kind, layer, tensor, value, threshold, message) VALUES (?,?,?,?,?,?,?)", events)
    c["events"] = len(events)
    c["loss_phases"] = 2
    return c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--mode", default="fp8")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--nulls", action="store_true")
    p.add_argument("--empty", action="store_true")
    p.add_argument("--alerts", action="store_true")
    p.add_argument("--phases", action="store_true")
    p.add_argument("--from-run")
    p.add_argument("--checks", action="store_true")
    p.add_argument("--checks-empty", action="store_true")
    a = p.parse_args()
    rng = random.Random(7)
    os.makedirs(a.run_dir, exist_ok=True)
    path = os.path.join(a.run_dir, "telemetry.sqlite")
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    if a.checks or a.checks_empty:
        db.executescript(CHECKS_SCHEMA)

    steps, validation, pmap = [], [], None
    if a.from_run:
        with open(os.path.join(a.from_run, "metrics.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if "val_loss" in r:
                    validation.append((r["step"], r["val_loss"]))
                else:
                    steps.append(r)
        with open(os.path.join(a.from_run, "precision_map.json")) as f:
            pmap = json.load(f)
    elif not a.empty:
        for s in range(1, a.steps + 1):
            loss = 2.4 + 3.2 * math.exp(-s / (a.steps / 4)) + rng.gauss(0, 0.05)
            steps.append({"step": s, "loss": loss, "lr": 3e-3 * min(1, s / 10), "grad_norm": 1 + rng.random(),
                          "loss_scale": 1.0, "skipped": False, "skip_reason": "", "tokens": 512,
                          "ms": 40 + rng.random() * 4, "tokens_per_second": 512 / (0.04 + rng.random() * 0.004)})
            if s % 25 == 0 or s == a.steps:
                validation.append((s, loss + 0.15))
    if pmap is None:
        fp8 = a.mode == "fp8"
        pmap = [{"layer": n, "in_features": 64, "out_features": 64,
                 "forward": "fp8" if fp8 and n != "lm_head" else "bf16",
                 "input_gradient": "fp8" if fp8 and n != "lm_head" else "bf16",
                 "weight_gradient": "fp8" if fp8 and n != "lm_head" else "bf16",
                 "reason": ("excluded by config" if n == "lm_head" else "FP8 by policy") if fp8
                 else f"mode {a.mode}"} for n in layer_names(a.layers)]
    fp8_layers = [e["layer"] for e in pmap if e["forward"] == "fp8"]
    mode = "fp8" if fp8_layers else a.mode

    facts = {"name": os.path.basename(os.path.normpath(a.run_dir)), "octet_version": "0.1.0",
             "started_at": "2026-11-22T12:00:00Z", "mode": mode, "device": "cpu",
             "recipe": "delayed (hybrid E4M3/E5M2, history 16, margin 0)" if mode == "fp8" else "none",
             "telemetry_interval": str(a.interval), "config": "[train]\nmixed_precision = \"%s\"\n" % mode,
             "precision_map": json.dumps(pmap)}
    if a.checks:
        facts.update({"calibration": "runs/calibration.json", "precision_map_file": "runs/model.precision_map.json",
                      "localization": "budget 0.5%, predicted loss change +0.2%", "shadow_loss_threshold": "0.02",
                      "shadow_cosine_threshold": "0.9"})
    db.executemany("INSERT INTO run VALUES (?, ?)", facts.items())
    if a.empty:
        db.commit()
        print(json.dumps({"loss_points": 0, "validation_points": 0, "layers": len(pmap), "events": 0}))
        return

    skipped = set()
    if a.alerts:
        skipped.add(steps[len(steps) // 2]["step"])
    loss_points = 0
    for i, r in enumerate(steps):
        null = a.nulls and i % 7 == 3
        loss = None if null or r["step"] in skipped else r["loss"]
        loss_points += loss is not None
        db.execute("INSERT INTO steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                   (r["step"], loss, None if null else r["lr"], None if null else r["grad_norm"],
                    r.get("loss_scale"), int(r["step"] in skipped),
                    "non-finite gradient in h.0.mlp.c_fc.weight" if r["step"] in skipped else None,
                    r.get("tokens"), None if null else r["ms"], None if null else r["tokens_per_second"],
                    r.get("fp8_gemms", 3 * len(fp8_layers)), r.get("other_gemms", 3 * (len(pmap) - len(fp8_layers)))))
    for i, (s, v) in enumerate(validation):
        db.execute("INSERT INTO validation VALUES (?, ?)", (s, None if a.nulls and i == 0 else v))
    validation_points = sum(1 for i, (s, v) in enumerate(validation) if not (a.nulls and i == 0))

    moved_layer, moved_step = (fp8_layers[-1], steps[2 * len(steps) // 3]["step"]) if a.alerts and fp8_layers else (None, None)
    for e in pmap:
        for g in GEMMS:
            db.execute("INSERT INTO gemms VALUES (?,?,?,?,0)", (e["layer"], g, {"fp32": "f32", "fp16": "f16"}.get(e[g], e[g]), e["reason"]))
    if moved_layer:
        for g in GEMMS:
            db.execute("INSERT INTO gemms VALUES (?,?,'bf16',?,?)",
                       (moved_layer, g, f"moved to BF16 at step {moved_step}: gradient underflow above 5%", moved_step))

    stat_steps = [r["step"] for r in steps if r["step"] % a.interval == 0 or r["step"] == 1]
    stat_rows, at_threshold = 0, 0
    alert_step = stat_steps[len(stat_steps) // 3] if stat_steps else None
    for s in stat_steps:
        for li, layer in enumerate(fp8_layers):
            if moved_layer == layer and s > moved_step:
                continue
            for tensor, (base, fmax) in TENSORS.items():
                amax = base * (1 + 0.3 * li) * (1 + 0.5 * math.sin(s / 17 + li)) ** 2 + base * 0.05
                sat = 0.0 if rng.random() < 0.8 else 10 ** rng.uniform(-6, -3)
                under = 10 ** rng.uniform(-4, -1.5) if tensor == "gradient" else (0.0 if rng.random() < 0.5 else 10 ** rng.uniform(-7, -4))
                if a.alerts and s == alert_step and li == 0 and tensor == "activation":
                    sat = 0.012  # the saturation alert below
                null = a.nulls and (li + s) % 11 == 0
                at_threshold += (sat >= 0.01) + (not null and under >= 0.10)
                db.execute("INSERT INTO tensor_stats VALUES (?,?,?,?,?,?,?,?)",
                           (s, layer, tensor, None if null else amax, fmax / amax, sat, None if null else under, None))
                stat_rows += 1

    if a.phases:
        for r in steps:
            for phase, ms in (("forward", 12.0), ("backward", 24.0), ("optimizer", 3.0), ("data", 0.4)):
                db.execute("INSERT INTO phases VALUES (?,?,?)", (r["step"], phase, ms * (1 + 0.1 * rng.random())))

    checks = write_checks(db, a, steps, fp8_layers, pmap, rng) if a.checks else {}
    events = checks.pop("events", 0)
    if a.alerts:
        rows = [(steps[len(steps) // 2]["step"], "skipped_step", None, None, None, None,
                 "step skipped: non-finite gradient in h.0.mlp.c_fc.weight")]
        if fp8_layers:
            rows += [(alert_step, "saturation", fp8_layers[0], "activation", 0.012, 0.01,
                      f"{fp8_layers[0]} activation: 1.2% of values saturated (threshold 1%)"),
                     (moved_step, "underflow", moved_layer, "gradient", 0.071, 0.05,
                      f"{moved_layer} gradient: 7.1% of values underflowed (threshold 5%)"),
                     (moved_step, "layer_to_bf16", moved_layer, None, None, None,
                      f"{moved_layer} moved to BF16 <after repeated underflow> & kept there")]
        rows.append((None, "info", None, None, None, None, "telemetry every %d steps" % a.interval))
        db.executemany("INSERT INTO events(step, kind, layer, tensor, value, threshold, message) VALUES (?,?,?,?,?,?,?)", rows)
        events += len(rows)
    db.commit()
    db.close()
    print(json.dumps({"loss_points": loss_points, "validation_points": validation_points, "layers": len(pmap),
                      "fp8_layers": len(fp8_layers), "stat_steps": len(stat_steps), "events": events,
                      "cells_at_threshold": at_threshold, **checks}))


if __name__ == "__main__":
    sys.exit(main())
