"""The Decision API's routes (docs/serving.md): `POST /v1/systemone`, `POST /v1/feedback`, `GET /v1/models`,
`GET /v1/shadow`, `GET /healthz` and `GET /metrics`, with what they share: the caller's key (`caller`), the
error handlers every error leaves through (`ERROR_HANDLERS`) and the timing of decision requests (`measured`).

The handlers hold no state: each reads what its app serves with (`AppParts`: the catalog, the batcher, the
metrics, the keys, ...) from `request.app.state.parts`, which `pipeline.serving.server.create_app` sets.
"""

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
import torch
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.cpu.load import ThreadGovernor
from pipeline.data.answers import (
    InvalidRequest,
    ParsedRequest,
    RequestTooLarge,
    parse_request,
    request_limits,
    request_parts,
)
from pipeline.device import precision_name
from pipeline.families.base import Answered, BadQuestion
from pipeline.flywheel.feedback import FeedbackRefused, Labeller, store_feedback
from pipeline.flywheel.log import InferenceLog, Served
from pipeline.flywheel.table import new_decision_id
from pipeline.serving.batching import MicroBatcher, QueueFull
from pipeline.serving.body import BodyLimits
from pipeline.serving.catalog import Catalog, ModelForbidden, ModelLoading, ModelNotFound, ServedModel
from pipeline.serving.errors import ERROR_RESPONSES, api_error, error_detail, error_json
from pipeline.serving.keys import KeyStore
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.schema import DecisionRequest, DecisionResponse, FeedbackBody
from pipeline.serving.shadow import ShadowScorer

log = logging.getLogger("decision.serve")
RETRY_AFTER_LOADING_S = 5
RETRY_AFTER_BUSY_S = 1
DECISION_ID_HEADER = "X-Decision-Id"


@dataclass(frozen=True)
class ServerConfig:
    """Batching, size limits and key policy of one server."""

    max_batch_items: int = 64
    """Questions per forward pass (`--max-batch`)."""
    max_wait_s: float = 0.002
    """How long a batch waits to fill (`--max-wait-ms`)."""
    max_queue: int = 256
    """Waiting requests before a 503 (`--max-queue`)."""
    limits: BodyLimits = field(default_factory=BodyLimits)
    """Request body limits, compressed and decompressed (`--max-body-mb`)."""
    require_key: bool = False
    """Every keyless request is a 401, the default model's too (`--require-key`); needs keys configured."""
    part_chars: int = 10_000
    """A request whose questions hold more characters is answered in parts of about this many, one after
    another, so requests that come meanwhile run between them rather than wait for all of it
    (`request_parts`)."""


@dataclass(frozen=True)
class AppParts:
    """What one app serves with: built once by `create_app`, read by every handler from `app.state.parts`."""

    catalog: Catalog
    batcher: MicroBatcher
    metrics: ServerMetrics
    keys: KeyStore
    config: ServerConfig
    shadow: ShadowScorer | None = None
    threads: ThreadGovernor | None = None
    inference_log: InferenceLog | None = None

    @property
    def limits(self) -> dict[str, Any]:
        """What one request may hold, as `/v1/models` states it: `request_limits` and the body limits."""
        body = self.config.limits
        sizes = {
            "max_body_bytes": body.max_body_bytes,
            "max_compressed_body_bytes": body.max_compressed_bytes,
        }
        return request_limits() | sizes


def app_parts(request: Request) -> AppParts:
    """The parts of the app that `request` came to (a dependency of every handler)."""
    return request.app.state.parts


Parts = Annotated[AppParts, Depends(app_parts)]

BEARER = HTTPBearer(auto_error=False, description="An API key as `Authorization: Bearer <key>`.")
API_KEY = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="An API key (the same keys as Bearer)."
)


@dataclass(frozen=True)
class Caller:
    owner: str | None  # None: no key (or an open server)
    open_server: bool
    admin: bool = False  # an admin key: may label any logged decision


def caller(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    x_api_key: Annotated[str | None, Depends(API_KEY)],
) -> Caller:
    """Who sent the request, by its key (`authenticate`): the dependency of every route that needs to know."""
    # HTTPBearer parses the header, but with auto_error=False (keyless callers are answered) it passes a
    # malformed one (`Basic ...`, `Bearer` with no key) over as absent; that must stay a 401, so whether
    # an Authorization header was sent at all is read here.
    if bearer is None and request.headers.get("authorization"):
        raise _unauthorized("Authorization must be 'Bearer <key>'")
    parts = app_parts(request)
    return authenticate(
        parts.keys, bearer.credentials if bearer else None, x_api_key, parts.config.require_key
    )


def authenticate(keys: KeyStore, bearer: str | None, x_api_key: str | None, require_key: bool) -> Caller:
    """401 for a key the server does not know, two different keys in one request, or no key where one is
    required."""
    presented = {k.strip() for k in (bearer, x_api_key) if k and k.strip()}
    if len(presented) > 1:
        raise _unauthorized("Authorization and X-API-Key name different keys")
    if keys.open:
        return Caller(None, True)
    if not presented:
        if require_key:
            raise _unauthorized("this server requires an API key (Authorization: Bearer <key> or X-API-Key)")
        return Caller(None, False)
    key = presented.pop()
    owner = keys.owner_of(key)
    if owner is None:
        raise _unauthorized("unknown API key")
    return Caller(owner, False, keys.is_admin(key))


Who = Annotated[Caller, Depends(caller)]
router = APIRouter()


@router.post("/v1/systemone", response_model=DecisionResponse, responses=ERROR_RESPONSES)
async def systemone(body: DecisionRequest, who: Who, request: Request, parts: Parts) -> Response:
    started = time.perf_counter()
    model = _resolve(parts.catalog, body.model, who)
    questions = {qid: q.model_dump() for qid, q in body.questions.items()}
    try:
        parsed = parse_request(body.state, questions)
    except RequestTooLarge as error:
        raise api_error(413, str(error)) from None
    except InvalidRequest as error:
        return error_json(422, error.errors)
    result = await _answered(parts, model, parsed, _turn_of(who, request))
    decision_id = new_decision_id()
    usage = {"input_tokens": result.input_tokens, "output_tokens": 0}
    answer = {"model": model.name, "x_decision_id": decision_id, "answers": result.answers, "usage": usage}
    response = _json(answer, headers={DECISION_ID_HEADER: decision_id})
    if parts.inference_log is not None:
        latency_ms = (time.perf_counter() - started) * 1000
        served = Served(
            decision_id=decision_id,
            model=model.name,
            model_version=model.version,
            owner=who.owner,
            state=body.state,
            questions=questions,
            answers=result.answers,
            latency_ms=latency_ms,
        )
        parts.inference_log.record(served)
    if parts.shadow is not None and model is parts.catalog.serving:
        parts.shadow.offer(parsed, result.answers)  # after the answer is made; offer never blocks
    return response


@router.post("/v1/feedback", responses=ERROR_RESPONSES)
async def feedback(body: FeedbackBody, who: Who, parts: Parts) -> Response:
    """What actually happened, for logged decisions: one item or a list. Stored whole or not at all; a
    re-sent (decision, question) replaces its label. Only the key that made a decision (or an admin key)
    may label it."""
    inference_log = parts.inference_log
    if inference_log is None:
        raise api_error(404, "this server keeps no inference log (decision serve --inference-log DIR|URL)")
    if who.owner is None and not who.open_server:
        raise _unauthorized(
            "feedback needs an API key: the key that made the decision, or an admin key (a "
            "decision made without a key may be labelled with an admin key only)"
        )
    labeller = Labeller(who.owner, who.admin, who.open_server)
    # FeedbackItem has checked each item's shape and the list's length: what `parse_items` does for a file.
    items = [item.model_dump() for item in (body if isinstance(body, list) else [body])]
    try:
        stored = await run_in_threadpool(
            store_feedback, inference_log.store, items, labeller, flush=inference_log.flush
        )
    except FeedbackRefused as error:
        detail = error.errors if error.status == 422 else error_detail(error.status, str(error))
        return error_json(error.status, detail)
    except OSError as error:  # the log's folder full or read-only: nothing stored, and the caller told so
        log.error("feedback not stored: %s", error)
        raise api_error(503, f"feedback could not be stored ({type(error).__name__}); retry later") from None
    return _json({"stored": stored, "decisions": len({item["decision_id"] for item in items})})


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(who: Who, parts: Parts) -> Response:
    try:
        return _json({"models": parts.catalog.listing(who.owner, who.open_server, parts.limits)})
    except ModelLoading as error:
        raise api_error(503, str(error), "model_loading", _retry_after(RETRY_AFTER_LOADING_S)) from None


@router.get("/v1/shadow", responses=ERROR_RESPONSES)
async def shadow_report(who: Who, parts: Parts) -> Response:
    if parts.shadow is None:
        raise api_error(404, "no shadow challenger (decision serve --shadow models:/NAME@ALIAS)")
    return _json(parts.shadow.summary())


@router.get("/metrics", include_in_schema=False)
async def prometheus(parts: Parts) -> Response:
    return Response(parts.metrics.exposition(), media_type=parts.metrics.content_type)


@router.get("/healthz")
async def healthz(parts: Parts) -> Response:
    catalog, batcher, serving = parts.catalog, parts.batcher, parts.catalog.serving
    body = {
        "status": "ok" if serving else "loading",
        "model": serving.name if serving else None,
        "error": catalog.load_error,
        "queued": batcher.queued,
        "batches": batcher.batches,
        "requests": batcher.jobs,
        "pid": os.getpid(),
        **(catalog.precision_facts(serving) if serving else {"precision": precision_name(catalog.dtype)}),
        **_backend_facts(catalog, serving),
        **_thread_facts(parts.threads),
    }
    headers = {} if serving else _retry_after(RETRY_AFTER_LOADING_S)
    return _json(body, 200 if serving else 503, headers)


async def measured(request: Request, call_next):
    """The latency and status of every decision request, for `/metrics` (the app's outermost middleware)."""
    # Decision requests only: a GET's 405 is none.
    if request.url.path != "/v1/systemone" or request.method != "POST":
        return await call_next(request)
    started = time.perf_counter()
    response = await call_next(request)
    app_parts(request).metrics.answered(response.status_code, time.perf_counter() - started)
    return response


# Every error leaves through `error_json` (pipeline.serving.errors): one body shape, safe for echoed input.
async def invalid(request: Request, error: RequestValidationError) -> Response:
    return error_json(422, jsonable_encoder(error.errors()))


async def refused(request: Request, error: StarletteHTTPException) -> Response:
    return error_json(error.status_code, error.detail, error.headers)


async def crashed(request: Request, error: Exception) -> Response:
    # Starlette still logs the traceback; the caller gets the JSON body instead of its plain text.
    return error_json(500, error_detail(500, f"internal error ({type(error).__name__}); logged"))


ERROR_HANDLERS = {RequestValidationError: invalid, StarletteHTTPException: refused, Exception: crashed}


def _backend_facts(catalog: Catalog, serving: ServedModel | None) -> dict[str, Any]:
    """Where the serving model's encoder runs (`--backend`) and why; nothing while it loads."""
    if serving is None:
        return {"backend": None}
    choice = catalog.backends.get(serving.folder)
    return {"backend": serving.model.backend, "backend_reason": choice.reason if choice else None}


def _thread_facts(threads: ThreadGovernor | None) -> dict[str, Any]:
    """How many torch threads a batch runs on, and why (`--threads`, the CPU budget, others' load)."""
    if threads is None:
        return {"threads": torch.get_num_threads(), "threads_source": "torch default"}
    return threads.state()


async def _answered(parts: AppParts, model: ServedModel, parsed: ParsedRequest, turn: str) -> Answered:
    """The request's answers (`_answer_in_parts`), or the HTTP error its failure is: a 503 with Retry-After
    for a full queue, a 422 for a question the model cannot answer, a short 500 for a fault in the model."""
    try:
        return await _answer_in_parts(parts.batcher, model, parsed, parts.config.part_chars, turn)
    except QueueFull:
        raise api_error(
            503, "the server is busy", "overloaded_error", _retry_after(RETRY_AFTER_BUSY_S)
        ) from None
    except BadQuestion as error:
        raise HTTPException(422, [_question_error(error)]) from None
    except (
        Exception
    ) as error:  # a server fault: logged, the caller told in the JSON body, and the server serves on
        log.exception("request failed in the model: %s", type(error).__name__)
        raise api_error(500, f"internal error ({type(error).__name__}); logged") from None


async def _answer_in_parts(
    batcher: MicroBatcher, model: ServedModel, parsed: ParsedRequest, part_chars: int, turn: str
) -> Answered:
    """The request's answers, its parts (`request_parts`) queued one after another in the line of `turn` (the
    batcher takes the lines in turn): new option texts cost the encoder a pass each (~6 ms per option on 2
    cores), and 64 questions of 255 fresh options would otherwise hold the inference thread for a minute and
    more while every other caller waits."""
    parts = request_parts(parsed, part_chars)
    results = [await batcher.submit(model, part, len(part.questions), turn) for part in parts]
    answers = {qid: answer for result in results for qid, answer in result.answers.items()}
    return Answered(answers, sum(result.input_tokens for result in results))


def _turn_of(who: Caller, request: Request) -> str:
    """Whose line a request waits in: its key's owner, else (no key, an open server) the client's address; one
    proxy in front of an open server makes every request one caller's, as a plain queue would."""
    if who.owner is not None:
        return f"owner:{who.owner}"
    return f"address:{request.client.host if request.client else 'unknown'}"


def _unauthorized(message: str) -> HTTPException:
    return api_error(401, message, "authentication_error", {"WWW-Authenticate": "Bearer"})


def _retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


def _resolve(catalog: Catalog, requested: str | None, who: Caller) -> ServedModel:
    try:
        return catalog.resolve(requested, who.owner, who.open_server)
    except ModelForbidden as error:
        raise api_error(403, str(error), "permission_error") from None
    except ModelNotFound as error:
        raise api_error(404, str(error), "not_found_error") from None
    except ModelLoading as error:
        raise api_error(503, str(error), "model_loading", _retry_after(RETRY_AFTER_LOADING_S)) from None


def _question_error(error: BadQuestion) -> dict[str, Any]:
    loc = ["body", "questions", error.question_id] if error.question_id else ["body", "questions"]
    return {"loc": loc, "msg": str(error), "type": "value_error"}


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")
