"""Every refusal as RFC 9457 problem details (``application/problem+json``).

    {"type": "https://elastrain.dev/problems/validation", "title": "Invalid request", "status": 422,
     "detail": "invalid request: name: ...; containers: ...", "instance": "/api/v1/clusters",
     "errors": [{"loc": "body.name", "message": "..."}, ...], "error": "<= detail (deprecated)"}

`type` names the kind of problem (one URI per kind, `PROBLEM_TYPES`; ``about:blank`` for a status
without one), `detail` is the one-line message that says how to fix the request, `instance` the
request path. Validation problems (422) list **every** bad field in `errors`. `error` repeats `detail`
for clients written against the old ``{"error", "status"}`` shape; it is deprecated.

`install` registers the handlers (`ApiError`, request validation, Starlette's HTTP exceptions, any other
exception) and `problem_response` is what the body-limit middleware answers with.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from elastrain.server.disk_full import DISK_FULL_DETAIL, is_disk_full
from elastrain.server.errors import ApiError, FieldError, InvalidRequest
from elastrain.server.redact import redact

log = logging.getLogger("elastrain.server")
PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "https://elastrain.dev/problems/"
PROBLEM_TYPES: dict[int, tuple[str, str]] = {
    400: ("bad-request", "Bad request"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    409: ("conflict", "Conflict"),
    413: ("too-large", "Request body too large"),
    422: ("validation", "Invalid request"),
    429: ("too-many", "Too many requests"),
    500: ("internal", "Internal server error"),
    507: ("storage-full", "Insufficient storage"),
}
"""status -> (the last part of the type URI, title): one problem type per kind of refusal."""


class ProblemResponse(JSONResponse):
    """A JSON response with the problem-details media type."""

    media_type = PROBLEM_MEDIA_TYPE


def problem_type(status: int) -> tuple[str, str]:
    """``(type URI, title)`` of a status: ours, else ``about:blank`` with the HTTP reason phrase."""
    if status in PROBLEM_TYPES:
        slug, title = PROBLEM_TYPES[status]
        return PROBLEM_BASE + slug, title
    try:
        return "about:blank", HTTPStatus(status).phrase
    except ValueError:
        return "about:blank", "Error"


def problem_body(
    status: int, detail: str, instance: str, errors: Sequence[FieldError] | None = None
) -> dict[str, Any]:
    """The problem-details object (validation problems always carry `errors`)."""
    kind, title = problem_type(status)
    detail = redact(detail)  # a refusal made deep down may name a server directory
    body: dict[str, Any] = {
        "type": kind,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors is not None or status == 422:
        body["errors"] = [{"loc": e.loc, "message": redact(e.message)} for e in errors or ()]
    body["error"] = detail  # deprecated: the old {"error", "status"} shape
    return body


def problem_response(
    status: int,
    detail: str,
    instance: str,
    errors: Sequence[FieldError] | None = None,
    headers: Mapping[str, str] | None = None,
) -> ProblemResponse:
    """A problem-details answer."""
    return ProblemResponse(
        problem_body(status, detail, instance, errors), status_code=status, headers=dict(headers or {})
    )


def validation_errors(raw: Iterable[Any]) -> list[FieldError]:
    """Every error pydantic reported, as ``loc`` (``body.name``, ``query.offset``) and message."""
    found = []
    for err in raw:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "request"
        message = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":  # loc is ("body", character offset)
            where = err.get("loc", ("body",))[-1]
            reason = (err.get("ctx") or {}).get("error", "")
            loc, message = "body", f"the body is not valid JSON ({reason} at character {where})"
        found.append(FieldError(loc, message))
    return found


BODY_UNREADABLE = "There was an error parsing the body"
"""FastAPI's 400 for a JSON body it cannot decode (bytes that are not UTF-8): answered as a 422."""


def unreadable_body(cause: BaseException | None) -> str:
    """Why a body FastAPI could not read is refused (its cause: a `UnicodeDecodeError`, mostly)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid JSON (not UTF-8 text: byte {cause.start} cannot be decoded)"
    return "the body is not valid JSON"


def validation_detail(errors: Sequence[FieldError]) -> str:
    """One line naming every bad field (the ``body.`` prefix left out, as the fields are the body's)."""
    parts = [f"{e.loc.removeprefix('body.')}: {e.message}" for e in errors]
    return "invalid request: " + "; ".join(parts)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@functools.lru_cache(maxsize=256)
def _template(path: str) -> re.Pattern[str]:
    """``/api/v1/jobs/{job_id}`` -> a pattern of the paths it routes (a parameter: one named segment)."""
    parts = re.split(r"\{([^}/]+)\}", path)
    return re.compile("".join(f"(?P<{p}>[^/]+)" if i % 2 else re.escape(p) for i, p in enumerate(parts)))


_INTEGER = re.compile(r"[+-]?\d+")


def _params_fit(operation: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    """Whether the path segments are of the operation's parameter types (``attach`` is no integer
    ``job_id``); bounds are left to the operation, which refuses them with a 422."""
    for param in operation.get("parameters", ()):
        value = values.get(param.get("name", "")) if param.get("in") == "path" else None
        integer = param.get("schema", {}).get("type") == "integer"
        if value is not None and integer and not _INTEGER.fullmatch(value):
            return False
    return True


def allowed_methods(app: FastAPI, path: str, fallback: str = "") -> str:
    """The ``Allow`` value of a 405 (RFC 9110): the methods of every documented operation whose path
    template matches `path` with segments of its parameters' types, else `fallback` (Starlette's value:
    the methods of the first route at that path)."""
    methods: set[str] = set()
    for template, item in app.openapi().get("paths", {}).items():
        found = _template(template).fullmatch(path)
        if found is None:
            continue
        for method, operation in item.items():
            if method.upper() in _METHODS and _params_fit(operation, found.groupdict()):
                methods.add(method.upper())
    if not methods:
        methods = {m.strip().upper() for m in fallback.split(",") if m.strip()}
    return ", ".join(sorted(methods, key=lambda m: (_METHODS.index(m) if m in _METHODS else 99, m)))


def instance_of(request: Request) -> str:
    """The request's path as it was sent (percent-encoded): a valid URI reference for `instance`,
    and never markup echoed back (``/clusters/%3Cscript%3E`` stays encoded)."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes) and raw:
        return raw.decode("latin-1").split("?", 1)[0]
    return quote(request.url.path, safe="/:@!$&'()*+,;=-._~")


def install(app: FastAPI) -> None:
    """Answer every refusal of `app` with problem details."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> ProblemResponse:
        errors = exc.errors if isinstance(exc, InvalidRequest) else None
        return problem_response(exc.status, str(exc), instance_of(request), errors)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> ProblemResponse:
        errors = validation_errors(exc.errors())
        return problem_response(422, validation_detail(errors), instance_of(request), errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> ProblemResponse:
        headers = dict(exc.headers or {})
        path, detail = instance_of(request), str(exc.detail)
        if exc.status_code == 400 and detail == BODY_UNREADABLE:  # FastAPI's: not UTF-8, say
            errors = [FieldError("body", unreadable_body(exc.__cause__))]
            return problem_response(422, validation_detail(errors), path, errors)
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(app, path, headers.get("Allow", ""))
            detail = f"{request.method} is not allowed on {path}; allowed: {headers['Allow']}"
        elif exc.status_code == 404 and detail == "Not Found":
            detail = f"no such route: {path} (the API is under /api/v1; see /docs)"
        return problem_response(exc.status_code, detail, path, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> ProblemResponse:
        if is_disk_full(exc):
            log.warning("a write failed, the data directory is full: %s", exc)
            return problem_response(507, DISK_FULL_DETAIL, instance_of(request))
        log.exception("unhandled error")
        return problem_response(500, f"internal error: {type(exc).__name__}", instance_of(request))
