"""`decision serve`: the Decision API on an export folder or a registered model's alias, refused in one line
(exit 2) before any model loads where it could not serve.

decision serve --model models/vader-minilm --port 8000
decision serve --run-config tickets --keys keys.json --require-key --workers 2
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.cli.options import AT_LEAST_ONE, SECONDS, device_option, load_run_params, number_option
from pipeline.cli.runner import EXIT_OK, refuse
from pipeline.config import SERVING_PRECISIONS

DEFAULT_INFERENCE_LOG = "inference"  # outside a project folder (no params.yaml): ./inference
DESCRIPTION = (
    "Start the Decision API on MODEL: an export folder, or models:/NAME@ALIAS, which is followed (a moved "
    "alias is loaded in the background, checked and swapped in without dropping requests). Concurrent "
    "requests share forward passes. Keys come from --keys and DECISION_API_KEYS (owner=sha256hex,...); "
    "without any the server is open. With keys, a keyless caller may use the default model only, unless "
    "--require-key makes every keyless request a 401."
)
MILLISECONDS = number_option(float, lambda ms: 0 <= ms < 60_000, "milliseconds from 0 to 60,000, e.g. 2")
PORT = number_option(int, lambda port: 1 <= port <= 65_535, "a port number from 1 to 65535, e.g. 8000")
SHARE = number_option(float, lambda share: 0 < share <= 1, "a share above 0 and at most 1, e.g. 0.1")


def add_serve(commands) -> None:
    """`decision serve` on the `decision` subparsers."""
    serve = commands.add_parser(
        "serve",
        help="serve a decision model over HTTP (Decision API: /v1/systemone, /v1/models, /healthz)",
        description=DESCRIPTION,
    )
    _add_model_flags(serve)
    _add_batching_flags(serve)
    _add_runtime_flags(serve)
    _add_shadow_flags(serve)
    _add_process_flags(serve)
    _add_inference_log_flags(serve)
    serve.set_defaults(handler=handle_serve)


def _add_model_flags(serve: argparse.ArgumentParser) -> None:
    """What is served, where, to whom."""
    which = serve.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="an export folder, or models:/NAME@ALIAS")
    which.add_argument(
        "--run-config",
        metavar="NAME",
        help="the champion of the model that configs/NAME.yaml registers (make serve NAME=...)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    serve.add_argument("--port", type=PORT, default=8000, help="default: 8000")
    serve.add_argument("--keys", help="API key file (see `decision keygen`)")
    serve.add_argument(
        "--require-key",
        action="store_true",
        help="answer every keyless request 401 (authentication_error), the default model's too; without it a "
        "keyless caller may use the default model (and gets 403 for any other); needs keys",
    )
    serve.add_argument("--finetunes", help="a folder of export folders served to their owners by name")
    serve.add_argument(
        "--poll-seconds", type=SECONDS, default=5.0, help="how often to check a followed alias"
    )


def _add_batching_flags(serve: argparse.ArgumentParser) -> None:
    """How requests are batched and bounded."""
    serve.add_argument(
        "--max-batch", type=AT_LEAST_ONE, default=64, help="questions per forward pass (default 64)"
    )
    serve.add_argument("--max-wait-ms", type=MILLISECONDS, default=2.0, help="how long a batch waits to fill")
    serve.add_argument(
        "--max-queue", type=AT_LEAST_ONE, default=256, help="waiting requests before 503 (default 256)"
    )
    serve.add_argument("--max-body-mb", type=AT_LEAST_ONE, default=8, help="request body limit, decompressed")
    serve.add_argument("--access-log", action="store_true", help="log every request")


def _add_runtime_flags(serve: argparse.ArgumentParser) -> None:
    """Where and how the model runs: device, precision, backend."""
    serve.add_argument(
        "--device", default="cpu", type=device_option, help="cpu (default), cuda, cuda:1, or auto"
    )
    serve.add_argument(
        "--precision",
        choices=SERVING_PRECISIONS,
        default="auto",
        help="auto (default): the export's int8 encoder where its int8 report (decision quantize) passes its "
        "bounds on held-out rows and the CPU has VNNI, else fp32; fp32: answers equal the trained model's "
        "within 1e-3; bf16 autocast: answers moved by up to 8e-3, refused where bf16 is emulated; int8: the "
        "int8 encoder with its own calibrator, refused with its report's figures where they fail the bounds "
        "(docs/serving.md, Precision)",
    )
    serve.add_argument(
        "--backend",
        choices=["auto", "torch", "onnxruntime", "openvino"],
        default="auto",
        help="where the encoder runs: torch, onnxruntime or openvino (CPU runtimes of the export's "
        "encoder.onnx; the onnx and openvino extras), or auto (default): every installed runtime that "
        "answers a few probe requests as torch does (|Δp| <= 1e-4) is timed against torch on them, and "
        "the fastest serves; the choice and why are in the log and on /healthz (docs/serving.md, "
        "Backends)",
    )


def _add_shadow_flags(serve: argparse.ArgumentParser) -> None:
    """A challenger scored beside the served model."""
    serve.add_argument(
        "--shadow",
        metavar="MODEL",
        help="a challenger (folder or models:/NAME@challenger) that scores a share of the requests after "
        "they are answered: agreement, mean |dp| and its latency on /v1/shadow, in the log and as "
        "metrics of its version's MLflow run",
    )
    serve.add_argument(
        "--shadow-share", type=SHARE, default=0.1, help="share of requests the shadow scores (0.1)"
    )


def _add_process_flags(serve: argparse.ArgumentParser) -> None:
    """How many server processes, and the threads they share."""
    serve.add_argument(
        "--workers",
        type=AT_LEAST_ONE,
        default=1,
        help="server processes on one port, each with its own model and batcher and 1/N of the threads "
        "(default 1)",
    )
    serve.add_argument(
        "--threads",
        type=AT_LEAST_ONE,
        metavar="N",
        help="torch threads of all workers together (default: the cores this process may use, its affinity "
        "mask or container CPU quota, whichever is smaller; OMP_NUM_THREADS when set); /healthz "
        "reports the choice",
    )


def _add_inference_log_flags(serve: argparse.ArgumentParser) -> None:
    """Where answered decisions are written, and what of them."""
    logged = serve.add_argument_group(
        "inference log", "every answered decision, for feedback, harvest and drift (docs/flywheel.md)"
    )
    logged.add_argument(
        "--inference-log",
        metavar="DIR|URL",
        help="where answered decisions are written: a folder of Parquet files by day or a postgresql:// URL "
        "(default: params.yaml's flywheel.inference, with --run-config's, where review, feedback and "
        "harvest read it; ./inference without a params.yaml)",
    )
    logged.add_argument(
        "--no-inference-log",
        action="store_true",
        help="log nothing (no feedback either: POST /v1/feedback answers 404)",
    )
    logged.add_argument(
        "--log-sample",
        type=SHARE,
        default=1.0,
        metavar="SHARE",
        help="the share of decisions written (default 1.0: all)",
    )
    _add_redaction_flags(logged)
    logged.add_argument(
        "--log-flush-seconds",
        type=SECONDS,
        default=2.0,
        help="the longest a decision waits in memory before it is written (default 2); a SIGKILL loses at "
        "most this much, SIGTERM nothing",
    )


def _add_redaction_flags(logged: argparse._ArgumentGroup) -> None:
    """What of a logged state is never written, or written only as a keyed hash."""
    logged.add_argument(
        "--redact-drop",
        metavar="PATHS",
        help="comma-separated dotted paths of JSON-object state fields never written, e.g. "
        "customer.email,notes",
    )
    logged.add_argument(
        "--redact-hash",
        metavar="PATHS",
        help="state fields written as a keyed hash (HMAC-SHA256, key DECISION_LOG_SALT): they still group "
        "and join, but cannot be read back",
    )


def handle_serve(args: argparse.Namespace) -> int:
    from pipeline.serving.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if (problem := _serve_problem(args)) is not None:
        return refuse(args, problem)
    run_server(_serve_options(args), args.host, args.port, args.access_log)
    return EXIT_OK


def _serve_problem(args: argparse.Namespace) -> str | None:
    """What stops the server, found once here rather than once per worker: a bad params file or run config, a
    model that is not there, a bad key file or --require-key without keys, a precision the device lacks, a
    place the server cannot use. Fills in --run-config's model and the inference log (`_from_params`)."""
    from pipeline.config import ConfigError
    from pipeline.device import PrecisionUnavailable, pick_device, serving_dtype
    from pipeline.serving.keys import KeyConfigError, load_keys

    try:
        _from_params(args)
    except ConfigError as error:
        return str(error)
    if (problem := _model_problem(args.model)) is not None:
        return problem
    try:
        load_keys(args.keys).check_require_key(args.require_key)
        serving_dtype(args.precision, pick_device(args.device))
    except (KeyConfigError, PrecisionUnavailable) as error:
        return str(error)
    return _int8_problem(args) or _place_problem(args)


def _int8_problem(args: argparse.Namespace) -> str | None:
    """Why `--precision int8` cannot serve the model folder (no int8 report, or one outside its bounds),
    before the server starts; a registry version is checked when it loads (its error on /healthz)."""
    from pipeline.device import pick_device
    from pipeline.families.runtimes.precision import int8_refusal

    if args.precision != "int8" or args.model.startswith("models:/"):
        return None
    return int8_refusal(Path(args.model), pick_device(args.device))


def _from_params(args: argparse.Namespace) -> None:
    """--run-config's model (its champion) and the inference log where --inference-log is not given: the
    project's flywheel.inference (with the run config's), where review, feedback and harvest read it, or
    ./inference outside a project folder. ConfigError for a bad params file or run config."""
    from pipeline.config import PARAMS_FILE

    if args.run_config is None and (args.inference_log is not None or not Path(PARAMS_FILE).is_file()):
        args.inference_log = args.inference_log or DEFAULT_INFERENCE_LOG
        return
    params = load_run_params(args.run_config)
    if args.run_config:
        args.model = f"models:/{params.retrain.model_name}@champion"
    args.inference_log = args.inference_log or params.flywheel.inference


def _model_problem(model: str) -> str | None:
    """Why `model` would serve nothing: no such folder, or an alias that names no version."""
    from pipeline.mlops.registry import alias_problem, parse_alias_uri

    if (aliased := parse_alias_uri(model)) is None and not Path(model).is_dir():
        return f"--model {model}: no such folder (or use models:/NAME@ALIAS)"
    if aliased is not None and (problem := alias_problem(*aliased)) is not None:
        return f"--model {model}: {problem}"
    return None


def _place_problem(args: argparse.Namespace) -> str | None:
    """What stops the server before any model loads: a --shadow or --finetunes folder that is not there (the
    server would run on without it), or an address another process holds (found after the model loaded)."""
    import errno
    import os
    import socket

    if args.shadow and not args.shadow.startswith("models:/") and not Path(args.shadow).is_dir():
        return f"--shadow {args.shadow}: no such folder (or use models:/NAME@ALIAS)"
    if args.finetunes and not Path(args.finetunes).is_dir():
        return f"--finetunes {args.finetunes}: no such folder (a folder of export folders)"
    if (problem := _log_place_problem(args)) is not None:
        return problem
    try:
        with socket.create_server((args.host, args.port), reuse_port=False) as _:
            return None
    except OSError as error:
        taken = error.errno == errno.EADDRINUSE
        why = (
            "another process listens there; give another --port"
            if taken
            else f"cannot listen there ({os.strerror(error.errno) if error.errno else error})"
        )
        return f"{args.host}:{args.port}: {why}"


def _log_place_problem(args: argparse.Namespace) -> str | None:
    """Why the inference log's folder takes no files (a file there, a read-only place): served decisions would
    be dropped at every flush, and feedback and harvest would find none of them."""
    from pipeline.families.base_folders import unwritable_place
    from pipeline.flywheel.table import POSTGRES_SCHEMES

    where = None if args.no_inference_log else args.inference_log
    if where is None or str(where).startswith(POSTGRES_SCHEMES):
        return None
    if Path(where).exists() and not Path(where).is_dir():
        return f"--inference-log {where}: a file; the inference log is a folder (or a postgresql:// URL)"
    unwritable = unwritable_place(Path(where) / "decisions")
    return None if unwritable is None else f"--inference-log {where}: {unwritable}"


def _serve_options(args: argparse.Namespace):
    """What every server process builds its app from (`ServeOptions`), from the checked flags."""
    from pipeline.device import pick_device
    from pipeline.flywheel.log import LogConfig
    from pipeline.serving.body import BodyLimits
    from pipeline.serving.server import ServeOptions, ServerConfig

    body_bytes = args.max_body_mb * 1024 * 1024
    config = ServerConfig(
        max_batch_items=args.max_batch,
        max_wait_s=args.max_wait_ms / 1000,
        max_queue=args.max_queue,
        limits=BodyLimits(max_body_bytes=body_bytes, max_compressed_bytes=body_bytes),
        require_key=args.require_key,
    )
    inference_log = LogConfig(
        where=None if args.no_inference_log else args.inference_log,
        sample=args.log_sample,
        drop_fields=_paths(args.redact_drop),
        hash_fields=_paths(args.redact_hash),
        flush_s=args.log_flush_seconds,
    )
    return ServeOptions(
        model=args.model,
        keys=args.keys,
        finetunes=args.finetunes,
        poll_s=args.poll_seconds,
        device=str(pick_device(args.device)),
        precision=args.precision,
        config=config,
        workers=args.workers,
        shadow=args.shadow,
        shadow_share=args.shadow_share,
        threads=args.threads,
        backend=args.backend,
        inference_log=inference_log,
    )


def _paths(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())
