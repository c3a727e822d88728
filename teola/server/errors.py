"""Errors in OpenAI's format (`{"error": {"message", "type", "param", "code"}}`) with their status.

Every failure a route can meet is an `APIError`; one exception handler turns it into
the JSON response, so the official clients raise their matching exception classes
(`BadRequestError`, `AuthenticationError`, `NotFoundError`, `InternalServerError`).
Overload is a 503 with `Retry-After` (the clients wait that long and retry); a request
past its deadline is a 504.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from teola.server.schemas import ErrorResponse


class APIError(Exception):
    """A request failure with its HTTP status and OpenAI error type."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, object]:
        return ErrorResponse.of(self.message, self.type, self.param, self.code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def from_validation(error: ValidationError) -> APIError:
    """A 400 naming the offending field (`messages.0.content`), with every problem listed.

    A union's alternatives add their type to the location (`content.str`,
    `content.list[TextPart]`): the field named is the common prefix of the errors on the
    first offending top-level field.
    """
    items = error.errors(include_url=False)
    problems = []
    for item in items:
        loc = ".".join(str(p) for p in item["loc"])
        if item["type"] == "json_invalid":
            problems.append(f"invalid JSON: {item['msg']}")
        elif item["type"] == "extra_forbidden":
            problems.append(f"{loc}: unknown field")
        else:
            problems.append(f"{loc or 'body'}: {item['msg']}")
    param = None
    if items and items[0]["type"] != "json_invalid" and items[0]["loc"]:
        first = items[0]["loc"]
        same = [tuple(i["loc"]) for i in items if i["loc"] and i["loc"][0] == first[0]]
        prefix: list[object] = []
        for parts in zip(*same, strict=False):
            if len(set(parts)) != 1:
                break
            prefix.append(parts[0])
        param = ".".join(str(p) for p in prefix) or None
    return bad_request("; ".join(problems), param=param)


def app_failure(model: str, exc: BaseException, step: str | None = None) -> APIError:
    """A 500 naming the app, the exception and the step that raised it (`step`, as the
    framework's callbacks saw it, and the primitive Teola notes on the exception)."""
    notes = [n for n in getattr(exc, "__notes__", []) if isinstance(n, str)]
    where = [f"in step {step!r}"] if step else []
    detail = f" ({'; '.join(where + notes)})" if where or notes else ""
    return APIError(500, f"app {model!r} failed: {type(exc).__name__}: {exc}{detail}", "server_error", code="app_error")


def overloaded(model: str, why: str, retry_after_s: int) -> APIError:
    """A 503 the OpenAI clients retry after `Retry-After` seconds."""
    return APIError(
        503,
        f"model {model!r} is overloaded ({why}); retry in {retry_after_s} s",
        "server_error",
        code="overloaded",
        headers={"Retry-After": str(retry_after_s), "retry-after-ms": str(retry_after_s * 1000)},
    )


def past_deadline(model: str, timeout_s: float) -> APIError:
    return APIError(
        504,
        f"the request to model {model!r} ran past the server's request timeout ({timeout_s:g} s); its query was "
        "cancelled (teola serve --request-timeout)",
        "server_error",
        code="request_timeout",
    )


def unsupported_media(content_type: str) -> APIError:
    shown = content_type or "none"
    return APIError(415, f"Content-Type must be application/json, got {shown}", "invalid_request_error")


async def handle_api_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI exception handler for `APIError`."""
    if not isinstance(exc, APIError):
        raise exc
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else exc.headers
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)
