"""Every schema fleetctl ships is a valid JSON Schema 2020-12 document (orchestrator/schemas.py no longer checks
that at run time) and loads through the validator the commands use."""

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from orchestrator import schemas

SCHEMAS = sorted((Path(__file__).resolve().parents[2] / "schemas").glob("*.schema.json"))


def test_there_are_schemas():
    assert len(SCHEMAS) >= 10


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.name)
def test_a_shipped_schema_is_valid_against_the_meta_schema(path):
    Draft202012Validator.check_schema(json.loads(path.read_text()))
    assert schemas.validator(path.name.removesuffix(".schema.json")).schema["$id"]
