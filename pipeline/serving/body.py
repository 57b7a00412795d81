"""Request bodies for the Decision API: size limits and `Content-Encoding: zstd`, before any JSON is parsed.

Clients compress bodies of 1 KiB or more with zstd (typesafe-sdk does by default). This ASGI middleware reads
the body once, refuses one over the limit with 413 (the compressed size first, then the decompressed size,
read through a bounded stream so a small bomb cannot expand in memory), answers 422 where one JSON object
gives a key twice (a question id: parsers keep the last silently), 400 for a body that is not valid zstd and
415 for an encoding it does not know or a Content-Type that is not JSON (each as `pipeline.serving.errors`
writes every error), and hands the app the plain JSON (a body sent with no Content-Type is read as JSON).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from pipeline.serving.errors import error_detail, error_text

PLAIN_ENCODINGS = {"", "identity"}


@dataclass(frozen=True)
class BodyLimits:
    max_body_bytes: int = 8 * 1024 * 1024  # 64 questions x 20,000 characters, a 200,000-character state, JSON
    max_compressed_bytes: int = 8 * 1024 * 1024


class BodyRejected(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DecodeBodyMiddleware:
    """Pure ASGI (no per-request task): buffers and decodes request bodies, passes everything else through."""

    def __init__(self, app, limits: BodyLimits = BodyLimits()) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
        try:
            check_declared(headers, self.limits)
            body = decode_body(
                await _read_body(receive, self.limits.max_compressed_bytes), encoding, self.limits
            )
        except BodyRejected as error:
            await _reject(send, error.status, str(error))
            return
        repeated = repeated_key(body)
        if repeated is not None:  # a 422 as FastAPI writes them: its list of errors
            await _reject(send, 422, [{"loc": ["body"], "msg": repeated, "type": "value_error"}])
            return
        dropped = (b"content-encoding", b"content-length", b"content-type")
        kept = [(k, v) for k, v in scope["headers"] if k not in dropped]
        sent = [(b"content-length", str(len(body)).encode()), (b"content-type", JSON)]  # none sent: JSON too
        await self.app({**scope, "headers": [*kept, *sent]}, _replay(body), send)


JSON = b"application/json"


def check_declared(headers: dict[bytes, bytes], limits: BodyLimits) -> None:
    """Refuse from the headers alone: a Content-Type that is not JSON (415: a form or plain text would reach
    the app as one long string and come back echoed in a 422), and a Content-Length over the limit (413 at
    once, rather than waiting for bytes the limit would refuse anyway)."""
    declared = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if declared and declared != JSON.decode() and not declared.endswith("+json"):
        raise BodyRejected(
            415,
            f"Content-Type {declared!r} is not supported: send the body as JSON with "
            "Content-Type: application/json (curl: -H 'Content-Type: application/json')",
        )
    length = headers.get(b"content-length", b"").strip()
    if length.isdigit() and int(length) > limits.max_compressed_bytes:
        raise BodyRejected(413, f"{int(length)} bytes declared, at most {limits.max_compressed_bytes}")


def decode_body(raw: bytes, encoding: str, limits: BodyLimits) -> bytes:
    """The plain body, or BodyRejected with the status and reason."""
    if encoding in PLAIN_ENCODINGS:
        if len(raw) > limits.max_body_bytes:
            raise BodyRejected(413, f"body of {len(raw)} bytes, at most {limits.max_body_bytes}")
        return raw
    if encoding != "zstd":
        raise BodyRejected(415, f"Content-Encoding {encoding!r} is not supported (send zstd or none)")
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            body = reader.read(limits.max_body_bytes + 1)
    except zstandard.ZstdError as error:
        raise BodyRejected(400, f"the body is not valid zstd: {error}") from None
    if len(body) > limits.max_body_bytes:
        raise BodyRejected(413, f"decompressed body over {limits.max_body_bytes} bytes")
    return body


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyRejected(413, f"body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def repeated_key(body: bytes) -> str | None:
    """What is wrong where one JSON object gives a key twice (a question id, an option), or None. JSON parsers
    keep the last silently, so the first question would go unanswered and unsaid. A body that is no JSON is
    left to the app's own 422."""
    try:
        return decode_noting_repeats(body)[1]
    except (ValueError, RecursionError):
        return None


def decode_noting_repeats(text: str | bytes) -> tuple[Any, str | None]:
    """The JSON value, and what is wrong where one of its objects gives a key twice (None where none does);
    ValueError (or RecursionError) for text that is no JSON. An escaped unpaired surrogate is kept, for the
    request's own check to name."""
    repeated: list[str] = []

    def noting(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        repeated.extend(key for i, key in enumerate(keys) if key in keys[:i])
        return dict(pairs)

    decoded = json.loads(text, object_pairs_hook=noting)
    said = f"key {repeated[0]!r} is given twice in one JSON object; give each key once" if repeated else None
    return decoded, said


async def _reject(send, status: int, message: str | list[dict[str, Any]]) -> None:
    payload = error_text(message if isinstance(message, list) else error_detail(status, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
