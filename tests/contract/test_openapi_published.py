"""The published schema, ``docs/openapi.json``, is what the server serves, and a valid OpenAPI document.

The file is in the repository so that every API change shows in review as a diff of it; `make openapi`
(``scripts/export_openapi.py``) regenerates it from the app itself. The served document here is that of
an in-process app (SQLite, nothing started); ``test_generated_client`` compares the file with what a
live ``elastrain server`` process serves too.
"""

from __future__ import annotations

import difflib
import json

import pytest

from tests.contract.conftest import PUBLISHED, export_script

pytestmark = pytest.mark.timeout(60)
STALE = "docs/openapi.json is not what the server serves: run `make openapi` (and commit the file)"


def test_published_schema_equals_the_served_one() -> None:
    script = export_script()  # builds the app in process and GETs /openapi.json through a TestClient
    served = script.render(script.served_document())
    assert PUBLISHED.exists(), STALE
    published = PUBLISHED.read_text(encoding="utf-8")
    if published != served:
        diff = difflib.unified_diff(
            published.splitlines(), served.splitlines(), "docs/openapi.json", "served", lineterm="", n=1
        )
        pytest.fail(STALE + "\n" + "\n".join(list(diff)[:60]), pytrace=False)


def test_published_schema_is_valid_openapi() -> None:
    from openapi_spec_validator import validate

    document = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    assert document["openapi"].startswith("3."), document["openapi"]
    validate(document)  # raises OpenAPIValidationError naming the first problem
