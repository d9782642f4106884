"""Prometheus for the canary analysis (docs/baseline.md, "Canary metrics"): a baseline's PromQL query rendered for
a cohort of hosts, the series it returns mapped back to inventory hosts, and the client of Prometheus's HTTP API
(/api/v1/query_range) that asks for them.

A query names its cohort with the placeholder `{hosts}`, written inside a quoted label matcher
(`{Hostname=~"{hosts}"}`): it becomes a regular expression (RE2, as Prometheus reads it) that matches the cohort's
hosts' label values and nothing else. A host's label value is its host variable `fleetctl_prometheus_name`, else
its inventory name; the label that carries it is the metric's `host_label` (default `instance`).

The client: POSTs (a cohort's query may be longer than a URL may be) through urllib3, through the proxy
$https_proxy or $http_proxy names unless $no_proxy lists the host, TLS verified against the system's trust store
(SSL_CERT_FILE names another), redirects not followed, headers from `--prometheus-headers` (as the webhook's). A
request gets TRIES tries (a connection refused or reset, HTTP 502, 503 or 504: a Prometheus restarting), each
bounded by the timeout for each read and the whole request by TRIES x the timeout, however slowly a server answers;
an answer is at most MAX_BYTES. Every failure is one PrometheusError line naming the server and the cause.

urllib3 is imported when a Client is made: the query functions are also the baseline's, on `fleetctl check`'s path.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .. import __version__, inputs, redact
from ..notify import send as notify
from ..errors import InputError, OperationError
from ..sanitize import one_line

if TYPE_CHECKING:
    from ..fleet.inventory import Host

PLACEHOLDER = "{hosts}"
NAME_VAR = "fleetctl_prometheus_name"  # the host variable that gives a host's label value
DEFAULT_HOST_LABEL = "instance"
MAX_POINTS = 11_000  # points of one series in a range: Prometheus refuses more (its own limit)
MAX_BYTES = 32 * 1024 * 1024  # an answer (a 2 h soak at a sample a minute: 120 points a host, a few KiB)
TRIES = 2
RETRY_STATUSES = frozenset({502, 503, 504})
RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")
QUOTES = "\"'`"


class PrometheusError(OperationError):
    """Prometheus could not be asked, or answered what cannot be used: one line naming the server and the cause;
    KIND and SAID: Prometheus's errorType and error, where it answered one."""

    def __init__(self, message: str, kind: str = "", said: str = ""):
        super().__init__(message)
        self.kind, self.said = kind, said


# ---- queries for a cohort ------------------------------------------------------------------------------------------

def host_name(host: Host) -> str:
    """HOST's value of the metrics' host label: its `fleetctl_prometheus_name`, else its inventory name."""
    return str(host.vars.get(NAME_VAR) or host.name)


def placeholders(query: str) -> list[tuple[int, str]]:
    """(offset, quote) of each `{hosts}` of QUERY: the quote (" ' or `) of the PromQL string it stands in. One that
    stands outside a string is a ValueError saying where (it would not be a regular expression of a matcher)."""
    found: list[tuple[int, str]] = []
    quote, i = "", 0
    while i < len(query):
        if query.startswith(PLACEHOLDER, i):
            if not quote:
                raise ValueError(f"{PLACEHOLDER} at character {i + 1} is outside a quoted label matcher "
                                 f"(write {{label=~\"{PLACEHOLDER}\"}})")
            found.append((i, quote))
            i += len(PLACEHOLDER)
            continue
        c = query[i]
        if not quote and c == "#":  # a comment, to the end of the line
            end = query.find("\n", i)
            i = len(query) if end < 0 else end
            continue
        if not quote and c in QUOTES:
            quote = c
        elif quote and c == "\\" and quote != "`":
            i += 1  # an escaped character (a raw `string` has none)
        elif c == quote:
            quote = ""
        i += 1
    return found


def re2_literal(value: str) -> str:
    """A regular expression (RE2) that matches VALUE alone; quotes and unprintable characters as \\x{..}, so that it
    ends no PromQL string."""
    return "".join("\\" + c if c in RE2_SPECIAL else f"\\x{{{ord(c):x}}}" if c in QUOTES or not c.isprintable()
                   else c for c in value)


def render(query: str, hosts: Iterable[Host]) -> str:
    """QUERY with each `{hosts}` replaced by a regular expression matching the label values of HOSTS (at least one),
    escaped for the string it stands in. A placeholder outside a string: ValueError (the baseline refuses it)."""
    names = sorted({host_name(h) for h in hosts})
    if not names:
        raise ValueError("a query rendered for no host")
    regex = "(?:" + "|".join(map(re2_literal, names)) + ")"
    out, at = [], 0
    for offset, quote in placeholders(query):
        out += [query[at:offset], regex if quote == "`" else regex.replace("\\", "\\\\")]
        at = offset + len(PLACEHOLDER)
    return "".join(out) + query[at:]


def by_host(series: Mapping[str, Any], hosts: Iterable[Host]) -> dict[str, Any]:
    """SERIES (host label value -> anything) keyed by the inventory names of HOSTS instead; a value no host of HOSTS
    has is left out, a host without series is absent. Two hosts with one label value: InputError."""
    names: dict[str, str] = {}
    for host in hosts:
        value = host_name(host)
        if names.setdefault(value, host.name) != host.name:
            raise InputError(f"hosts {names[value]} and {host.name} have the same Prometheus name {value!r} "
                             f"(host variable {NAME_VAR})")
    return {names[value]: found for value, found in series.items() if value in names}


# ---- the client ----------------------------------------------------------------------------------------------------

def not_json(constant: str) -> Any:
    """json.loads's parse_constant: NaN, Infinity and -Infinity are not JSON (Prometheus writes values as strings)."""
    raise ValueError(f"{constant} is not JSON")


def client(url: str | None, headers_file: str | None, timeout_s: float) -> Client | None:
    """The client for these settings (--prometheus-url, --prometheus-headers, --prometheus-timeout), checked
    (input errors now), or None without a URL."""
    if not url:
        return None
    headers = notify.read_headers(headers_file, "Prometheus") if headers_file else []
    notify.check_url(url, bool(headers), "--prometheus-url", "Prometheus")
    return Client(url, headers, timeout_s)


class Client:
    def __init__(self, url: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], timeout: float):
        """URL: the server's (a path prefix kept: https://host/prometheus; a query string sent with every request:
        https://host/p?tenant=a asks https://host/p/api/v1/query_range?tenant=a); HEADERS: sent with every request
        (a token: never shown); TIMEOUT: seconds, for each read and Prometheus's evaluation of the query."""
        import urllib3

        from ..notify import webhook

        self.url, self.timeout_s = url, float(timeout)
        parts = urllib.parse.urlsplit(url)
        self.base, self.query = parts._replace(path=parts.path.rstrip("/"), query="", fragment=""), parts.query
        self.headers = {"Accept": "application/json", "User-Agent": f"fleetctl/{__version__}",
                        **dict(headers.items() if isinstance(headers, Mapping) else headers)}
        context, proxy = notify.ssl_context(None), webhook.proxy_for(url)
        timeouts = urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s)
        self.pool = urllib3.PoolManager(ssl_context=context, timeout=timeouts) if proxy is None else \
            urllib3.ProxyManager(proxy, proxy_headers=webhook.proxy_auth(proxy), ssl_context=context,
                                 timeout=timeouts)

    def describe(self) -> str:
        return f"Prometheus {redact.url(self.url)}"

    def check(self, query: str) -> None:
        """QUERY parses and is one Prometheus can evaluate over a range (an instant vector or a scalar): else one
        InputError line, Prometheus's own verdict. Asked of a range at the start of 1970: nothing is evaluated."""
        try:
            self.post("/api/v1/query_range", {"query": query, "start": "0", "end": "0", "step": "1"})
        except PrometheusError as e:
            if e.kind == "bad_data":
                raise InputError(f"not a valid query: {e.said}") from None
            raise

    def range(self, query: str, start: float, end: float, step: float,
              host_label: str = DEFAULT_HOST_LABEL) -> dict[str, list[tuple[float, float]]]:
        """QUERY's series from START to END (Unix times) every STEP seconds (more where the range would have more
        than MAX_POINTS points), keyed by their HOST_LABEL value: [(time, value)] in time order, NaN and infinite
        values left out. A series without the label, or two with one value (a query not aggregated by it): a
        PrometheusError, as every failure."""
        step = max(float(step), math.ceil(max(end - start, 0) / MAX_POINTS * 1000) / 1000, 0.001)
        data = self.post("/api/v1/query_range", {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"),
                                                                                             list):
            raise self.error("the answer is not a range of series")
        out: dict[str, list[tuple[float, float]]] = {}
        for series in data["result"]:
            try:
                value = series["metric"].get(host_label)
                points = [(float(t), float(v)) for t, v in series["values"]]
            except (AttributeError, KeyError, TypeError, ValueError, OverflowError):  # 10**400: no float
                raise self.error("the answer is not a range of series") from None
            if not all(math.isfinite(t) for t, _ in points):
                raise self.error("the answer is not a range of series")
            if not isinstance(value, str):
                raise self.error(f"a series without the label {host_label}: aggregate the query by ({host_label})")
            if value in out:
                raise self.error(f"several series for {host_label}={one_line(value, 80)!r}: aggregate the query "
                                 f"by ({host_label})")
            out[value] = [(t, v) for t, v in points if math.isfinite(v)]
        return out

    # ---- HTTP ----

    def error(self, cause: str, kind: str = "", said: str = "") -> PrometheusError:
        return PrometheusError(f"{self.describe()}: {cause}", kind, said)

    def post(self, path: str, fields: dict[str, str]) -> Any:
        """The `data` of the API's answer to FIELDS at PATH, within TRIES x the timeout in all."""
        from ..notify import webhook

        def attempt() -> tuple[int, str, bytes] | PrometheusError:  # in within()'s thread: returned, not raised
            try:
                return self.request(path, {**fields, "timeout": f"{self.timeout_s:g}"})
            except PrometheusError as e:
                return e
            except Exception as e:  # noqa: BLE001 (a URL urllib3 refuses...): one line, never its text
                return self.error(type(e).__name__)

        limit = TRIES * self.timeout_s + 1
        done = webhook.within(attempt, limit)
        if not done:
            raise self.error(f"no complete answer in {limit:g}s")
        if isinstance(done[0], PrometheusError):
            raise done[0]
        status, reason, body = done[0]
        try:  # JSON as RFC 8259 has it: no NaN or Infinity; a number past Python's digit limit a ValueError
            doc = json.loads(body, parse_constant=not_json)
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError too
            doc = None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise self.error(f"HTTP {status}: redirects are not followed" if 300 <= status < 400 else
                             f"HTTP {status} {one_line(reason, 80)}".rstrip() if status >= 400 else
                             "the answer is not Prometheus's JSON")
        if doc["status"] == "error" or status >= 300:
            kind, said = one_line(doc.get("errorType", ""), 40), one_line(doc.get("error", ""), 300)
            said = said.removeprefix('invalid parameter "query": ')
            raise self.error(f"HTTP {status}: {kind}: {said}", kind, said)
        return doc.get("data")

    def request(self, path: str, fields: dict[str, str]) -> tuple[int, str, bytes]:
        """(status, reason, body) of one POST of FIELDS (form-encoded) with its tries; a failure: PrometheusError."""
        import urllib3

        from ..notify import webhook

        retry = urllib3.Retry(total=TRIES - 1, redirect=False, raise_on_status=False, allowed_methods=None,
                              status_forcelist=RETRY_STATUSES, backoff_factor=0.5, respect_retry_after_header=False)
        try:
            url = urllib.parse.urlunsplit(self.base._replace(path=self.base.path + path, query=self.query))
            response = self.pool.request("POST", url, fields=fields, encode_multipart=False,
                                         headers=self.headers, retries=retry, redirect=False, preload_content=False)
            with response:
                chunks, read = [], 0
                while chunk := response.read(1 << 16):
                    read += len(chunk)
                    if read > MAX_BYTES:
                        raise self.error(f"the answer is larger than {inputs.size(MAX_BYTES)}")
                    chunks.append(chunk)
        except urllib3.exceptions.HTTPError as e:
            cause = webhook.describe(webhook.underlying(e), self.timeout_s)
            raise self.error("proxy: " + cause if isinstance(e, urllib3.exceptions.ProxyError) else cause) from None
        return response.status, response.reason or "", b"".join(chunks)
