"""The `decision` subcommands of the Decision API: `serve`, `smoke` and `keygen`.

decision serve --model models/vader-minilm --port 8000
decision smoke --url http://127.0.0.1:8000 --data data/processed/vader.jsonl --model-dir models/vader-minilm
decision keygen --owner alice --keys keys.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pipeline.cli.tables import AT_LEAST_ONE, console, device_option, number_option

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
DEFAULT_INFERENCE_LOG = "inference"  # outside a project folder (no params.yaml): ./inference


def _serve(args: argparse.Namespace) -> int:
    from pipeline.mlops.registry import alias_problem, parse_alias_uri
    from pipeline.serving.body import BodyLimits
    from pipeline.serving.keys import KeyConfigError, load_keys
    from pipeline.serving.server import ServeOptions, ServerConfig, run_server

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from pipeline.config import ConfigError

    try:
        _from_params(args)
    except ConfigError as error:
        where = f"--run-config {args.run_config}: " if args.run_config else ""
        print(f"decision serve: {where}{error}", file=sys.stderr)
        return EXIT_UNUSABLE
    if (aliased := parse_alias_uri(args.model)) is None and not Path(args.model).is_dir():
        print(
            f"decision serve: --model {args.model}: no such folder (or use models:/NAME@ALIAS)",
            file=sys.stderr,
        )
        return EXIT_UNUSABLE
    if aliased is not None and (problem := alias_problem(*aliased)) is not None:
        print(f"decision serve: --model {args.model}: {problem}", file=sys.stderr)  # it would serve nothing
        return EXIT_UNUSABLE
    try:  # checked here, so a bad key file or --require-key without keys is one error, not one per worker
        load_keys(args.keys).check_require_key(args.require_key)
    except KeyConfigError as error:
        print(f"decision serve: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    config = ServerConfig(args.max_batch, args.max_wait_ms / 1000, args.max_queue,
                          BodyLimits(args.max_body_mb * 1024 * 1024, args.max_body_mb * 1024 * 1024),
                          args.require_key)  # fmt: skip
    from pipeline.device import PrecisionUnavailable, pick_device, serving_dtype

    device = pick_device(args.device)
    try:
        serving_dtype(args.precision, device)  # refused here, once, before any worker starts
    except PrecisionUnavailable as error:
        print(f"decision serve: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    if (problem := _place_problem(args)) is not None:
        print(f"decision serve: {problem}", file=sys.stderr)
        return EXIT_UNUSABLE
    options = ServeOptions(args.model, args.keys, args.finetunes, args.poll_seconds, str(device), args.precision,
                           config, args.workers, args.shadow, args.shadow_share, args.threads,
                           args.backend, _log_config(args))  # fmt: skip
    run_server(options, args.host, args.port, args.access_log)
    return EXIT_OK


def _from_params(args: argparse.Namespace) -> None:
    """--run-config's model (its champion) and the inference log where --inference-log is not given: the
    project's flywheel.inference (with the run config's), where review, feedback and harvest read it, or
    ./inference outside a project folder. ConfigError for a bad params file or run config."""
    from pipeline.config import PARAMS_FILE, load_params

    if args.run_config is None and (args.inference_log is not None or not Path(PARAMS_FILE).is_file()):
        args.inference_log = args.inference_log or DEFAULT_INFERENCE_LOG
        return
    params = load_params(run_config=args.run_config)
    if args.run_config:
        args.model = f"models:/{params.retrain.model_name}@champion"
    args.inference_log = args.inference_log or params.flywheel.inference


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
    """Why the inference log's folder takes no files (a file there, a read-only place): served decisions would be
    dropped at every flush, and feedback and harvest would find none of them."""
    from pipeline.families.base_folders import unwritable_place
    from pipeline.flywheel.table import POSTGRES_SCHEMES

    where = None if args.no_inference_log else args.inference_log
    if where is None or str(where).startswith(POSTGRES_SCHEMES):
        return None
    if Path(where).exists() and not Path(where).is_dir():
        return f"--inference-log {where}: a file; the inference log is a folder (or a postgresql:// URL)"
    unwritable = unwritable_place(Path(where) / "decisions")
    return None if unwritable is None else f"--inference-log {where}: {unwritable}"


def _log_config(args: argparse.Namespace):
    from pipeline.flywheel.log import LogConfig

    return LogConfig(None if args.no_inference_log else args.inference_log, args.log_sample,
                     _paths(args.redact_drop), _paths(args.redact_hash), args.log_flush_seconds)  # fmt: skip


def _paths(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _smoke(args: argparse.Namespace) -> int:
    from pipeline.config import load_params
    from pipeline.data.read import UnreadableInput
    from pipeline.data.split import TrainSource
    from pipeline.families.base import ModelLayoutError
    from pipeline.stages.smoke import SmokeInputError, heldout_requests, smoke_test

    try:
        validated = TrainSource(args.data, split_config=load_params(args.params).validate).validated()
        records = validated.split.every_record() if args.all_rows else validated.split.heldout
        bodies = heldout_requests(sorted(records, key=lambda r: r.row) if args.all_rows else records, args.n)
    except (UnreadableInput, FileNotFoundError) as error:
        print(f"decision smoke: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        result = smoke_test(
            args.url, bodies, args.model_dir, args.api_key, args.model, args.timeout, args.expected
        )
    except (ModelLayoutError, SmokeInputError) as error:  # --model-dir or --expected, before any request
        flag = "--model-dir " if isinstance(error, ModelLayoutError) else ""
        print(f"decision smoke: {flag}{error}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        _print_smoke(result)
    return EXIT_OK if result.passed else EXIT_FAILED


def _print_smoke(result) -> None:
    from rich.table import Table

    table = Table(title=f"Smoke test of {result.url} ({result.model or 'no model answered'})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    agreement = "n/a (no --model-dir)" if result.agreement is None else f"{result.agreement:.4f}"
    diff = "n/a" if result.max_probability_diff is None else f"{result.max_probability_diff:.2e}"
    trained = "n/a (no --expected)" if result.trained_agreement is None else f"{result.trained_agreement:.4f}"
    trained_diff = "n/a" if result.trained_agreement is None else f"{result.trained_max_probability_diff:.2e}"
    for name, value in (("requests", result.requests), ("decisions", result.decisions),
                        ("agreement on the chosen option", agreement), ("largest probability difference", diff),
                        ("agreement with the trained model", trained),
                        ("largest difference from the trained model", trained_diff),
                        ("latency p50 (ms)", result.latency_ms["p50"]), ("latency p95 (ms)", result.latency_ms["p95"])):  # fmt: skip
        table.add_row(name, str(value))
    out = console()
    out.print(table)
    out.print("[green]passed[/]" if result.passed else "[red]failed:[/] " + "; ".join(result.failures))


def _keygen(args: argparse.Namespace) -> int:
    from pipeline.serving.keys import KeyConfigError, add_key

    try:
        key = add_key(args.keys, args.owner, args.admin)
    except (KeyConfigError, OSError) as error:
        print(f"decision keygen: {error}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(json.dumps({"owner": args.owner, "key": key, "keys": args.keys}) if args.json else key)
    print(f"(stored only as a hash in {args.keys}; this is the one time the key is shown)", file=sys.stderr)
    return EXIT_OK


SECONDS = number_option(float, lambda s: 0 < s < float("inf"), "a positive number of seconds, e.g. 30")
MILLISECONDS = number_option(float, lambda ms: 0 <= ms < 60_000, "milliseconds from 0 to 60,000, e.g. 2")
PORT = number_option(int, lambda port: 1 <= port <= 65_535, "a port number from 1 to 65535, e.g. 8000")
SHARE = number_option(float, lambda share: 0 < share <= 1, "a share above 0 and at most 1, e.g. 0.1")


def server_url(text: str) -> str:
    """`--url`: an http(s) URL, refused at once otherwise rather than once per request."""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1].strip("/")) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected the server's http:// or https:// URL")
    return text


def add_api_commands(commands) -> None:
    """Register serve, smoke and keygen on the `decision` subparsers."""
    serve = commands.add_parser(
        "serve",
        help="serve a decision model over HTTP (Decision API: /v1/systemone, /v1/models, /healthz)",
        description="Start the Decision API on MODEL: an export folder, or models:/NAME@ALIAS, which is followed "
        "(a moved alias is loaded in the background, checked and swapped in without dropping requests). "
        "Concurrent requests share forward passes. Keys come from --keys and DECISION_API_KEYS "
        "(owner=sha256hex,...); without any the server is open. With keys, a keyless caller may use the default "
        "model only, unless --require-key makes every keyless request a 401.",
    )
    which = serve.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="an export folder, or models:/NAME@ALIAS")
    which.add_argument("--run-config", metavar="NAME",
                       help="the champion of the model that configs/NAME.yaml registers (make serve NAME=...)")  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    serve.add_argument("--port", type=PORT, default=8000, help="default: 8000")
    serve.add_argument("--keys", help="API key file (see `decision keygen`)")
    serve.add_argument(
        "--require-key", action="store_true",
        help="answer every keyless request 401 (authentication_error), the default model's too; without it a "
             "keyless caller may use the default model (and gets 403 for any other); needs keys",
    )  # fmt: skip
    serve.add_argument("--finetunes", help="a folder of export folders served to their owners by name")
    serve.add_argument(
        "--poll-seconds", type=SECONDS, default=5.0, help="how often to check a followed alias"
    )
    serve.add_argument(
        "--max-batch", type=AT_LEAST_ONE, default=64, help="questions per forward pass (default 64)"
    )
    serve.add_argument("--max-wait-ms", type=MILLISECONDS, default=2.0, help="how long a batch waits to fill")
    serve.add_argument(
        "--max-queue", type=AT_LEAST_ONE, default=256, help="waiting requests before 503 (default 256)"
    )
    serve.add_argument("--max-body-mb", type=AT_LEAST_ONE, default=8, help="request body limit, decompressed")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.add_argument(
        "--device", default="cpu", type=device_option, help="cpu (default), cuda, cuda:1, or auto"
    )
    serve.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32",
        help="fp32 (default: answers equal the trained model's within 1e-3) or bf16 autocast: 1.4x-1.7x the "
             "requests/s on a 2-core CPU with native bf16, but answers moved by up to 8e-3 (docs/results.md, "
             "Serving); refused where bf16 is emulated",
    )  # fmt: skip
    serve.add_argument(
        "--backend", choices=["auto", "torch", "onnxruntime", "openvino"], default="auto",
        help="where the encoder runs: torch, onnxruntime or openvino (CPU runtimes of the export's encoder.onnx; "
             "the onnx and openvino extras), or auto (default): every installed runtime that answers a few probe "
             "requests as torch does (|Δp| <= 1e-4) is timed against torch on them, and the fastest serves; the "
             "choice and why are in the log and on /healthz (docs/serving.md, Backends)",
    )  # fmt: skip
    serve.add_argument("--shadow", metavar="MODEL",
                       help="a challenger (folder or models:/NAME@challenger) that scores a share of the requests "
                            "after they are answered: agreement, mean |dp| and its latency on /v1/shadow, in the log "
                            "and as metrics of its version's MLflow run")  # fmt: skip
    serve.add_argument(
        "--shadow-share", type=SHARE, default=0.1, help="share of requests the shadow scores (0.1)"
    )
    serve.add_argument(
        "--workers", type=AT_LEAST_ONE, default=1,
        help="server processes on one port, each with its own model and batcher and 1/N of the threads (default 1)",
    )  # fmt: skip
    serve.add_argument(
        "--threads", type=AT_LEAST_ONE, metavar="N",
        help="torch threads of all workers together (default: the cores this process may use, its affinity mask "
             "or container CPU quota, whichever is smaller; OMP_NUM_THREADS when set); /healthz reports the choice",
    )  # fmt: skip
    logged = serve.add_argument_group("inference log", "every answered decision, for feedback, harvest and drift "
                                      "(docs/flywheel.md)")  # fmt: skip
    logged.add_argument("--inference-log", metavar="DIR|URL",
                        help="where answered decisions are written: a folder of Parquet files by day or a "
                             "postgresql:// URL (default: params.yaml's flywheel.inference, with --run-config's, "
                             "where review, feedback and harvest read it; ./inference without a params.yaml)")  # fmt: skip
    logged.add_argument("--no-inference-log", action="store_true",
                        help="log nothing (no feedback either: POST /v1/feedback answers 404)")  # fmt: skip
    logged.add_argument("--log-sample", type=SHARE, default=1.0, metavar="SHARE",
                        help="the share of decisions written (default 1.0: all)")  # fmt: skip
    logged.add_argument("--redact-drop", metavar="PATHS",
                        help="comma-separated dotted paths of JSON-object state fields never written, e.g. "
                             "customer.email,notes")  # fmt: skip
    logged.add_argument("--redact-hash", metavar="PATHS",
                        help="state fields written as a keyed hash (HMAC-SHA256, key DECISION_LOG_SALT): they still "
                             "group and join, but cannot be read back")  # fmt: skip
    logged.add_argument("--log-flush-seconds", type=SECONDS, default=2.0,
                        help="the longest a decision waits in memory before it is written (default 2); a SIGKILL "
                             "loses at most this much, SIGTERM nothing")  # fmt: skip
    serve.set_defaults(handler=_serve)

    smoke = commands.add_parser(
        "smoke",
        help="send held-out decisions to a Decision API and compare with in-process predictions",
        description="Send the held-out rows of DATA (one request per row, up to N decisions) to URL, one at a "
        "time; with --model-dir compare every answer with the same folder's in-process prediction. Fails "
        "(exit 1) below 99.5% agreement on the chosen option, above a 1e-3 probability difference, or on any "
        "failed request. With --expected (a run's expected_answers.npz) every answer is also compared with what the "
        "trained model answered before export: below 99.5% agreement or above a 5e-3 difference fails.",
    )
    smoke.add_argument("--url", required=True, type=server_url, help="the server, e.g. http://127.0.0.1:8000")
    smoke.add_argument("--data", required=True, help="decision file; its held-out split is sent")
    smoke.add_argument("--n", type=AT_LEAST_ONE, default=200, help="decisions to send (default 200)")
    smoke.add_argument("--model-dir", help="the folder the server serves, to compare answers with")
    smoke.add_argument("--model", help="the model name to ask for (default: the serving model)")
    smoke.add_argument(
        "--expected", metavar="NPZ", help="the trained model's answers (runs/KEY/expected_answers.npz)"
    )
    smoke.add_argument("--api-key", help="sent as Authorization: Bearer")
    smoke.add_argument("--all-rows", action="store_true", help="send any rows, not only the held-out split")
    smoke.add_argument("--params", default="params.yaml", help="where the held-out split is defined")
    smoke.add_argument("--timeout", type=SECONDS, default=30.0, help="seconds per request")
    smoke.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    smoke.set_defaults(handler=_smoke)

    keygen = commands.add_parser("keygen", help="make an API key for an owner and store its hash",
                                 description="Print a new API key once and add its sha256 to the key file.")  # fmt: skip
    keygen.add_argument(
        "--owner", required=True, help="whose key: the owner its requests, fine-tunes and feedback belong to"
    )
    keygen.add_argument("--keys", required=True, help="the key file (created if missing)")
    keygen.add_argument("--admin", action="store_true",
                        help="an admin key: may label any logged decision (POST /v1/feedback), not only its owner's")  # fmt: skip
    keygen.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    keygen.set_defaults(handler=_keygen)
