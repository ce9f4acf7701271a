"""The OpenAPI document says what the routes do: their statuses, media types, headers and operationIds.

- `errors(...)` is a route's ``responses`` for the refusals it can answer; `finalize` then puts every
  4xx/5xx answer under ``application/problem+json`` (the `schemas.ErrorOut` model), whatever the route's
  own media type, replacing FastAPI's default 422 ``HTTPValidationError``;
- every answer declares the ``X-Request-ID`` header the access log adds;
- `operation_id` makes the operationIds camelCase verbs from the route functions' names
  (``create_cluster`` -> ``createCluster``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from elastrain.server import schemas
from elastrain.server.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPES, problem_type

ERROR_REF = "#/components/schemas/ErrorOut"
REQUEST_ID = {
    "description": "the request's id, as in the server's access log (elastrain.access)",
    "schema": {"type": "string"},
}
_WHY = {
    400: "The request cannot be read (e.g. a malformed Content-Length).",
    401: "No valid credential: a missing, unknown, expired or revoked token.",
    403: "Authenticated, but not allowed (not an admin, not the owner, over quota, a refused mount).",
    404: "No such object, or not one of the caller's.",
    409: "The object exists already or its state refuses the request (retry later).",
    413: "The request body is larger than the server's cap (--max-body-bytes).",
    422: "A value is refused; `errors` names every bad field.",
    429: "A per-user bound is reached (e.g. concurrent exec streams); retry when one ends.",
    500: "A server bug; the access log has the request id.",
    503: "Reads of this cluster's files still run (a few per cluster); retry later.",
    504: "A file the tenant can write did not answer within the read deadline; retry later.",
}
BODY = (401, 413, 422)
"""What a route with a request body can always answer: the body-limit middleware's 401 and 413, 422."""


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route for the refusals `statuses` (the content type is set by `finalize`)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        kind, title = problem_type(status)
        why = _WHY.get(status, title)
        out[status] = {"model": schemas.ErrorOut, "description": f"{title}: {why} Problem type `{kind}`."}
    return out


def merged(*parts: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """Several ``responses`` dicts as one (later ones win)."""
    out: dict[int | str, dict[str, Any]] = {}
    for part in parts:
        for status, spec in part.items():
            out[status] = {**out.get(status, {}), **spec}
    return out


def created(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a create route: 201 with ``Location``, and the refusals `statuses`."""
    location = {"description": "the URL of what was created", "schema": {"type": "string"}}
    return merged({201: {"headers": {"Location": location}}}, errors(*statuses))


def location(*segments: object) -> str:
    """The ``Location`` of a created object: ``/api/v1/`` and the segments, each URL-quoted."""
    return "/api/v1/" + "/".join(quote(str(s), safe="") for s in segments)


def operation_id(route: APIRoute) -> str:
    """``create_cluster`` -> ``createCluster``: the route function's name, camelCase."""
    first, *rest = route.name.split("_")
    return first + "".join(word[:1].upper() + word[1:] for word in rest)


def _problem_content() -> dict[str, Any]:
    """The ``content`` of every error answer: problem details."""
    return {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": ERROR_REF}}}


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_bound(value: float) -> int | float:
    """An integer schema's bound as the int pydantic declared: FastAPI writes it as a float, and
    ``float(2**63 - 1)`` is ``2**63`` (`schemas.MAX_DB_INT` is meant); a fractional bound is kept."""
    if value == float(schemas.MAX_DB_INT):
        return schemas.MAX_DB_INT
    return int(value) if value.is_integer() else value


def exact_integer_bounds(node: Any) -> None:
    """Rewrite in place every float bound of an integer schema (bodies, parameters) as an exact int, so
    that clients and fuzzers do not send ``9223372036854775999`` for a bound of ``2**63 - 1``."""
    if isinstance(node, list):
        for item in node:
            exact_integer_bounds(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        for key in _BOUNDS:
            if isinstance(node.get(key), float):
                node[key] = _exact_bound(node[key])
    for value in node.values():
        exact_integer_bounds(value)


def rewrite(document: dict[str, Any]) -> dict[str, Any]:
    """Errors as problem+json, X-Request-ID on every answer, no unused validation-error schemas,
    exact integer bounds (`exact_integer_bounds`)."""
    exact_integer_bounds(document)
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, response in operation["responses"].items():
                if str(status)[:1] in ("4", "5"):
                    response["content"] = _problem_content()
                    if response.get("description") == "Validation Error":
                        response["description"] = errors(422)[422]["description"]
                response.setdefault("headers", {}).setdefault("X-Request-ID", REQUEST_ID)
    components = document.get("components", {}).get("schemas", {})
    text = str(document.get("paths", {}))
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused in components and f"/{unused}'" not in text:
            del components[unused]
    if "ErrorOut" in components:
        kinds = ", ".join(f"`{problem_type(s)[0]}` ({s})" for s in PROBLEM_TYPES)
        components["ErrorOut"]["description"] += f" Problem types: {kinds}; other statuses: `about:blank`."
    return document


def finalize(app: FastAPI) -> None:
    """Serve `rewrite`'s document at ``app.openapi_url`` (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            app.openapi_schema = rewrite(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
