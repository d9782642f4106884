"""A webhook target of the notifications (send.py): the POST through urllib3, its tries, their bounds, and the
proxy the environment names. Its own module, imported when a webhook is given: `fleetctl check` and every command
without one never load urllib3."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from typing import Any, Callable, TypeVar

import urllib3

from .. import __version__, redact
from ..sanitize import one_line

BACKOFF_S = 1.0  # urllib3's backoff factor: the second try at once, the third after 2 s
MAX_RETRY_AFTER_S = 30  # the longest wait before a try, whatever the server's Retry-After says
RETRY_STATUSES = frozenset({408, 425, 429, *range(500, 600)})
T = TypeVar("T")


def proxy_for(url: str) -> str | None:
    """The proxy that $https_proxy or $http_proxy names for URL, unless $no_proxy bypasses its host (as urllib
    decides both)."""
    p = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(p.scheme)
    if not proxy or urllib.request.proxy_bypass(p.netloc):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def proxy_auth(proxy: str) -> dict[str, str] | None:
    """The Proxy-Authorization header for the user:password in PROXY's URL, as urllib sends it."""
    auth = urllib3.util.parse_url(proxy).auth
    return urllib3.make_headers(proxy_basic_auth=urllib.parse.unquote(auth)) if auth else None


class Tries(urllib3.Retry):
    """urllib3's Retry, which takes a Retry-After that is neither seconds nor an HTTP date for none (urllib3 would
    fail the delivery)."""

    def parse_retry_after(self, retry_after: str) -> float:
        try:
            return super().parse_retry_after(retry_after)
        except urllib3.exceptions.InvalidHeader:
            return 0.0  # the backoff's wait


def underlying(e: BaseException) -> BaseException:
    """The socket, TLS or HTTP error under urllib3's wrappers (what ran out the tries, the error a connection or
    protocol error was raised from)."""
    while isinstance(e, urllib3.exceptions.HTTPError):
        inner = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) else \
            e.__cause__ or next((a for a in e.args if isinstance(a, BaseException)), None)
        if inner is None:
            return e
        e = inner
    return e


class Webhook:
    def __init__(self, url: str, headers: list[tuple[str, str, str]], context: ssl.SSLContext, timeout_s: float, *,
                 tries: int, encode: Callable[[dict[str, Any], bytes], bytes]):
        """ENCODE(event, its JSON) gives the body (the notifications' format); TRIES a delivery's tries."""
        self.url, self.timeout_s, self.tries, self.encode = url, timeout_s, tries, encode
        self.headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": f"fleetctl/{__version__}",
                        **{name: value for name, value, _ in headers}}
        timeout, proxy = urllib3.Timeout(connect=timeout_s, read=timeout_s), proxy_for(url)
        self.pool = urllib3.PoolManager(ssl_context=context, timeout=timeout) if proxy is None else \
            urllib3.ProxyManager(proxy, proxy_headers=proxy_auth(proxy), ssl_context=context, timeout=timeout)
        self.failing = False  # the last notification failed every try: one try each until one gets through

    def describe(self) -> str:
        return f"webhook {redact.url(self.url)}"

    def deliver(self, payload: dict[str, Any], body: bytes) -> str | None:
        data = self.encode(payload, body)
        tries = 1 if self.failing else self.tries
        # What may be retried: a connection or an answer that failed (timeout, reset, a TLS error such as a handshake
        # cut short, a proxy's error) and the statuses that say "later"; never a certificate that is not trusted (no
        # later try trusts it), a redirect (it would carry the headers elsewhere) or another 4xx. urllib3's Retry
        # decides and waits (backoff, Retry-After); each try is bounded here as a whole.
        retry = Tries(total=tries - 1, redirect=False, raise_on_status=False, allowed_methods=None,
                      status_forcelist=RETRY_STATUSES, backoff_factor=BACKOFF_S, backoff_max=MAX_RETRY_AFTER_S,
                      retry_after_max=MAX_RETRY_AFTER_S)
        while True:
            status, reason, error = self.bounded_try(data, 2 * self.timeout_s)
            try:
                if error is not None and isinstance(underlying(error), ssl.SSLCertVerificationError):
                    break
                if error is not None:
                    retry = retry.increment("POST", self.url, error=error)
                    retry.sleep()
                elif retry.is_retry("POST", status.status, "Retry-After" in status.headers):
                    retry = retry.increment("POST", self.url, response=status)
                    retry.sleep(status)
                else:
                    break
            except urllib3.exceptions.MaxRetryError as e:
                reason = reason or self.describe_error(underlying(e))
                break
        took = len(retry.history) + 1
        self.failing = reason is not None
        return None if reason is None else reason + (f" ({took} tries)" if took > 1 else "")

    def bounded_try(self, data: bytes, limit_s: float) -> tuple[Any, str | None, Exception | None]:
        """One try within LIMIT_S in all (within()): (response, the failure it means or None, the error that stopped
        it or None)."""
        done = within(lambda: self.one_try(data), limit_s)
        if done:
            return done[0]
        why = f"no complete answer in {limit_s:g}s"
        return None, why, urllib3.exceptions.ReadTimeoutError(None, self.url, why)  # type: ignore[arg-type]

    def one_try(self, data: bytes) -> tuple[Any, str | None, Exception | None]:
        try:
            response = self.pool.request("POST", self.url, body=data, headers=self.headers, retries=False,
                                         redirect=False, preload_content=False)
            with response:  # a body cut short or stalled is a read error, retried as such
                response.read(1 << 16, decode_content=False)  # bounded: the answer is not used
        except urllib3.exceptions.HTTPError as e:
            reason = self.describe_error(underlying(e))
            return None, ("proxy: " + reason if isinstance(e, urllib3.exceptions.ProxyError) else reason), e
        if response.status < 300:
            return response, None, None
        reason = f"HTTP {response.status} {one_line(response.reason or '', 80)}"
        return response, (reason + ": redirects are not followed" if response.status < 400 else reason), None

    def describe_error(self, e: BaseException) -> str:
        return describe(e, self.timeout_s)


def within(call: Callable[[], T], limit_s: float) -> tuple[T] | tuple[()]:
    """(CALL's result,) if it returns within LIMIT_S, else (): a call cut short is left to finish in its daemon
    thread, which the process does not wait for. (A timeout bounds each read; a server that answers a byte at a time
    would hold a request for ever.)"""
    done: list[T] = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(limit_s)
    return (done[0],) if done else ()


def describe(e: BaseException, timeout_s: float) -> str:
    """The socket, TLS or HTTP error E (underlying()'s) in a few words, never its text (it could quote what was
    sent); TIMEOUT_S: the one each read had."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: certificate not trusted ({one_line(e.verify_message, 120)})"
    if isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "TLS: the server closed the connection"
    if isinstance(e, ssl.SSLError):
        return f"TLS: {one_line(e.reason or type(e).__name__, 120)}"
    if isinstance(e, http.client.IncompleteRead):
        return "the answer was cut short"
    if isinstance(e, TimeoutError):
        return f"no answer in {timeout_s:g}s"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host name ({one_line(e.strerror, 80)})"
    if isinstance(e, OSError) and e.strerror:
        return one_line(e.strerror, 120)
    return type(e).__name__  # never str(e): an exception's text could quote what was sent
