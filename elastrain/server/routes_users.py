"""Routes of users, their tokens and the node (``/me``, ``/users``, ``/inventory``, ``/images``).

No ``from __future__ import annotations``: FastAPI must see the route annotations as objects.
"""

from typing import Annotated

from fastapi import APIRouter, Body, Path, Response

from elastrain.server import schemas
from elastrain.server import users as accounts
from elastrain.server.deps import Credentials, CurrentUser, ServicesDep
from elastrain.server.openapi import BODY, created, errors, location
from elastrain.server.schemas import MAX_DB_INT

TokenId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="a token id (elastrain user token list)")]
_NEW_USER = {"alice": {"summary": "a user whose first token lasts 90 days", "value": {"name": "alice",
             "token_expires_in_days": 90}}}  # fmt: skip
_NEW_TOKEN = {"ci": {"summary": "a token for CI, 30 days", "value": {"name": "ci", "expires_in_days": 30}}}
_QUOTA = {
    "quota": {"summary": "at most 2 clusters and 8 GPUs", "value": {"quota": {"clusters": 2, "gpus": 8}}}
}


router = APIRouter(prefix="/api/v1")


@router.get("/healthz", tags=["meta"])
async def get_health() -> dict[str, str]:
    """Liveness (no token needed): answered on the event loop, whatever the worker threads do."""
    return {"status": "ok"}


@router.get("/me", response_model=schemas.UserOut, responses=errors(401), tags=["users"])
def get_current_user(user: CurrentUser) -> schemas.UserOut:
    """Who the token belongs to."""
    return schemas.UserOut(name=user.name, admin=user.is_admin)


@router.post(
    "/users",
    response_model=schemas.UserOut,
    status_code=201,
    responses=created(*BODY, 403, 409),
    tags=["users"],
)
def create_user(
    services: ServicesDep,
    req: Annotated[schemas.UserCreate, Body(openapi_examples=_NEW_USER)],
    user: CurrentUser,
    response: Response,
) -> schemas.UserOut:
    """Create a user and return their token (admin only); `Location` is the user's URL."""
    out = services.create_user(user, req)
    response.headers["Location"] = location("users", out.name)
    return out


@router.get("/users/{name}", response_model=schemas.UserDetailOut, responses=errors(401, 404), tags=["users"])
def get_user(services: ServicesDep, name: str, user: CurrentUser) -> schemas.UserDetailOut:
    """A user with their quota and usage (your own; an admin sees anyone's)."""
    return accounts.get_user(services.db, user, name, services.quota_defaults)


@router.patch(
    "/users/{name}",
    response_model=schemas.UserDetailOut,
    responses=errors(*BODY, 403, 404),
    tags=["users"],
)
def update_user(
    services: ServicesDep,
    name: str,
    req: Annotated[schemas.UserPatch, Body(openapi_examples=_QUOTA)],
    user: CurrentUser,
) -> schemas.UserDetailOut:
    """Set a user's quota (admin only); a null limit goes back to the server default."""
    return accounts.update_user(services.db, user, name, req, services.quota_defaults)


@router.post(
    "/users/{name}/tokens",
    response_model=schemas.TokenCreated,
    status_code=201,
    responses=created(*BODY, 403, 404, 409),
    tags=["users"],
)
def create_token(
    services: ServicesDep,
    name: str,
    req: Annotated[schemas.TokenCreate, Body(openapi_examples=_NEW_TOKEN)],
    user: CurrentUser,
    token: Credentials,
    response: Response,
) -> schemas.TokenCreated:
    """Create an API token for a user (yourself; an admin: anyone); the token is shown this once.

    `Location` is the token's URL (DELETE it to revoke the token)."""
    out = accounts.create_token(services.db, user, name, req, token.credentials if token else "")
    response.headers["Location"] = location("users", out.user, "tokens", out.id)
    return out


@router.get(
    "/users/{name}/tokens",
    response_model=list[schemas.TokenOut],
    responses=errors(401, 404),
    tags=["users"],
)
def list_tokens(services: ServicesDep, name: str, user: CurrentUser) -> list[schemas.TokenOut]:
    """A user's tokens: id, name, created, expires, revoked, last used (never the token itself)."""
    return accounts.list_tokens(services.db, user, name)


@router.delete(
    "/users/{name}/tokens/{token_id}",
    response_model=schemas.TokenOut,
    responses=errors(401, 404, 409, 422),
    tags=["users"],
)
def revoke_token(services: ServicesDep, name: str, token_id: TokenId, user: CurrentUser) -> schemas.TokenOut:
    """Revoke a token at once: every later request with it answers 401. 409: it is the last active
    token of any admin (create another first)."""
    return accounts.revoke_token(services.db, user, name, token_id)


@router.get("/inventory", response_model=schemas.InventoryOut, responses=errors(401), tags=["meta"])
def get_inventory(services: ServicesDep, _user: CurrentUser) -> schemas.InventoryOut:
    """GPUs of this node and how many are in use."""
    return services.inventory_out()


@router.get("/images", response_model=list[schemas.ImageOut], responses=errors(401, 409), tags=["meta"])
def list_images(services: ServicesDep, _user: CurrentUser) -> list[schemas.ImageOut]:
    """Images clusters can be created from (`elastrain image build` adds them); 409: the backend cannot
    list them now."""
    return services.images()
