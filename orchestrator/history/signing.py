"""Detached ed25519 signatures for exports: over the canonical JSON of a JSON/OSCAL export (so re-indenting it
does not break the signature), over the file's bytes for CSV and HTML. The .sig file is JSON."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import chain
from .. import files, inputs
from ..errors import InputError

MAX_EXPORT_BYTES = 256 * inputs.MiB  # a signed export read back to check it (real ones: a few MiB)


def signed_bytes(path: Path, how: str) -> bytes:
    data = inputs.read_regular(path, "the signed export", MAX_EXPORT_BYTES)
    if how == "canonical-json":
        try:
            return chain.canonical(json.loads(data))
        except ValueError:
            raise InputError(f"{path}: not JSON, but its signature was made over canonical JSON") from None
    return data


def load_private(path: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(read_key(path, "the signing key"), password=None)
    except (ValueError, TypeError) as e:
        raise InputError(f"{path}: not a readable unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path}: not an ed25519 key (openssl genpkey -algorithm ed25519)")
    return key


def load_public(path: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(read_key(path, "the public key"))
    except ValueError as e:
        raise InputError(f"{path}: not a readable PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{path}: not an ed25519 public key")
    return key


def read_key(path: str, label: str) -> bytes:
    """The PEM key file at PATH, read as every input is (inputs.read_regular: a FIFO or a device is refused)."""
    return inputs.read_regular(path, label, inputs.MAX_DOCUMENT_BYTES)


def raw(public: Ed25519PublicKey) -> str:
    return base64.b64encode(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def signature_of(path: str | Path) -> Path:
    """Where the signature of the export at PATH goes: PATH.sig."""
    return Path(f"{path}.sig")


def sign(path: Path, key_path: str, fmt: str, head: str) -> Path:
    key = load_private(key_path)
    how = "canonical-json" if fmt in ("json", "oscal") else "bytes"
    signature = key.sign(signed_bytes(path, how))
    out = signature_of(path)
    files.write_atomically(out, json.dumps({
        "algorithm": "ed25519", "signed": how, "file": path.name, "chain_head": head,
        "public_key": raw(key.public_key()), "signature": base64.b64encode(signature).decode()}, indent=2) + "\n")
    return out


def verify(sig_path: str, file_path: str | None, key_path: str | None) -> tuple[bool, str]:
    raw_sig = inputs.read_regular(sig_path, "the signature file", inputs.MAX_DOCUMENT_BYTES)
    try:
        sig: dict[str, Any] = json.loads(raw_sig)
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(sig["public_key"]))
        signature = base64.b64decode(sig["signature"])
        how, head = str(sig["signed"]), str(sig["chain_head"])
        target = Path(file_path) if file_path else Path(sig_path).with_name(sig["file"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # with_name: TypeError for 5, ValueError for "a/b"
        raise InputError(f"{sig_path}: not a fleetctl signature file ({e})") from None
    if key_path and raw(load_public(key_path)) != sig["public_key"]:
        return False, f"{target}: signed by another key than {key_path}"
    try:
        public.verify(signature, signed_bytes(target, how))
    except InvalidSignature:
        return False, f"{target}: signature does not match (the file changed since it was signed)"
    return True, f"{target}: signature valid (ed25519, chain head {head})"
