"""`decision monitor`: the Prefect `monitor` flow (flows/monitor.py) in its own process; its inputs (the
params, the model's version, the inference log, the reference data) are checked here first, one line and exit
2.

decision monitor                                             # decision-model@champion, the last monitor.window_hours
decision monitor --model tickets@champion --inference /srv/inference --window-hours 6 --json
"""

from __future__ import annotations

import argparse
import datetime as dt

from pipeline.cli.launch import launch_flow
from pipeline.cli.options import FLOW_QUIET_HELP, add_output_flags, number_option
from pipeline.cli.retrain import RUN_CONFIG_HELP
from pipeline.cli.runner import refuse
from pipeline.config import MAX_WINDOW_HOURS, MonitorConfig
from pipeline.strict_json import to_json

DESCRIPTION = (
    "Judge a window of served decisions (the inference store) against the rows the serving version trained "
    "on, answered by that same version: Evidently's data drift preset over state length and kind, the "
    "question mix, and per question the chosen option and its top probability; expected accuracy against the "
    "accuracy measured on the decisions with feedback. The HTML report goes to the version's MLflow run "
    "(monitoring/) and to <inference>/monitor/, whose latest.json the server's /metrics reads; a drifted "
    "window emits the Prefect event decision.drift.detected (docs/flywheel.md, Drift)."
)
DEFAULT_MODEL = "decision-model@champion"


HOURS = number_option(
    float,
    lambda h: 0 < h <= MAX_WINDOW_HOURS,
    f"a positive number of hours up to {MAX_WINDOW_HOURS:,}, e.g. 24",
)


def window_end(text: str) -> str:
    """`--window-end`: an ISO 8601 moment that has come (a window in the future holds no decision yet)."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected an ISO 8601 moment, e.g. 2026-12-03T10:00:00+00:00"
        ) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    if moment > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5):  # minutes of clock skew allowed
        raise argparse.ArgumentTypeError(f"{text!r}: in the future, where no decision is logged yet")
    return text


def add_monitor(commands) -> None:
    """`decision monitor` on the `decision` subparsers."""
    monitor = commands.add_parser(
        "monitor", help="drift and label-free monitoring of a served model", description=DESCRIPTION
    )
    monitor.add_argument(
        "--model",
        help="NAME@ALIAS or NAME/VERSION, models:/ optional (default: the run's retrain.model_name@champion: "
        f"{DEFAULT_MODEL} without --run-config)",
    )
    monitor.add_argument(
        "--inference",
        metavar="WHERE",
        help="the inference store: its folder or a postgresql:// URL (over monitor.inference)",
    )
    monitor.add_argument(
        "--window-hours",
        type=HOURS,
        metavar="H",
        help="the window's length, ending at --window-end (default: monitor.window_hours, "
        f"{MonitorConfig.window_hours:g} unless the params or run config say otherwise)",
    )
    monitor.add_argument(
        "--window-end",
        type=window_end,
        metavar="ISO",
        help="the window's end, e.g. 2026-12-03T10:00:00+00:00, not in the future; one without a time zone "
        "is UTC (default: now)",
    )
    monitor.add_argument(
        "--reference", metavar="DATA", help="the data the version trained on (default: its `data` tag)"
    )
    monitor.add_argument("--params", default="params.yaml", help="the params file")
    monitor.add_argument("--run-config", help=RUN_CONFIG_HELP)
    add_output_flags(monitor, FLOW_QUIET_HELP)
    monitor.set_defaults(handler=handle_monitor)


def monitor_parameters(args: argparse.Namespace) -> dict:
    """The monitor flow's parameters, by name, from the parsed options."""
    return {
        "model": args.model,
        "inference": args.inference,
        "window_hours": args.window_hours,
        "window_end": args.window_end,
        "reference": args.reference,
        "params_file": args.params,
        "run_config": args.run_config,
    }


def handle_monitor(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_params
    from pipeline.data.read import UnreadableInput, open_readable
    from pipeline.flywheel.table import missing_log
    from pipeline.mlops.registry import RegistryError
    from pipeline.stages.monitor import MonitorError, champion_of, inference_of, resolve_version

    try:
        params = load_params(args.params, args.run_config)
        resolve_version(args.model or champion_of(params))
        if problem := missing_log(inference_of(params, args.inference)):
            raise MonitorError(problem)
        if args.reference is not None:
            open_readable(args.reference)  # BadSource: no such path, an unknown format, an empty folder
    except (ConfigError, MonitorError, RegistryError, UnreadableInput) as error:
        return refuse(args, error)
    launched = launch_flow("flows.monitor", monitor_parameters(args), args.quiet)
    if launched.result is not None:
        lines = [launched.result["line"]]
        lines += [f"certificate {check['line']}" for check in launched.result.get("certificates", [])]
        print(to_json(launched.result) if args.json else "\n".join(lines))
    return launched.code
