"""Field types of the API schemas: each carries the server's own bound into the OpenAPI schema (pattern,
length, minimum and maximum, enum) and refuses a value with the server's one-line message.

The checks of `elastrain.server.validation` stay the truth (the services call them again); a type here
runs the same check first, so a request the schema calls valid is not refused for a reason the schema
could have said, and a refusal names its field (a 422 listing every bad field, never a 500).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from elastrain.db.models import Framework, RestartPolicy
from elastrain.server import validation as checks
from elastrain.server.errors import InvalidRequest

MAX_DB_INT = 2**63 - 1
"""The largest integer a database column holds (64-bit signed): larger ids/offsets are a 422, not a 500."""
Count = Annotated[int, Field(ge=0, le=MAX_DB_INT)]
"""A non-negative integer stored in the database (step, epoch, bytes, ...)."""
DbInt = Annotated[int, Field(ge=-MAX_DB_INT - 1, le=MAX_DB_INT)]
"""Any integer a 64-bit database column holds."""
MAX_EPOCH_S = 253402300799.0
"""The last second of year 9999 in epoch seconds: the latest time an RFC 3339 timestamp can hold."""
EpochSeconds = Annotated[float, Field(ge=0, le=MAX_EPOCH_S)]
"""A wall-clock time as seconds since 1970-01-01T00:00:00Z (what `time.time()` gives)."""
MAX_ARGUMENT = 1024
"""The longest command argument, in characters (a longer script: a file, run by its path)."""
MAX_ARGUMENTS = 64
"""The most arguments of one command. With `MAX_ARGUMENT`, a command at both bounds written as JSON
(12 bytes a character at worst: a ``\\uXXXX\\uXXXX`` pair) is 768 KiB: every schema-valid request fits
under the server's default 1 MiB body cap (tests/contract/test_body_bounds.py)."""


def server_check(check: Callable[[Any], object], kind: type) -> BeforeValidator:
    """Run `check` (one of validation.py's) on a value of `kind` before pydantic's own type and bound
    checks, turning its `InvalidRequest` into a field error with the same message; other values (a
    string where a number belongs, ...) fall through to pydantic, which words their error."""

    def run(value: Any) -> Any:
        if isinstance(value, kind) and not isinstance(value, bool):
            try:
                check(value)
            except InvalidRequest as exc:
                raise PydanticCustomError("value_error", str(exc)) from None
        return value

    return BeforeValidator(run)


def _is_number_type(annotation: Any) -> bool:
    """Whether a field of `annotation` holds a number (int or float, optional or not)."""
    if get_origin(annotation) is Annotated:
        return _is_number_type(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_number_type(arg) for arg in get_args(annotation) if arg is not type(None))
    return annotation in (int, float)


class Body(BaseModel):
    """A request body: a JSON ``true``/``false`` is never a number (pydantic's lax mode would take
    ``true`` as 1 where the schema says ``integer`` or ``number``)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_number_type(field.annotation):
            raise PydanticCustomError("number_type", "Input should be a number, not a boolean")
        return value


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a naive value (what SQLite gives back) is UTC already."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _optional_size(text: str) -> int:
    return checks.parse_size(text) if text else 0


UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]
"""A timestamp in answers: RFC 3339 in UTC with ``Z`` (``2026-12-01T19:17:15.430803Z``)."""

ClusterName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=checks.NAME_MAX, pattern=checks.NAME_PATTERN),
    server_check(partial(checks.check_name, what="cluster name"), str),
]
"""A cluster's name: a DNS label (1-63 lowercase letters, digits and '-', alphanumeric at both ends)."""
UserName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=checks.NAME_MAX, pattern=checks.NAME_PATTERN),
    server_check(partial(checks.check_name, what="user name"), str),
]
"""A user's name: a DNS label."""
StorageName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=checks.NAME_MAX, pattern=checks.NAME_PATTERN),
    server_check(partial(checks.check_name, what="storage area name"), str),
]
"""A storage area's name: a DNS label (unique among its owner's areas)."""
ContainerName = Annotated[
    str, StringConstraints(min_length=1, max_length=80, pattern=r"^[a-z0-9]([a-z0-9-]{0,78}[a-z0-9])?$")
]
"""A container's name (``<cluster>-launcher``, ``<cluster>-worker-N``)."""

SafeText = Annotated[
    str,
    StringConstraints(pattern=checks.TEXT_PATTERN),
    server_check(partial(checks.check_text, what="the value"), str),
]
"""Any text without control characters (C0 including tab and newline, DEL, C1)."""
CommandArgument = Annotated[
    str,
    StringConstraints(max_length=MAX_ARGUMENT, pattern=checks.ARG_PATTERN),
    server_check(partial(checks.check_text, what="the argument", argument=True), str),
]
"""One argument of a command: tabs and newlines allowed (a ``sh -c`` script), other control characters
(NUL first of all: no program can receive it) refused."""
Command = Annotated[
    list[CommandArgument],
    Field(
        min_length=1,
        max_length=MAX_ARGUMENTS,
        description=f"the argument vector (no shell: ['sh', '-c', '...'] for one), 1 to {MAX_ARGUMENTS} "
        f"arguments of at most {MAX_ARGUMENT} characters each (a longer script: a file, run by its path)",
    ),
]
"""A command as its argument vector (no shell: ``["sh", "-c", "..."]`` for one)."""

Size = Annotated[
    str, StringConstraints(max_length=64, pattern=checks.SIZE_PATTERN), server_check(checks.parse_size, str)
]
"""A size: a number and a unit (``512Mi``, ``2Gi``, ``1G``; none: bytes)."""
OptionalSize = Annotated[
    str,
    StringConstraints(max_length=64, pattern=checks.OPTIONAL_SIZE_PATTERN),
    server_check(_optional_size, str),
]
"""A size, or ``""`` for none."""
MountSpec = Annotated[
    str,
    StringConstraints(max_length=4096, pattern=checks.MOUNT_PATTERN),
    server_check(checks.check_mount_format, str),
]
"""``SOURCE:TARGET``: an absolute host path and an absolute container path."""

ContainerCount = Annotated[
    int,
    Field(ge=checks.MIN_CONTAINERS, le=checks.MAX_CONTAINERS),
    server_check(checks.check_containers, int),
]
"""Containers of a cluster, the launcher included (2: one launcher, one worker)."""
MinContainers = Annotated[
    int,
    Field(ge=checks.MIN_CONTAINERS, le=checks.MAX_CONTAINERS),
    server_check(partial(checks.check_bound, what="min_containers"), int),
]
"""An elastic cluster's lower bound, the launcher included."""
MaxContainers = Annotated[
    int,
    Field(ge=checks.MIN_CONTAINERS, le=checks.MAX_CONTAINERS),
    server_check(partial(checks.check_bound, what="max_containers"), int),
]
"""An elastic cluster's upper bound, the launcher included."""
GpuCount = Annotated[int, Field(ge=0, le=checks.MAX_GPUS_PER_CONTAINER), server_check(checks.check_gpus, int)]
"""GPUs per container (the node must also have them: checked when the cluster is created)."""

FrameworkName = Annotated[Framework, server_check(checks.check_framework, str)]
"""A training framework (an unknown one is refused with the list of valid ones)."""
RestartPolicyName = Annotated[RestartPolicy, server_check(checks.check_restart_policy, str)]
"""What happens to a container whose process died."""
