"""Bad input to the control plane: every refusal is a 4xx JSON error with a message, never a 500."""

from __future__ import annotations

from typing import Any

import pytest

from elastrain.testing.server import ControlPlane, sqlite_only

pytestmark = pytest.mark.timeout(180)


BAD_CREATES = [
    ({"name": "Bad_Name"}, "DNS label"),
    ({"name": "ok1", "containers": 1}, "launcher"),
    ({"name": "ok2", "framework": "tensorflow"}, "horovod, deepspeed, megatron, pytorch, slurm"),
    ({"name": "ok3", "gpus_per_container": -1}, ">= 0"),
    ({"name": "ok4", "shm": "lots"}, "512Mi"),
    ({"name": "ok5", "mounts": ["/etc:/data"]}, "outside the allowed roots"),
    ({"name": "ok6", "mounts": ["MOUNTS/no-such-dir:/data"]}, "does not exist"),  # MOUNTS: cp.mounts
    ({"name": "ok7", "containers": 3, "gpus_per_container": 4}, "this node has 8 virtual GPUs"),
    ({"name": "ok8", "containers": "many"}, "containers"),
    ({"name": "ok9", "bogus": 1}, "bogus"),
    ({}, "name"),
]


@pytest.mark.parametrize("body,message", BAD_CREATES)
def test_bad_input_is_a_4xx_with_a_message(cp: ControlPlane, body: dict[str, Any], message: str) -> None:
    import httpx

    if body.get("mounts"):
        body = {**body, "mounts": [m.replace("MOUNTS", str(cp.mounts)) for m in body["mounts"]]}
    response = httpx.post(
        f"{cp.url}/api/v1/clusters", json=body, headers={"Authorization": f"Bearer {cp.token}"}
    )
    assert 400 <= response.status_code < 500, response.text
    assert message in response.json()["error"]


def test_bad_requests_never_500(cp: ControlPlane) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {cp.token}"}
    for method, path, kwargs in [
        (
            "POST",
            "/clusters",
            {"content": b"{not json", "headers": {**headers, "content-type": "application/json"}},
        ),
        ("PATCH", "/clusters/nope", {"json": {"containers": 3}, "headers": headers}),
        ("PATCH", "/clusters/nope", {"json": {"containers": "x"}, "headers": headers}),
        ("GET", "/clusters/NOT_A_NAME", {"headers": headers}),
        ("POST", "/clusters/nope/exec", {"json": {"command": []}, "headers": headers}),
        ("GET", "/no-such-route", {"headers": headers}),
        ("DELETE", "/healthz", {}),
    ]:
        response = httpx.request(method, f"{cp.url}/api/v1{path}", **kwargs)
        assert 400 <= response.status_code < 500, (method, path, response.text)
        assert response.json()["error"]


def test_cli_errors_are_one_line(cp: ControlPlane) -> None:
    sqlite_only(cp)
    result = cp.cli("cluster", "create", "x", "--containers", "1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "launcher" in result.stderr
    result = cp.cli("cluster", "get", "missing", token="et_bad")
    assert result.returncode != 0 and "401" in result.stderr and "Traceback" not in result.stderr


def test_fuzzed_create_bodies_never_5xx(cp: ControlPlane) -> None:
    import httpx

    sqlite_only(cp)
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    anything = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=80),
        st.lists(st.text(max_size=20), max_size=3),
    )
    body = st.fixed_dictionaries(
        {},
        optional={
            k: anything
            for k in (
                "name",
                "framework",
                "containers",
                "gpus_per_container",
                "shm",
                "image",
                "mounts",
                "restart_policy",
            )
        },
    )
    headers = {"Authorization": f"Bearer {cp.token}"}
    created: list[str] = []

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=st.one_of(body, anything))
    def check(body: Any) -> None:
        response = httpx.post(f"{cp.url}/api/v1/clusters", json=body, headers=headers, timeout=30)
        assert response.status_code < 500, (body, response.text)
        if response.status_code == 201:
            created.append(response.json()["name"])

    check()
    with cp.client() as c:
        for name in created:
            c.delete_cluster(name)
        for name in created:
            c.wait_deleted(name)


ROUTES = [
    ("GET", "/clusters/{}"),
    ("PATCH", "/clusters/{}"),
    ("DELETE", "/clusters/{}"),
    ("GET", "/clusters/{}/hostfile"),
    ("GET", "/clusters/{}/events"),
    ("GET", "/clusters/{}/logs"),
    ("POST", "/clusters/{}/exec"),
    ("POST", "/clusters/{}/jobs"),
    ("GET", "/jobs/{}"),
    ("DELETE", "/jobs/{}"),
    ("GET", "/jobs/{}/logs"),
    ("POST", "/jobs/{}/progress"),
    ("GET", "/jobs/{}/checkpoints"),
    ("POST", "/jobs/attach?{}"),
    ("POST", "/users"),
]


def test_fuzzed_requests_on_every_route_never_5xx(cp: ControlPlane) -> None:
    import urllib.parse

    import httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sqlite_only(cp)
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=30))
    bodies = st.one_of(
        scalars,
        st.dictionaries(
            st.sampled_from(
                [
                    "containers",
                    "command",
                    "name",
                    "step",
                    "loss",
                    "container",
                    "admin",
                    "hosts",
                    "checkpoint",
                    "pid",
                ]
            ),
            st.one_of(scalars, st.lists(scalars, max_size=3)),
            max_size=3,
        ),
    )
    names = st.one_of(st.text(min_size=1, max_size=30), st.integers(-5, 10**12).map(str))
    headers = {"Authorization": f"Bearer {cp.token}"}

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(ROUTES), name=names, body=bodies)
    def check(route: tuple[str, str], name: str, body: Any) -> None:
        method, template = route
        path = template.format(urllib.parse.quote(name, safe=""))
        kwargs = {"json": body} if method in ("POST", "PATCH") else {}
        response = httpx.request(method, f"{cp.url}/api/v1{path}", headers=headers, timeout=30, **kwargs)
        assert response.status_code < 500, (method, path, body, response.text)

    check()


def test_attach_needs_a_terminal_token(cp: ControlPlane) -> None:
    import httpx

    sqlite_only(cp)
    body = {"command": ["elastrain", "run", "true"], "pid": 1}
    for token in ("", "not-a-token", cp.token):  # not even the admin's API token: only a shell's own token
        response = httpx.post(f"{cp.url}/api/v1/jobs/attach", json=body, headers={"X-Attach-Token": token})
        assert response.status_code == 401 and "ELASTRAIN_ATTACH_TOKEN" in response.json()["error"]
