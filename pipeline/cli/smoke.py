"""`decision smoke`: held-out decisions sent to a running Decision API, each answer compared with the same
folder's in-process prediction (and with what the trained model answered, given its expected answers).

decision smoke --url http://127.0.0.1:8000 --data data/processed/vader.jsonl --model-dir models/vader-minilm
decision smoke --url http://127.0.0.1:8000 --data DATA --expected runs/KEY/expected_answers.npz --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.options import AT_LEAST_ONE, SECONDS, add_json_flag
from pipeline.cli.runner import EXIT_FAILED, EXIT_OK, run_command
from pipeline.cli.tables import console

DESCRIPTION = (
    "Send the held-out rows of DATA (one request per row, up to N decisions) to URL, one at a time; with "
    "--model-dir compare every answer with the same folder's in-process prediction. Fails (exit 1) below "
    "99.5% agreement on the chosen option, above a 1e-3 probability difference, or on any failed request. "
    "With --expected (a run's expected_answers.npz) every answer is also compared with what the trained "
    "model answered before export: below 99.5% agreement or above a 5e-3 difference fails."
)


def server_url(text: str) -> str:
    """`--url`: an http(s) URL, refused at once otherwise rather than once per request."""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1].strip("/")) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected the server's http:// or https:// URL")
    return text


def add_smoke(commands) -> None:
    """`decision smoke` on the `decision` subparsers."""
    smoke = commands.add_parser(
        "smoke",
        help="send held-out decisions to a Decision API and compare with in-process predictions",
        description=DESCRIPTION,
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
    add_json_flag(smoke, help="print one JSON object instead of a table")
    smoke.set_defaults(handler=handle_smoke)


def handle_smoke(args: argparse.Namespace) -> int:
    from pipeline.data.read import UnreadableInput
    from pipeline.stages.smoke import SmokeInputError

    return run_command(
        args,
        lambda: _smoked(args),
        print_smoke,
        refused_input=(UnreadableInput, FileNotFoundError, SmokeInputError),
        done=lambda result: EXIT_OK if result.passed else EXIT_FAILED,
    )


def _smoked(args: argparse.Namespace):
    """The smoke test's result; --model-dir and --expected are read before any request (SmokeInputError)."""
    from pipeline.config import load_params
    from pipeline.data.split import TrainSource
    from pipeline.families.base import ModelLayoutError
    from pipeline.stages.smoke import SmokeInputError, heldout_requests, smoke_test

    validated = TrainSource(args.data, split_config=load_params(args.params).validate).validated()
    records = validated.split.every_record() if args.all_rows else validated.split.heldout
    bodies = heldout_requests(sorted(records, key=lambda r: r.row) if args.all_rows else records, args.n)
    try:
        return smoke_test(
            args.url, bodies, args.model_dir, args.api_key, args.model, args.timeout, args.expected
        )
    except ModelLayoutError as error:  # --model-dir's folder, found before any request
        raise SmokeInputError(f"--model-dir {error}") from None


def print_smoke(result) -> None:
    """What was sent, how the answers agreed, the latency, and the verdict."""
    from rich.table import Table

    table = Table(title=f"Smoke test of {result.url} ({result.model or 'no model answered'})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in _measures(result):
        table.add_row(name, str(value))
    out = console()
    out.print(table)
    out.print("[green]passed[/]" if result.passed else "[red]failed:[/] " + "; ".join(result.failures))


def _measures(result) -> list[tuple[str, object]]:
    agreement = "n/a (no --model-dir)" if result.agreement is None else f"{result.agreement:.4f}"
    diff = "n/a" if result.max_probability_diff is None else f"{result.max_probability_diff:.2e}"
    trained = "n/a (no --expected)" if result.trained_agreement is None else f"{result.trained_agreement:.4f}"
    trained_diff = "n/a" if result.trained_agreement is None else f"{result.trained_max_probability_diff:.2e}"
    return [
        ("requests", result.requests),
        ("decisions", result.decisions),
        ("agreement on the chosen option", agreement),
        ("largest probability difference", diff),
        ("agreement with the trained model", trained),
        ("largest difference from the trained model", trained_diff),
        ("latency p50 (ms)", result.latency_ms["p50"]),
        ("latency p95 (ms)", result.latency_ms["p95"]),
    ]
