"""Notifications: each event (schemas/notification.schema.json) to commands run on this machine and to webhooks.

`--notify CMD` runs CMD without a shell (split into words first, then the placeholders {event} {severity} {kind}
{campaign} {host} {target} {state} {run} filled in per word, as the drain hooks do), the event as JSON on stdin,
killed with its process group after the timeout. `--webhook URL` POSTs the event (as it is, or shaped for Slack or
Microsoft Teams) with urllib3, through the proxy $https_proxy or $http_proxy names unless $no_proxy lists the host:
TLS verified (`--webhook-ca FILE` adds a private CA, nothing turns verification off), redirects not followed, 3
tries (urllib3's backoff: the second at once, the third 2 s later, or when the server's Retry-After says, up to
30 s; one try while the target keeps failing; an untrusted certificate gets one), headers from
`--webhook-headers FILE` and `$FLEETCTL_WEBHOOK_HEADERS` (`Name: value` lines, for tokens).

A notification that fails is one line on stderr and a record in the history; it never stops or changes what
fleetctl was doing, nor its exit code. A signal while fleetctl waits for its deliveries stops the wait: each event
not sent yet is such a failure, `interrupted by SIGTERM`, and the signal goes on. Header values and webhook URL
paths (Slack's secret) are never shown or recorded: a target is named by its program or its scheme://host:port.

Events are built by events.py; each target gets them in order from its own thread (a dead webhook delays
neither a campaign nor the other targets).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import queue
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .. import inputs, interrupts, redact
from ..errors import InputError
from ..sanitize import clean_data, one_line

if TYPE_CHECKING:
    import ssl  # imported where used: `fleetctl check` imports this module (through settings) and sends nothing

    from .webhook import Webhook

FORMATS = ("json", "slack", "teams")
PLACEHOLDERS = ("event", "severity", "kind", "campaign", "host", "target", "state", "run")
HEADERS_ENV = "FLEETCTL_WEBHOOK_HEADERS"
TRIES = 3  # a webhook's (orchestrator/notify/webhook.py)
MAX_HEADERS_BYTES = 64 * 1024  # a headers file (real ones: a line or two)
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
RESERVED_HEADERS = ("content-type", "content-length", "host", "transfer-encoding", "connection")
PLACEHOLDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,30}")  # a typo worth naming; anything else is not named


_STDERR = threading.Lock()


def warn(line: str) -> None:
    """LINE on stderr in one write: the targets' threads report at once, and a line is never cut by another."""
    with _STDERR, contextlib.suppress(Exception):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---- targets ------------------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def check_url(url: str, with_headers: bool, flag: str = "--webhook", what: str = "webhook") -> None:
    """URL (FLAG's, with WHAT's headers when WITH_HEADERS) is an http(s) URL without credentials, https where headers
    would leave this machine."""
    try:
        p = urllib.parse.urlsplit(url)
        p.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise InputError(f"{flag} {redact.url(url)}: not a URL") from None
    if p.scheme not in ("http", "https") or not p.hostname:
        raise InputError(f"{flag} {redact.url(url)}: not an http:// or https:// URL")
    if p.username is not None or p.password is not None:
        raise InputError(f"{flag} {redact.url(url)}: credentials in the URL: put them in --{what.lower()}-headers")
    if p.scheme == "http" and with_headers and not is_loopback(p.hostname):
        raise InputError(f"{flag} {redact.url(url)}: plain http would send the {what} headers in clear text "
                         "(use https)")


def parse_headers(text: str, source: str) -> list[tuple[str, str]]:
    """`Name: value` lines (blank lines and # comments skipped). An error names the line, never its value."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not HEADER_NAME.match(name):
            raise InputError(f"{source}: line {n}: not a 'Name: value' header")
        if not value or not value.isprintable():
            raise InputError(f"{source}: line {n}: header {name}: an empty value or one with control characters")
        if name.lower() in RESERVED_HEADERS:
            raise InputError(f"{source}: line {n}: header {name} is fleetctl's to set")
        out.append((name, value))
    return out


def read_headers(path: str, what: str) -> list[tuple[str, str]]:
    """The headers of the file at PATH (WHAT's: webhook, Prometheus): a regular file (or /dev/null) of at most
    MAX_HEADERS_BYTES of `Name: value` lines that only its owner may read. A problem is one InputError line that
    never quotes the file."""
    label = f"the {what} headers"
    raw = inputs.read_regular(path, label, MAX_HEADERS_BYTES, devnull_is_empty=True)
    try:
        mode, text = os.stat(path).st_mode, raw.decode()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{inputs.shown(path)}: cannot read {label}: {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISREG(mode) and mode & (stat.S_IRGRP | stat.S_IROTH):  # tokens: for the owner's eyes only
        raise InputError(f"{inputs.shown(path)}: {label} file is readable by others (mode {stat.S_IMODE(mode):04o}): "
                         "chmod 600 it")
    return parse_headers(text, inputs.shown(path))


def load_headers(path: str | None) -> list[tuple[str, str, str]]:
    """(name, value, source): the file's headers, then the environment's (which win on the same name)."""
    found: dict[str, tuple[str, str, str]] = {}
    if path:
        for name, value in read_headers(path, "webhook"):
            found[name.lower()] = (name, value, path)
    env = os.environ.get(HEADERS_ENV)
    if env:
        for name, value in parse_headers(env, f"${HEADERS_ENV}"):
            found[name.lower()] = (name, value, f"${HEADERS_ENV}")
    return list(found.values())


def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's trust store (certificate and host name verified), plus CA_FILE's certificates. Both files are
    held to inputs.py's rules first (OpenSSL would block on a FIFO, read /dev/zero for ever): CA_FILE is read
    through it, $SSL_CERT_FILE (which OpenSSL opens itself) checked."""
    import ssl
    if os.environ.get("SSL_CERT_FILE"):
        inputs.check_regular(os.environ["SSL_CERT_FILE"], "$SSL_CERT_FILE")
    context = ssl.create_default_context()
    if ca_file:
        pem = inputs.read_regular(ca_file, "the webhook CA").decode("ascii", "ignore")  # PEM is ASCII; not comments
        try:
            context.load_verify_locations(cadata=pem)
        except (ssl.SSLError, ValueError) as e:  # ValueError: an empty file
            raise InputError(f"{inputs.shown(ca_file)}: not a PEM CA certificate "
                             f"({getattr(e, 'reason', None) or 'no certificate in it'})") from None
    return context


def values_of(payload: dict[str, Any]) -> dict[str, str]:
    """The placeholders' values for one event ('' where it has none)."""
    campaign, run = payload.get("campaign") or {}, payload.get("run") or {}
    return {"event": payload["event"], "severity": payload["severity"], "kind": payload["source"],
            "campaign": str(campaign.get("id", "")), "host": payload.get("host") or "",
            "target": campaign.get("target", ""), "state": campaign.get("state", ""), "run": str(run.get("id", ""))}


def template_words(template: str) -> list[str]:
    """TEMPLATE split into words, its placeholders checked (an input error now, never at the first event)."""
    try:
        words = shlex.split(template)
    except ValueError as e:  # the template is never echoed: its arguments may hold a token
        raise InputError(f"--notify: cannot split the command into words: {e}") from None
    if not words:
        raise InputError("--notify: empty command")
    sample = dict.fromkeys(PLACEHOLDERS, "x")
    for word in words:
        try:
            word.format(**sample)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
            name = e.args[0] if isinstance(e, KeyError) and e.args else None
            what = (f"unknown placeholder '{name}'" if isinstance(name, str) and PLACEHOLDER_NAME.fullmatch(name)
                    else "a '{' or '}' that is not a placeholder (write {{ and }} for braces)")
            raise InputError(f"--notify: {what} (use " + " ".join("{" + p + "}" for p in PLACEHOLDERS) + ")") \
                from None
    return words


class Command:
    def __init__(self, template: str, timeout_s: float):
        self.words = template_words(template)
        self.timeout_s = timeout_s

    def describe(self) -> str:
        return f"command {self.words[0]}"  # its arguments may hold a token: never shown or recorded

    def deliver(self, payload: dict[str, Any], body: bytes) -> str | None:
        values = values_of(payload)
        argv = [w.format(**values) for w in self.words]
        env = {k: v for k, v in os.environ.items() if k != HEADERS_ENV}
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True)  # its own group: killed whole on a timeout
        except OSError as e:
            return f"cannot run it: {e.strerror or type(e).__name__}"
        try:
            out, err = proc.communicate(body + b"\n", timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # something left the group and holds its pipes
                for pipe in (proc.stdout, proc.stderr):
                    with contextlib.suppress(OSError):
                        pipe.close()
                proc.wait()
            return f"no exit in {self.timeout_s:g}s (killed)"
        if proc.returncode != 0:
            lines = (err or out).decode(errors="replace").strip().splitlines()
            return f"exited {proc.returncode}" + (f": {one_line(lines[-1], 200)}" if lines else "")
        return None


# ---- Slack and Microsoft Teams ------------------------------------------------------------------------------

EMOJI = {"info": ":large_blue_circle:", "warning": ":large_orange_circle:", "critical": ":red_circle:"}
CARD_COLOR = {"info": "Good", "warning": "Warning", "critical": "Attention"}


def title(payload: dict[str, Any]) -> str:
    c = payload.get("campaign")
    if c:
        return f"fleetctl campaign {c['id']} to {c['target']}: {payload['event'].replace('_', ' ')}"
    return f"fleetctl {payload['source']}: {payload['event'].replace('_', ' ')}"


def facts(payload: dict[str, Any]) -> list[tuple[str, str]]:
    out = [("Severity", payload["severity"])]
    c = payload.get("campaign")
    if c:
        out += [("Campaign", str(c["id"])), ("Target", c["target"]), ("State", c["state"]),
                ("Wave", f"{c['wave']} of {c['waves']}")]
    run = payload.get("run")
    if run:
        out += [("Run", f"{run['kind']} {run['id']}"), ("Inventory", run["inventory"])]
    if payload.get("host"):
        out.append(("Host", payload["host"]))
    out.append(("Control node", payload["control_node"]))
    return out


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # <!channel> would ping everyone


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def shape(payload: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The body for FMT: json is the event itself; slack an incoming-webhook message (text + Block Kit blocks);
    teams a message with one Adaptive Card (Teams workflows and incoming webhooks); their text from hosts
    visible() (sanitize.py), as every output format shows it."""
    if fmt in ("slack", "teams"):
        payload = clean_data(payload)
    if fmt == "slack":
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": cut(title(payload), 150), "emoji": True}},
            {"type": "section", "text": {"type": "mrkdwn", "text": cut(
                f"{EMOJI[payload['severity']]} {slack_escape(payload['summary'])}", 3000)}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": cut(f"*{k}*\n{slack_escape(v)}", 2000)}
                                           for k, v in facts(payload)[:10]]}]
        if payload.get("action"):
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": cut(
                f"*What to do:* {slack_escape(payload['action'])}", 3000)}})
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": cut(
            f"fleetctl {payload['tool']['version']} on {slack_escape(payload['control_node'])} at {payload['at']}",
            3000)}]})
        return {"text": cut(f"{title(payload)}: {payload['summary']}", 3000), "blocks": blocks}
    if fmt == "teams":
        body: list[dict[str, Any]] = [
            {"type": "TextBlock", "text": title(payload), "weight": "Bolder", "size": "Medium", "wrap": True,
             "color": CARD_COLOR[payload["severity"]]},
            {"type": "TextBlock", "text": payload["summary"], "wrap": True},
            {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in facts(payload)]}]
        if payload.get("action"):
            body.append({"type": "TextBlock", "text": f"What to do: {payload['action']}", "wrap": True,
                         "weight": "Bolder"})
        card = {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                "version": "1.4", "msteams": {"width": "Full"}, "body": body}
        return {"type": "message", "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}]}
    return payload


# ---- delivery -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    target: str  # as describe() names it: no secret
    notification: str  # the event
    about: str  # "campaign 3" or "audit run 12"
    reason: str

    def line(self) -> str:
        return (f"fleetctl: warning: notification failed: {self.target} ({self.about} {self.notification}): "
                f"{self.reason}")

    def record(self) -> dict[str, str]:
        return {"target": self.target, "notification": self.notification, "reason": self.reason}


def about(payload: dict[str, Any]) -> str:
    if payload.get("campaign"):
        return f"campaign {payload['campaign']['id']}"
    run = payload.get("run") or {}
    return f"{payload['source']} run {run.get('id', '?')}"


class Notifier:
    """The targets of one command (built from its flags and the config file's defaults)."""

    def __init__(self, targets: list[Command | Webhook], secrets: list[str]):
        self.targets = targets
        self.secrets = [s for s in secrets if s]  # scrubbed from every failure, whatever reported it

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def dispatch(self) -> Dispatch:
        return Dispatch(self)

    def send_now(self, payload: dict[str, Any]) -> list[Failure]:
        """PAYLOAD to every target at once; back when each has answered, failed or timed out."""
        d = self.dispatch()
        d.submit(payload)
        d.close(wait=True)
        return d.take_failures()


class Dispatch:
    """One thread per target, each sending events in the order submitted; failures printed (one line each) as
    they happen and kept for the caller to record."""

    def __init__(self, notifier: Notifier):
        self.notifier = notifier
        self.failures: queue.SimpleQueue[Failure] = queue.SimpleQueue()
        self.queues: list[queue.SimpleQueue] = []
        self.sending: list[dict[str, Any] | None] = [None] * len(notifier.targets)  # each target's event under way
        self.threads = []
        for i, target in enumerate(notifier.targets):
            q: queue.SimpleQueue = queue.SimpleQueue()
            t = threading.Thread(target=self._work, args=(i, target, q), name=f"fleetctl-notify-{i}", daemon=True)
            self.queues.append(q)
            self.threads.append(t)
            t.start()

    def submit(self, payload: dict[str, Any]) -> None:
        for q in self.queues:
            q.put(payload)

    def _work(self, i: int, target: Command | Webhook, q: queue.SimpleQueue) -> None:
        while True:
            payload = q.get()
            if payload is None:
                return
            self.sending[i] = payload
            try:
                body = json.dumps(payload).encode()
                reason = target.deliver(payload, body)
            except Exception as e:  # a bug: reported like any failure, never raised into the campaign
                reason = f"internal error: {type(e).__name__}"
            if reason is not None:
                self._fail(target, payload, reason)
            self.sending[i] = None

    def _fail(self, target: Command | Webhook, payload: dict[str, Any], reason: str) -> None:
        failure = Failure(target.describe(), payload["event"], about(payload), self.notifier.scrub(reason))
        warn(failure.line())
        self.failures.put(failure)

    def _interrupted(self, signal_name: str) -> None:
        """Each event a target has not sent yet (the one under way, those waiting) a failure, `interrupted by
        SIGNAL`; the targets' threads end with what they are sending."""
        for i, (target, q) in enumerate(zip(self.notifier.targets, self.queues)):
            left = [self.sending[i]]  # (not is_alive(): an interrupted join() marks a running thread stopped)
            with contextlib.suppress(queue.Empty):
                while True:
                    left.append(q.get_nowait())
            q.put(None)
            for payload in left:
                if payload is not None:
                    self._fail(target, payload, f"interrupted by {signal_name}")

    def take_failures(self) -> list[Failure]:
        out = []
        while True:
            try:
                out.append(self.failures.get_nowait())
            except queue.Empty:
                return out

    def close(self, wait: bool = True) -> None:
        """No more events; with WAIT, back when every target has sent (or failed) what it was given. A signal while
        waiting stops the wait: what was not sent is a failure (_interrupted()), and the signal is raised on."""
        for q in self.queues:
            q.put(None)
        if not wait:
            return
        try:
            for t in self.threads:
                t.join()
        except (KeyboardInterrupt, interrupts.Interrupted) as e:
            with interrupts.deferred():  # the failures noted whole; a second signal waits for them
                self._interrupted(getattr(e, "name", "SIGINT"))
            raise


def encoder(fmt: str) -> Callable[[dict[str, Any], bytes], bytes]:
    """A webhook's body in FMT: the event's JSON as it is, or the message shape() makes for Slack or Teams."""
    if fmt == "json":
        return lambda payload, body: body
    return lambda payload, body: json.dumps(shape(payload, fmt)).encode()


def build(commands: tuple[str, ...] | list[str], webhooks: tuple[str, ...] | list[str], fmt: str,
          headers_file: str | None, ca_file: str | None, timeout_s: float) -> Notifier | None:
    """The notifier for these settings, checked (input errors now), or None without a target."""
    if not commands and not webhooks:
        return None
    if fmt not in FORMATS:
        raise InputError(f"--webhook-format {fmt!r}: choose {', '.join(FORMATS)}")
    targets: list[Command | Webhook] = [Command(c, timeout_s) for c in commands]
    secrets: list[str] = []
    if webhooks:
        from .webhook import Webhook

        headers = load_headers(headers_file)
        context = ssl_context(ca_file)
        for url in webhooks:
            check_url(url, bool(headers))
            targets.append(Webhook(url, headers, context, timeout_s, tries=TRIES, encode=encoder(fmt)))
        secrets = [value for _, value, _ in headers] + list(webhooks)
        secrets += [urllib.parse.urlsplit(u).path for u in webhooks if len(urllib.parse.urlsplit(u).path) > 8]
    return Notifier(targets, secrets)
