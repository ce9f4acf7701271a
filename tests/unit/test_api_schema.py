"""The OpenAPI schema carries what the server enforces (issue 21): DNS-label names, container, GPU, size
and mount bounds, enums for states, statuses, frameworks and causes; answers' timestamps are RFC 3339
with a zone; a control character in a command, a mount or a name is a 422 naming the field, never 500.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy import select

import elastrain
from elastrain.db.models import (
    ClusterState,
    ContainerState,
    Event,
    EventAction,
    Framework,
    Job,
    JobStatus,
    User,
)
from elastrain.db.repository import add_event, cluster_by_name
from elastrain.db.session import Database
from elastrain.portal.api import MetricOut
from elastrain.rendezvous.api import Cause
from elastrain.server import job_schemas, schemas
from elastrain.server.errors import Forbidden, InvalidRequest
from elastrain.server.validation import (
    MOUNT_PATTERN,
    NAME_PATTERN,
    SIZE_PATTERN,
    check_mount_format,
    check_name,
    parse_size,
)
from tests.security.server_app import make_app

PACKAGE = Path(elastrain.__file__).parent
ZONED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    root = tmp_path_factory.mktemp("schema")
    made = make_app(root)
    with TestClient(made.app, headers={"Authorization": f"Bearer {made.token}"}) as client:
        yield client, root


@pytest.fixture(scope="module")
def spec(api: tuple[TestClient, Path]) -> dict[str, Any]:
    answer = api[0].get("/openapi.json")
    assert answer.status_code == 200
    return dict(answer.json())


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = spec["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _model(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found = spec["components"]["schemas"]
    for key in (name, f"{name}-Output", f"{name}-Input"):
        if key in found:
            return dict(found[key])
    raise AssertionError(f"no schema {name} in {sorted(found)}")


def _prop(spec: dict[str, Any], model: str, field: str) -> dict[str, Any]:
    """A property's schema, through $ref and a nullable anyOf."""
    node = _resolve(spec, _model(spec, model)["properties"][field])
    variants = [_resolve(spec, v) for v in node.get("anyOf", [])]
    concrete = [v for v in variants if v.get("type") != "null"]
    return {**concrete[0], **{k: v for k, v in node.items() if k != "anyOf"}} if concrete else node


def _message(answer: Any) -> str:
    """The refusal's one-line message (problem details' `detail`, or the older `error`)."""
    body = answer.json()
    detail = body.get("detail")
    return detail if isinstance(detail, str) else str(body.get("error", json.dumps(body)))


# --- constraints --------------------------------------------------------------------------------


def test_names_carry_the_dns_label_pattern_and_length(spec: dict[str, Any]) -> None:
    for model in ("ClusterCreate", "UserCreate"):
        name = _prop(spec, model, "name")
        assert (name["pattern"], name["minLength"], name["maxLength"]) == (NAME_PATTERN, 1, 63), model
    assert _prop(spec, "ExecRequest", "container")["maxLength"] == 80


def test_counts_sizes_and_mounts_carry_the_servers_bounds(spec: dict[str, Any]) -> None:
    for model, field in (("ClusterCreate", "containers"), ("ClusterScale", "containers")):
        assert (_prop(spec, model, field)["minimum"], _prop(spec, model, field)["maximum"]) == (2, 64)
    for field in ("min_containers", "max_containers"):
        assert _prop(spec, "ClusterCreate", field)["minimum"] == 2
    gpus = _prop(spec, "ClusterCreate", "gpus_per_container")
    assert gpus["minimum"] == 0 and gpus["maximum"] >= 8
    assert _prop(spec, "ClusterCreate", "shm")["pattern"] == SIZE_PATTERN
    assert re.fullmatch(_prop(spec, "ClusterCreate", "memory")["pattern"], "")
    assert _prop(spec, "ClusterCreate", "mounts")["items"]["pattern"] == MOUNT_PATTERN
    assert _prop(spec, "ClusterCreate", "cpus")["maximum"] == 4096
    for model in ("ExecRequest", "JobSubmit"):
        command = _prop(spec, model, "command")
        argument = re.compile(command["items"]["pattern"])
        assert command["minItems"] == 1 and argument.fullmatch("sh -c 'a\n\tb'"), model
        assert not argument.fullmatch("a\x00b") and not argument.fullmatch("a\x1bb"), model


@pytest.mark.parametrize(
    "model,field,members",
    [
        ("ClusterOut", "state", ClusterState),
        ("ClusterOut", "framework", Framework),
        ("ClusterCreate", "framework", Framework),
        ("ContainerOut", "state", ContainerState),
        ("JobOut", "status", JobStatus),
        ("JobIncident", "cause", Cause),
        ("TokenOut", "state", schemas.TokenState),
    ],
)
def test_states_statuses_frameworks_and_causes_are_enums(
    spec: dict[str, Any], model: str, field: str, members: Any
) -> None:
    assert _prop(spec, model, field)["enum"] == [m.value for m in members]


def test_event_action_is_the_enum_of_every_action(spec: dict[str, Any]) -> None:
    action = _prop(spec, "EventOut", "action")
    assert action["enum"] == [m.value for m in EventAction]
    assert "cluster.created" in action["enum"] and "unknown" in action["description"]


def _recording_calls() -> Iterator[tuple[str, ast.Call, ast.expr]]:
    """Every call that records an event in elastrain/ (``add_event``, ``_add_job_event``), with the
    expression it passes as the action."""
    position = {"add_event": 2, "_add_job_event": 3}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name not in position:
                continue
            keyword = [k.value for k in node.keywords if k.arg == "action"]
            args = node.args[position[name]] if len(node.args) > position[name] else None
            action = keyword[0] if keyword else args
            assert action is not None, f"{path}:{node.lineno}: {name} without an action"
            yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node, action


def test_every_recorded_action_is_a_member_of_the_enum() -> None:
    """No event is recorded with a string: every action passed is an `EventAction` member (or the one
    computed from a cluster state), and every member but `unknown` is recorded somewhere."""
    used: set[EventAction] = {EventAction.of_cluster_state(state) for state in ClusterState}
    sites = 0
    for where, _call, action in _recording_calls():
        sites += 1
        for node in ast.walk(action):
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, str)), (
                where,
                ast.unparse(action),
            )
            assert not isinstance(node, ast.JoinedStr), (where, ast.unparse(action))
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "EventAction"
            ) and node.attr != "of_cluster_state":
                used.add(EventAction[node.attr])
        names = {n.id for n in ast.walk(action) if isinstance(n, ast.Name)}
        assert names <= {"EventAction", "d", "was_admitted", "action"}, (where, ast.unparse(action))
    assert sites >= 25, sites
    assert set(EventAction) - used == {EventAction.unknown}


def test_a_stored_action_this_server_does_not_know_is_answered_as_unknown(
    api: tuple[TestClient, Path],
) -> None:
    client, root = api
    _cluster(client, "old")
    db = Database(f"sqlite:///{root / 'data' / 'elastrain.db'}")
    try:
        with db.session() as session:
            row = cluster_by_name(session, "old")
            assert row is not None
            session.add(
                Event(actor="reconciler", action="container.started", cluster="old", cluster_uid=row.uid,
                      owner_id=row.owner_id, detail='{"container": "old-launcher"}')
            )  # fmt: skip
    finally:
        db.dispose()
    answer = client.get("/api/v1/clusters/old/events")
    assert answer.status_code == 200, answer.text
    events = answer.json()
    assert {"action": "unknown", "detail": {"container": "old-launcher", "action": "container.started"}} in [
        {"action": e["action"], "detail": e["detail"]} for e in events
    ]
    assert {e["action"] for e in events} <= {m.value for m in EventAction}
    assert EventAction.cluster_created.value in {e["action"] for e in events}
    with pytest.raises(ValueError):  # recording an action that is no member is refused
        add_event(None, "admin", "container.started")  # type: ignore[arg-type]


def test_incident_times_are_answered_as_rfc3339_utc(
    api: tuple[TestClient, Path], spec: dict[str, Any]
) -> None:
    client, root = api
    _cluster(client, "inc")
    job = _job(root, "inc", incident={"generation": 1, "cause": "worker_failure", "fault_at": 1764616635.25,
                                      "detected_at": 1764616636.0, "formed_at": 1764616637.5})  # fmt: skip
    answer = client.get(f"/api/v1/jobs/{job}/events")
    assert answer.status_code == 200, answer.text
    incident = next(e["detail"] for e in answer.json() if e["action"] == "job.incident")
    assert incident["fault_at"] == "2025-12-01T19:17:15.250000Z"
    assert incident["detected_at"] == "2025-12-01T19:17:16Z" and incident["formed_at"].endswith(".500000Z")
    assert incident["generation"] == 1 and "first_step_at" not in incident
    for field in schemas.INCIDENT_TIMES:
        bounds = _prop(spec, "JobIncident", field)
        assert (bounds["type"], bounds["minimum"], bounds["maximum"]) == ("number", 0, schemas.MAX_EPOCH_S)
    assert schemas.epoch_as_rfc3339(schemas.MAX_EPOCH_S) == "9999-12-31T23:59:59Z"
    assert schemas.epoch_as_rfc3339(1e300) == 1e300  # an old row's odd value: answered as stored
    with pytest.raises(ValidationError):
        job_schemas.JobIncident.model_validate(
            {"generation": 1, "cause": "start", "world_size": 1, "start_step": 0, "steps_lost": 0,
             "detect_s": 0, "fault_at": 1e300}
        )  # fmt: skip


def test_a_job_answers_its_resizes_with_their_pauses_and_restarted_processes(
    api: tuple[TestClient, Path],
) -> None:
    client, root = api
    _cluster(client, "rs")
    base = {"start_step": 0, "steps_lost": 0, "detect_s": 0.0}
    job = _job(
        root,
        "rs",
        {**base, "generation": 0, "cause": "start", "world_size": 2, "formed_at": 1764616600.0},
        {**base, "generation": 2, "cause": "scale_in", "world_size": 3, "recover_s": 0.03,
         "detected_at": 1764616640.0},
        {**base, "generation": 1, "cause": "scale_out", "world_size": 4, "recover_s": 0.57,
         "detected_at": 1764616630.0},
        {**base, "generation": 3, "cause": "worker_failure", "world_size": 2, "restarted": True},
    )  # fmt: skip
    answer = client.get(f"/api/v1/jobs/{job}")
    assert answer.status_code == 200, answer.text
    resizes = answer.json()["resizes"]
    assert [
        (r["from_world"], r["to_world"], r["cause"], r["pause_s"], r["restarted_processes"]) for r in resizes
    ] == [
        (2, 4, "scale_out", 0.57, 0),
        (4, 3, "scale_in", 0.03, 0),
        (3, 2, "worker_failure", None, 2),
    ]
    assert resizes[0]["at"] == "2025-12-01T19:17:10Z"
    listed = client.get("/api/v1/jobs").json()
    assert [j["resizes"] for j in listed if j["id"] == job] == [None]  # lists do not read the events


def test_log_headers_images_and_metrics_bounds_in_the_schema(spec: dict[str, Any]) -> None:
    logs = spec["paths"]["/api/v1/jobs/{job_id}/logs"]["get"]["responses"]["200"]["headers"]
    assert _resolve(spec, logs["X-Job-Status"]["schema"])["enum"] == [s.value for s in JobStatus]
    for field in ("frameworks", "default_for"):
        assert _resolve(spec, _prop(spec, "ImageOut", field)["items"])["enum"] == [f.value for f in Framework]
    created = _model(spec, "ImageOut")["properties"]["created"]
    assert {v.get("format") or v.get("type") for v in created["anyOf"]} == {"date-time", "null"}
    bounds = {}
    for route in ("/api/v1/jobs/{job_id}/metrics", "/api/v1/jobs/{job_id}/logs", "/api/v1/jobs/{job_id}"):
        for param in spec["paths"][route]["get"]["parameters"]:
            bounds[(route, param["name"])] = (param["schema"]["minimum"], param["schema"]["maximum"])
    ids = {v for (_r, name), v in bounds.items() if name == "job_id"}
    assert ids == {(1, 2**63 - 1)}, bounds
    assert (
        bounds[("/api/v1/jobs/{job_id}/metrics", "after")] == bounds[("/api/v1/jobs/{job_id}/logs", "offset")]
    )
    assert bounds[("/api/v1/jobs/{job_id}/metrics", "after")] == (0, 2**63 - 1)


def test_image_frameworks_and_creation_time() -> None:
    assert schemas.known_frameworks(["jax", "pytorch", "horovod", "pytorch"]) == [
        Framework.pytorch,
        Framework.horovod,
    ]
    assert schemas.rfc3339_or_none("") is None and schemas.rfc3339_or_none("yesterday") is None
    image = schemas.ImageOut(name="i", frameworks=[], size_bytes=0,
                             created=schemas.rfc3339_or_none("2026-12-01T19:17:15Z"))  # fmt: skip
    assert json.loads(image.model_dump_json())["created"] == "2026-12-01T19:17:15Z"


def test_one_refusal_names_every_bad_field() -> None:
    with pytest.raises(ValidationError) as refused:
        schemas.ClusterCreate.model_validate({"name": "", "containers": 0, "shm": "lots"})
    errors = {e["loc"][0]: e["msg"] for e in refused.value.errors()}
    assert "not a DNS label" in errors["name"] and "launcher" in errors["containers"]
    assert "512Mi" in errors["shm"] and all("\n" not in m for m in errors.values())


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (schemas.ClusterCreate, "cpus"),  # schemathesis seed 7 found `"cpus": true` accepted
        (schemas.ClusterCreate, "priority"),
        (schemas.ClusterCreate, "min_containers"),
        (schemas.ClusterScale, "containers"),
        (job_schemas.JobProgress, "loss"),
        (job_schemas.JobProgress, "step"),
    ],
)
def test_a_boolean_is_never_a_number(model: type[BaseModel], field: str) -> None:
    body = {"name": "a", field: True} if model is schemas.ClusterCreate else {field: True}
    with pytest.raises(ValidationError) as refused:
        model.model_validate_json(json.dumps(body))
    assert [(e["loc"], e["msg"]) for e in refused.value.errors()] == [
        ((field,), "Input should be a number, not a boolean")
    ]


# --- the schema and the server's checks agree ------------------------------------------------------


def _accepted(check: Any, value: str) -> bool:
    try:
        check(value)
    except (InvalidRequest, Forbidden):  # Forbidden: well-formed but reserved (a mount target of /etc)
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.from_regex(SIZE_PATTERN, fullmatch=True), st.text(max_size=12)))
def test_the_size_pattern_is_what_parse_size_takes(text: str) -> None:
    assert bool(re.fullmatch(SIZE_PATTERN, text)) == _accepted(parse_size, text), text


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.from_regex(NAME_PATTERN, fullmatch=True), st.text(max_size=70)))
def test_the_name_pattern_is_what_check_name_takes(text: str) -> None:
    assert bool(re.fullmatch(NAME_PATTERN, text)) == _accepted(check_name, text), text


@settings(max_examples=300, deadline=None)
@given(st.from_regex(MOUNT_PATTERN, fullmatch=True))
def test_every_mount_the_server_takes_matches_the_pattern(spec_text: str) -> None:
    if _accepted(check_mount_format, spec_text):
        assert re.fullmatch(MOUNT_PATTERN, spec_text)
    for bad in ("data:/data", "/a:data", "/a\x00b:/data", "nocolon"):
        assert not re.fullmatch(MOUNT_PATTERN, bad) and not _accepted(check_mount_format, bad)


@pytest.mark.parametrize(
    "text,message",
    [("2000000Gi", "at most 6 digits before Gi"), ("10P", "at most 1 digit before P"), ("lots", "512Mi")],
)
def test_a_refused_size_says_why_in_one_line(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        parse_size(text)
    assert "\n" not in str(refused.value)


# --- control characters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/clusters/pc/exec", {"command": ["echo", "a\x00b"]}, "command"),
        ("/clusters/pc/jobs", {"command": ["echo", "a\x00b"]}, "command"),
        ("/clusters", {"name": "nul", "containers": 2, "mounts": ["/tmp/a\x00b:/data"]}, "mounts"),
        ("/clusters", {"name": "a\x00b", "containers": 2}, "name"),
        ("/clusters", {"name": "esc", "containers": 2, "image": "x\x1by"}, "image"),
        ("/clusters/pc/exec", {"command": ["true"], "container": "pc-\nlauncher"}, "container"),
        ("/users", {"name": "bad\x00"}, "name"),
    ],
)
def test_a_control_character_is_a_422_naming_the_field(
    api: tuple[TestClient, Path], path: str, body: dict[str, Any], field: str
) -> None:
    client, _root = api
    _cluster(client, "pc")
    answer = client.post(f"/api/v1{path}", json=body)
    assert answer.status_code == 422, answer.text
    message = _message(answer)
    assert field in message and "\n" not in message, message
    locations = [str(e.get("loc")) for e in answer.json().get("errors", [])]
    assert not locations or any(field in loc for loc in locations), locations


def test_a_command_argument_may_hold_a_script() -> None:
    body = {"command": ["python", "-c", "import sys\n\tprint(sys.argv)"]}
    assert schemas.JobSubmit.model_validate(body).command[2].count("\n") == 1


# --- timestamps --------------------------------------------------------------------------------------


def _cluster(client: TestClient, name: str) -> None:
    if client.get(f"/api/v1/clusters/{name}").status_code == 404:
        made = client.post("/api/v1/clusters", json={"name": name, "containers": 2})
        assert made.status_code == 201, made.text


def _job(root: Path, cluster: str, incident: dict[str, Any] | None = None, *more: dict[str, Any]) -> int:
    """A finished job of `cluster` and its events (with `incident`: a ``job.incident`` of that detail
    too), written as SQLite keeps them (naive UTC)."""
    db = Database(f"sqlite:///{root / 'data' / 'elastrain.db'}")
    try:
        with db.session() as session:
            row = cluster_by_name(session, cluster)
            assert row is not None
            naive = datetime.now(timezone.utc).replace(tzinfo=None)
            job = Job(
                cluster_id=row.id,
                owner_id=row.owner_id,
                command='["true"]',
                status=JobStatus.Succeeded,
                exit_code=0,
                created_at=naive - timedelta(seconds=5),
                finished_at=naive,
            )
            session.add(job)
            session.flush()
            add_event(session, "admin", EventAction.job_submitted, cluster, row.owner_id, job=job.id)
            for detail in [incident, *more] if incident is not None else []:
                add_event(session, "elastrain run", EventAction.job_incident, cluster, row.owner_id,
                          **detail, job=job.id)  # fmt: skip
            return int(job.id)
    finally:
        db.dispose()


def _date_times(spec: dict[str, Any], schema: dict[str, Any], value: Any) -> Iterator[tuple[str, Any]]:
    """Every (where, value) in `value` whose schema says ``format: date-time``."""
    schema = _resolve(spec, schema)
    if schema.get("format") == "date-time":
        yield "", value
    for variant in schema.get("anyOf", []) + schema.get("oneOf", []):
        if value is not None:
            yield from _date_times(spec, variant, value)
    if isinstance(value, list) and "items" in schema:
        for item in value:
            yield from _date_times(spec, schema["items"], item)
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from ((f"{key}{w and '.' + w}", v) for w, v in _date_times(spec, sub, value[key]))


def test_every_date_time_in_answers_carries_a_zone(
    api: tuple[TestClient, Path], spec: dict[str, Any]
) -> None:
    client, root = api
    _cluster(client, "tz")
    assert client.patch("/api/v1/clusters/tz", json={"containers": 3}).status_code == 200
    job = _job(root, "tz")
    made = client.post("/api/v1/users", json={"name": "tz-user", "token_expires_in_days": 30})
    assert made.status_code == 201, made.text
    checked = []
    for path, template in [
        ("/api/v1/clusters", "/api/v1/clusters"),
        ("/api/v1/clusters/tz", "/api/v1/clusters/{name}"),
        ("/api/v1/clusters/tz/events", "/api/v1/clusters/{name}/events"),
        ("/api/v1/jobs", "/api/v1/jobs"),
        (f"/api/v1/jobs/{job}", "/api/v1/jobs/{job_id}"),
        (f"/api/v1/jobs/{job}/events", "/api/v1/jobs/{job_id}/events"),
        ("/api/v1/users/tz-user", "/api/v1/users/{name}"),
        ("/api/v1/users/tz-user/tokens", "/api/v1/users/{name}/tokens"),
    ]:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text)
        schema = spec["paths"][template]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        for where, value in _date_times(spec, schema, answer.json()):
            checked.append(f"{path} {where}")
            assert value is None or ZONED.fullmatch(value), (path, where, value)
    events = client.get("/api/v1/clusters/tz/events").json()
    assert events and all(e["at"].endswith("Z") for e in events), events
    assert any(c.endswith("at") for c in checked if "/events" in c), checked
    assert any("finished_at" in c for c in checked) and any("expires_at" in c for c in checked), checked


REQUEST_TIMES = {"UserCreate.token_expires_at", "TokenCreate.expires_at"}  # an offset is required there


def _answer_date_times() -> list[Any]:
    """Every date-time field of an answer model, as a test parameter (its type, with validators)."""
    modules = (schemas, job_schemas)
    found = {m for mod in modules for m in vars(mod).values() if isinstance(m, type)} | {MetricOut}
    models: list[type[BaseModel]] = [m for m in found if issubclass(m, BaseModel) and m is not BaseModel]
    params = []
    for model in sorted(models, key=lambda m: m.__name__):
        properties = model.model_json_schema(mode="serialization")["properties"]
        for name, field in model.model_fields.items():
            where = f"{model.__name__}.{name}"
            if "date-time" in json.dumps(properties[name]) and where not in REQUEST_TIMES:
                meta = tuple(field.metadata)
                typed = Annotated[(field.annotation, *meta)] if meta else field.annotation
                params.append(pytest.param(typed, id=where))
    return params


@pytest.mark.parametrize("annotation", _answer_date_times())
def test_answer_timestamps_serialise_in_utc_with_z(annotation: Any) -> None:
    adapter = TypeAdapter(annotation)
    naive = datetime(2026, 12, 1, 19, 17, 15, 430803)  # as SQLite gives it back: UTC
    assert adapter.dump_json(adapter.validate_python(naive)) == b'"2026-12-01T19:17:15.430803Z"'
    offset = datetime(2026, 12, 1, 21, 17, 15, tzinfo=timezone(timedelta(hours=2)))
    assert adapter.dump_json(adapter.validate_python(offset)) == b'"2026-12-01T19:17:15Z"'


def test_timestamps_are_stored_and_read_back_zone_aware(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    try:
        at = datetime(2026, 12, 1, 21, 17, 15, tzinfo=timezone(timedelta(hours=2)))
        with db.session() as session:
            session.add(User(name="tz", created_at=at))
        with db.session() as session:
            user = session.scalars(select(User).where(User.name == "tz")).one()
            assert user.created_at == at and user.created_at.tzinfo == timezone.utc
    finally:
        db.dispose()
