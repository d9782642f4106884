"""JSON Schema validation with errors that name the file and the JSON path."""

from __future__ import annotations

import itertools
import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from . import inputs, resources
from .errors import InputError


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
    schema = json.loads(resources.schema_path(name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER)


def json_path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path if len(path) <= 200 else path[:200] + "..."  # a key a host made up may be a megabyte long


def first_error(name: str, document: Any, among: int | None = None) -> ValidationError | None:
    """The shallowest problem, which is the one a person can act on (of the first AMONG found, if given)."""
    errors = list(itertools.islice(validator(name).iter_errors(document), among))
    return min(errors, key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))) if errors else None


def check(name: str, document: Any, source: str) -> None:
    """Raise InputError naming SOURCE and the JSON path of the first problem."""
    error = first_error(name, document)
    if error is not None:
        raise InputError(f"{source}: {json_path(error)}: {error.message}")


HOST_RESULT_ERRORS = 100  # schema errors looked at in a host's result: 200000 wrong values would take minutes


def host_result_problem(name: str, document: Any) -> str | None:
    """Why a module result from a host (to be valid against schema NAME) cannot be trusted, as one line, or None:
    too large or nested too deeply (checked first, in bounded time: the schema's validator recurses), else the
    shallowest of its first schema problems."""
    problem = inputs.result_problem(document)
    if problem is None:
        error = first_error(name, document, among=HOST_RESULT_ERRORS)
        problem = None if error is None else f"{json_path(error)}: {error.message[:200]}"
    return None if problem is None else " ".join(problem.split())
