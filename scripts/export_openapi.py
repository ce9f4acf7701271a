#!/usr/bin/env python3
"""`make openapi`: write the control plane's OpenAPI document to ``docs/openapi.json``.

The app is built in process (``create_app`` on a throwaway SQLite database in a temp dir, the process
backend, no GPUs, nothing started, no port opened) and its ``/openapi.json`` is fetched through
Starlette's TestClient, so the file is exactly what a server serves. The JSON is indented and its keys
sorted, so a change to the API shows as a readable diff in review; ``tests/contract`` fails when the
file and the served document differ.

Usage: ``.venv/bin/python scripts/export_openapi.py [--output PATH] [--check]``
(``--check``: write nothing, exit 1 when the file is stale).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "openapi.json"


def build_app(root: Path) -> Any:
    """`create_app` wired to real services on `root` (the test harness's in-process app)."""
    from elastrain.testing.app import make_app

    return make_app(root).app


def served_document() -> dict[str, Any]:
    """The document a fresh server answers on ``GET /openapi.json``."""
    from fastapi.testclient import TestClient

    with tempfile.TemporaryDirectory(prefix="elastrain-openapi-") as tmp:
        with TestClient(build_app(Path(tmp))) as client:
            response = client.get("/openapi.json")
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document


def render(document: dict[str, Any]) -> str:
    """The file's text: keys sorted, two-space indent, non-ASCII kept, one trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) the published schema; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write (docs/openapi.json)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render(served_document())
    output: Path = args.output
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != text:
            print(f"{output} is stale: run `make openapi`", file=sys.stderr)
            return 1
        print(f"{output} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
