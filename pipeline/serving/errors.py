"""Error bodies of the Decision API (docs/serving.md): one shape for every error but 422.

    {"detail": {"error_type": "authentication_error", "message": "unknown API key"}}

A 422 keeps FastAPI's list, `{"detail": [{"loc", "msg", "type"}]}`, which clients parse field by field. Every
other refusal (the app's, Starlette's own 404 and 405, the body middleware's 400, 413 and 415, a 500) is built
here, so a client reads `detail.error_type` to decide what to do and `detail.message` to tell a person why.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, Field
from starlette.responses import Response

# The error type of each status when the code raising it names none (Starlette's own 404 and 405, say).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_error",
    500: "internal_error",
    503: "overloaded_error",
}
FALLBACK_TYPE = "api_error"


class ErrorDetail(BaseModel):
    error_type: str = Field(
        description="authentication_error, permission_error, not_found_error, "
        "request_too_large, overloaded_error, model_loading, internal_error, ..."
    )
    message: str


class ErrorBody(BaseModel):
    """Every error but 422 (which is FastAPI's `{"detail": [{"loc", "msg", "type"}]}`)."""

    detail: ErrorDetail


# What the OpenAPI schema says each route may answer besides 200 and 422.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "invalid_request_error: a body sent as zstd that is not valid zstd",
        401: "authentication_error: an unknown API key, or none where the server requires one",
        403: "permission_error: a keyless caller asked for a model other than the default",
        404: "not_found_error: no such model visible to this key",
        413: "request_too_large: over the size limits (body, questions, characters)",
        415: "unsupported_media_type: a Content-Encoding other than zstd or none",
        500: "internal_error: a server fault, logged",
        503: "model_loading or overloaded_error (the queue is full); see Retry-After",
    }.items()
}


def error_detail(status: int, message: str, error_type: str | None = None) -> dict[str, str]:
    """`{"error_type", "message"}`; the type defaults to the status's (ERROR_TYPES)."""
    return {"error_type": error_type or ERROR_TYPES.get(status, FALLBACK_TYPE), "message": message}


def api_error(
    status: int, message: str, error_type: str | None = None, headers: dict[str, str] | None = None
) -> HTTPException:
    """An exception for a handler to raise; the app's HTTPException handler writes it as `error_json`."""
    return HTTPException(status, error_detail(status, message, error_type), headers)


def error_json(status: int, detail: Any, headers: dict[str, str] | None = None) -> Response:
    """The error response: a 422's list as it is, anything else as `{"error_type", "message"}` (a bare
    message, from Starlette or older code, gets its status's type)."""
    if status != 422 and not _is_detail(detail):
        detail = error_detail(status, str(detail))
    return Response(error_text(detail), status, headers, media_type="application/json")


def error_text(detail: Any) -> bytes:
    """`{"detail": ...}` as bytes no text the caller sent can break: errors may echo a field name or an input,
    so non-ASCII is escaped (an unpaired surrogate becomes its \\u escape instead of failing the response, as
    Starlette's strict UTF-8 would) and anything JSON has no form for is written as text."""
    if isinstance(detail, list):  # a 422's errors: what they quote of the input, bounded and always JSON
        detail = [
            {k: v if k in ("loc", "msg", "type") else _echoed(v) for k, v in error.items()}
            if isinstance(error, dict)
            else error
            for error in detail
        ]
    return json.dumps({"detail": detail}, ensure_ascii=True, default=str).encode("ascii")


MAX_ECHO_CHARACTERS = 200


def _echoed(value: Any) -> Any:
    """What a 422 quotes of the input: the value itself where it is short, strict JSON; else its JSON text as
    a string, cut at `MAX_ECHO_CHARACTERS` (a NaN state stays readable by strict parsers, and an 8 MB body
    that failed validation is not sent back)."""
    try:
        strict = json.dumps(value, ensure_ascii=True, default=str, allow_nan=False)
    except (ValueError, RecursionError):
        strict = None
    if strict is not None and len(strict) <= MAX_ECHO_CHARACTERS:
        return value
    try:
        text = strict or json.dumps(value, ensure_ascii=True, default=str)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep to show>"
    if len(text) <= MAX_ECHO_CHARACTERS:
        return text
    return f"{text[:MAX_ECHO_CHARACTERS]}... ({len(text):,} characters)"


def _is_detail(detail: Any) -> bool:
    return isinstance(detail, dict) and isinstance(detail.get("error_type"), str) and "message" in detail
