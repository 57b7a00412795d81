"""The Decision API over HTTP (docs/serving.md): `POST /v1/systemone`, `GET /v1/models`, `GET /healthz`, and
`GET /metrics` (Prometheus).

A thin FastAPI layer: request and response models, keys and status codes. Parsing, the forward pass,
temperatures and answer shaping are `pipeline.data.answers` and the model family (`pipeline.families`), shared with the smoke test
and the MLflow model; the model catalog and alias following are `pipeline.serving.catalog`, micro-batching is
`pipeline.serving.batching`.

    decision serve --model models/vader-minilm --port 8000
    decision serve --model models:/decision-model@champion --keys keys.json
"""

import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

import orjson
import torch
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.cpu.budget import CpuBudget, apply_threads, plan_threads
from pipeline.cpu.load import ThreadGovernor
from pipeline.data.answers import (
    InvalidRequest,
    ParsedRequest,
    RequestTooLarge,
    parse_request,
    request_limits,
    request_parts,
)
from pipeline.data.contract import QUESTION_TYPES
from pipeline.device import precision_name, serving_dtype
from pipeline.families.base import Answered, BadQuestion
from pipeline.flywheel.feedback import MAX_ITEMS, FeedbackRefused, Labeller, store_feedback
from pipeline.flywheel.log import InferenceLog, LogConfig, Served
from pipeline.flywheel.table import POSTGRES_SCHEMES, new_decision_id
from pipeline.mlops.tracking import record_shadow
from pipeline.serving.batching import MicroBatcher, QueueFull
from pipeline.serving.body import BodyLimits, DecodeBodyMiddleware
from pipeline.serving.catalog import Catalog, ModelForbidden, ModelLoading, ModelNotFound, ServedModel
from pipeline.serving.errors import ERROR_RESPONSES, api_error, error_detail, error_json
from pipeline.serving.keys import KeyStore, load_keys
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.shadow import ShadowScorer

log = logging.getLogger("decision.serve")
RETRY_AFTER_LOADING_S = 5
RETRY_AFTER_BUSY_S = 1
DECISION_ID_HEADER = "X-Decision-Id"
JSONText = str | dict[str, Any] | list[Any] | None
# What a question's fields may hold, as the OpenAPI schema shows it. The shape is checked by `parse_request`, which
# says per question type what its criteria must be (pydantic's check of a union named each branch's type instead).
_SHOWN = {name: WithJsonSchema(TypeAdapter(shape).json_schema())
          for name, shape in (("instructions", JSONText), ("criteria", dict[str, JSONText] | list[JSONText] | None))}  # fmt: skip


class QuestionIn(BaseModel):
    """One question: `criteria` per type (choice: object or list of ids; score: list of levels; noul: optional)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal[QUESTION_TYPES]  # type: ignore[valid-type]
    instructions: Annotated[Any, _SHOWN["instructions"]] = None
    criteria: Annotated[Any, _SHOWN["criteria"]] = None


class DecisionRequest(BaseModel):
    """A state (text or any JSON) and named questions about it."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = Field(None, description="default, jev-latest, jev-preview, or a name from /v1/models")
    state: Any = Field(..., description="text or any JSON value")
    questions: dict[str, QuestionIn] = Field(..., min_length=1)

    @field_validator("state")
    @classmethod
    def _state_present(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("state is required (text or any JSON value, not null)")
        return value


JEV_CONFIDENCE = "the Jev confidence (max p - 1/n) / (1 - 1/n) over the n options: 0 uniform, 1 certain"
TOP_PROBABILITY = "max p: the chosen option's probability (not a Jev field)"


class ChoiceAnswer(BaseModel):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(description=JEV_CONFIDENCE)
    x_top_probability: float = Field(description=TOP_PROBABILITY)


class ScoreAnswer(BaseModel):
    type: Literal["score"]
    score: float
    legend: dict[str, Any]
    probabilities: dict[str, float]
    confidence: float = Field(description=JEV_CONFIDENCE.replace("options", "levels"))
    x_top_probability: float = Field(description=TOP_PROBABILITY.replace("option", "level"))


class NoulAnswer(BaseModel):
    """P(true), and no confidence (docs/serving.md)."""

    type: Literal["noul"]
    noul: float
    x_confidence: float = Field(description="max(P(true), 1 - P(true)) (not a Jev field)")


class FeedbackItem(BaseModel):
    """The outcome of one logged decision."""

    decision_id: str = Field(min_length=1, description="the decision_id its answer carried")
    gold: dict[str, Any] = Field(min_length=1, description="{question_id: label or {label, probabilities}}")


# One item or a list of them, told apart by the body's JSON kind: a malformed item is then one error at its field
# (loc body.item.gold, or body.items.0.gold), where a plain union reported each branch's failure.
FeedbackBody = Annotated[
    Annotated[FeedbackItem, Tag("item")]
    | Annotated[list[FeedbackItem], Field(min_length=1, max_length=MAX_ITEMS), Tag("items")],
    Discriminator(lambda body: "items" if isinstance(body, list) else "item"),
]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class DecisionResponse(BaseModel):
    model: str
    decision_id: str = Field(
        description="this decision's id (also the X-Decision-Id header): what "
        "POST /v1/feedback labels; real Jev clients ignore it"
    )
    answers: dict[str, Annotated[ChoiceAnswer | ScoreAnswer | NoulAnswer, Field(discriminator="type")]]
    usage: Usage


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
    """A request whose questions hold more characters is answered in parts of about this many, one after another,
    so requests that come meanwhile run between them rather than wait for all of it (`request_parts`)."""


BEARER = HTTPBearer(auto_error=False, description="An API key as `Authorization: Bearer <key>`.")
API_KEY = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="An API key (the same keys as Bearer)."
)


@dataclass(frozen=True)
class Caller:
    owner: str | None  # None: no key (or an open server)
    open_server: bool
    admin: bool = False  # an admin key: may label any logged decision


def create_app(catalog: Catalog, keys: KeyStore, config: ServerConfig = ServerConfig(),
               shadow: ShadowScorer | None = None, threads: ThreadGovernor | None = None,
               log_config: LogConfig | None = None) -> FastAPI:  # fmt: skip
    """The Decision API app; the catalog starts loading (and following its alias) when the app starts. With
    `shadow`, a sampled share of the serving model's answered requests is scored by the challenger after the
    answer has gone out (`/v1/shadow` reports the comparison). `threads` follows the CPU budget the process was
    given (and other processes' load, where the budget was found, not set); every batch runs on its count, and
    `/healthz` says how many threads and why. With `log_config` (and its `where` set) every answered decision is
    written to the inference log under the id its answer carries, off the hot path."""
    if config.require_key and keys.open:
        raise ValueError("--require-key: no API keys are configured (--keys or DECISION_API_KEYS)")
    limits = request_limits() | {"max_body_bytes": config.limits.max_body_bytes,
                                 "max_compressed_body_bytes": config.limits.max_compressed_bytes}  # fmt: skip
    metrics = ServerMetrics(lambda: batcher.queued, lambda: inference_log.queued if inference_log else 0,
                            _monitor_folder(log_config))  # fmt: skip
    inference_log = None
    if log_config is not None and log_config.where is not None:
        inference_log = InferenceLog(log_config, on_drop=metrics.log_drop, on_write=metrics.log_written)
    batcher = MicroBatcher(
        _following(threads),
        config.max_batch_items,
        config.max_wait_s,
        config.max_queue,
        metrics.batch,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if keys.open:
            log.warning("no API keys configured: the server is open to every caller and shows every model")
        catalog.start()
        batcher.start()
        if threads is not None:
            threads.start()
        if shadow is not None:
            shadow.start(busy=lambda: batcher.busy)
        if inference_log is not None:
            inference_log.start()
        yield
        if inference_log is not None:
            inference_log.stop()  # after the last answer: what was answered is written
        if shadow is not None:
            shadow.stop()
        await batcher.stop()
        if threads is not None:
            threads.stop()
        catalog.stop()

    app = FastAPI(title="Decision API", version="1", lifespan=lifespan,
                  description="System One decisions: calibrated probabilities per option in one forward pass.")  # fmt: skip
    app.add_middleware(DecodeBodyMiddleware, limits=config.limits)
    app.state.catalog, app.state.batcher, app.state.metrics = catalog, batcher, metrics
    app.state.inference_log = inference_log

    @app.middleware("http")
    async def measured(request: Request, call_next):
        # Decision requests only: a GET's 405 is none.
        if request.url.path != "/v1/systemone" or request.method != "POST":
            return await call_next(request)
        started = time.perf_counter()
        response = await call_next(request)
        metrics.answered(response.status_code, time.perf_counter() - started)
        return response

    # Every error leaves through `error_json` (pipeline.serving.errors): one body shape, safe for any input echoed.
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> Response:
        return error_json(422, jsonable_encoder(error.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, error: StarletteHTTPException) -> Response:
        return error_json(error.status_code, error.detail, error.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, error: Exception) -> Response:
        # Starlette still logs the traceback; the caller gets the JSON body instead of its plain text.
        return error_json(500, error_detail(500, f"internal error ({type(error).__name__}); logged"))

    def caller(request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
               x_api_key: Annotated[str | None, Depends(API_KEY)]) -> Caller:  # fmt: skip
        # HTTPBearer parses the header, but with auto_error=False (keyless callers are answered) it passes a
        # malformed one (`Basic ...`, `Bearer` with no key) over as absent; that must stay a 401, so whether
        # an Authorization header was sent at all is read here.
        if bearer is None and request.headers.get("authorization"):
            raise _unauthorized("Authorization must be 'Bearer <key>'")
        return _authenticate(keys, bearer.credentials if bearer else None, x_api_key, config.require_key)

    @app.post("/v1/systemone", response_model=DecisionResponse, responses=ERROR_RESPONSES)
    async def systemone(
        body: DecisionRequest, who: Annotated[Caller, Depends(caller)], request: Request
    ) -> Response:
        started = time.perf_counter()
        model = _resolve(catalog, body.model, who)
        questions = {qid: q.model_dump() for qid, q in body.questions.items()}
        try:
            parsed = parse_request(body.state, questions)
        except RequestTooLarge as error:
            raise api_error(413, str(error)) from None
        except InvalidRequest as error:
            return error_json(422, error.errors)
        try:
            result = await _answer_in_parts(batcher, model, parsed, config.part_chars, _turn_of(who, request))
        except QueueFull:
            raise api_error(
                503, "the server is busy", "overloaded_error", _retry_after(RETRY_AFTER_BUSY_S)
            ) from None
        except BadQuestion as error:
            return error_json(422, [_question_error(error)])
        except Exception as error:  # a server fault: a short JSON 500, and the server keeps serving
            log.exception("request failed in the model: %s", type(error).__name__)
            return error_json(500, error_detail(500, f"internal error ({type(error).__name__}); logged"))
        usage = {"input_tokens": result.input_tokens, "output_tokens": 0}
        decision_id = new_decision_id()
        response = _json({"model": model.name, "decision_id": decision_id, "answers": result.answers, "usage": usage},
                         headers={DECISION_ID_HEADER: decision_id})  # fmt: skip
        if inference_log is not None:
            inference_log.record(Served(decision_id, model.name, model.version, who.owner, body.state, questions,
                                        result.answers, (time.perf_counter() - started) * 1000))  # fmt: skip
        if shadow is not None and model is catalog.serving:
            shadow.offer(parsed, result.answers)  # after the answer is made; offer never blocks
        return response

    @app.post("/v1/feedback", responses=ERROR_RESPONSES)
    async def feedback(body: FeedbackBody, who: Annotated[Caller, Depends(caller)]) -> Response:
        """What actually happened, for logged decisions: one item or a list. Stored whole or not at all; a
        re-sent (decision, question) replaces its label. Only the key that made a decision (or an admin key)
        may label it."""
        if inference_log is None:
            raise api_error(
                404, "this server keeps no inference log (decision serve --inference-log DIR|URL)"
            )
        if who.owner is None and not who.open_server:
            raise _unauthorized("feedback needs an API key: the key that made the decision, or an admin key (a "
                                "decision made without a key may be labelled with an admin key only)")  # fmt: skip
        labeller = Labeller(who.owner, who.admin, who.open_server)
        # FeedbackItem has checked each item's shape and the list's length: what `parse_items` does for a file.
        items = [item.model_dump() for item in (body if isinstance(body, list) else [body])]
        try:
            stored = await run_in_threadpool(store_feedback, inference_log.store, items, labeller,
                                             flush=inference_log.flush)  # fmt: skip
        except FeedbackRefused as error:
            detail = error.errors if error.status == 422 else error_detail(error.status, str(error))
            return error_json(error.status, detail)
        except OSError as error:  # the log's folder full or read-only: nothing stored, and the caller told so
            log.error("feedback not stored: %s", error)
            raise api_error(
                503, f"feedback could not be stored ({type(error).__name__}); retry later"
            ) from None
        return _json({"stored": stored, "decisions": len({item["decision_id"] for item in items})})

    @app.get("/v1/models", responses=ERROR_RESPONSES)
    async def models(who: Annotated[Caller, Depends(caller)]) -> Response:
        try:
            return _json({"models": catalog.listing(who.owner, who.open_server, limits)})
        except ModelLoading as error:
            raise api_error(503, str(error), "model_loading", _retry_after(RETRY_AFTER_LOADING_S)) from None

    @app.get("/v1/shadow", responses=ERROR_RESPONSES)
    async def shadow_report(who: Annotated[Caller, Depends(caller)]) -> Response:
        if shadow is None:
            raise api_error(404, "no shadow challenger (decision serve --shadow models:/NAME@ALIAS)")
        return _json(shadow.summary())

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=metrics.content_type)

    @app.get("/healthz")
    async def healthz() -> Response:
        serving = catalog.serving
        body = {"status": "ok" if serving else "loading", "model": serving.name if serving else None,
                "error": catalog.load_error, "queued": batcher.queued, "batches": batcher.batches,
                "requests": batcher.jobs, "pid": os.getpid(), "precision": precision_name(catalog.dtype),
                **_backend_facts(catalog, serving),
                **(threads.state() if threads else {"threads": torch.get_num_threads(), "threads_source": "torch default"})}  # fmt: skip
        headers = {} if serving else {"Retry-After": str(RETRY_AFTER_LOADING_S)}
        return _json(body, 200 if serving else 503, headers)

    return app


def _monitor_folder(log_config: LogConfig | None) -> str | None:
    """Where the drift monitor leaves its summary by default: the inference folder (a PostgreSQL log has none)."""
    if log_config is None or log_config.where is None or log_config.where.startswith(POSTGRES_SCHEMES):
        return None
    return log_config.where


def _backend_facts(catalog: Catalog, serving: ServedModel | None) -> dict[str, Any]:
    """Where the serving model's encoder runs (`--backend`) and why; nothing while it loads."""
    if serving is None:
        return {"backend": None}
    choice = catalog.backends.get(serving.folder)
    return {"backend": serving.model.backend, "backend_reason": choice.reason if choice else None}


async def _answer_in_parts(batcher: MicroBatcher, model: ServedModel, parsed: ParsedRequest, part_chars: int,
                           turn: str) -> Answered:  # fmt: skip
    """The request's answers, its parts (`request_parts`) queued one after another in the line of `turn` (the
    batcher takes the lines in turn): new option texts cost the encoder a pass each (~6 ms per option on 2 cores),
    and 64 questions of 255 fresh options would otherwise hold the inference thread for a minute and more while
    every other caller waits."""
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


def _run_batch(model: ServedModel, requests: list[Any]) -> list[Any]:
    return model.model.answer(requests)


def _following(threads: ThreadGovernor | None) -> Callable[[ServedModel, list[Any]], list[Any]]:
    """`_run_batch` on the thread count `threads` says now, set in the inference thread that runs it (a torch
    thread count belongs to the thread that sets it)."""

    def run_batch(model: ServedModel, requests: list[Any]) -> list[Any]:
        if threads is not None:
            threads.follow()
        return _run_batch(model, requests)

    return run_batch


def _authenticate(keys: KeyStore, bearer: str | None, x_api_key: str | None, require_key: bool) -> Caller:
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


@dataclass(frozen=True)
class ServeOptions:
    """Everything a server process needs to build its app: what `--workers` hands to each worker process."""

    model: str
    keys: str | None = None
    finetunes: str | None = None
    poll_s: float = 5.0
    device: str = "cpu"
    precision: str = "fp32"  # or bf16 (autocast; refused where the device only emulates it)
    config: ServerConfig = field(default_factory=ServerConfig)
    workers: int = 1  # server processes, splitting the CPU budget between them
    shadow: str | None = None  # a challenger (folder or models:/NAME@ALIAS) scored off the hot path
    shadow_share: float = 0.1
    threads: int | None = None  # the CPU budget of all workers together (None: `cpu.budget.usable_cpus`)
    backend: str = "auto"  # where the encoder runs: torch, onnxruntime, or auto (`backends.choose_backend`)
    inference_log: LogConfig = field(default_factory=LogConfig)  # every worker writes its own files to it

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> "ServeOptions":
        data = json.loads(text)
        limits = BodyLimits(**data["config"].pop("limits"))
        logged = {k: tuple(v) if isinstance(v, list) else v for k, v in data.pop("inference_log").items()}
        return cls(**{**data, "config": ServerConfig(**data["config"], limits=limits),
                      "inference_log": LogConfig(**logged)})  # fmt: skip


OPTIONS_ENV = "DECISION_SERVE_OPTIONS"


def serving_threads(options: ServeOptions) -> CpuBudget:
    """Each server process's share of the CPU budget (`--threads`, else the cores it may use), split between the
    `--workers`."""
    return plan_threads(options.threads, "--threads", share=options.workers, sharing="workers")


def build_app(options: ServeOptions) -> FastAPI:
    """The app of one server process: its torch threads (`serving_threads`), its own catalog (the model loaded
    in this process) and batcher."""
    threads = serving_threads(options)
    apply_threads(threads)  # before the model loads: a thread keeps the pool size it first ran with
    log.info("torch threads in process %d: %s", os.getpid(), threads.describe())
    dtype = serving_dtype(options.precision, torch.device(options.device))
    catalog = Catalog(options.model, options.finetunes, poll_s=options.poll_s, device=options.device, dtype=dtype,
                      backend=options.backend)  # fmt: skip
    shadow = None
    if options.shadow:
        source = Catalog(options.shadow, poll_s=options.poll_s, device=options.device, dtype=dtype,
                         backend=options.backend)  # fmt: skip
        shadow = ShadowScorer(source, options.shadow_share, on_report=record_shadow)
    return create_app(catalog, load_keys(options.keys), options.config, shadow, ThreadGovernor(threads),
                      options.inference_log)  # fmt: skip


def app_from_environment() -> FastAPI:
    """uvicorn's app factory in each worker process (`--workers N`): options from the parent's environment.

    The CPU budget is split between the workers (`serving_threads`), so N processes do not each start a thread
    per core.
    """
    return build_app(ServeOptions.from_env(os.environ[OPTIONS_ENV]))


def run_server(
    options: ServeOptions, host: str = "127.0.0.1", port: int = 8000, access_log: bool = False
) -> None:
    """Serve until interrupted. One process batches every request in one place; `workers` > 1 runs that many
    processes on one port (uvicorn shares the listening socket), each with its own model and batcher."""
    import uvicorn

    if options.workers == 1:
        uvicorn.run(build_app(options), host=host, port=port, log_level="info", access_log=access_log)
        return
    log.info("%d workers, torch threads in each: %s", options.workers, serving_threads(options).describe())
    os.environ[OPTIONS_ENV] = options.to_env()
    uvicorn.run("pipeline.serving.server:app_from_environment", factory=True, workers=options.workers, host=host,
                port=port, log_level="info", access_log=access_log)  # fmt: skip
