"""The Prometheus client of the canary analysis (orchestrator/judge/promql.py): a query rendered for a cohort, its
series mapped back to inventory hosts, and every way a server can fail it, against a real HTTP server on 127.0.0.1 that
answers as a Prometheus would (or would not): one line each, in bounded time and memory. A real Prometheus:
tests/integration/test_prometheus_server.py."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.judge import promql
from orchestrator.errors import InputError
from orchestrator.fleet.inventory import Host
from tests.helpers.cli import fleetctl
from tests.helpers.webhooks import closed_port

TENSOR = 'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"{hosts}"})'


def matrix(*series) -> dict:
    """A successful range answer: SERIES are (labels, [(t, "v")])."""
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": m, "values": [[t, v] for t, v in values]}
                                                     for m, values in series]}}


class Server:
    """HTTP on 127.0.0.1 in a thread. SCRIPT: the answers in order, each (status, body: a dict as JSON, or bytes),
    "hang" (nothing, ever) or "drip" (a 200 whose body comes a byte every 0.1 s); then FALLBACK. Every request's
    path, headers and form fields are kept."""

    def __init__(self, *script, fallback=(200, matrix())):
        self.script, self.fallback, self.requests = list(script), fallback, []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                server.requests.append((self.path, dict(self.headers.items()), dict(urllib.parse.parse_qsl(body))))
                answer = server.script.pop(0) if server.script else server.fallback
                if answer == "hang":
                    server.release.wait(30)
                    return
                if answer == "drip":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    for _ in range(1000):
                        if server.release.wait(0.1):
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    return
                status, body = answer
                data = json.dumps(body).encode() if isinstance(body, dict) else body
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve():
    started = []

    def start(*script, **kw) -> Server:
        started.append(Server(*script, **kw))
        return started[-1]

    yield start
    for server in started:
        server.close()


def hosts(*names, **prometheus_names) -> list[Host]:
    return [Host(n, ("all",), {promql.NAME_VAR: prometheus_names[n]} if n in prometheus_names else {})
            for n in names]


# ---- queries for a cohort ------------------------------------------------------------------------------------------

def test_the_placeholder_becomes_the_cohorts_names_as_a_literal_regex():
    cohort = hosts("gpu-02.lab", "gpu-01.lab")
    assert promql.render(TENSOR, cohort) == \
        'avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~"(?:gpu-01\\\\.lab|gpu-02\\\\.lab)"})'
    # a raw string keeps its backslashes single; a port after the placeholder applies to every host
    assert promql.render("up{instance=~`{hosts}:9400`}", cohort) == r"up{instance=~`(?:gpu-01\.lab|gpu-02\.lab):9400`}"
    # a quote in a name cannot end the string; the names' regex characters are literal
    assert promql.render("up{x='{hosts}'}", hosts("a'b", "c|d+")) == r"up{x='(?:a\\x{27}b|c\\|d\\+)'}"


def test_a_host_is_named_by_its_prometheus_name_variable_else_its_inventory_name():
    cohort = hosts("gpu-01", "gpu-02", **{"gpu-02": "10.0.0.2:9400"})
    assert promql.render('up{instance=~"{hosts}"}', cohort) == 'up{instance=~"(?:10\\\\.0\\\\.0\\\\.2:9400|gpu-01)"}'
    series = {"gpu-01": [(1.0, 2.0)], "10.0.0.2:9400": [(1.0, 3.0)], "gpu-09": [(1.0, 4.0)]}
    assert promql.by_host(series, cohort) == {"gpu-01": [(1.0, 2.0)], "gpu-02": [(1.0, 3.0)]}  # gpu-09: not ours
    with pytest.raises(InputError, match="hosts gpu-01 and gpu-02 have the same Prometheus name 'gpu-01'"):
        promql.by_host(series, hosts("gpu-01", "gpu-02", **{"gpu-02": "gpu-01"}))


@pytest.mark.parametrize("query, where", [
    ("DCGM_FI_DEV_POWER_USAGE{hosts}", 24),
    ('up{job="x"} + {hosts}', 15),
    ('up{a="\\"{hosts}"} or up{hosts}', 24),
])
def test_a_placeholder_outside_a_quoted_matcher_is_refused(query, where):
    with pytest.raises(ValueError, match=f"character {where} is outside a quoted label matcher"):
        promql.render(query, hosts("gpu-01"))


def test_a_placeholder_in_a_comment_is_left_alone():
    assert promql.render('up{a="{hosts}"} # not {hosts}', hosts("n1")) == 'up{a="(?:n1)"} # not {hosts}'


# ---- the client against a server -----------------------------------------------------------------------------------

def test_a_range_is_the_series_per_host_label_value(serve):
    server = serve((200, matrix(({"Hostname": "gpu-02"}, [(100, "0.5"), (160, "NaN"), (220, "0.7")]),
                                ({"Hostname": "gpu-01"}, [(100, "0.9"), (160, "+Inf")]))))
    client = promql.Client(server.url + "/prom/", {"Authorization": "Bearer t0ken"}, 2)
    got = client.range(TENSOR, 100, 220, 60, host_label="Hostname")
    assert got == {"gpu-02": [(100.0, 0.5), (220.0, 0.7)], "gpu-01": [(100.0, 0.9)]}  # NaN, Inf: not samples
    path, headers, form = server.requests[0]
    assert path == "/prom/api/v1/query_range" and headers["Authorization"] == "Bearer t0ken"
    assert form == {"query": TENSOR, "start": "100.000", "end": "220.000", "step": "60.000", "timeout": "2"}


def test_a_long_range_is_asked_with_a_step_that_keeps_it_under_prometheus_limit(serve):
    server = serve()
    promql.Client(server.url, {}, 2).range("up", 0, 7 * 86400, 1)
    step = float(server.requests[0][2]["step"])
    assert 7 * 86400 / step <= promql.MAX_POINTS and step < 7 * 86400 / (promql.MAX_POINTS - 10)


@pytest.mark.parametrize("series, said", [
    ([({"instance": "n1"}, [(1, "1")])], "a series without the label Hostname: aggregate the query by (Hostname)"),
    ([({"Hostname": "n1", "gpu": "0"}, [(1, "1")]), ({"Hostname": "n1", "gpu": "1"}, [(1, "2")])],
     "several series for Hostname='n1': aggregate the query by (Hostname)"),
])
def test_series_that_do_not_name_one_host_each_are_refused(serve, series, said):
    server = serve((200, matrix(*series)))
    with pytest.raises(promql.PrometheusError) as e:
        promql.Client(server.url, {}, 2).range("x", 0, 60, 60, host_label="Hostname")
    assert str(e.value) == f"Prometheus {server.url}: {said}"


def test_a_query_that_does_not_parse_is_one_input_error_line_with_prometheus_verdict(serve):
    said = 'invalid parameter "query": 1:9: parse error: unexpected "}" in aggregation'
    server = serve((400, {"status": "error", "errorType": "bad_data", "error": said}))
    with pytest.raises(InputError) as e:
        promql.Client(server.url, {}, 2).check("sum(up{)}")
    assert str(e.value) == 'not a valid query: 1:9: parse error: unexpected "}" in aggregation'
    assert server.requests[0][2]["start"] == "0"  # asked of 1970: parsed, nothing evaluated


@pytest.mark.parametrize("answers, said, tries", [
    ([(422, {"status": "error", "errorType": "execution", "error": "many-to-many matching not allowed"})],
     "HTTP 422: execution: many-to-many matching not allowed", 1),
    ([(503, b"<html>down</html>")] * 2, "HTTP 503 Service Unavailable", 2),
    ([(503, b"down"), (200, b"<html>a login page</html>")], "the answer is not Prometheus's JSON", 2),
    ([(401, b"")], "HTTP 401 Unauthorized", 1),
    ([(302, b"")], "HTTP 302: redirects are not followed", 1),
    ([(200, {"status": "success", "data": {"resultType": "vector", "result": []}})],
     "the answer is not a range of series", 1),
    ([(200, {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": 3}]}})],
     "the answer is not a range of series", 1),
])
def test_every_failure_is_one_line_naming_the_server_and_the_cause(serve, answers, said, tries):
    """(check() asks whether the query parses: what an answer holds is range()'s to judge.)"""
    server = serve(*answers)
    client = promql.Client(server.url, {}, 2)
    calls = [lambda: client.range("up", 0, 60, 60)] + ([lambda: client.check("up")] if "range" not in said else [])
    for call in calls:
        server.requests.clear()
        server.script = list(answers)
        with pytest.raises(promql.PrometheusError) as e:
            call()
        assert str(e.value) == f"Prometheus {server.url}: {said}" and len(server.requests) == tries


BIG = "9" * 5000  # a number past Python's 4300 digits (int) and past a float (inf)
HUGE = "1" + "0" * 400  # an integer no float holds


@pytest.mark.parametrize("body, said", [
    (('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"instance": "n1"}, '
      '"values": [[%s, "1"]]}]}}' % BIG).encode(), "the answer is not Prometheus's JSON"),
    (('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"instance": "n1"}, '
      '"values": [[%s, "1"]]}]}}' % HUGE).encode(), "the answer is not a range of series"),
    (b'{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"instance": "n1"}, '
     b'"values": [[NaN, "1"]]}]}}', "the answer is not Prometheus's JSON"),
    (matrix(({"instance": "n1"}, [(60, "1"), ("NaN", "2")])), "the answer is not a range of series"),
    (matrix(({"instance": "n1"}, [("-Inf", "1")])), "the answer is not a range of series"),
])
def test_odd_numbers_in_an_answer_are_one_line_not_a_crash(serve, body, said):
    """Issue 42: a 5000-digit number was an internal error (exit 70), a NaN time a sample."""
    server = serve((200, body))
    with pytest.raises(promql.PrometheusError) as e:
        promql.Client(server.url, {}, 2).range("up", 0, 60, 60)
    assert str(e.value) == f"Prometheus {server.url}: {said}"


def test_a_value_too_large_for_a_float_is_no_sample(serve):
    server = serve((200, matrix(({"instance": "n1"}, [(60, BIG), (120, "2")]))))
    assert promql.Client(server.url, {}, 2).range("up", 0, 120, 60) == {"n1": [(120.0, 2.0)]}


@pytest.mark.parametrize("suffix, path", [
    ("/p?t=X", "/p/api/v1/query_range?t=X"),
    ("/p/?t=X&u=%2F", "/p/api/v1/query_range?t=X&u=%2F"),
    ("?tenant=a#ignored", "/api/v1/query_range?tenant=a"),
])
def test_a_query_string_in_the_url_is_sent_with_every_request(serve, suffix, path):
    """Issue 42: http://h:9090/p?t=X was asked as POST /p?t=X/api/v1/query_range."""
    server = serve()
    client = promql.client(server.url + suffix, None, 2)
    client.range("up", 0, 60, 60)
    client.check("up")
    assert [p for p, _, _ in server.requests] == [path, path]
    assert client.describe() == f"Prometheus {server.url}/…"


def test_a_server_that_is_not_there_is_a_refused_connection():
    client = promql.Client(f"http://127.0.0.1:{closed_port()}", {}, 1)
    with pytest.raises(promql.PrometheusError, match=r"^Prometheus http://127\.0\.0\.1:\d+: connection refused$"):
        client.range("up", 0, 60, 60)


@pytest.mark.parametrize("answer, said", [("hang", "no answer in 0.5s"), ("drip", "no complete answer in 2s")])
def test_a_slow_server_is_given_up_on_in_bounded_time(serve, answer, said):
    server = serve(fallback=answer)
    started = time.monotonic()
    with pytest.raises(promql.PrometheusError) as e:
        promql.Client(server.url, {}, 0.5).range("up", 0, 60, 60)
    took = time.monotonic() - started
    assert str(e.value) == f"Prometheus {server.url}: {said}" and took < promql.TRIES * 0.5 + 1.5


def test_an_answer_too_large_is_refused_after_reading_no_more_than_the_bound(serve, monkeypatch):
    monkeypatch.setattr(promql, "MAX_BYTES", 64 * 1024)
    big = matrix(*[({"instance": f"n{i}"}, [(t, "1") for t in range(100)]) for i in range(100)])
    server = serve((200, big))
    with pytest.raises(promql.PrometheusError, match="the answer is larger than 65536 bytes$"):
        promql.Client(server.url, {}, 2).range("up", 0, 6000, 60)


# ---- the settings: URL and headers file -------------------------------------------------------------------------

def headers_file(tmp_path, text="Authorization: Bearer t0ken\n", mode=0o600):
    path = tmp_path / "prom-headers"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_client_sends_the_headers_files_headers(serve, tmp_path):
    server = serve()
    promql.client(server.url, headers_file(tmp_path), 2).range("up", 0, 60, 60)
    assert server.requests[0][1]["Authorization"] == "Bearer t0ken"
    assert promql.client(None, None, 10) is None


@pytest.mark.parametrize("url, make, said", [
    ("https://admin:pw@prom.example", None, "--prometheus-url https://prom.example: credentials in the URL: put them "
                                            "in --prometheus-headers"),
    ("ftp://prom.example", None, "--prometheus-url ftp://prom.example: not an http:// or https:// URL"),
    ("http://prom.example:9090", headers_file, "--prometheus-url http://prom.example:9090: plain http would send the "
                                               "Prometheus headers in clear text (use https)"),
    ("https://prom.example", lambda p: headers_file(p, mode=0o644),
     "the Prometheus headers file is readable by others (mode 0644): chmod 600 it"),
    ("https://prom.example", lambda p: headers_file(p, "Authorization Bearer t0ken\n"),
     "line 1: not a 'Name: value' header"),
    ("https://prom.example", lambda p: (os.mkfifo(p / "fifo"), str(p / "fifo"))[1],
     "cannot read the Prometheus headers: a FIFO, not a regular file"),
    ("https://prom.example", lambda p: headers_file(p, "X: " + "y" * 70000),
     "cannot read the Prometheus headers: larger than 65536 bytes"),
])
def test_a_bad_url_or_headers_file_is_one_line_that_shows_no_secret(tmp_path, url, make, said):
    with pytest.raises(InputError) as e:
        promql.client(url, make(tmp_path) if make else None, 10)
    assert said in str(e.value) and "t0ken" not in str(e.value) and "pw" not in str(e.value)


def test_plan_refuses_a_bad_prometheus_setting_before_anything_runs(tmp_path):
    result = fleetctl("plan", "--to", "570.86.15", "--prometheus-url", "http://prom.example:9090",
                      "--prometheus-headers", headers_file(tmp_path), home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("fleetctl: error: --prometheus-url http://prom.example:9090: plain http would send the "
                             "Prometheus headers in clear text (use https)\n")
