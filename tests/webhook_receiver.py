"""A real webhook receiver for tests: http.server on 127.0.0.1 in a thread, plain HTTP or HTTPS (certificates made
with the `cryptography` package), answering from a script, recording every request it got."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import threading
import time
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
    """SCRIPT: the answers in order (an HTTP status, (status, headers), or "hang"); once used up, FALLBACK for every
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
    cert = (_builder(_name("fleetctl test self-signed"), _name("fleetctl test self-signed"), key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(SAN, critical=False)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "self.pem").write_bytes(_pem(cert))
    (directory / "self.key").write_bytes(_key_pem(key))
    return Pki(directory / "self.pem", directory / "self.pem", directory / "self.key")


def private_ca(directory: Path) -> Pki:
    """A private CA and a server certificate it signed for 127.0.0.1 (what an internal webhook has)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (_builder(_name("fleetctl test CA"), _name("fleetctl test CA"), ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (_builder(_name("127.0.0.1"), ca.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(SAN, critical=False)
            .sign(ca_key, hashes.SHA256()))
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
