"""Routes of the caller's storage areas (``/storage``): create, list, read, delete.

No ``from __future__ import annotations``: FastAPI must see the route annotations as objects.
"""

from typing import Annotated

from fastapi import APIRouter, Body, Response

from elastrain.server.deps import CurrentUser, ServicesDep
from elastrain.server.openapi import BODY, created, errors, location
from elastrain.server.storage_service import StorageCreate, StorageOut

_NEW_AREA = {"mnist": {"summary": "an area for a data set and checkpoints", "value": {"name": "mnist"}}}

router = APIRouter(prefix="/api/v1", tags=["storage"])


@router.get("/storage", response_model=list[StorageOut], responses=errors(401))
def list_storage(services: ServicesDep, user: CurrentUser) -> list[StorageOut]:
    """The caller's storage areas (each user sees only their own)."""
    return services.storage_areas.list_areas(user)


@router.post("/storage", response_model=StorageOut, status_code=201, responses=created(*BODY, 403, 409))
def create_storage(
    services: ServicesDep,
    req: Annotated[StorageCreate, Body(openapi_examples=_NEW_AREA)],
    user: CurrentUser,
    response: Response,
) -> StorageOut:
    """Create an empty storage area, owned by the caller's uid in containers; a cluster mounts it with
    ``storage:NAME:/data``. 409 when the caller has one of that name; 403 past the per-user count."""
    out = services.storage_areas.create(user, req.name)
    response.headers["Location"] = location("storage", out.name)
    return out


@router.get("/storage/{name}", response_model=StorageOut, responses=errors(401, 404))
def get_storage(services: ServicesDep, name: str, user: CurrentUser) -> StorageOut:
    """One of the caller's areas (another user's name answers 404, as an unknown one)."""
    return services.storage_areas.get(user, name)


@router.delete("/storage/{name}", status_code=204, responses=errors(401, 404, 409))
def delete_storage(services: ServicesDep, name: str, user: CurrentUser) -> Response:
    """Delete the area and every file in it; 409 while a cluster of the caller mounts it."""
    services.storage_areas.delete(user, name)
    return Response(status_code=204)
