#!/usr/bin/env python3
"""The dashboard in a real browser: trains a tiny GPT in fp8 (alerts move layers to BF16) and in bf16 with
`octet train`, and one in fp8 with a precision map from `octet localize`, a calibration file, shadow checks and
recalibrations, writes `octet report RUN --compare REFERENCE`, loads the page in headless Chromium and requires
that its script finished without a console message, that it drew what telemetry.sqlite holds (loss and
validation points, precision map cells, heatmap rows per tensor, events, localization rows, shadow checks,
recalibrations, the phases of a run resumed in another mode), that it made no network request and
names no external resource, and that its screenshot is not blank. Then it plants failures in copies of the page
(an error in a panel, an uncaught error after load, a request to the network, a blank page) and requires the
same checks to reject each. Exit 0 pass, 1 fail, 77 skipped (no Chromium).

  test_dashboard.py OCTET_BINARY WORK_DIR"""
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_browser  # noqa: E402

FAILURES = []


def expect(condition, message):
    if not condition:
        FAILURES.append(message)
        print("FAIL: " + message)


def octet(binary, *args):
    r = subprocess.run([binary] + list(args), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"octet {' '.join(args)} exited with {r.returncode}: {r.stderr}")
    return r.stdout


def prepare_data(binary, work):
    text = os.path.join(work, "text")
    os.makedirs(text)
    files = []
    for d in range(40):
        path = os.path.join(text, f"doc{100 + d}.txt")
        with open(path, "w") as f:
            for i in range(60):
                f.write(f"The quick brown fox {(d * 7 + i) % 13} jumps over the lazy dog.\n")
        files.append(path)
    octet(binary, "data", "prepare", "--tokenizer", "bytes", "--out", os.path.join(work, "shards"), *files)


def write_config(work, name, mode, fp8):
    run_dir = os.path.join(work, "run-" + name)
    config = os.path.join(work, name + ".toml")
    with open(config, "w") as f:
        f.write(f"""[model]
vocab_size = 256
max_seq_len = 16
layers = 2
heads = 2
channels = 32
[train]
mixed_precision = "{mode}"
batch_size = 2
seq_len = 16
steps = 40
[scheduler]
warmup_steps = 2
[fp8]
{fp8}
[data]
dir = "{os.path.join(work, "shards")}"
eval_every = 10
eval_batches = 2
[logging]
run_dir = "{run_dir}"
log_every = 10
[telemetry]
interval = 2
""")
    return config, run_dir


def train(binary, work, mode):
    """A tiny run; in fp8 any underflow raises an alert that moves the layer to BF16, so that the page has moved
    GEMMs and events to show whatever the alert thresholds' defaults are."""
    config, run_dir = write_config(work, mode, mode, 'on_alert = "bf16_layer"\nalert_underflow = 0.0')
    octet(binary, "train", config)
    return run_dir


PLANTED_BF16 = "h.1.mlp.c_proj"


def train_with_checks(binary, work):
    """An fp8 run of the static recipe with what the localization, shadow and calibration panels show: a precision
    map made by `octet localize` (every layer in FP8, casts counted as free; one layer then set to BF16 in it), a
    calibration file from `octet calibrate`, a shadow check every 4 steps and a recalibration every 10."""
    config, run_dir = write_config(work, "checks", "fp8", 'recipe = "static"\nshadow_every = 4\nrecalibrate_every = 10')
    map_file, calibration = os.path.join(work, "checks.map.json"), os.path.join(work, "checks.calibration.json")
    octet(binary, "localize", config, "--batches", "2", "--free-casts", "--out", map_file)
    with open(map_file) as f:
        m = json.load(f)
    for layer in m["layers"]:
        if layer["name"] == PLANTED_BF16:
            layer["choice"], layer["reason"] = "bf16", "bf16: kept out of FP8 by the test"
    with open(map_file, "w") as f:
        json.dump(m, f, indent=1)
    octet(binary, "calibrate", config, "--batches", "2", "--out", calibration)
    octet(binary, "train", config, "--set", "fp8.precision_map=" + map_file, "--set", "fp8.calibration=" + calibration)
    return run_dir, m


# The first step of the run's latest segment (0, or the step after its last mode_change event), and the rowid
# of the row of gemms g's GEMM in force then.
SEGMENT_START = "(SELECT COALESCE(MAX(step) + 1, 0) FROM events WHERE kind = 'mode_change')"
AT_SEGMENT_START = ("(SELECT rowid FROM gemms WHERE layer = g.layer AND gemm = g.gemm AND since_step <= "
                    f"{SEGMENT_START} ORDER BY since_step DESC, rowid DESC LIMIT 1)")


def expected_summary(run_dir, compare_dir):
    """What the page must report having drawn, counted independently from the database."""
    db = sqlite3.connect(os.path.join(run_dir, "telemetry.sqlite"))
    one = lambda sql, *a: db.execute(sql, a).fetchone()[0]  # noqa: E731
    e = {
        "loss-points": one("SELECT COUNT(*) FROM steps WHERE loss IS NOT NULL"),
        "validation-points": one("SELECT COUNT(*) FROM validation WHERE loss IS NOT NULL"),
        "precision-layers": one("SELECT COUNT(DISTINCT layer) FROM gemms"),
        "precision-cells": one("SELECT COUNT(*) FROM (SELECT DISTINCT layer, gemm FROM gemms)"),
        # Layers in FP8 at the start of the run's latest segment (a run resumed in another mode starts anew).
        "fp8-layers": one(f"SELECT COUNT(DISTINCT layer) FROM gemms g WHERE mode = 'fp8' AND rowid = {AT_SEGMENT_START}"),
        "heatmap-columns": min(400, one("SELECT COUNT(DISTINCT step) FROM tensor_stats")),
        "throughput-points": one("SELECT COUNT(*) FROM steps WHERE tokens_per_s IS NOT NULL"),
        "phases": one("SELECT COUNT(DISTINCT phase) FROM phases"),
        "events": one("SELECT COUNT(*) FROM events"),
        "moved-cells": one(f"""SELECT COUNT(*) FROM (SELECT layer, gemm FROM gemms g WHERE since_step > {SEGMENT_START}
                               AND mode != (SELECT mode FROM gemms WHERE rowid = {AT_SEGMENT_START})
                               GROUP BY layer, gemm)"""),
    }
    # The fractions' heatmaps are coloured against the run's alert thresholds: the darkest red exactly where a
    # value is at or beyond one (a threshold of 0 gives no scale to colour against).
    thresholds = dict(db.execute("SELECT key, value FROM run WHERE key IN ('alert_saturation', 'alert_underflow')"))
    at_threshold = 0
    for column, key, default in (("saturated_fraction", "alert_saturation", 0.01),
                                 ("underflow_fraction", "alert_underflow", 0.10)):
        t = float(thresholds.get(key, default))
        if t > 0:
            at_threshold += one(f"SELECT COUNT(*) FROM tensor_stats WHERE {column} >= ?", t)
    e["heat-cells-at-threshold"] = at_threshold
    e["heat-dark-cells"] = at_threshold
    for (tensor,) in db.execute("SELECT DISTINCT tensor FROM tensor_stats"):
        e["heatmap-rows-" + tensor] = one("SELECT COUNT(DISTINCT layer) FROM tensor_stats WHERE tensor = ?", tensor)
    # The localization, shadow and calibration panels (tables a database of an earlier version lacks).
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    count = lambda table, sql: one(sql) if table in tables else 0  # noqa: E731
    mapped = count("localization", "SELECT COUNT(*) FROM localization")
    e["localization-map"] = "yes" if mapped else "no"
    e["localization-rows"] = mapped or one("SELECT COUNT(DISTINCT layer) FROM gemms")
    e["localization-fp8"] = count("localization", "SELECT COUNT(*) FROM localization WHERE choice = 'fp8'")
    e["shadow-checks"] = count("shadow_loss", "SELECT COUNT(*) FROM shadow_loss WHERE relative_difference IS NOT NULL")
    e["shadow-layers"] = count("shadow", "SELECT COUNT(DISTINCT layer) FROM shadow")
    e["shadow-cosines"] = count("shadow", "SELECT COUNT(*) FROM shadow WHERE cosine IS NOT NULL")
    e["shadow-lines"] = min(5, count("shadow", "SELECT COUNT(DISTINCT layer) FROM shadow WHERE cosine IS NOT NULL"))
    e["recalibration-rows"] = count("recalibrations", "SELECT COUNT(*) FROM recalibrations")
    e["recalibration-steps"] = count("recalibrations", "SELECT COUNT(DISTINCT step) FROM recalibrations")
    e["calibration-file"] = "yes" if one("SELECT COUNT(*) FROM run WHERE key = 'calibration'") else "no"
    changes = one("SELECT COUNT(*) FROM events WHERE kind = 'mode_change'")
    e["loss-phases"] = changes + 1 if changes else 0
    if compare_dir:
        ref = sqlite3.connect(os.path.join(compare_dir, "telemetry.sqlite"))
        e["compare-loss-points"] = ref.execute("SELECT COUNT(*) FROM steps WHERE loss IS NOT NULL").fetchone()[0]
        e["compare-validation-points"] = ref.execute(
            "SELECT COUNT(*) FROM validation WHERE loss IS NOT NULL").fetchone()[0]
    return {k: str(v) for k, v in e.items()}


def check_report(chromium, work, html, run_dir, compare_dir, name):
    problems, loaded = report_browser.check_page(chromium, html, os.path.join(work, "browser-" + name))
    for p in problems:
        expect(False, f"{name}: {p}")
    print(f"{name}: summary {loaded['summary']}; screenshot {loaded.get('screenshot_stats')}")
    for key, value in expected_summary(run_dir, compare_dir).items():
        expect(loaded["summary"].get(key) == value,
               f"{name}: the page drew {key}={loaded['summary'].get(key)!r}, the database holds {value}")
    with open(html, encoding="utf-8") as f:
        page = f.read()
    template = re.sub(r'<script type="application/json" id="octet-data">.*?</script>', "", page, flags=re.S)
    expect("http://" not in template and "https://" not in template,
           f"{name}: the page's markup, style or script names an http(s) address")
    return loaded


def planted(chromium, work, html, name, edit, expected_problem):
    """A copy of the page changed by `edit` must fail the checks, with a problem that mentions expected_problem."""
    with open(html, encoding="utf-8") as f:
        page = f.read()
    changed = edit(page)
    assert changed != page, f"planting {name} changed nothing"
    path = os.path.join(work, "planted-" + name + ".html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(changed)
    problems, _ = report_browser.check_page(chromium, path, os.path.join(work, "browser-planted-" + name))
    print(f"planted {name}: {len(problems)} problem(s): {problems[:3]}")
    expect(any(expected_problem in p for p in problems),
           f"planted {name}: the checks did not report '{expected_problem}' (they found {problems})")


def main():
    binary, work = sys.argv[1], sys.argv[2]
    chromium = report_browser.find_chromium()
    if chromium is None:
        print("chromium is not installed: skipped")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prepare_data(binary, work)
    fp8_run, bf16_run = train(binary, work, "fp8"), train(binary, work, "bf16")
    for run in (fp8_run, bf16_run):
        if not os.path.exists(os.path.join(run, "telemetry.sqlite")):
            print(f"FAIL: octet train wrote no telemetry.sqlite in {run}")
            return 1

    out = octet(binary, "report", fp8_run, "--compare", bf16_run)
    html = os.path.join(fp8_run, "report.html")
    expect(out.startswith(html + ": ") and out.count("\n") == 1, f"octet report printed {out!r}")
    loaded = check_report(chromium, work, html, fp8_run, bf16_run, "fp8-vs-bf16")
    s = loaded["summary"]
    expect(int(s.get("fp8-layers", 0)) > 0, "the fp8 run shows no FP8 layer")
    for tensor in ("activation", "weight", "gradient"):
        expect(s.get("heatmap-rows-" + tensor) == s.get("fp8-layers"),
               f"{tensor} heatmap has {s.get('heatmap-rows-' + tensor)} rows for {s.get('fp8-layers')} FP8 layers")
    expect(int(s.get("moved-cells", 0)) > 0, "no GEMM shows as moved to BF16 although alerts moved layers")
    expect(s.get("compare") == "yes" and s.get("charts") == "3", f"loss, difference and throughput charts: {s}")

    # A run without FP8 layers and without a reference: the page still works, with empty FP8 panels.
    bf16_html = os.path.join(work, "bf16-report.html")
    octet(binary, "report", bf16_run, "--out", bf16_html)
    s = check_report(chromium, work, bf16_html, bf16_run, None, "bf16-alone")["summary"]
    expect(s.get("fp8-layers") == "0" and s.get("heatmaps") == "0" and s.get("compare") == "no",
           f"the bf16 run's page: {s}")

    # The bf16 run continued in fp8 from its last checkpoint: the page describes its latest segment (layers in
    # FP8 from the step of the change, none framed as moved by an alert) and says when the mode changed.
    resumed = os.path.join(work, "run-resumed")
    shutil.copytree(bf16_run, resumed)
    config = os.path.join(work, "resumed.toml")
    with open(os.path.join(work, "fp8.toml")) as f, open(config, "w") as g:
        g.write(f.read().replace(fp8_run, resumed).replace("steps = 40", "steps = 50"))
    octet(binary, "train", config, "--resume")
    resumed_html = os.path.join(work, "resumed-report.html")
    out = octet(binary, "report", resumed, "--out", resumed_html)
    s = check_report(chromium, work, resumed_html, resumed, None, "bf16-resumed-in-fp8")["summary"]
    expect(int(s.get("fp8-layers", 0)) > 0 and f"{s.get('fp8-layers')} of " in out, f"the resumed run's FP8 layers: {s} {out}")
    with open(resumed_html, encoding="utf-8") as f:
        expect("mode fp8 from step 41 (bf16 before)" in f.read(), "the resumed run's page does not say its mode changed")
    expect(s.get("loss-phases") == "2", f"the resumed run's loss chart shows {s.get('loss-phases')} phases, not bf16 and fp8")

    # The run with a precision map, a calibration file, shadow checks and recalibrations: every panel has its
    # data, counted from the database above, and the counts are the run's own.
    checks_run, pmap = train_with_checks(binary, work)
    octet(binary, "report", checks_run)
    s = check_report(chromium, work, os.path.join(checks_run, "report.html"), checks_run, None, "checks")["summary"]
    layers = len(pmap["layers"])
    expect(s.get("localization-map") == "yes" and s.get("localization-rows") == str(layers) and
           s.get("localization-fp8") == str(layers - 2), f"checks: localization of {layers} layers, lm_head excluded, one BF16: {s}")
    # 40 steps: checks at 4, 8, ..., 40 of the 8 layers in FP8; recalibrations at 10, 20, 30, 40 of 3 operands each.
    expect(s.get("shadow-checks") == "10" and s.get("shadow-layers") == str(layers - 2) and s.get("shadow-lines") == "5",
           f"checks: shadow panel {s}")
    expect(s.get("recalibration-steps") == "4" and s.get("recalibration-rows") == str(4 * 3 * (layers - 2)) and
           s.get("calibration-file") == "yes", f"checks: calibration panel {s}")
    db = sqlite3.connect(os.path.join(checks_run, "telemetry.sqlite"))
    expect(db.execute("SELECT COUNT(*) FROM events WHERE kind = 'scale_jump'").fetchone()[0] == 0,
           "checks: recalibrations raised scale_jump alerts")
    expect(db.execute("SELECT mode FROM gemms WHERE layer = ? AND gemm = 'forward'", (PLANTED_BF16,)).fetchone()[0] == "bf16",
           f"checks: the map's BF16 layer {PLANTED_BF16} runs in FP8")
    with open(os.path.join(checks_run, "report.html"), encoding="utf-8") as f:
        page = f.read()
    expect("bf16: kept out of FP8 by the test" in page and "checks.calibration.json" in page,
           "checks: the page lacks the map's reason or the calibration file")

    # The checks must reject broken pages.
    planted(chromium, work, html, "panel-error", lambda p: p.replace("  renderEvents();\n",
                                                                     "  renderEvents();\n  null.planted;\n", 1),
            "page status is 'error'")
    planted(chromium, work, html, "late-error", lambda p: p.replace(
        "</body>", "<script>setTimeout(() => { throw new Error('planted'); }, 0);</script></body>", 1), "console:")
    planted(chromium, work, html, "syntax-error", lambda p: p.replace("function renderEvents()", "function renderEvents(", 1),
            "page status is 'loading'")
    # A request made by script, with the page's Content-Security-Policy removed: only the network log sees it.
    planted(chromium, work, html, "network", lambda p: re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", p).replace(
        "</body>", "<script>new Image().src = 'http' + '://192.0.2.1/planted.png';</script></body>", 1),
        "network request: http://192.0.2.1/planted.png")
    planted(chromium, work, html, "external-link", lambda p: p.replace(
        "<footer", '<link rel="stylesheet" href="https://example.invalid/x.css"><footer', 1), "external reference")
    planted(chromium, work, html, "blank", lambda p: '<!DOCTYPE html><html><body data-status="ok"></body></html>',
            "the screenshot looks blank")

    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("dashboard: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
