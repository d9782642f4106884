"""The HTML report in real headless Chromium: a screenshot is taken and its charts are found in it, and the page
asks the network for nothing (every request would reach a recording proxy)."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading

import pytest

from tests.cli_helpers import fleetctl
from tests.unit.test_chain import history, pristine  # noqa: F401  (fixtures)

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
