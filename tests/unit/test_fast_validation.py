"""jsonschema-rs's yes-or-no (schemas.fast_validator) never passes what jsonschema refuses: over every host's facts
the real captures hold and thousands of small damages to them, a document the fast validator passes is one
jsonschema finds no error in; what it fails, jsonschema's error is read (and its verdict stands)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from orchestrator import schemas

TESTDATA = Path(__file__).parents[1] / "testdata"


def captured_facts() -> list[dict]:
    """Every host's facts in the real audit captures (tests/testdata/*/audit-*.json)."""
    out = []
    for path in sorted(TESTDATA.glob("*/audit-*.json")):
        out += [h["facts"] for h in json.loads(path.read_text()).get("hosts", []) if h.get("facts")]
    return out


FACTS = captured_facts()
ODD = [None, True, -1, 1.5, "", "x" * 300, [], {}, {"odd": 1}, "2026-13-45T99:00:00Z"]


def damaged(doc: dict, rng: random.Random) -> dict:
    """DOC with one value somewhere replaced by an odd one, or one key dropped or added."""
    doc = copy.deepcopy(doc)
    node, steps = doc, rng.randint(1, 6)
    for _ in range(steps):
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        containers = [(k, v) for k, v in children if isinstance(v, (dict, list)) and v]
        if not containers or rng.random() < 0.3:
            break
        key, node = rng.choice(containers)
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        what = rng.random()
        if what < 0.2:
            del node[key]
        elif what < 0.3:
            node["unexpected_key"] = 1
        else:
            node[key] = rng.choice(ODD)
    elif isinstance(node, list) and node:
        node[rng.randrange(len(node))] = rng.choice(ODD)
    return doc


def test_the_captures_are_many_and_valid_both_ways():
    assert len(FACTS) >= 5
    for facts in FACTS:
        assert schemas.valid("host-facts", facts) and schemas.validator("host-facts").is_valid(facts)


@pytest.mark.parametrize("seed", range(4))
def test_what_the_fast_validator_passes_jsonschema_passes(seed):
    rng = random.Random(seed)
    fails = 0
    for _ in range(400):
        doc = damaged(rng.choice(FACTS), rng)
        full = schemas.validator("host-facts").is_valid(doc)
        fast = schemas.valid("host-facts", doc)
        assert not (fast and not full), json.dumps(doc)[:300]
        fails += not full
        if not fast:  # jsonschema's verdict stands: the one line a person reads, or None where it finds nothing
            assert (schemas.host_result_problem("host-facts", doc) is None) == full
    assert fails > 100  # the damages do break the documents


def test_without_jsonschema_rs_jsonschema_alone_decides(monkeypatch):
    schemas.fast_validator.cache_clear()
    monkeypatch.setitem(__import__("sys").modules, "jsonschema_rs", None)  # import fails
    try:
        assert schemas.fast_validator("host-facts") is None
        bad = copy.deepcopy(FACTS[0])
        bad["schema_version"] = "one"
        assert schemas.host_result_problem("host-facts", bad).startswith("$.schema_version: ")
        assert schemas.host_result_problem("host-facts", FACTS[0]) is None
    finally:
        schemas.fast_validator.cache_clear()
