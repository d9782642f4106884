"""The HTML report in real headless Chromium: a screenshot is taken and its charts are found in it, and the page
asks the network for nothing (every request would reach a recording proxy)."""

from __future__ import annotations

import html as html_mod
import html.parser
import http.server
import json
import re
import shutil
import subprocess
import threading

import pytest

from tests.helpers.cli import fleetctl

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup --test)")


# Chromium's own background traffic (network time, component updates, sign-in): not the page's.
BROWSER_SERVICES = ("clients2.google.com", "accounts.google.com", "update.googleapis.com", "googleapis.com",
                    "gvt1.com", "clients1.google.com")


def page_requests(requests: list[str]) -> list[str]:
    host = lambda r: r.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]  # noqa: E731
    return [r for r in requests if not any(host(r) == s or host(r).endswith("." + s) for s in BROWSER_SERVICES)]


class Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        Recorder.requests.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_CONNECT = do_POST = do_GET

    def log_message(self, *args):
        pass


def chromium(page, shot, tmp_path) -> list[str]:
    """Screenshot PAGE in headless Chromium with every request going to a recording proxy; the requests."""
    Recorder.requests = []
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                              f"--proxy-server=http://127.0.0.1:{proxy.server_address[1]}",
                              "--proxy-bypass-list=<-loopback>", "--no-first-run", "--window-size=1280,1800",
                              f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    finally:
        proxy.shutdown()
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    return list(Recorder.requests)


def test_html_report_renders_charts_offline(history, tmp_path):  # noqa: F811
    from PIL import Image

    page = tmp_path / "report.html"
    proc = fleetctl("report", "--format", "html", "-o", str(page), home=history)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    # A page that does load something from the network: the proxy must see it (the method can catch one).
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://fleetctl-test.invalid/pixel.png"></body></html>')
    shot = tmp_path / "shot.png"
    assert "fleetctl-test.invalid" in "".join(chromium(control, tmp_path / "control.png", tmp_path))
    assert page_requests(chromium(page, shot, tmp_path)) == []
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1800)
    colours = {c for _, c in image.getcolors(1 << 24)}
    assert len(colours) > 50  # text and charts, not a blank page
    drawn = {name for name, rgb in {"failing controls": (0xC6, 0x28, 0x28), "passing controls": (0x2E, 0x7D, 0x32),
                                    "driver versions": (0x15, 0x65, 0xC0), "compliance over time": (0x90, 0xA4, 0xAE)
                                    }.items() if rgb in colours}
    assert drawn == {"failing controls", "passing controls", "driver versions", "compliance over time"}


# Run in the page (a copy of it without its Content-Security-Policy, which forbids scripts): the layout's figures,
# written into the DOM for --dump-dom to hand back.
MEASURE = """<script>
const inside = (r, box) => r.left >= box.left - 0.5 && r.right <= box.right + 0.5 && r.top >= box.top - 0.5
                           && r.bottom <= box.bottom + 0.5;
const clipped = [...document.querySelectorAll("svg")].flatMap(svg => [...svg.querySelectorAll("text")]
    .filter(t => !inside(t.getBoundingClientRect(), svg.getBoundingClientRect())).map(t => t.textContent));
const crossing = (r, b) => Math.min(r.right, b.right) - Math.max(r.left, b.left) > 0.5
                            && Math.min(r.bottom, b.bottom) - Math.max(r.top, b.top) > 0.5;
const overlapping = [...document.querySelectorAll("svg")].flatMap(svg => [...svg.querySelectorAll("text")]
    .filter(t => [...svg.querySelectorAll("rect")].some(b => crossing(t.getBoundingClientRect(),
                                                                      b.getBoundingClientRect())))
    .map(t => t.textContent));
const fonts = [...new Set([...document.querySelectorAll("svg text")].map(t => getComputedStyle(t).fontFamily))];
const widest = Math.max(...[...document.querySelectorAll("body > table")].map(t => t.getBoundingClientRect().width));
const why = [...document.querySelectorAll("td.why")].map(td => ({
    text: td.textContent, folded: td.querySelector("details:not([open])") !== null,
    summary: td.querySelector("summary") ? td.querySelector("summary").textContent : null,
    summary_height: td.querySelector("summary") ? td.querySelector("summary").getBoundingClientRect().height : null,
    details_height: td.querySelector("details") ? td.querySelector("details").getBoundingClientRect().height : null}));
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({window: innerWidth, widest, clipped, overlapping, fonts, why,
                                  charts: document.querySelectorAll("svg text").length});
document.body.appendChild(out);
</script>"""

@pytest.fixture
def rolled_back_by_a_wall(history):  # noqa: F811
    """The history, and a campaign rolled back for a gate whose reason was recorded the old way: every series."""
    from orchestrator.history.store import Store
    from tests.helpers.campaign import start
    from tests.helpers.campaign import OldGate

    with Store(history / "history.sqlite3") as store:
        assert start(store, OldGate(), ["c"], ["d"])[2].run() == "rolled_back"
    return history


def measured(page, tmp_path) -> dict:
    """PAGE laid out in a 1600 px headless Chromium window: MEASURE's figures."""
    probe = tmp_path / "measured.html"
    html = page.read_text()
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
                     .replace("</body>", MEASURE + "</body>"))
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          "--hide-scrollbars", "--window-size=1600,1200", "--run-all-compositor-stages-before-draw",
                          "--virtual-time-budget=5000", f"--user-data-dir={tmp_path / 'measure-profile'}",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', run.stdout, re.S)
    assert run.returncode == 0 and found, run.stderr[-2000:]
    return json.loads(html_mod.unescape(found.group(1)))


def test_html_report_uses_the_window_shows_every_label_and_folds_long_reasons(rolled_back_by_a_wall, tmp_path):
    page = tmp_path / "report.html"
    proc = fleetctl("report", "--format", "html", "-o", str(page), home=rolled_back_by_a_wall)
    assert proc.returncode == 0, proc.stderr
    m = measured(page, tmp_path)
    assert m["window"] == 1600 and m["widest"] > 0.9 * 1600  # the tables span the window, not a column of it
    assert m["charts"] > 10 and m["clipped"] == []  # every label and value inside its chart
    assert m["overlapping"] == [] and m["fonts"] == ["monospace"]  # no label or value on a bar: the font measured
    wall = next(w for w in m["why"] if "GPU 7 bandwidth_gbs" in w["text"])
    assert wall["folded"] and "GPU 7 bandwidth_gbs" not in wall["summary"]  # the whole reason only when opened
    assert wall["summary"].startswith("wave 1 failed (1 of 1 hosts") and len(wall["summary"]) <= 203
    assert wall["details_height"] == wall["summary_height"]  # folded: the reason in full takes no room until opened


class Cells(html_mod.parser.HTMLParser):
    """Each table row's cells, as text."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


@pytest.mark.parametrize("waves, fail_at, state", [((["a"], ["b"]), [1, 1], "rolled_back"),
                                                   ((["a"], ["b", "c"]), [1, 2], "done")])  # b rolled back alone
def test_the_campaigns_outcome_names_the_hosts_whose_rollback_failed(history, tmp_path,  # noqa: F811
                                                                     waves, fail_at, state):
    """Was: `rolled_back` (or `done`) and b among the hosts rolled back, for a campaign that exits 6: a person needed."""
    from orchestrator.history.store import Store
    from tests.helpers.campaign import Script, start

    with Store(history / "history.sqlite3") as store:
        script = Script({("b", "verify"): "fail", ("b", "rollback_verify"): "fail"})
        assert start(store, script, *waves, fail_at=fail_at)[2].run() == state
    page = tmp_path / "report.html"
    assert fleetctl("report", "--format", "html", "-o", str(page), home=history).returncode == 0
    parser = Cells()
    parser.feed(page.read_text())
    head = next(r for r in parser.rows if r[:1] == ["Campaign"])
    rows = [dict(zip(head, r)) for r in parser.rows if r[:1] == ["2"]]  # the history's own campaign is 1
    assert len(rows) == 1
    assert rows[0]["Outcome"] == f"{state}: rollback failed on b, a person is needed"
    assert "b" not in rows[0]["Rolled back"].split(", ")
