"""The checks of a cluster-create request, all of them: one 422 names every bad field.

`check_cluster_create` runs each field's check (`elastrain.server.validation`), then the checks across
fields whose inputs passed (shm within memory, distinct mount targets, an image holding the framework),
and raises one `InvalidRequest` listing every refusal (`FieldErrors`). Only then come the refusals of
valid values that depend on this node: more GPUs than it has (409), a mount source outside the allowed
roots or of the server's own state (403) or missing (409), each raised at once.

`check_gpu_type` refuses (409, like more GPUs than the node has) a well-formed GPU type the node's
inventory does not have; it runs after the 422 of the request's own values, and the GPU check then
counts that model's GPUs only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastrain.backends.api import Mount
from elastrain.db.models import Cluster, Framework, RestartPolicy, User
from elastrain.server import schemas
from elastrain.server.errors import Conflict, FieldErrors, InvalidRequest, checked
from elastrain.server.validation import (
    check_bound,
    check_bounds,
    check_containers,
    check_framework,
    check_gpus,
    check_mount_format,
    check_name,
    check_restart_policy,
    normal_target,
    parse_size,
)


@dataclass(frozen=True)
class ValidCluster:
    """What a valid create request resolves to."""

    framework: Framework
    low: int
    high: int
    elastic: bool
    shm: int
    memory: int
    policy: RestartPolicy
    mounts: list[Mount]
    image: str
    gpu_type: str | None = None  # the node's name of the GPU model asked for (None: any)


def _resolve(resolve_image: Callable[[str, str], str], image: str, framework: str) -> str:
    """The image to run `framework` from; an image without it is an `InvalidRequest`."""
    try:
        return resolve_image(image, framework)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _bounds(found: FieldErrors, req: schemas.ClusterCreate) -> tuple[int, int] | None:
    """``(min, max)`` containers, or None when the count or a bound was refused."""
    before = len(found.errors)
    found.check("body.containers", check_containers, req.containers)
    for key, bound in (("min_containers", req.min_containers), ("max_containers", req.max_containers)):
        if bound is not None:
            found.check(f"body.{key}", check_bound, bound, key)
    if len(found.errors) > before:
        return None
    return found.check(
        "body.containers", check_bounds, req.containers, req.min_containers, req.max_containers
    )


RESERVED_NAMES = frozenset({"new"})
"""Cluster names nobody gets (``/clusters/new`` is the portal's create page)."""


def check_name_free(name: str, holder: Cluster | None, user: User) -> None:
    """Refuse (409) a cluster name in use or reserved. Names are unique on the server (not per user),
    so the caller learns that a name is unavailable; the refusal does not say whether another user
    holds it or it is reserved (only the caller's own clusters are named as such)."""
    if holder is not None and holder.owner_id == user.id:
        raise Conflict(f"you already have a cluster named {name!r}; pick another name")
    if holder is not None or name in RESERVED_NAMES:
        raise Conflict(f"cluster name {name!r} is not available; pick another name")


MIN_CPUS = 0.01
"""The smallest CPU limit podman (the container runtime) can honour; 0 means no limit."""


def check_cpus(cpus: float) -> None:
    """A CPU limit the runtime can honour: 0 (none) or at least `MIN_CPUS` (a smaller one was accepted,
    then ``podman run`` failed on every retry and the cluster never started)."""
    if 0 < cpus < MIN_CPUS:
        raise InvalidRequest(
            f"cpus {cpus:g} is below the smallest limit the runtime honours ({MIN_CPUS:g}); "
            f"ask for at least {MIN_CPUS:g} cores, or 0 for no limit"
        )


def _check_fields(
    found: FieldErrors, req: schemas.ClusterCreate
) -> tuple[Framework | None, tuple[int, int] | None, int | None, int | None, RestartPolicy | None]:
    """The checks of the request's own values (none needs this node), recorded in `found`: the
    framework, container bounds, shm, memory and restart policy they resolve to (None: refused)."""
    found.check("body.name", check_name, req.name)
    framework = found.check("body.framework", check_framework, req.framework)
    bounds = _bounds(found, req)
    found.check("body.gpus_per_container", check_gpus, req.gpus_per_container)
    shm = found.check("body.shm", parse_size, req.shm)
    memory = found.check("body.memory", parse_size, req.memory) if req.memory else 0
    policy = found.check("body.restart_policy", check_restart_policy, req.restart_policy)
    found.check("body.cpus", check_cpus, req.cpus)
    specs = [found.check(f"body.mounts.{i}", check_mount_format, spec) for i, spec in enumerate(req.mounts)]
    if shm is not None and memory and shm > memory:
        found.add(
            "body.shm",
            f"shm {req.shm} is larger than the memory limit {req.memory}: /dev/shm counts against "
            "the container's memory; ask for less shm or more memory",
        )
    targets = [normal_target(spec[1]) for spec in specs if spec is not None]
    if len(set(targets)) != len(targets):
        found.add("body.mounts", "two mounts share a target path; give each mount its own target")
    return framework, bounds, shm, memory, policy


def check_gpu_type(requested: str | None, models: Sequence[str]) -> str | None:
    """The node's GPU model `requested` names (case aside; None or '': any model); a `Conflict` (409)
    saying which models there are when the node has none of that name."""
    if requested is None or not requested.strip():
        return None
    wanted = requested.strip().casefold()
    found = next((model for model in models if model.casefold() == wanted), None)
    if found is None:
        have = ", ".join(repr(m) for m in models) if models else "none (no real GPUs: only null, any type)"
        raise Conflict(
            f"gpu_type {requested.strip()!r} is not a GPU model of this node; its models: {have} "
            "(GET /api/v1/inventory); send one of them, or null for any"
        )
    return found


def check_cluster_create(
    req: schemas.ClusterCreate,
    *,
    check_gpu_total: Callable[[int, int, str | None], None],
    static: bool,
    parse_mount: Callable[[str], Mount],
    resolve_image: Callable[[str, str], str],
    gpu_models: Sequence[str] = (),
) -> ValidCluster:
    """Every check of `req`; one `InvalidRequest` names every bad field (see the module docstring).

    `gpu_models` are the node's GPU models (a `gpu_type` naming none of them: 409);
    `check_gpu_total(containers, gpus, gpu_type)` refuses (409) more GPUs (of that model) than the node
    has or can free (for the lower bound, and in a `static` server without a scheduler for the
    requested size too); `parse_mount` resolves one
    ``SOURCE:TARGET`` on this node (403, 409); `resolve_image(image, framework)` raises ValueError for an
    image without it. The node's refusals come after the 422 of the request's own values.
    """
    found = FieldErrors()
    framework, bounds, shm, memory, policy = _check_fields(found, req)
    image = None
    if framework is not None:
        image = found.check("body.image", _resolve, resolve_image, req.image, framework.value)
    found.raise_if_any()
    if (
        framework is None
        or bounds is None
        or shm is None
        or memory is None
        or policy is None
        or image is None
    ):
        raise InvalidRequest("invalid request")  # unreachable: each None recorded a refusal
    gpu_type = check_gpu_type(req.gpu_type, gpu_models)
    # static: all of it
    check_gpu_total(req.containers if static else bounds[0], req.gpus_per_container, gpu_type)
    mounts = [checked(f"body.mounts.{i}", parse_mount, spec) for i, spec in enumerate(req.mounts)]
    return ValidCluster(
        framework=framework,
        low=bounds[0],
        high=bounds[1],
        elastic=req.min_containers is not None or req.max_containers is not None,
        shm=shm,
        memory=memory,
        policy=policy,
        mounts=mounts,
        image=image,
        gpu_type=gpu_type,
    )
