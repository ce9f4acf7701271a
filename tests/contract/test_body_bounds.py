"""Every request body the published schema allows fits under the server's default body cap (1 MiB).

A schema-valid body answered 413 is a departure from the contract (schemathesis's positive-data check
finds it), so the bounds of every request body (maxLength, maxItems, maxProperties) must keep its
largest JSON text under the cap. "Largest" as the common clients write JSON (Python's ``json.dumps``
as requests and schemathesis call it: ``ensure_ascii``, ``", "`` and ``": "`` separators): a character
costs at most 12 bytes (a non-BMP one escaped as two ``\\uXXXX``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest

from elastrain.server.limits import DEFAULT_MAX_BODY_BYTES
from tests.contract.conftest import PUBLISHED

pytestmark = pytest.mark.timeout(60)
CHAR_BYTES = 12  # "\ud83d\ude00": one character, ensure_ascii
NUMBER_BYTES = 24  # -1.7976931348623157e+308
DATE_TIME_BYTES = 64  # RFC 3339 with microseconds and an offset, quoted, with room to spare


def worst_bytes(schema: dict[str, Any], components: dict[str, Any]) -> float:
    """The largest compact-as-clients-write JSON text of a value valid under `schema` (inf: unbounded)."""
    if "$ref" in schema:
        return worst_bytes(components[schema["$ref"].rsplit("/", 1)[1]], components)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return max(worst_bytes(s, components) for s in schema[key])
    if "allOf" in schema:
        return min(worst_bytes(s, components) for s in schema["allOf"])
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return max(len(json.dumps(v)) for v in values)
    kind = schema.get("type")
    if kind == "string":
        if schema.get("format") == "date-time":
            return DATE_TIME_BYTES
        return 2 + CHAR_BYTES * schema["maxLength"] if "maxLength" in schema else math.inf
    if kind in ("integer", "number"):
        return NUMBER_BYTES
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        item = worst_bytes(schema.get("items", {}), components)
        return 2 + schema["maxItems"] * (item + 2) if "maxItems" in schema else math.inf
    if kind == "object" or "properties" in schema:
        size = 2.0 + sum(
            len(json.dumps(name)) + 2 + worst_bytes(sub, components) + 2
            for name, sub in schema.get("properties", {}).items()
        )
        extra = schema.get("additionalProperties", True)
        values = list(schema.get("patternProperties", {}).values())
        if extra is not False:
            values.append(extra if isinstance(extra, dict) else {})
        if values:  # names beyond `properties`: at most maxProperties of them, names as propertyNames says
            if "maxProperties" not in schema:
                return math.inf
            names = {"type": "string", **schema.get("propertyNames", {})}  # a JSON name is a string
            value = max(worst_bytes(v, components) for v in values)
            size += schema["maxProperties"] * (worst_bytes(names, components) + 2 + value + 2)
        return size
    return math.inf  # any value at all


def request_bodies() -> list[tuple[str, dict[str, Any]]]:
    """(``METHOD /path``, JSON schema) of every JSON request body of the published document."""
    document = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    out = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                out.append((f"{method.upper()} {path}", content["application/json"]["schema"]))
    return out


def test_every_schema_valid_request_body_fits_under_the_body_cap() -> None:
    components = json.loads(PUBLISHED.read_text(encoding="utf-8"))["components"]["schemas"]
    sizes = {op: worst_bytes(schema, components) for op, schema in request_bodies()}
    assert len(sizes) >= 10, sorted(sizes)
    print({op: (size if math.isinf(size) else int(size)) for op, size in sorted(sizes.items())})
    over = {op: size for op, size in sizes.items() if size > DEFAULT_MAX_BODY_BYTES}
    assert not over, f"schema-valid bodies larger than {DEFAULT_MAX_BODY_BYTES} bytes (413): {over}"


def test_named_figures_count_at_most_max_properties_names_of_their_longest() -> None:
    schema = {
        "type": "object",
        "maxProperties": 2,
        "propertyNames": {"type": "string", "maxLength": 3},
        "patternProperties": {"^a": {"type": "number"}},
        "additionalProperties": False,
    }
    assert worst_bytes(schema, {}) == 2 + 2 * ((2 + 3 * CHAR_BYTES) + 2 + NUMBER_BYTES + 2)
    assert worst_bytes({**schema, "maxProperties": 0}, {}) == 2
    assert math.isinf(worst_bytes({k: v for k, v in schema.items() if k != "maxProperties"}, {}))


def test_the_measure_is_that_of_a_real_worst_body() -> None:
    """The bound is reached: a list of non-BMP strings at their maxLength, written as requests writes it."""
    schema = {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 5}}
    body = json.dumps(["\U0001f600" * 5] * 3)
    assert len(body.encode()) == worst_bytes(schema, {}) - 2  # the bound allows one ", " too many


def test_every_status_a_body_field_names_is_a_documented_answer() -> None:
    """A field's description that says a value is refused ("refused (422)", "outside them: 409") names
    a status the operation documents: the rules between values JSON Schema cannot state."""
    document = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    components = document["components"]["schemas"]
    named = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                continue
            ref = content["schema"].get("$ref", "")
            properties = components[ref.rsplit("/", 1)[1]].get("properties", {}) if ref else {}
            for field, spec in properties.items():
                for status in re.findall(r"\b(4\d\d)\b", spec.get("description", "")):
                    named += 1
                    assert status in operation["responses"], (method, path, field, status)
    assert named >= 6, named  # image, min/max_containers, gpu_type, scale, the token expiries
