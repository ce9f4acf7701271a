"""Schemathesis hooks of the contract test: every generated request is made harmless before it is sent.

Loaded by ``st run`` (``hooks`` in ``tests/contract/schemathesis.toml``). The ``before_call`` hook sees
every request of every phase (examples, coverage, fuzzing, stateful, and the checks' own re-sends):

- **commands**: the command-running routes (``POST /clusters/{name}/exec`` and
  ``POST /clusters/{name}/jobs``) get ``["echo", *fuzzed]`` instead of a fuzzed command: every fuzzed
  string (control characters, NUL and all) still reaches the server, as echo's arguments, so the
  routes' validation is fuzzed while a command that passes it only prints;
- **the harness's own tokens** are never revoked (``DELETE /users/{name}/tokens/{id}`` of one of them
  targets a token that does not exist instead): a run that revoked its own credential would test 401s;
- **container counts** of a new cluster are capped at ``CAP_CONTAINERS``, so a fuzzed cluster holds a
  few processes rather than 64 (the admin is exempt from quotas);
- **rules between values that JSON Schema cannot state** hold in a valid request: a token's
  ``expires_at``/``token_expires_at`` lies between now and ``MAX_TOKEN_DAYS`` ahead (else it becomes a
  day ahead), and a new cluster's ``min_containers <= containers <= max_containers`` (a bound on the
  wrong side of ``containers`` becomes ``containers``), and its memory limit holds its shm (a smaller
  limit becomes the shm's size), and its mounts have distinct targets (a later mount on a target
  already mounted is dropped), and its image is one GET /images lists with its framework (another
  becomes ``""``, the default). Invalid requests are sent as generated.

Each rewrite keeps a request as valid or as invalid as it was (a valid value maps to a valid one, an
invalid one is left alone; the cap is monotonic, so ``min <= containers <= max`` holds after it iff it
held before); schemathesis revalidates what a ``before_call`` hook changes anyway.

- **the job routes' own credentials**: ``POST /jobs/{job_id}/progress`` and ``/incidents`` carry the
  ``X-Job-Token`` of a job the harness submitted, and a valid job id in the path becomes that job's id
  (a job's token is good for its own id only); ``POST /jobs/attach`` carries an attach token of a shell
  in the harness's cluster, and a valid ``pid`` becomes a live process of its launcher (the harness's
  sleeper job): so these routes' bodies are fuzzed past authentication, and a valid report is taken;
- **the harness's own cluster and processes** are never deleted or cancelled: ``DELETE`` of the
  harness's cluster, of its sleeper job or of a job attached to the sleeper targets one that does not
  exist instead (cancelling an attached job would kill the sleeper, and later attaches would fail; a
  job is known as attached to the sleeper by its pid, read from the API).

The ``after_call`` hook keeps at most ``MAX_LIVE_CLUSTERS`` clusters of a run alive: past that, the
oldest one it created is deleted (the server drains it), so a long run does not pile up processes.

``application/x-ndjson`` (the exec stream) has a deserializer, so its answers are checked against the
schema too: every line is an object of the documented shape, the last one ``{"exit": CODE}``.

Settings come from the environment the test sets: ``ELASTRAIN_ST_PROTECTED_TOKENS`` (token ids, comma
separated), ``ELASTRAIN_ST_TOKEN`` (the run's identity) and ``ELASTRAIN_ST_HARNESS`` (a JSON object:
``api_url``, ``cluster``, ``job_id``, ``job_token``, ``attach_token``, ``attach_pid``, ``sleeper_job``;
see `Harness`).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import Any
from urllib.parse import quote

import jsonschema_rs
import requests
import schemathesis
from pydantic import AwareDatetime, TypeAdapter, ValidationError

SAFE_PROGRAM = "echo"
CAP_CONTAINERS = 3
MAX_CONTAINERS = 64  # the server's bound (elastrain.server.validation.MAX_CONTAINERS)
MAX_LIVE_CLUSTERS = 8
MAX_TOKEN_DAYS = 3650  # the server's bound on a token's lifetime (elastrain.server.schemas)
DEFAULT_CONTAINERS = 2  # ClusterCreate.containers's default
DEFAULT_SHM = "64Mi"  # ClusterCreate.shm's default
DEFAULT_FRAMEWORK = "horovod"  # ClusterCreate.framework's default
_COMMAND_ROUTES = ("/clusters/{name}/exec", "/clusters/{name}/jobs")
_TOKEN_ROUTE = "/users/{name}/tokens/{token_id}"
_EXPIRY_FIELDS = {"/users": "token_expires_at", "/users/{name}/tokens": "expires_at"}
_CLUSTERS_ROUTE = "/clusters"
_COUNT_FIELDS = ("containers", "min_containers", "max_containers")
_DETOUR = 1_000_000  # protected token id + this: an id no token has in a test server
_INT = TypeAdapter(int)
_AWARE = TypeAdapter(AwareDatetime)
_created: deque[tuple[str, str]] = deque()  # (cluster URL, Authorization) of the clusters created
MAX_DB_INT = 2**63 - 1  # the server's bound on ids (elastrain.server.fields.MAX_DB_INT)
MAX_PID = 2**31 - 1  # JobAttach.pid's bound
_JOB_TOKEN_ROUTES = ("/jobs/{job_id}/progress", "/jobs/{job_id}/incidents")
_ATTACH_ROUTE = "/jobs/attach"
_JOB_ROUTE = "/jobs/{job_id}"
_CLUSTER_ROUTE = "/clusters/{name}"
_NO_SUCH_CLUSTER = "st-no-such-cluster"


@dataclass(frozen=True)
class Harness:
    """What the test set up before the run: its cluster, a finished job and its report token, an attach
    token of a shell in the cluster, and a live process of the launcher (a sleeper job) to attach."""

    api_url: str = ""
    cluster: str = ""
    job_id: int = 0
    job_token: str = ""
    attach_token: str = ""
    attach_pid: int = 0
    sleeper_job: int = 0

    @classmethod
    def from_env(cls) -> Harness:
        """``ELASTRAIN_ST_HARNESS`` (JSON); an empty `Harness` without it."""
        raw = os.environ.get("ELASTRAIN_ST_HARNESS", "")
        return cls(**json.loads(raw)) if raw else cls()


@cache
def harness() -> Harness:
    """The harness of this run (read once)."""
    return Harness.from_env()


def protected_tokens() -> frozenset[int]:
    """Ids of the tokens the harness authenticates with (never revoked)."""
    raw = os.environ.get("ELASTRAIN_ST_PROTECTED_TOKENS", "")
    return frozenset(int(part) for part in raw.split(",") if part.strip().isdigit())


def harmless_command(command: Any) -> Any:
    """``["echo", *command]`` for a list (every item kept, valid or not); anything else unchanged.

    An empty list stays empty (invalid: the server wants at least one item); a non-list is invalid
    whatever it holds, so it is sent as generated.
    """
    if isinstance(command, list) and command:
        return [SAFE_PROGRAM, *command]
    return command


def _number(value: Any) -> bool:
    """An int, or a float with no fraction (JSON Schema's integers include ``25.0``); never a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def capped_count(value: Any) -> Any:
    """A valid container count (2..64) above the cap becomes the cap; anything else is unchanged."""
    if _number(value) and CAP_CONTAINERS < value <= MAX_CONTAINERS:
        return CAP_CONTAINERS
    return value


def future_expiry(value: Any, now: datetime) -> Any:
    """An RFC 3339 time with a zone outside (now + 1 minute, now + MAX_TOKEN_DAYS) becomes now + 1 day."""
    if not isinstance(value, str):
        return value
    try:
        when = _AWARE.validate_python(value)  # the server's parser: RFC 3339's lower-case t and z too
    except ValidationError:
        return value
    if now + timedelta(minutes=1) < when < now + timedelta(days=MAX_TOKEN_DAYS - 1):
        return value
    return (now + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def ordered_bounds(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with ``min_containers``/``max_containers`` moved to ``containers`` when on its wrong side."""
    count = body.get("containers", DEFAULT_CONTAINERS)
    if not _number(count):
        return body
    out = dict(body)
    low, high = out.get("min_containers"), out.get("max_containers")
    if _number(low) and low > count:
        out["min_containers"] = count
    if _number(high) and high < count:
        out["max_containers"] = count
    return out


def shm_within_memory(body: dict[str, Any]) -> dict[str, Any]:
    """`body` whose memory limit holds its shm (given or the default 64Mi): /dev/shm counts against
    the memory limit, a rule between two sizes JSON Schema cannot state. A limit below the shm
    becomes the shm's own size."""
    from elastrain.server.errors import InvalidRequest
    from elastrain.server.validation import parse_size

    memory, shm = body.get("memory"), body.get("shm", DEFAULT_SHM)
    if not (isinstance(memory, str) and memory.strip() and isinstance(shm, str)):
        return body
    try:
        if parse_size(memory) >= parse_size(shm):
            return body
    except (ValueError, InvalidRequest):  # an invalid size is left as generated
        return body
    return {**body, "memory": shm}


def distinct_mount_targets(body: dict[str, Any]) -> dict[str, Any]:
    """`body` keeping the first mount of each target (normalised as the server does: ``//x/`` is
    ``/x``): two mounts on one target is a rule between items JSON Schema cannot state."""
    from elastrain.server.validation import normal_target

    mounts = body.get("mounts")
    if not isinstance(mounts, list):
        return body
    kept, seen = [], set()
    for mount in mounts:
        if isinstance(mount, str):
            target = normal_target(mount.rpartition(":")[2])
            if target in seen:
                continue
            seen.add(target)
        kept.append(mount)
    return body if len(kept) == len(mounts) else {**body, "mounts": kept}


def listed_image(body: dict[str, Any], images: list[dict[str, Any]]) -> dict[str, Any]:
    """`body` whose ``image`` is one of `images` (GET /images) holding its framework, or ``""`` (the
    framework's default): which images exist is the server's state, not something JSON Schema states."""
    image, framework = body.get("image"), body.get("framework", DEFAULT_FRAMEWORK)
    if not isinstance(image, str) or not image:
        return body
    for entry in images:
        held = entry.get("frameworks") or []
        if entry.get("name") == image and (not held or framework in held):
            return body
    return {**body, "image": ""}


@cache
def served_images() -> list[dict[str, Any]]:
    """GET /images as this run's identity sees it (read once; empty without an answer)."""
    url, token = harness().api_url, os.environ.get("ELASTRAIN_ST_TOKEN", "")
    if not url:
        return []
    try:
        answer = requests.get(f"{url}/images", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        listed = answer.json() if answer.status_code == 200 else []
    except (requests.RequestException, ValueError):
        return []
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []


def valid_int(value: Any, low: int, high: int) -> bool:
    """`value` is an integer of the schema in ``low..high`` (an integral float counts, a bool never)."""
    return _number(value) and low <= value <= high


def with_header(headers: dict[str, Any] | None, name: str, value: str) -> dict[str, Any]:
    """`headers` with `name` set to `value` (any spelling of `name` replaced)."""
    kept = {k: v for k, v in (headers or {}).items() if k.lower() != name.lower()}
    return {**kept, name: value}


def job_report(
    case_path: dict[str, Any] | None, headers: dict[str, Any] | None, found: Harness
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job report's path parameters and headers: the harness job's token, and its id for a valid id."""
    params = dict(case_path or {})
    if valid_int(params.get("job_id"), 1, MAX_DB_INT):
        params["job_id"] = found.job_id
    return params, with_header(headers, "X-Job-Token", found.job_token)


def attach_body(body: Any, found: Harness) -> Any:
    """An attach request's body with a valid pid made the sleeper's (anything else as generated)."""
    if isinstance(body, dict) and valid_int(body.get("pid"), 1, MAX_PID) and found.attach_pid:
        return {**body, "pid": found.attach_pid}
    return body


def protected_job(value: Any, found: Harness, pid_of: Callable[[int], int | None]) -> bool:
    """A job id (as the server reads the path segment) of the sleeper or of a job attached to it
    (`pid_of`: a job's pid as the run's identity sees it; jobs attached in an earlier run count too)."""
    number = as_server_int(value)
    if number is None or not found.attach_pid:
        return False
    return number == found.sleeper_job or pid_of(number) == found.attach_pid


def job_pid(job_id: int) -> int | None:
    """The pid of job `job_id` as this run's identity sees it (None: not its job, or no answer)."""
    url = harness().api_url
    if not url or not 1 <= job_id <= MAX_DB_INT:
        return None
    token = os.environ.get("ELASTRAIN_ST_TOKEN", "")
    try:
        answer = requests.get(
            f"{url}/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        pid = answer.json().get("pid") if answer.status_code == 200 else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def as_server_int(value: Any) -> int | None:
    """The integer the server reads from a path segment (pydantic's lax parsing: "01", " 1", "1.0")."""
    try:
        return _INT.validate_python(str(value))
    except ValidationError:
        return None


def _route(case: Any) -> str:
    """The operation's path template without the ``/api/v1`` prefix."""
    path: str = case.operation.path
    return path.removeprefix("/api/v1")


def _positive(case: Any) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and bool(meta.generation.mode.is_positive)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Rewrite the request of `case` in place (see the module docstring)."""
    method, route, body = case.operation.method.upper(), _route(case), case.body
    if method == "POST" and route in _COMMAND_ROUTES and isinstance(body, dict) and "command" in body:
        case.body = {**body, "command": harmless_command(body["command"])}
    elif method == "POST" and route == _CLUSTERS_ROUTE and isinstance(body, dict):
        body = {k: capped_count(v) if k in _COUNT_FIELDS else v for k, v in body.items()}
        if _positive(case):
            body = distinct_mount_targets(shm_within_memory(ordered_bounds(body)))
            body = listed_image(body, served_images())
        case.body = body
    elif method == "POST" and route in _EXPIRY_FIELDS and isinstance(body, dict) and _positive(case):
        field, now = _EXPIRY_FIELDS[route], datetime.now(timezone.utc)
        if field in body:
            case.body = {**body, field: future_expiry(body[field], now)}
    elif method == "DELETE" and route == _TOKEN_ROUTE:
        params = case.path_parameters or {}
        number = as_server_int(params.get("token_id"))
        if number is not None and number in protected_tokens():
            case.path_parameters = {**params, "token_id": number + _DETOUR}
    elif method == "POST" and route in _JOB_TOKEN_ROUTES and harness().job_token:
        case.path_parameters, case.headers = job_report(case.path_parameters, case.headers, harness())
    elif method == "POST" and route == _ATTACH_ROUTE and harness().attach_token:
        case.headers = with_header(case.headers, "X-Attach-Token", harness().attach_token)
        if _positive(case):
            case.body = attach_body(body, harness())
    elif method == "DELETE" and route == _JOB_ROUTE:
        params = case.path_parameters or {}
        if protected_job(params.get("job_id"), harness(), job_pid):
            case.path_parameters = {**params, "job_id": MAX_DB_INT}  # no such job
    elif method == "DELETE" and route == _CLUSTER_ROUTE:
        params = case.path_parameters or {}
        if harness().cluster and params.get("name") == harness().cluster:
            case.path_parameters = {**params, "name": _NO_SUCH_CLUSTER}


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    """Past `MAX_LIVE_CLUSTERS` clusters created by this run, delete the oldest one."""
    if case.operation.method.upper() != "POST" or _route(case) != _CLUSTERS_ROUTE:
        return
    if response.status_code != 201:
        return
    try:
        name = response.json()["name"]
    except (ValueError, KeyError, TypeError):
        return
    url = str(response.request.url).split("?", 1)[0].rstrip("/") + "/" + quote(str(name), safe="")
    _created.append((url, str(response.request.headers.get("Authorization", ""))))
    while len(_created) > MAX_LIVE_CLUSTERS:
        oldest, auth = _created.popleft()
        try:
            requests.delete(oldest, headers={"Authorization": auth}, timeout=10)
        except requests.RequestException:
            pass  # the test's cleanup deletes whatever is left


def ndjson_lines(content: bytes) -> list[Any]:
    """The JSON value of every non-blank line of an NDJSON body (a blank line is a keep-alive);
    ValueError for a line that is no JSON."""
    return [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]


def exec_stream(lines: list[Any], line_schema: dict[str, Any]) -> Any:
    """The one value of an exec stream schemathesis checks against the schema of a line: the first line
    that `line_schema` refuses (so the check reports it), else the last line, which must be the
    ``{"exit": CODE}`` (an order a per-line schema cannot state: ValueError otherwise)."""
    if not lines:
        raise ValueError('an empty exec stream (no {"exit": CODE} line)')
    validator = jsonschema_rs.validator_for(line_schema)
    for line in lines:
        if not validator.is_valid(line):
            return line
    exits = [i for i, line in enumerate(lines) if "exit" in line]
    if exits != [len(lines) - 1]:
        raise ValueError(f'the exec stream does not end with its one {{"exit": CODE}} line: {lines[-3:]!r}')
    return lines[-1]


@schemathesis.deserializer("application/x-ndjson")
def deserialize_ndjson(ctx: Any, response: Any) -> Any:
    """An exec stream (`exec_stream`): every line checked against the documented line schema."""
    content = ctx.operation.definition.raw["responses"][str(response.status_code)]["content"]
    return exec_stream(ndjson_lines(response.content), content["application/x-ndjson"]["schema"])
