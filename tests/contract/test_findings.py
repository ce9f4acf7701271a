"""Unique failures are read from schemathesis's NDJSON events, with the shortest request as the example."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.contract.findings import Known, read_findings


def _scenario(case_id: str, body: str, status: int, code: str = "ST101") -> dict[str, object]:
    failure = {"code": code, "operation": "POST /api/v1/clusters", "title": "Server error", "message": ""}
    check = {"name": "not_a_server_error", "status": "failure", "failure_info": {"failure": failure}}
    request = {"method": "POST", "uri": "http://h/api/v1/clusters", "body": {"$base64": _b64(body)}}
    response = {"status_code": status, "content": {"$base64": _b64('{"status":500}')}}
    recorder = {
        "checks": {case_id: [check, {"name": "other", "status": "success"}]},
        "interactions": {case_id: {"request": request, "response": response}},
    }
    return {"ScenarioFinished": {"recorder": recorder}}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_failures_are_deduplicated_keeping_the_shortest_request(tmp_path: Path) -> None:
    events = [
        {"Initialize": {"seed": 7}},
        _scenario("a", '{"name": "long-long-name"}', 500),
        _scenario("b", '{"name": "x"}', 500),
        _scenario("c", '{"name": "y"}', 500, code="ST103"),
    ]
    path = tmp_path / "events.ndjson"
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    found = read_findings(path)
    assert [(f.code, f.status) for f in found] == [("ST101", 500), ("ST103", 500)]
    assert found[0].request == 'POST http://h/api/v1/clusters {"name": "x"}'
    assert '{"status":500}' in found[0].describe()


def test_known_failures_match_by_operation_glob_code_and_status(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    path.write_text(json.dumps(_scenario("a", "{}", 500)) + "\n")
    (finding,) = read_findings(path)
    assert Known("POST /api/v1/*", "ST101", None, "why").matches(finding)
    assert Known("POST /api/v1/clusters", "ST101", 500, "why").matches(finding)
    assert not Known("POST /api/v1/clusters", "ST101", 400, "why").matches(finding)
    assert not Known("GET *", "ST101", None, "why").matches(finding)
    assert not Known("*", "ST103", None, "why").matches(finding)
