"""JSON Schema validation with errors that name the file and the JSON path, and the cache of documents found valid
before (jsonschema is imported on first use: `fleetctl check` with a baseline it has validated before does without)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__, inputs, resources
from .errors import InputError
from .sanitize import one_line

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError
    from referencing import Registry


@cache
def registry() -> Registry:
    """Every schema of schemas/, so that one can $ref another by its $id."""
    from referencing import Registry, Resource
    resources_ = []
    for path in sorted((resources.root() / "schemas").glob("*.schema.json")):
        schema = json.loads(path.read_text())
        resources_.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources_)


@cache
def validator(name: str) -> Draft202012Validator:
    """NAME's validator. The shipped schemas are checked against the 2020-12 meta-schema by a unit test
    (tests/unit/test_schemas_shipped.py), not here: that took half a second of every run (of `fleetctl check` on
    every Slurm node too)."""
    from jsonschema import Draft202012Validator
    schema = json.loads(resources.schema_path(name).read_text())
    return Draft202012Validator(schema, registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER)


# What an error message may quote from the document: a name (a key someone mistyped, an enum value) or a number.
# Anything else (a line of /etc/shadow given as a baseline, a token) is described, never echoed.
# A whole document that is one word is never quoted: that word may be a token.
QUOTABLE = re.compile(r"-?[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,63}")


def quotable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float)) or \
        (isinstance(value, str) and QUOTABLE.fullmatch(value) is not None)


def json_path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if quotable(part) else "[a key that is not a name]"
    return path if len(path) <= 200 else path[:200] + "..."  # a key a host made up may be a megabyte long


def message(error: ValidationError) -> str:
    """The validator's message where it quotes nothing but names and numbers from the document; else the same
    verdict in words, the value left out."""
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        patterns = error.schema.get("patternProperties", {})
        extra = [k for k in instance if k not in known and not any(re.search(p, k) for p in patterns)]
        if extra and all(quotable(k) for k in extra):
            return error.message
        return f"{len(extra)} unexpected key{'s' if len(extra) != 1 else ''}" \
            + ("" if extra and any(quotable(k) for k in extra) else ", not one of them a name")
    if error.validator == "required" or (quotable(instance) and error.absolute_path):
        return error.message
    kind = {dict: "a mapping", list: "a list", str: "a string"}.get(type(instance), type(instance).__name__)
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"expected {' or '.join(map(str, wanted))}, found {kind}"
    if error.validator == "enum":
        return f"{kind} that is not one of {error.validator_value}"
    return f"{kind} that fails the schema's {error.validator!r} rule"


@cache
def fast_validator(name: str) -> Any:
    """jsonschema-rs's validator of NAME, or None where it is not installed: a compiled validator, 180 times
    jsonschema's speed on a host's facts (0.09 ms against 15: docs/benchmarks.md). It only says yes or no: a
    document it passes is valid, one it fails goes to jsonschema (validator), whose error a person reads and whose
    verdict stands. Formats are asserted as jsonschema's FORMAT_CHECKER asserts them."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    schemas = [json.loads(path.read_text()) for path in sorted((resources.root() / "schemas").glob("*.schema.json"))]
    registry = jsonschema_rs.Registry([(schema["$id"], schema) for schema in schemas])
    return jsonschema_rs.validator_for(json.loads(resources.schema_path(name).read_text()), validate_formats=True,
                                       registry=registry)


def valid(name: str, document: Any) -> bool:
    """Whether jsonschema-rs passes DOCUMENT against schema NAME (False too where it cannot say)."""
    fast = fast_validator(name)
    try:
        return fast is not None and fast.is_valid(document)
    except Exception:  # a value it cannot take (not JSON's): jsonschema decides
        return False


def first_error(name: str, document: Any, among: int | None = None) -> ValidationError | None:
    """The shallowest problem, which is the one a person can act on (of the first AMONG found, if given); None
    at once for a document jsonschema-rs passes."""
    if valid(name, document):
        return None
    errors = list(itertools.islice(validator(name).iter_errors(document), among))
    return min(errors, key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))) if errors else None


def check(name: str, document: Any, source: str, raw: bytes | None = None) -> None:
    """Raise InputError naming SOURCE and the JSON path of the first problem. RAW, the bytes DOCUMENT was read from:
    once valid, remembered (valid_marker), and those bytes are not validated again."""
    marker = None if raw is None else valid_marker(name, raw)
    if marker is not None and os.path.exists(marker):  # False too where it cannot be looked at
        return
    error = first_error(name, document)
    if error is not None:
        raise InputError(f"{source}: {json_path(error)}: {message(error)}")
    if marker is not None:
        with contextlib.suppress(OSError):  # a read-only home: validated again next time, nothing else
            marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))


def cache_dir() -> Path | None:
    """fleetctl's cache: $XDG_CACHE_HOME/fleetctl, else ~/.cache/fleetctl; None for a user without a home. What is in
    it may be deleted at any time."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative one is ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleetctl" if os.path.isabs(base) else None


def valid_marker(name: str, raw: bytes) -> Path | None:
    """The empty file whose presence says that the document of bytes RAW is valid against schema NAME. Its name is
    the sha256 of fleetctl's version, the schema file's bytes and RAW: another byte in any of them, another name (an
    edited file is validated again; a file edited back to bytes found valid is not). Created only once the document
    was found valid, and empty: a check running beside the one creating it sees it whole or not at all."""
    directory = cache_dir()
    if directory is None:
        return None
    digest = hashlib.sha256()
    for part in (__version__.encode(), resources.schema_path(name).read_bytes(), raw):
        digest.update(hashlib.sha256(part).digest())
    return directory / "valid" / f"{name}-{digest.hexdigest()}"


HOST_RESULT_ERRORS = 100  # schema errors looked at in a host's result: 200000 wrong values would take minutes


def host_result_problem(name: str, document: Any) -> str | None:
    """Why a module result from a host (to be valid against schema NAME) cannot be trusted, as one line, or None:
    too large or nested too deeply (checked first, in bounded time: the schema's validator recurses), else the
    shallowest of its first schema problems."""
    problem = inputs.result_problem(document)
    if problem is None:
        error = first_error(name, document, among=HOST_RESULT_ERRORS)
        problem = None if error is None else f"{json_path(error)}: {message(error)[:200]}"
    return None if problem is None else one_line(problem)
