#!/usr/bin/env python3
"""`octet report` on the inputs a real run rarely produces, written by synthetic_run.py with the store's schema:
NULLs in every nullable column, alerts that moved a layer to BF16, skipped steps, phase timings, a run with no
FP8 layer, tables with no rows, the FP8 checks' tables (localization, shadow checks, recalibrations) with NULLs,
empty, or absent as in a database of an earlier version. Each page must be written and, where Chromium is installed, load without a
problem and draw what the database holds. Run directories without a database, with a corrupt, truncated or
foreign one, or a --compare directory without one, must fail with exit code 2, one line on standard error, and
no page: neither a new one nor a partial one, and an earlier page is left as it was. Exit 0 pass, 1 fail.

  test_report_inputs.py OCTET_BINARY WORK_DIR"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report_browser  # noqa: E402

FAILURES = []


def expect(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL: " + message)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300)


def synthetic(work, name, *options):
    run_dir = os.path.join(work, name)
    r = run(sys.executable, os.path.join(HERE, "synthetic_run.py"), run_dir, *options)
    assert r.returncode == 0, r.stderr
    return run_dir, json.loads(r.stdout)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    chromium = report_browser.find_chromium()
    if chromium is None:
        print("chromium is not installed: pages are written but not loaded")

    reference, _ = synthetic(work, "reference", "--mode", "bf16", "--steps", "120")
    cases = [("full", ["--alerts", "--phases", "--nulls", "--layers", "3", "--steps", "200"], True),
             ("bf16", ["--mode", "bf16", "--steps", "60"], False),
             ("empty", ["--empty"], True),
             ("checks", ["--checks", "--alerts", "--nulls", "--layers", "3", "--steps", "200"], True),
             ("checks-empty", ["--checks-empty", "--steps", "60"], False)]
    for name, options, compare in cases:
        run_dir, wrote = synthetic(work, name, *options)
        args = [binary, "report", run_dir] + (["--compare", reference] if compare else [])
        r = run(*args)
        expect(r.returncode == 0, f"{name}: octet report exited with {r.returncode}: {r.stderr}")
        html = os.path.join(run_dir, "report.html")
        expect(os.path.exists(html), f"{name}: no report.html")
        if r.returncode != 0 or chromium is None:
            continue
        problems, loaded = report_browser.check_page(chromium, html, os.path.join(work, "browser-" + name),
                                                     min_colours=20, min_ink=0.05)
        for p in problems:
            expect(False, f"{name}: {p}")
        s = loaded["summary"]
        print(f"{name}: {s}")
        expect(s.get("loss-points") == str(wrote["loss_points"]), f"{name}: loss points {s.get('loss-points')} vs {wrote}")
        expect(s.get("validation-points") == str(wrote["validation_points"]),
               f"{name}: validation points {s.get('validation-points')} vs {wrote}")
        expect(s.get("events") == str(wrote["events"]), f"{name}: events {s.get('events')} vs {wrote}")
        expect(s.get("compare") == ("yes" if compare else "no"), f"{name}: compare {s.get('compare')}")
        if name == "full":
            expect(s.get("heatmap-rows-gradient") == str(wrote["fp8_layers"]) and s.get("heatmap-columns") == str(wrote["stat_steps"]),
                   f"full: heatmap {s}")
            expect(s.get("moved-cells") == "3" and s.get("phases") == "4", f"full: moved GEMMs and phases {s}")
            # The fractions' heatmaps are coloured against the alert thresholds (this run records none: the
            # defaults, 1% and 10%): the darkest red only where a value is at or beyond one, here the one
            # saturated fraction that raised the alert.
            expect(wrote["cells_at_threshold"] == 1 and s.get("heat-cells-at-threshold") == "1" and
                   s.get("heat-dark-cells") == "1", f"full: cells at the thresholds {wrote} {s}")
        if name == "bf16":
            expect(s.get("fp8-layers") == "0" and s.get("heatmaps") == "0", f"bf16: FP8 panels {s}")
        # The FP8 checks' panels: drawn from their tables (NULLs left out), empty where the tables are empty or,
        # in a database of an earlier version, absent; without a map the layers' precision now.
        checks = {"localization-map": "yes" if wrote.get("localization_rows") else "no",
                  "localization-rows": str(wrote.get("localization_rows") or wrote["layers"]),
                  "localization-fp8": str(wrote.get("localization_fp8", 0)),
                  "shadow-checks": str(wrote.get("shadow_checks", 0)), "shadow-layers": str(wrote.get("shadow_layers", 0)),
                  "shadow-cosines": str(wrote.get("shadow_cosines", 0)),
                  "shadow-lines": str(min(5, wrote.get("shadow_layers", 0))),
                  "recalibration-rows": str(wrote.get("recalibration_rows", 0)),
                  "recalibration-steps": str(wrote.get("recalibration_steps", 0)),
                  "calibration-file": "yes" if name == "checks" else "no",
                  "loss-phases": str(wrote.get("loss_phases", 0))}
        for key, value in checks.items():
            expect(s.get(key) == value, f"{name}: {key} is {s.get(key)!r}, expected {value} ({wrote})")

    # Bad inputs: exit code 2, one line, no page, an earlier page untouched, no temporary file left behind.
    def refused(name, run_dir, message, extra=()):
        before = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else None
        r = run(binary, "report", run_dir, *extra)
        expect(r.returncode == 2, f"{name}: exit code {r.returncode}, expected 2 ({r.stderr.strip()})")
        expect(r.stdout == "" and r.stderr.count("\n") == 1, f"{name}: output {r.stdout!r} {r.stderr!r}")
        expect(message in r.stderr, f"{name}: '{message}' not in {r.stderr!r}")
        after = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else None
        expect(before == after, f"{name}: the run directory changed: {before} -> {after}")

    refused("missing directory", os.path.join(work, "nowhere"), "is not a run directory")
    no_db = os.path.join(work, "no-db")
    os.makedirs(no_db)
    refused("no database", no_db, "has no telemetry.sqlite")

    corrupt = os.path.join(work, "corrupt")
    os.makedirs(corrupt)
    with open(os.path.join(corrupt, "telemetry.sqlite"), "wb") as f:
        f.write(os.urandom(8192))
    with open(os.path.join(corrupt, "report.html"), "w") as f:
        f.write("earlier page")
    refused("corrupt database", corrupt, "is not a readable octet telemetry database")
    with open(os.path.join(corrupt, "report.html")) as f:
        expect(f.read() == "earlier page", "corrupt database: the earlier page was changed")

    truncated, _ = synthetic(work, "truncated", "--alerts", "--steps", "400", "--layers", "4")
    path = os.path.join(truncated, "telemetry.sqlite")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 3)
    refused("truncated database", truncated, "is not a readable octet telemetry database")

    foreign = os.path.join(work, "foreign")
    os.makedirs(foreign)
    db = sqlite3.connect(os.path.join(foreign, "telemetry.sqlite"))
    db.execute("CREATE TABLE run(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.commit()
    db.close()
    refused("foreign database", foreign, "has no table 'steps'")

    good, _ = synthetic(work, "good", "--steps", "30")
    refused("missing reference", good, "--compare:", ["--compare", no_db])

    out = os.path.join(work, "elsewhere.html")
    r = run(binary, "report", good, "--out", out)
    expect(r.returncode == 0 and os.path.exists(out) and not os.path.exists(os.path.join(good, "report.html")),
           f"--out: {r.returncode} {r.stderr}")

    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("report inputs: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
