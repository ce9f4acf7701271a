"""The JupyterLab proxy's pure rules: URL mapping, header filtering, origin checks, the lab cookie, the
launcher's JupyterLab configuration and where the server finds it (no server, no container)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastrain.agent.services import LAB_PORT, LAB_TOKEN_ENV, jupyterlab_service, lab_config
from elastrain.backends.api import ContainerSpec
from elastrain.backends.container_run import is_secret_env, lab_endpoint_of, run_env
from elastrain.portal.lab_access import LabUnavailable, bearer, refusal
from elastrain.portal.lab_http import (
    LAB_COOKIE,
    close_code,
    cookie_value,
    lab_path_ok,
    request_headers,
    response_headers,
    same_origin,
    session_cookie,
    upstream_url,
    valid_token,
    without_cookie,
)
from elastrain.server.errors import NotFound

ORIGIN = "http://10.89.0.2:8888"


def test_requests_keep_their_path_and_query() -> None:
    raw = "/clusters/seed/lab/api/contents/my%20dir/a.ipynb"
    assert upstream_url(ORIGIN, raw, "content=1&type=file") == f"{ORIGIN}{raw}?content=1&type=file"
    assert upstream_url(ORIGIN, "/clusters/seed/lab/", "") == f"{ORIGIN}/clusters/seed/lab/"
    ws = upstream_url(ORIGIN, "/clusters/seed/lab/terminals/websocket/1", "", websocket=True)
    assert ws == "ws://10.89.0.2:8888/clusters/seed/lab/terminals/websocket/1"


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/clusters/seed/lab/", True),
        ("/clusters/seed/lab/lab/tree/home", True),
        ("/clusters/seed/lab/static/..x/a.js", True),
        ("/clusters/seed/lab/../other/lab/", False),
        ("/clusters/seed/lab/a/%2E%2E/b", False),
        ("/clusters/seedling/lab/", False),
        ("/clusters/other/lab/", False),
    ],
)
def test_only_paths_under_the_clusters_own_prefix(path: str, ok: bool) -> None:
    assert lab_path_ok("seed", path) is ok


def test_upstream_request_headers() -> None:
    incoming = [
        ("Host", "portal.example:8080"),
        ("Authorization", "Bearer et_portal_token"),
        ("Cookie", f"_xsrf=abc; {LAB_COOKIE}=et_portal_token; theme=dark"),
        ("Origin", "http://portal.example:8080"),
        ("Connection", "keep-alive, X-Private"),
        ("X-Private", "hop"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Type", "application/json"),
        ("Content-Length", "12"),
        ("Accept", "*/*"),
    ]
    out = request_headers(incoming, "labtoken", ORIGIN)
    names = [k.lower() for k, _ in out]
    assert dict((k.lower(), v) for k, v in out) == {
        "content-type": "application/json",
        "content-length": "12",
        "accept": "*/*",
        "cookie": "_xsrf=abc; theme=dark",
        "origin": ORIGIN,
        "authorization": "token labtoken",
    }
    assert len(names) == len(set(names))
    assert "et_portal_token" not in json.dumps(out)  # the portal's credential never goes upstream


def test_websocket_handshake_headers_are_the_clients_own() -> None:
    incoming = [
        ("Host", "portal:8080"),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "x"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Protocol", "v1.kernel.websocket.jupyter.org"),
        ("Sec-WebSocket-Extensions", "permessage-deflate"),
        ("User-Agent", "chromium"),
        ("Origin", "http://portal:8080"),
        ("Cookie", f"{LAB_COOKIE}=et_x"),
    ]
    out = request_headers(incoming, "labtoken", ORIGIN, websocket=True)
    assert out == [("authorization", "token labtoken")]  # Origin and subprotocols: connect()'s arguments


def test_answers_lose_hop_by_hop_and_cors_headers() -> None:
    upstream = [
        ("Content-Type", "text/html"),
        ("Content-Length", "10"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
        ("Access-Control-Allow-Origin", "http://evil.example"),
        ("Access-Control-Allow-Credentials", "true"),
        ("Set-Cookie", "_xsrf=1; Path=/clusters/seed/lab/"),
        ("Set-Cookie", "username-x=2; Path=/clusters/seed/lab/"),
        ("Location", f"{ORIGIN}/clusters/seed/lab/lab?"),
    ]
    out = response_headers(upstream, ORIGIN)
    assert out == [
        ("Content-Type", "text/html"),
        ("Content-Length", "10"),
        ("Set-Cookie", "_xsrf=1; Path=/clusters/seed/lab/"),
        ("Set-Cookie", "username-x=2; Path=/clusters/seed/lab/"),
        ("Location", "/clusters/seed/lab/lab?"),
    ]


def test_origin_checks() -> None:
    assert same_origin(None, "portal:8080")  # not a browser's cross-site request
    assert same_origin("http://portal:8080", "portal:8080")
    assert same_origin("https://PORTAL:8080", "portal:8080")
    assert not same_origin("http://evil.example", "portal:8080")
    assert not same_origin("null", "portal:8080")
    assert not same_origin("http://portal:8080", None)


def test_the_lab_cookie() -> None:
    header = f"a=1; {LAB_COOKIE}=et_abc-_; b=2"
    assert cookie_value(header, LAB_COOKIE) == "et_abc-_"
    assert cookie_value("a=1", LAB_COOKIE) is None and cookie_value(None, LAB_COOKIE) is None
    assert without_cookie(header, LAB_COOKIE) == "a=1; b=2"
    cookie = session_cookie("seed", "et_abc", secure=False)
    assert cookie == f"{LAB_COOKIE}=et_abc; Path=/clusters/seed/lab/; HttpOnly; SameSite=Strict"
    assert session_cookie("seed", "et_abc", secure=True).endswith("; Secure")
    assert valid_token("et_" + "A-z_9" * 8)
    assert not valid_token("") and not valid_token("a;b") and not valid_token("a b")
    assert bearer("Bearer  et_x ") == "et_x" and bearer("token et_x") is None and bearer(None) is None


def test_close_codes_that_may_be_sent_on() -> None:
    assert [close_code(c) for c in (1000, 1001, 1011, 4001, None, 1005, 1006, 1015, 999)] == [
        1000,
        1001,
        1011,
        4001,
        1000,
        1000,
        1000,
        1000,
        1000,
    ]


def test_refusals_are_a_page_for_browsers_and_problems_for_clients() -> None:
    page = refusal(NotFound("cluster 'x' not found"), "/clusters/x/lab/", "x", "text/html,*/*")
    assert page.status_code == 404 and page.media_type == "text/html"
    assert b"cluster &#x27;x&#x27; not found" in page.body
    problem = refusal(LabUnavailable("starting"), "/clusters/x/lab/api", "x", "application/json")
    assert problem.status_code == 503 and problem.headers["retry-after"] == "5"
    body = json.loads(problem.body)
    assert (
        body["status"] == 503 and body["detail"] == "starting" and body["instance"] == "/clusters/x/lab/api"
    )


def _spec(role: str) -> ContainerSpec:
    return ContainerSpec(
        cluster="seed",
        cluster_uid="u1",
        name=f"seed-{role}",
        role=role,
        address=f"seed-{role}",
        framework="pytorch",
        tenant="alice",
        tenant_uid=20001,
    )


def test_only_the_launcher_gets_the_lab_token_and_it_stays_out_of_argv() -> None:
    assert run_env(_spec("launcher"), "s", "labtok")[LAB_TOKEN_ENV] == "labtok"
    assert LAB_TOKEN_ENV not in run_env(_spec("worker"), "s", "labtok")
    assert is_secret_env(LAB_TOKEN_ENV)


def test_the_launchers_jupyterlab(tmp_path: Path) -> None:
    environ = {
        "ELASTRAIN_CLUSTER": "seed",
        "ELASTRAIN_CONTAINER_ROLE": "launcher",
        "HOME": "/home/alice",
        LAB_TOKEN_ENV: "labtok",
    }
    config = lab_config(environ)
    server = config["ServerApp"]
    assert server["base_url"] == "/clusters/seed/lab/" and server["port"] == LAB_PORT
    assert server["ip"] == "0.0.0.0" and server["root_dir"] == "/"
    assert server["terminado_settings"] == {"shell_command": ["/bin/bash"]}
    assert config["ContentsManager"]["preferred_dir"] == "home/alice"
    service = jupyterlab_service(environ, tmp_path)
    assert service is not None and service.env["JUPYTER_TOKEN"] == "labtok"
    assert "labtok" not in " ".join(service.argv)
    service.prepare()
    written = json.loads((tmp_path / "jupyter_lab_config.json").read_text())
    assert written["ServerApp"]["base_url"] == "/clusters/seed/lab/"
    hook = (tmp_path / "jupyter_lab_config.py").read_text()  # loaded with the .json: blanks the page's token
    assert '"token": ""' in hook and "page_config_hook" in hook
    overrides = json.loads((tmp_path / "lab-settings" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false"}
    assert jupyterlab_service({**environ, "ELASTRAIN_CONTAINER_ROLE": "worker"}, tmp_path) is None
    assert jupyterlab_service({**environ, LAB_TOKEN_ENV: ""}, tmp_path) is None


def _inspect(running: bool = True, env: list[str] | None = None, network: str = "net") -> str:
    return json.dumps(
        [
            {
                "State": {"Running": running},
                "Config": {"Env": env if env is not None else ["PATH=/bin", f"{LAB_TOKEN_ENV}=labtok"]},
                "NetworkSettings": {"Networks": {network: {"IPAddress": "10.89.0.2"}}},
            }
        ]
    )


def test_where_the_server_finds_a_launchers_jupyterlab() -> None:
    endpoint = lab_endpoint_of(_inspect(), "net")
    assert endpoint is not None and endpoint.origin == f"http://10.89.0.2:{LAB_PORT}"
    assert endpoint.token == "labtok"
    assert lab_endpoint_of(_inspect(running=False), "net") is None
    assert lab_endpoint_of(_inspect(env=["PATH=/bin"]), "net") is None  # started without a lab
    assert lab_endpoint_of(_inspect(network="other"), "net") is None
    assert lab_endpoint_of("", "net") is None and lab_endpoint_of("not json", "net") is None
