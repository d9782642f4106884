"""A real webhook receiver for tests: http.server on 127.0.0.1 in a thread, plain HTTP or HTTPS (certificates made
with the `cryptography` package), answering from a script, recording every request it got; and a forward proxy."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import select
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Request:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """SCRIPT: the answers in order (an HTTP status, (status, headers), "hang", "stall": 200 and part of the body,
    then nothing, or "cut": 200 and the connection closed before the body); once used up, FALLBACK for every
    request."""

    script: list = field(default_factory=list)
    fallback: int | str = 200
    tls: ssl.SSLContext | None = None
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self):
        self.release = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append(Request(time.monotonic(), self.path, dict(self.headers.items()), body))
                    answer = receiver.script.pop(0) if receiver.script else receiver.fallback
                if answer == "hang":
                    receiver.release.wait(60)
                    return
                if answer in ("stall", "cut"):  # 200 and a body of 100 bytes: 2 of them then nothing, or none at all
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    if answer == "stall":
                        self.wfile.write(b"ok")
                        self.wfile.flush()
                        receiver.release.wait(60)
                    return  # the connection closes
                answer, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(answer)
                if 300 <= answer < 400:
                    self.send_header("Location", f"http://127.0.0.1:{receiver.port}/elsewhere")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def bodies(self) -> list:
        return [r.json() for r in self.requests]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """A forward HTTP proxy on 127.0.0.1 (what $https_proxy and $http_proxy name): an absolute-URI request is sent on
    to its server, a CONNECT gets a tunnel; every request line is recorded."""

    def __init__(self):
        self.lines: list[str] = []
        self.auth: list[str | None] = []  # each request's Proxy-Authorization
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_CONNECT(self):
                proxy.lines.append(self.requestline)
                proxy.auth.append(self.headers.get("Proxy-Authorization"))
                host, port = self.path.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=10) as upstream:
                    self.send_response(200)
                    self.end_headers()
                    relay(self.connection, upstream)
                self.close_connection = True

            def do_POST(self):
                proxy.lines.append(self.requestline)
                proxy.auth.append(self.headers.get("Proxy-Authorization"))
                target = urllib.parse.urlsplit(self.path)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
                upstream.request("POST", target.path, body, {k: v for k, v in self.headers.items()
                                                             if k.lower() not in ("host", "proxy-connection")})
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways between A and B until either end closes (or 10 s pass with none)."""
    while True:
        ready, _, _ = select.select([a, b], [], [], 10)
        if not ready:
            return
        for s in ready:
            data = s.recv(1 << 16)
            if not data:
                return
            (b if s is a else a).sendall(data)


def closed_port() -> int:
    """A loopback port nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- certificates -----------------------------------------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _usage(**allowed: bool) -> x509.KeyUsage:
    """A KeyUsage extension allowing only ALLOWED (e.g. key_cert_sign=True)."""
    flags = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
             "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
    return x509.KeyUsage(**{f: allowed.get(f, False) for f in flags})


def _server(builder: x509.CertificateBuilder, usage: x509.KeyUsage, signer) -> x509.Certificate:
    """BUILDER with USAGE and what a TLS server certificate for 127.0.0.1 carries, signed by SIGNER."""
    return (builder.add_extension(usage, critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(SAN, critical=False)
            .sign(signer, hashes.SHA256()))


SAN = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])


@dataclass(frozen=True)
class Pki:
    ca: Path  # what --webhook-ca is given
    cert: Path  # the server's chain
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def self_signed(directory: Path) -> Pki:
    """A self-signed server certificate for 127.0.0.1 (its own CA: what a test box or a lab appliance has)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _server(_builder(_name("fleetctl test self-signed"), _name("fleetctl test self-signed"), key.public_key())
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True),
                   _usage(digital_signature=True, key_cert_sign=True), key)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "self.pem").write_bytes(_pem(cert))
    (directory / "self.key").write_bytes(_key_pem(key))
    return Pki(directory / "self.pem", directory / "self.pem", directory / "self.key")


def private_ca(directory: Path) -> Pki:
    """A private CA and a server certificate it signed for 127.0.0.1 (what an internal webhook has)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (_builder(_name("fleetctl test CA"), _name("fleetctl test CA"), ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_usage(key_cert_sign=True, crl_sign=True), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _server(_builder(_name("127.0.0.1"), ca.subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False),
                   _usage(digital_signature=True), ca_key)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(_pem(ca))
    (directory / "server.pem").write_bytes(_pem(leaf) + _pem(ca))
    (directory / "server.key").write_bytes(_key_pem(key))
    return Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")


RECORDER = """\
import json, sys
out = sys.argv[1]
with open(out, "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[2:], "stdin": json.loads(sys.stdin.read())}) + "\\n")
"""


def recorder(directory: Path) -> tuple[Path, Path]:
    """A --notify program (run as `python RECORDER OUT {event} ...`) appending its argv and stdin's JSON to OUT."""
    directory.mkdir(parents=True, exist_ok=True)
    script, out = directory / "record_event.py", directory / "events.jsonl"
    script.write_text(RECORDER)
    return script, out


def recorded(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
