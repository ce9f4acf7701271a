"""The access log: every answer carries an X-Request-ID, one line per request, no secret in it.

A real `create_app` (SQLite, process backend) through Starlette's TestClient.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from elastrain.server.access_log import request_id_from
from tests.security.server_app import AppUnderTest, access_lines, make_app

pytestmark = pytest.mark.timeout(60)
GENERATED = re.compile(r"[0-9a-f]{32}")
CAP = 4096


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[AppUnderTest, TestClient]]:
    app = make_app(tmp_path, max_body_bytes=CAP)

    @app.app.get("/boom", include_in_schema=False)
    def boom() -> None:
        raise RuntimeError("kaboom")

    with TestClient(app.app, raise_server_exceptions=False) as client:
        yield app, client


def line_of(lines: list[str], request_id: str) -> str:
    [line] = [line for line in lines if f" id={request_id} " in line]
    return line


def test_every_answer_has_a_request_id_and_one_log_line(served: tuple[AppUnderTest, TestClient]) -> None:
    app, client = served
    with access_lines() as lines:
        answer = client.get("/api/v1/healthz")
        rid = answer.headers["x-request-id"]
        assert answer.status_code == 200 and GENERATED.fullmatch(rid)
        other = client.get("/api/v1/healthz").headers["x-request-id"]
        assert other != rid
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {app.token}"})
    line = line_of(lines, rid)
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z id={rid} client=\S+ user=- method=GET "
        rf"path=/api/v1/healthz status=200 ms=\d+\.\d bytes={len(answer.content)}",
        line,
    ), line
    assert len(lines) == 3
    assert " user=admin " in line_of(lines, me.headers["x-request-id"])  # the token's owner, by name


def test_a_well_formed_incoming_id_is_echoed(served: tuple[AppUnderTest, TestClient]) -> None:
    _app, client = served
    with access_lines() as lines:
        for incoming in ("abc-123", "Trace.42:7_x", "x" * 64):
            answer = client.get("/api/v1/healthz", headers={"X-Request-ID": incoming})
            assert answer.headers["x-request-id"] == incoming
            assert line_of(lines, incoming)


@pytest.mark.attack
@pytest.mark.parametrize("incoming", ["x" * 65, "two words", "<script>", "id;rm", "caf\xe9", "", "a/b"])
def test_a_malformed_incoming_id_is_replaced(served: tuple[AppUnderTest, TestClient], incoming: str) -> None:
    _app, client = served
    with access_lines() as lines:
        answer = client.get("/api/v1/healthz", headers={"X-Request-ID": incoming.encode("latin-1")})
    rid = answer.headers["x-request-id"]
    assert GENERATED.fullmatch(rid), rid
    assert incoming not in "\n".join(lines) or not incoming
    assert line_of(lines, rid)


def test_a_log_injection_id_is_replaced() -> None:
    assert GENERATED.fullmatch(request_id_from([(b"x-request-id", b"ok\r\nid=forged status=200")]))
    assert request_id_from([(b"X-Request-ID", b" fine-1 ")]) == "fine-1"


@pytest.mark.attack
def test_refusals_of_the_body_limit_carry_the_id(served: tuple[AppUnderTest, TestClient]) -> None:
    app, client = served
    with access_lines() as lines:
        unauthenticated = client.post("/api/v1/users", json={"name": "x"}, headers={"X-Request-ID": "r-401"})
        too_big = client.post(
            "/api/v1/users",
            content=b"{" + b" " * (2 * CAP) + b"}",
            headers={"Authorization": f"Bearer {app.token}", "X-Request-ID": "r-413"},
        )
        crashed = client.get("/boom", headers={"X-Request-ID": "r-500"})
    assert unauthenticated.status_code == 401 and unauthenticated.headers["x-request-id"] == "r-401"
    assert too_big.status_code == 413 and too_big.headers["x-request-id"] == "r-413"
    assert crashed.status_code == 500 and crashed.headers["x-request-id"] == "r-500"
    assert " status=401 " in line_of(lines, "r-401") and " method=POST " in line_of(lines, "r-401")
    assert " status=413 " in line_of(lines, "r-413") and " user=admin " in line_of(lines, "r-413")
    assert " status=500 " in line_of(lines, "r-500")


@pytest.mark.attack
def test_tokens_bodies_and_query_strings_never_reach_the_log(served: tuple[AppUnderTest, TestClient]) -> None:
    app, client = served
    secret = "sk-body-secret-0123456789"
    auth = {"Authorization": f"Bearer {app.token}"}
    with access_lines() as lines:
        client.get(f"/api/v1/me?token={app.token}&api_key={secret}", headers=auth)
        client.post("/api/v1/users", json={"name": secret}, headers=auth)
        client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})  # an unknown token: 401
        client.get(f"/api/v1/nowhere%0d%0aid=forged%20{secret[:3]}", headers=auth)
        with client.websocket_connect("/api/v1/clusters/nope/terminal") as ws:
            ws.send_json({"token": app.token, "input": secret})
            with pytest.raises(WebSocketDisconnect):
                while True:
                    ws.receive_text()
    log = "\n".join(lines)
    assert len(lines) == 5
    assert app.token not in log and secret not in log
    assert "?" not in log and "\r" not in log and log.count("\n") == 4
    assert "path=/api/v1/nowhere%0D%0Aid=forged%20sk- " in log  # one line, no forged field
    assert "user=admin" in log and "status=401" in log


def test_websockets_are_logged_with_their_close_code(served: tuple[AppUnderTest, TestClient]) -> None:
    app, client = served
    with (
        access_lines() as lines,
        client.websocket_connect("/api/v1/clusters/nope/terminal", headers={"X-Request-ID": "ws-1"}) as ws,
    ):
        headers: dict[bytes, bytes] = dict(ws.extra_headers or [])
        ws.send_json({"token": app.token})
        assert "not found" in ws.receive_text()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 4404
    assert headers[b"x-request-id"] == b"ws-1"
    line = line_of(lines, "ws-1")
    assert " method=WS path=/api/v1/clusters/nope/terminal status=101 " in line
    assert line.endswith(" close=4404") and " user=admin " in line


def test_docs_assets_and_portal_pages_are_logged_too(served: tuple[AppUnderTest, TestClient]) -> None:
    _app, client = served
    with access_lines() as lines:
        assert client.get("/signin").headers["x-request-id"]
        assert client.get("/docs").headers["x-request-id"]
    assert any(" path=/signin status=200 " in line for line in lines)
    assert any(" path=/docs status=200 " in line for line in lines)
