"""Loads an `octet report` page in headless Chromium and judges it, for the report tests.

check_page() returns the list of problems it found (empty: the page passed):
  - the page's script did not finish: <body data-status> is not "ok" (a thrown error, caught or not, sets it to
    "error"; a script that never ran leaves "loading");
  - anything was written to the console (Chromium logs console messages and uncaught errors as CONSOLE lines
    with --enable-logging=stderr; the page itself writes nothing there when it works);
  - the page requested anything over the network (Chromium's network log, requests whose network isolation
    key is the file:// page), or its HTML refers to an external resource (src/href/url() with a scheme);
  - the screenshot is blank (too few distinct colours, or almost all pixels the background colour)."""
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import zlib

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--no-first-run", "--disable-extensions", "--mute-audio",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
WINDOW = "1400,2000"


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(chromium, args, workdir):
    profile = os.path.join(workdir, "chromium-profile")
    os.makedirs(profile, exist_ok=True)
    return subprocess.run([chromium] + FLAGS + ["--user-data-dir=" + profile] + args, capture_output=True,
                          text=True, timeout=120)


def console_lines(stderr):
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def page_requests(net_log_path):
    """URLs the page itself asked for, other than file: and data: ones."""
    try:
        with open(net_log_path) as f:
            text = f.read()
    except OSError:
        return ["(no network log was written)"]
    text = text.rstrip().rstrip(",")
    if not text.endswith("}"):
        text += "]}"  # a log cut short at exit lacks its closing brackets
    log = json.loads(text)
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log.get("events", []):
        params = event.get("params") or {}
        if event.get("type") != start_job or "url" not in params:
            continue
        if not str(params.get("network_isolation_key", "")).startswith("file://"):
            continue  # the browser's own background traffic, not the page's
        if not params["url"].startswith(("file:", "data:")):
            urls.append(params["url"])
    return urls


class _Attributes(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = {}
        self.summary = {}
        self.references = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if a.get("id") == "report-summary":
            self.summary = {k[5:]: v for k, v in a.items() if k.startswith("data-")}
        for name in ("src", "href", "action", "poster", "data"):
            value = a.get(name)
            if value and re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", value, re.I) and not value.strip().startswith(
                    ("data:", "#", "javascript:")):
                self.references.append(f"<{tag} {name}={value}>")


def parse_dom(dom):
    p = _Attributes()
    p.feed(dom)
    return p


def external_references(page):
    """External resources named by a page's markup or style: src/href attributes and CSS url()/@import."""
    refs = parse_dom(page).references
    for m in re.finditer(r"url\(\s*['\"]?([^)'\"]*)", page, re.I):
        if not m.group(1).strip().startswith(("data:", "#")):
            refs.append("url(" + m.group(1) + ")")
    refs += re.findall(r"@import[^;]*", page, re.I)
    return refs


def png_pixels(path):
    """(width, height, channels, rows) of an 8-bit RGB or RGBA PNG, decoded with zlib."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def screenshot_stats(path):
    """Distinct colours and the fraction of pixels that differ from the most common colour (every 2nd pixel)."""
    width, height, channels, rows = png_pixels(path)
    counts = {}
    for y in range(0, height, 2):
        row = rows[y]
        for x in range(0, width, 2):
            c = row[x * channels:x * channels + 3]
            counts[c] = counts.get(c, 0) + 1
    total = sum(counts.values())
    return {"width": width, "height": height, "colours": len(counts),
            "not_background": 1.0 - max(counts.values()) / total}


def load_page(chromium, html_path, workdir, screenshot=True):
    """Dumps the DOM after the page's script ran, with the console and the network log, and takes a screenshot."""
    url = "file://" + os.path.abspath(html_path)
    net_log = os.path.join(workdir, "net-log.json")
    dom_run = _run(chromium, ["--log-net-log=" + net_log, "--window-size=" + WINDOW, "--dump-dom", url], workdir)
    result = {"dom": dom_run.stdout, "console": console_lines(dom_run.stderr), "requests": page_requests(net_log),
              "exit_code": dom_run.returncode, "screenshot": None}
    if screenshot:
        png = os.path.join(workdir, "screenshot.png")
        if os.path.exists(png):
            os.remove(png)
        shot = _run(chromium, ["--window-size=" + WINDOW, "--screenshot=" + png, url], workdir)
        result["console"] += console_lines(shot.stderr)
        result["screenshot"] = png if os.path.exists(png) else None
    return result


def check_page(chromium, html_path, workdir, min_colours=40, min_ink=0.08):
    """Problems found in the page at html_path (empty: it passed); also returns what was loaded."""
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    loaded = load_page(chromium, html_path, workdir)
    problems = []
    if loaded["exit_code"] != 0:
        problems.append(f"chromium exited with {loaded['exit_code']}")
    dom = parse_dom(loaded["dom"])
    status = dom.body.get("data-status")
    if status != "ok":
        problems.append(f"page status is {status!r}, not 'ok'")
    problems += ["console: " + line for line in loaded["console"]]
    problems += ["network request: " + url for url in loaded["requests"]]
    problems += ["external reference: " + r for r in external_references(page) + dom.references]
    if loaded["screenshot"] is None:
        problems.append("no screenshot was written")
    else:
        stats = screenshot_stats(loaded["screenshot"])
        loaded["screenshot_stats"] = stats
        if stats["colours"] < min_colours or stats["not_background"] < min_ink:
            problems.append(f"the screenshot looks blank: {stats}")
    loaded["summary"] = dom.summary
    return problems, loaded
