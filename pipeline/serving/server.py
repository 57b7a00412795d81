"""The Decision API server (docs/serving.md): the app made from its parts, and the processes that run it.

`create_app` puts together what one app serves with (`routes.AppParts`: the catalog, the micro-batcher, the
metrics, the keys, the shadow, the inference log), the routes (`pipeline.serving.routes`, on the bodies of
`pipeline.serving.schema`) and their lifespan. `build_app` makes the app from `ServeOptions` in each server
process; `run_server` starts one process, or `--workers` of them on one port.

    decision serve --model models/vader-minilm --port 8000
    decision serve --model models:/decision-model@champion --keys keys.json
"""

import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from fastapi import FastAPI
from starlette.middleware.base import BaseHTTPMiddleware

from pipeline.cpu.budget import CpuBudget, apply_threads, plan_threads
from pipeline.cpu.load import ThreadGovernor
from pipeline.device import serving_dtype
from pipeline.flywheel.log import InferenceLog, LogConfig
from pipeline.flywheel.table import POSTGRES_SCHEMES
from pipeline.mlops.tracking import record_shadow
from pipeline.serving import routes
from pipeline.serving.batching import MicroBatcher
from pipeline.serving.body import BodyLimits, DecodeBodyMiddleware
from pipeline.serving.catalog import Catalog, ServedModel
from pipeline.serving.keys import KeyStore, load_keys
from pipeline.serving.metrics import ServerMetrics
from pipeline.serving.routes import AppParts, ServerConfig
from pipeline.serving.shadow import ShadowScorer

log = logging.getLogger("decision.serve")
DESCRIPTION = "System One decisions: calibrated probabilities per option in one forward pass."


def create_app(
    catalog: Catalog,
    keys: KeyStore,
    config: ServerConfig = ServerConfig(),
    shadow: ShadowScorer | None = None,
    threads: ThreadGovernor | None = None,
    log_config: LogConfig | None = None,
) -> FastAPI:
    """The Decision API app; the catalog starts loading (and following its alias) when the app starts. With
    `shadow`, a sampled share of the serving model's answered requests is scored by the challenger after the
    answer has gone out (`/v1/shadow` reports the comparison). `threads` follows the CPU budget the process
    was given (and other processes' load, where the budget was found, not set); every batch runs on its count,
    and `/healthz` says how many threads and why. With `log_config` (and its `where` set) every answered
    decision is written to the inference log under the id its answer carries, off the hot path."""
    keys.check_require_key(config.require_key)
    batcher, metrics, inference_log = _batching(config, threads, log_config)
    parts = AppParts(
        catalog=catalog,
        batcher=batcher,
        metrics=metrics,
        keys=keys,
        config=config,
        shadow=shadow,
        threads=threads,
        inference_log=inference_log,
    )
    app = FastAPI(title="Decision API", version="1", description=DESCRIPTION, lifespan=lifespan)
    app.state.parts = parts  # what the routes read; the four below by name too, for tests and tools
    app.state.catalog, app.state.batcher, app.state.metrics = catalog, batcher, metrics
    app.state.inference_log = inference_log
    app.add_middleware(DecodeBodyMiddleware, limits=config.limits)
    # `measured` added last, so it runs outside the body's decoding (a refused body is timed too)
    app.add_middleware(BaseHTTPMiddleware, dispatch=routes.measured)
    for error, handler in routes.ERROR_HANDLERS.items():
        app.add_exception_handler(error, handler)
    app.include_router(routes.router)
    return app


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start what the app serves with (the catalog loading its model, the batcher, the thread governor, the
    shadow, the inference log) and, once the last answer is out, stop it in the reverse order."""
    parts: AppParts = app.state.parts
    if parts.keys.open:
        log.warning("no API keys configured: the server is open to every caller and shows every model")
    parts.catalog.start()
    parts.batcher.start()
    if parts.threads is not None:
        parts.threads.start()
    if parts.shadow is not None:
        parts.shadow.start(busy=lambda: parts.batcher.busy)
    if parts.inference_log is not None:
        parts.inference_log.start()
    yield
    if parts.inference_log is not None:
        parts.inference_log.stop()  # after the last answer: what was answered is written
    if parts.shadow is not None:
        parts.shadow.stop()
    await parts.batcher.stop()
    if parts.threads is not None:
        parts.threads.stop()
    parts.catalog.stop()


def _batching(
    config: ServerConfig, threads: ThreadGovernor | None, log_config: LogConfig | None
) -> tuple[MicroBatcher, ServerMetrics, InferenceLog | None]:
    """An app's batcher (each batch on the thread count `threads` says), its metrics, and its inference log
    where `log_config` names a place."""
    metrics = ServerMetrics(
        lambda: batcher.queued,
        lambda: inference_log.queued if inference_log else 0,
        _monitor_folder(log_config),
    )
    inference_log = None
    if log_config is not None and log_config.where is not None:
        inference_log = InferenceLog(log_config, on_drop=metrics.log_drop, on_write=metrics.log_written)
    batcher = MicroBatcher(
        _following(threads), config.max_batch_items, config.max_wait_s, config.max_queue, metrics.batch
    )
    return batcher, metrics, inference_log


def _monitor_folder(log_config: LogConfig | None) -> str | None:
    """Where the drift monitor leaves its summary by default: the inference folder (a PostgreSQL log has
    none)."""
    if log_config is None or log_config.where is None or log_config.where.startswith(POSTGRES_SCHEMES):
        return None
    return log_config.where


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


@dataclass(frozen=True)
class ServeOptions:
    """Everything a server process needs to build its app: what `--workers` hands to each worker process."""

    model: str
    keys: str | None = None
    finetunes: str | None = None
    poll_s: float = 5.0
    device: str = "cpu"
    # auto (int8 where the export's int8 report passes, else fp32), fp32, bf16 (autocast; refused where the
    # device only emulates it) or int8 (`runtimes.precision`)
    precision: str = "auto"
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
        return cls(
            **{
                **data,
                "config": ServerConfig(**data["config"], limits=limits),
                "inference_log": LogConfig(**logged),
            }
        )


OPTIONS_ENV = "DECISION_SERVE_OPTIONS"


def serving_threads(options: ServeOptions) -> CpuBudget:
    """Each server process's share of the CPU budget (`--threads`, else the cores it may use), split between
    the `--workers`."""
    return plan_threads(options.threads, "--threads", share=options.workers, sharing="workers")


def build_app(options: ServeOptions) -> FastAPI:
    """The app of one server process: its torch threads (`serving_threads`), its own catalog (the model loaded
    in this process) and batcher."""
    threads = serving_threads(options)
    apply_threads(threads)  # before the model loads: a thread keeps the pool size it first ran with
    log.info("torch threads in process %d: %s", os.getpid(), threads.describe())
    # How every model of this process loads, the served one's and the shadow's alike.
    loading = {
        "poll_s": options.poll_s,
        "device": options.device,
        "dtype": serving_dtype(options.precision, torch.device(options.device)),
        "backend": options.backend,
        "precision": options.precision,
    }
    catalog = Catalog(options.model, options.finetunes, **loading)
    shadow = None
    if options.shadow:
        source = Catalog(options.shadow, **loading)
        shadow = ShadowScorer(source, options.shadow_share, on_report=record_shadow)
    return create_app(
        catalog,
        load_keys(options.keys),
        options.config,
        shadow,
        ThreadGovernor(threads),
        options.inference_log,
    )


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
    uvicorn.run(
        "pipeline.serving.server:app_from_environment",
        factory=True,
        workers=options.workers,
        host=host,
        port=port,
        log_level="info",
        access_log=access_log,
    )
