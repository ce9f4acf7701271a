"""The client reads problem details (detail, every field error) and the CLI prints each bad field.

The CLI runs in process against a real `create_app`: `httpx.Client` is swapped for a TestClient.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from elastrain.cli.main import main
from elastrain.client import ClientError, _error
from tests.security.server_app import AppUnderTest, make_app

pytestmark = pytest.mark.timeout(120)
PROBLEM = {
    "type": "https://elastrain.dev/problems/validation",
    "title": "Invalid request",
    "status": 422,
    "detail": "invalid request: name: bad; containers: too few",
    "instance": "/api/v1/clusters",
    "errors": [{"loc": "body.name", "message": "bad"}, {"loc": "body.containers", "message": "too few"}],
    "error": "invalid request: name: bad; containers: too few",
}


def cli_lines(err: str) -> list[str]:
    """What the CLI printed (the in-process server's access log also writes to stderr)."""
    return [line for line in err.splitlines() if not line.startswith("elastrain access:")]


def answer(status: int, **kwargs: Any) -> httpx.Response:
    """A response of `status` to a cluster create."""
    return httpx.Response(status, request=httpx.Request("POST", "http://x/api/v1/clusters"), **kwargs)


def test_a_problem_becomes_a_client_error_with_every_field() -> None:
    error = _error(answer(422, json=PROBLEM, headers={"content-type": "application/problem+json"}))
    assert isinstance(error, ClientError) and error.status == 422
    assert str(error) == f"{PROBLEM['detail']} (HTTP 422)"
    assert error.errors == [("body.name", "bad"), ("body.containers", "too few")]
    assert error.field_lines() == ["name: bad", "containers: too few"]
    assert error.problem_type.endswith("/validation")


def test_the_old_shape_and_plain_text_still_read() -> None:
    old = _error(answer(404, json={"error": "cluster 'x' not found", "status": 404}))
    assert str(old) == "cluster 'x' not found (HTTP 404)" and old.errors == []
    text = _error(answer(502, text="bad gateway"))
    assert str(text) == "bad gateway (HTTP 502)" and text.errors == []


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> AppUnderTest:
    return make_app(tmp_path_factory.mktemp("cli-problems"))


@pytest.fixture
def in_process(app: AppUnderTest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`elastrain.client.Client` talks to `app` (its httpx.Client is a TestClient)."""

    def client(*, base_url: str, headers: dict[str, str], timeout: float) -> TestClient:
        return TestClient(app.app, base_url=base_url, headers=headers)

    monkeypatch.setattr(httpx, "Client", client)
    monkeypatch.setenv("ELASTRAIN_TOKEN", app.token)
    monkeypatch.setenv("ELASTRAIN_URL", "http://testserver")
    yield


def test_the_cli_prints_every_bad_field_one_line_each(
    in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["cluster", "create", "", "--containers", "0", "--shm", "lots"])
    err = capsys.readouterr().err
    assert code == 2
    first, *fields = cli_lines(err)
    assert first == "elastrain cluster: error: invalid request: 3 problems (name, containers, shm) (HTTP 422)"
    assert [line.split(":")[0].strip() for line in fields] == ["name", "containers", "shm"], err
    assert all(line.startswith("  ") and len(line) > 12 for line in fields)
    assert "Traceback" not in err


def test_one_bad_field_stays_one_line(in_process: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "get", "no-such-cluster"]) == 2
    err = capsys.readouterr().err
    assert cli_lines(err) == ["elastrain cluster: error: cluster 'no-such-cluster' not found (HTTP 404)"]
