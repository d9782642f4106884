"""JSON Schema validation with errors that name the file and the JSON path."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from . import resources
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
    return path


def first_error(name: str, document: Any) -> ValidationError | None:
    """The shallowest problem, which is the one a person can act on."""
    errors = list(validator(name).iter_errors(document))
    return min(errors, key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))) if errors else None


def check(name: str, document: Any, source: str) -> None:
    """Raise InputError naming SOURCE and the JSON path of the first problem."""
    error = first_error(name, document)
    if error is not None:
        raise InputError(f"{source}: {json_path(error)}: {error.message}")
