"""JSON Schema validation with errors that name the file and the JSON path."""

from __future__ import annotations

import itertools
import json
import re
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from . import inputs, resources
from .errors import InputError
from .sanitize import one_line


@cache
def registry() -> Registry:
    """Every schema of schemas/, so that one can $ref another by its $id."""
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


def first_error(name: str, document: Any, among: int | None = None) -> ValidationError | None:
    """The shallowest problem, which is the one a person can act on (of the first AMONG found, if given)."""
    errors = list(itertools.islice(validator(name).iter_errors(document), among))
    return min(errors, key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))) if errors else None


def check(name: str, document: Any, source: str) -> None:
    """Raise InputError naming SOURCE and the JSON path of the first problem."""
    error = first_error(name, document)
    if error is not None:
        raise InputError(f"{source}: {json_path(error)}: {message(error)}")


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
