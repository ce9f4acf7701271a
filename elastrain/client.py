"""Typed SDK over the control plane's REST API (httpx); the CLI and the tests use it.

from elastrain.client import Client
with Client("http://127.0.0.1:8080", token) as c:
    c.create_cluster("tthvd", framework="horovod", containers=2, gpus_per_container=1)
    c.wait_cluster("tthvd", lambda cl: cl.state == "Running")
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from elastrain.errors import ElastrainError

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientError(ElastrainError):
    """The server refused a request (4xx/5xx) or could not be reached; `status` is 0 for the latter.

    From a problem-details answer (RFC 9457): `problem_type` is its ``type`` URI and `errors` its
    ``(loc, message)`` pairs, one per bad field (a 422 names every one).
    """

    def __init__(
        self,
        message: str,
        status: int = 0,
        *,
        errors: list[tuple[str, str]] | None = None,
        problem_type: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.errors = list(errors or [])
        self.problem_type = problem_type

    def field_lines(self) -> list[str]:
        """One ``FIELD: message`` line per bad field (``body.`` left out), for printing after the message."""
        return [f"{loc.removeprefix('body.')}: {message}" for loc, message in self.errors]


@dataclass(frozen=True)
class ContainerInfo:
    """One container of a cluster."""

    name: str
    role: str
    address: str
    gpus: int
    state: str
    gpu_ids: list[int] = field(default_factory=list)
    reason: str = ""
    pid: int | None = None
    started_at: str | None = None


@dataclass(frozen=True)
class ClusterInfo:
    """A cluster as the API returns it."""

    name: str
    framework: str
    state: str
    desired_containers: int
    hostfile_generation: int
    containers: list[ContainerInfo]
    reason: str = ""
    owner: str = ""
    gpus_per_container: int = 0
    shm: str = ""
    image: str = ""
    mounts: list[str] = field(default_factory=list)
    min_containers: int = 0
    max_containers: int = 0
    priority: int = 0
    size_reason: str = ""
    idle_release_after: int | None = None  # seconds without a job before the workers go (None: server's)
    gpu_type: str | None = None  # the GPU model its containers get (None: any)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterInfo:
        """Build from the API's JSON."""
        fields = ContainerInfo.__dataclass_fields__
        containers = [
            ContainerInfo(**{k: v for k, v in c.items() if k in fields}) for c in data["containers"]
        ]
        return cls(
            name=data["name"],
            framework=data["framework"],
            state=data["state"],
            desired_containers=data["desired_containers"],
            hostfile_generation=data["hostfile_generation"],
            containers=containers,
            reason=data.get("reason", ""),
            owner=data.get("owner", ""),
            gpus_per_container=data.get("gpus_per_container", 0),
            shm=data.get("shm", ""),
            image=data.get("image", ""),
            mounts=data.get("mounts", []),
            min_containers=data.get("min_containers", 0),
            max_containers=data.get("max_containers", 0),
            priority=data.get("priority", 0),
            size_reason=data.get("size_reason", ""),
            idle_release_after=data.get("idle_release_after"),
            gpu_type=data.get("gpu_type"),
            raw=data,
        )

    def summary(self) -> dict[str, Any]:
        """The stable JSON shape printed by ``elastrain cluster get -o json``."""
        return {
            "name": self.name,
            "framework": self.framework,
            "state": self.state,
            "reason": self.reason,
            "containers": [
                {
                    "name": c.name,
                    "role": c.role,
                    "address": c.address,
                    "gpus": c.gpus,
                    "gpu_ids": c.gpu_ids,
                    "state": c.state,
                    "pid": c.pid,
                    "started_at": c.started_at,
                }
                for c in self.containers
            ],
            "desired_containers": self.desired_containers,
            "min_containers": self.min_containers,
            "max_containers": self.max_containers,
            "priority": self.priority,
            "size_reason": self.size_reason,
            "idle_release_after": self.idle_release_after,
            "gpu_type": self.gpu_type,
            "hostfile_generation": self.hostfile_generation,
            "launch_hint": self.raw.get("launch_hint", ""),
        }

    def running(self, role: str | None = None) -> list[ContainerInfo]:
        """Containers in state Running (optionally of one role)."""
        return [c for c in self.containers if c.state == "Running" and (role is None or c.role == role)]


class Client:
    """A connection to one control plane with one token."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("ELASTRAIN_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("ELASTRAIN_TOKEN", "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the control plane at {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response

    # --- meta and users ----------------------------------------------------------------------------
    def health(self) -> bool:
        """True when the server answers."""
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def me(self) -> dict[str, Any]:
        """The caller's user."""
        return dict(self._request("GET", "/me").json())

    def create_user(self, name: str, admin: bool = False, token_expires_in_days: int | None = None) -> str:
        """Create a user (admin only); returns their token (expiring after the days given, else never)."""
        body: dict[str, Any] = {"name": name, "admin": admin}
        if token_expires_in_days is not None:
            body["token_expires_in_days"] = token_expires_in_days
        return str(self._request("POST", "/users", json=body).json()["token"])

    def get_user(self, name: str) -> dict[str, Any]:
        """A user with quota (effective and own overrides) and usage (yourself; an admin: anyone)."""
        return dict(self._request("GET", f"/users/{quote(name, safe='')}").json())

    def set_quota(self, name: str, limits: dict[str, int | None]) -> dict[str, Any]:
        """Set limits (keys ``clusters``, ``containers``, ``gpus``) of user `name` (admin only); a None
        value goes back to the server default, keys not given stay as they are."""
        return dict(self._request("PATCH", f"/users/{quote(name, safe='')}", json={"quota": limits}).json())

    def create_token(
        self,
        user: str,
        name: str = "token",
        expires_in_days: int | None = None,
        expires_at: str | None = None,
    ) -> dict[str, Any]:
        """Create a token for `user`; the answer's ``token`` is shown this once."""
        body: dict[str, Any] = {"name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        if expires_at is not None:
            body["expires_at"] = expires_at
        return dict(self._request("POST", f"/users/{quote(user, safe='')}/tokens", json=body).json())

    def list_tokens(self, user: str) -> list[dict[str, Any]]:
        """`user`'s tokens (id, name, state, created/expires/revoked/last-used times; never the token)."""
        return list(self._request("GET", f"/users/{quote(user, safe='')}/tokens").json())

    def revoke_token(self, user: str, token_id: int) -> dict[str, Any]:
        """Revoke token `token_id` of `user` at once."""
        return dict(self._request("DELETE", f"/users/{quote(user, safe='')}/tokens/{token_id}").json())

    def inventory(self) -> dict[str, Any]:
        """GPU inventory and usage."""
        return dict(self._request("GET", "/inventory").json())

    # --- clusters ----------------------------------------------------------------------------------
    def create_cluster(
        self,
        name: str,
        framework: str = "horovod",
        containers: int = 2,
        gpus_per_container: int = 0,
        shm: str = "64Mi",
        image: str = "",
        mounts: list[str] | None = None,
        restart_policy: str = "Always",
        min_containers: int | None = None,
        max_containers: int | None = None,
        priority: int = 0,
        memory: str = "",
        cpus: float = 0.0,
        gpu_type: str | None = None,
        idle_release_after: int | None = None,
    ) -> ClusterInfo:
        """Create a cluster (its containers start asynchronously); ``min_containers``/``max_containers``
        bound it (the elastic scheduler, the server's default, resizes it within them);
        ``idle_release_after`` (seconds, 0: never) overrides the server's idle release;
        ``gpu_type`` asks for GPUs of one model (sent only when given: an older server refuses it)."""
        body: dict[str, Any] = {
            "name": name,
            "framework": framework,
            "containers": containers,
            "gpus_per_container": gpus_per_container,
            "shm": shm,
            "image": image,
            "memory": memory,
            "cpus": cpus,
            "mounts": mounts or [],
            "restart_policy": restart_policy,
            "min_containers": min_containers,
            "max_containers": max_containers,
            "priority": priority,
        }
        if gpu_type is not None:
            body["gpu_type"] = gpu_type
        if idle_release_after is not None:  # sent only when given: an older server refuses it
            body["idle_release_after"] = idle_release_after
        return ClusterInfo.from_json(self._request("POST", "/clusters", json=body).json())

    def list_images(self) -> list[dict[str, Any]]:
        """The images clusters can be created from."""
        return list(self._request("GET", "/images").json())

    def get_cluster(self, name: str) -> ClusterInfo:
        """One cluster."""
        return ClusterInfo.from_json(self._request("GET", f"/clusters/{name}").json())

    def create_storage(self, name: str) -> dict[str, Any]:
        """Create one of the caller's storage areas (a cluster mounts it as ``storage:NAME:/data``)."""
        return dict(self._request("POST", "/storage", json={"name": name}).json())

    def list_storage(self) -> list[dict[str, Any]]:
        """The caller's storage areas (name, mount, mounted_by)."""
        return list(self._request("GET", "/storage").json())

    def delete_storage(self, name: str) -> None:
        """Delete one of the caller's storage areas and its files (409 while a cluster mounts it)."""
        self._request("DELETE", f"/storage/{name}")

    def list_clusters(self) -> list[ClusterInfo]:
        """The caller's clusters."""
        return [ClusterInfo.from_json(c) for c in self._request("GET", "/clusters").json()]

    def scale_cluster(self, name: str, containers: int) -> ClusterInfo:
        """Set the total container count (launcher included)."""
        return ClusterInfo.from_json(
            self._request("PATCH", f"/clusters/{name}", json={"containers": containers}).json()
        )

    def delete_cluster(self, name: str) -> None:
        """Ask for deletion (asynchronous: `wait_deleted` waits for it)."""
        self._request("DELETE", f"/clusters/{name}")

    def hostfile(self, name: str) -> str:
        """The cluster's hostfile text."""
        return self._request("GET", f"/clusters/{name}/hostfile").text

    def container_logs(self, name: str, container: str | None = None) -> str:
        """A container's captured output (the launcher's by default)."""
        params = {"container": container} if container else {}
        return self._request("GET", f"/clusters/{name}/logs", params=params).text

    def events(self, name: str) -> list[dict[str, Any]]:
        """The cluster's audit trail."""
        return list(self._request("GET", f"/clusters/{name}/events").json())

    def wait_cluster(
        self,
        name: str,
        condition: Callable[[ClusterInfo], bool],
        timeout: float = 60.0,
        interval: float = 0.1,
    ) -> ClusterInfo:
        """Poll until `condition(cluster)` holds; ClientError on timeout (with the last state)."""
        deadline = time.monotonic() + timeout
        while True:
            cluster = self.get_cluster(name)
            if condition(cluster):
                return cluster
            if time.monotonic() > deadline:
                raise ClientError(
                    f"timed out after {timeout:.0f}s waiting for cluster {name}: state {cluster.state}"
                    f" ({cluster.reason or 'no reason given'})"
                )
            time.sleep(interval)

    def wait_deleted(self, name: str, timeout: float = 60.0, interval: float = 0.1) -> None:
        """Poll until the cluster is gone (404)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get_cluster(name)
            except ClientError as exc:
                if exc.status == 404:
                    return
                raise
            time.sleep(interval)
        raise ClientError(f"timed out after {timeout:.0f}s waiting for cluster {name} to be deleted")

    def exec(self, name: str, command: list[str], container: str | None = None) -> Iterator[str | int]:
        """Run `command` in the launcher container: yields output text chunks, then the exit code (int)."""
        body = {"command": command, "container": container}
        try:
            with self._http.stream("POST", f"/clusters/{name}/exec", json=body, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                for line in response.iter_lines():
                    if not line:
                        continue
                    item = json.loads(line)
                    if "out" in item:
                        yield str(item["out"])
                    elif "exit" in item:
                        yield int(item["exit"])
        except httpx.HTTPError as exc:
            raise ClientError(f"lost the connection to {self.url} while running the command: {exc}") from None

    # --- jobs --------------------------------------------------------------------------------------
    def submit_job(
        self,
        cluster: str,
        command: list[str],
        tensorboard_dir: str = "",
        retries: int | None = None,
        max_platform_restarts: int | None = None,
    ) -> dict[str, Any]:
        """Run `command` detached in the cluster's launcher container (writing TensorBoard scalars under
        `tensorboard_dir` there, when given; started again up to `retries` times after a non-zero exit
        and `max_platform_restarts` times after its launcher died, the server's defaults when None);
        returns the job."""
        body: dict[str, Any] = {"command": command}
        if tensorboard_dir:
            body["tensorboard_dir"] = tensorboard_dir
        if retries is not None:
            body["retries"] = retries
        if max_platform_restarts is not None:
            body["max_platform_restarts"] = max_platform_restarts
        return dict(self._request("POST", f"/clusters/{cluster}/jobs", json=body).json())

    def get_job(self, job_id: int) -> dict[str, Any]:
        """A job with its status and last reported progress."""
        return dict(self._request("GET", f"/jobs/{job_id}").json())

    def list_jobs(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """The caller's jobs."""
        params = {"cluster": cluster} if cluster else {}
        return list(self._request("GET", "/jobs", params=params).json())

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        """Stop a running job."""
        return dict(self._request("DELETE", f"/jobs/{job_id}").json())

    def job_checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        """The job's checkpoints (step, epoch, world_size, bytes, write_s, path, at), newest first."""
        return list(self._request("GET", f"/jobs/{job_id}/checkpoints").json())

    def job_events(self, job_id: int) -> list[dict[str, Any]]:
        """The job's events, incidents (generation changes) included."""
        return list(self._request("GET", f"/jobs/{job_id}/events").json())

    def job_logs(self, job_id: int, offset: int = 0) -> tuple[str, int, str]:
        """(text from `offset`, next offset, job status)."""
        response = self._request("GET", f"/jobs/{job_id}/logs", params={"offset": offset})
        next_offset = int(response.headers.get("X-Next-Offset", offset))
        return (
            response.content.decode(errors="replace"),
            next_offset,
            response.headers.get("X-Job-Status", ""),
        )

    def follow_job_logs(self, job_id: int, interval: float = 0.3) -> Iterator[str]:
        """Yield log text as it is written until the job has ended and the log is drained."""
        offset = 0
        while True:
            text, offset, status = self.job_logs(job_id, offset)
            if text:
                yield text
            elif status not in ("Pending", "Running"):
                return
            else:
                time.sleep(interval)


def report_progress(**values: float | int | None) -> bool:
    """From inside a job: report step/epoch/loss/samples_per_s/world_size to the control plane.

    Uses ELASTRAIN_REPORT_URL, ELASTRAIN_JOB_ID and ELASTRAIN_REPORT_TOKEN (set for `elastrain job
    submit`); returns False (and does nothing) outside a job or when the server cannot be reached.
    """
    url, job, token = (
        os.environ.get(k) for k in ("ELASTRAIN_REPORT_URL", "ELASTRAIN_JOB_ID", "ELASTRAIN_REPORT_TOKEN")
    )
    if not (url and job and token):
        return False
    body = {k: v for k, v in values.items() if v is not None}
    try:
        response = httpx.post(
            f"{url}/api/v1/jobs/{job}/progress", json=body, headers={"X-Job-Token": token}, timeout=5
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 204


def _error(response: httpx.Response) -> ClientError:
    """The `ClientError` of a refusal: problem details (``detail``, ``errors``), else the text."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        message = response.text.strip() or response.reason_phrase
        return ClientError(f"{message} (HTTP {response.status_code})", response.status_code)
    message = str(data.get("detail") or data.get("error") or response.text.strip() or response.reason_phrase)
    found = data.get("errors")
    errors = [
        (str(e.get("loc", "")), str(e.get("message", "")))
        for e in (found if isinstance(found, list) else [])
        if isinstance(e, dict)
    ]
    return ClientError(
        f"{message} (HTTP {response.status_code})",
        response.status_code,
        errors=errors,
        problem_type=str(data.get("type") or ""),
    )
