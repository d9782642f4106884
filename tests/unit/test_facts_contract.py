"""One facts contract: schemas/host-facts.schema.json is the source. The gpu_facts module's RETURN documents the same
tree (every documented key path is in the schema and every schema key is documented where RETURN lists a dict's
keys, with matching types, choices and presence), its samples validate against the schema, and every control's
`needs` names a path of the schema."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from orchestrator import controls, resources

MODULE = "collections/ansible_collections/fleetctl/gpu/plugins/modules/gpu_facts.py"
# RETURN types -> the JSON types the schema may allow for them
TYPES = {"str": {"string"}, "int": {"integer", "number"}, "float": {"number"}, "bool": {"boolean"},
         "dict": {"object"}, "list": {"array"}}
# Top-level keys the collector always writes that the schema leaves optional, only so that facts recorded by older
# collectors (before these keys existed) still validate.
OPTIONAL_FOR_OLD_FACTS = {"facts.boot", "facts.interconnect", "facts.sxid", "facts.infiniband", "facts.imex"}


def schema() -> dict[str, Any]:
    return json.loads(resources.schema_path("host-facts").read_text())


def return_doc() -> dict[str, Any]:
    tree = ast.parse((resources.root() / MODULE).read_text())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "RETURN" for t in node.targets))
    return yaml.safe_load(text)


class Schema:
    """Walks the schema through $ref, oneOf and anyOf: a node is the list of the object/array/scalar schemas it may be."""

    def __init__(self, root: dict[str, Any]):
        self.root = root

    def branches(self, node: dict[str, Any]) -> list[dict[str, Any]]:
        if "$ref" in node:
            assert node["$ref"].startswith("#/$defs/"), node["$ref"]
            return self.branches({**self.root["$defs"][node["$ref"][len("#/$defs/"):]],
                                  **{k: v for k, v in node.items() if k != "$ref"}})
        for key in ("oneOf", "anyOf"):
            if key in node:
                rest = {k: v for k, v in node.items() if k != key}
                return [b for sub in node[key] for b in self.branches({**rest, **sub})]
        return [node]

    def types(self, node: dict[str, Any]) -> set[str]:
        out: set[str] = set()
        for b in self.branches(node):
            if "type" in b:
                out |= {b["type"]} if isinstance(b["type"], str) else set(b["type"])
            for value in ([b["const"]] if "const" in b else []) + list(b.get("enum", [])):
                out.add({bool: "boolean", int: "integer", float: "number", str: "string",
                         type(None): "null"}[type(value)])
        return out

    def enum(self, node: dict[str, Any]) -> set[Any] | None:
        values = [v for b in self.branches(node) for v in b.get("enum", [])]
        return {v for v in values if v is not None} if values else None

    def objects(self, node: dict[str, Any]) -> list[dict[str, Any]]:
        return [b for b in self.branches(node) if "properties" in b]

    def items(self, node: dict[str, Any]) -> dict[str, Any] | None:
        items = [b["items"] for b in self.branches(node) if "items" in b]
        return {"anyOf": items} if items else None

    def validator(self, node: dict[str, Any]) -> Draft202012Validator:
        return Draft202012Validator({**node, "$defs": self.root["$defs"]})

    def has(self, path: str) -> bool:
        """PATH ("driver.module_version", "interconnect.gpus[*].nvlink") names a key of the schema."""
        node: dict[str, Any] = {"anyOf": [self.root]}
        for part in path.split("."):
            name, star = (part[:-3], True) if part.endswith("[*]") else (part, False)
            found = [o["properties"][name] for o in self.objects(node) if name in o["properties"]]
            if not found:
                return False
            node = {"anyOf": found}
            if star:
                node = self.items(node)
                if node is None:
                    return False
        return True


def unshown(sample: Any, node: dict[str, Any], walker: Schema) -> set[str]:
    """Keys of the schema objects under NODE that SAMPLE does not show (every key below an empty list)."""
    objects = walker.objects(node)
    if isinstance(sample, dict) and objects:
        matching = [o for o in objects if not list(walker.validator(o).iter_errors(sample))] or objects
        props = {k: [o["properties"][k] for o in matching if k in o["properties"]] for o in matching
                 for k in o["properties"]}
        return {k for k in props if k not in sample} | {
            m for k, v in sample.items() if k in props for m in unshown(v, {"anyOf": props[k]}, walker)}
    items = walker.items(node)
    if isinstance(sample, list) and items is not None:
        if not sample:
            return {k for o in walker.objects(items) for k in o["properties"]} | unshown({}, items, walker)
        shown = [unshown(x, items, walker) for x in sample]
        return set.intersection(*shown)
    return set()


def words(doc: dict[str, Any]) -> set[str]:
    text = doc.get("description") or ""
    return set(re.findall(r"[a-z_][a-z0-9_.]*", " ".join(text) if isinstance(text, list) else text))


def problems_between(doc: dict[str, Any], node: dict[str, Any], path: str, walker: Schema,
                     described_null: bool = False) -> list[str]:
    """Where the RETURN entry DOC at PATH and the schema NODE disagree."""
    out = []
    types = walker.types(node)
    wanted = TYPES.get(doc.get("type"), set())
    if types and wanted and not wanted & types:
        out.append(f"{path}: RETURN says {doc['type']}, the schema {sorted(types)}")
    if doc.get("type") == "list" and doc.get("elements") in TYPES and walker.items(node) is not None:
        item_types = walker.types(walker.items(node))
        if item_types and not TYPES[doc["elements"]] & item_types:
            out.append(f"{path}: RETURN's elements are {doc['elements']}, the schema's items {sorted(item_types)}")
    enum = walker.enum(node)
    if "choices" in doc and set(doc["choices"]) != enum:
        out.append(f"{path}: RETURN's choices {doc['choices']} != the schema's enum {sorted(enum or [])}")
    described_null = described_null or "null" in " ".join(doc.get("description") or []
                                                           if isinstance(doc.get("description"), list)
                                                           else [doc.get("description") or ""]).lower()
    if "null" in types and not described_null:
        out.append(f"{path}: the schema allows null, RETURN never says when it is null")
    if "sample" in doc:
        sample = doc["sample"] if doc.get("type") != "list" or isinstance(doc["sample"], list) else [doc["sample"]]
        for error in walker.validator(node).iter_errors(sample):
            out.append(f"{path}: RETURN's sample fails the schema at {error.json_path}: {error.message}")
        # what the sample does not show, the description names
        out += [f"{path}: {key} is in the schema, neither in RETURN's sample nor named in its description"
                for key in sorted(unshown(doc["sample"], node, walker) - words(doc))]
    if "contains" in doc:
        target = walker.items(node) if doc.get("type") == "list" else node
        objects = walker.objects(target) if target else []
        props = {k: [o["properties"][k] for o in objects if k in o["properties"]] for o in objects for k in o["properties"]}
        for key, sub in doc["contains"].items():
            if key not in props:
                out.append(f"{path}.{key}: in RETURN, not in the schema")
                continue
            required = all(key in o.get("required", []) for o in objects)
            always = sub.get("returned") in ("always", "success")
            if required and not always:
                out.append(f"{path}.{key}: required by the schema, RETURN says returned: {sub.get('returned')}")
            if always and not required and f"{path}.{key}" not in OPTIONAL_FOR_OLD_FACTS:
                out.append(f"{path}.{key}: RETURN says returned: {sub.get('returned')}, the schema does not require it")
            # a list's or nullable dict's description may say for all its members when they are null
            out += problems_between(sub, {"anyOf": props[key]}, f"{path}.{key}", walker,
                                    described_null and doc.get("type") == "list")
        out += [f"{path}.{key}: in the schema, not in RETURN" for key in props if key not in doc["contains"]]
    return out


def test_return_and_the_schema_describe_the_same_facts():
    walker = Schema(schema())
    problems = problems_between(return_doc()["facts"], walker.root, "facts", walker)
    assert not problems, "\n".join(problems)


def test_every_top_level_fact_is_documented():
    assert set(return_doc()["facts"]["contains"]) == set(schema()["properties"])


@pytest.mark.parametrize("control", controls.CONTROLS, ids=lambda c: c.id)
def test_every_control_needs_facts_of_the_schema(control):
    walker = Schema(schema())
    assert [n for n in control.needs if not walker.has(n)] == []


def test_the_contract_check_sees_a_wrong_path():
    walker = Schema(schema())
    assert walker.has("interconnect.gpus[*].nvlink") and walker.has("boot.modules") and walker.has("gpus")
    assert not walker.has("container_runtime.cdi") and not walker.has("gpus.ecc") and not walker.has("driver.nope")
