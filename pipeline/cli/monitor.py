"""`decision monitor`: the Prefect `monitor` flow (flows/monitor.py) in its own process.

decision monitor                                             # decision-model@champion, the last monitor.window_hours
decision monitor --model tickets@champion --inference /srv/inference --window-hours 6 --json
"""

from __future__ import annotations

import argparse
import datetime as dt

from pipeline.cli.registry import launch_flow
from pipeline.cli.tables import number_option
from pipeline.config import MAX_WINDOW_HOURS, MonitorConfig

DESCRIPTION = (
    "Judge a window of served decisions (the inference store) against the rows the serving version trained on, "
    "answered by that same version: Evidently's data drift preset over state length and kind, the question mix, "
    "and per question the chosen option and its top probability; expected accuracy against the accuracy measured "
    "on the decisions with feedback. The HTML report goes to the version's MLflow run (monitoring/) and to "
    "<inference>/monitor/, whose latest.json the server's /metrics reads; a drifted window emits the Prefect event "
    "decision.drift.detected (docs/flywheel.md, Drift)."
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


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """The monitor's options (`decision monitor` and `python -m flows.monitor` share them)."""
    parser.add_argument("--model", help="NAME@ALIAS or NAME/VERSION, models:/ optional (default: the run's "
                        f"retrain.model_name@champion: {DEFAULT_MODEL} without --run-config)")  # fmt: skip
    parser.add_argument("--inference", metavar="WHERE",
                        help="the inference store: its folder or a postgresql:// URL (over monitor.inference)")  # fmt: skip
    parser.add_argument("--window-hours", type=HOURS, metavar="H",
                        help="the window's length, ending at --window-end (default: monitor.window_hours, "
                        f"{MonitorConfig.window_hours:g} unless the params or run config say otherwise)")  # fmt: skip
    parser.add_argument("--window-end", type=window_end, metavar="ISO",
                        help="the window's end, e.g. 2026-12-03T10:00:00+00:00, not in the future; one without a "
                        "time zone is UTC (default: now)")  # fmt: skip
    parser.add_argument("--reference", metavar="DATA",
                        help="the data the version trained on (default: its `data` tag)")  # fmt: skip
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--run-config", help="configs/<NAME>.yaml overrides, e.g. tiny")
    parser.add_argument("--json", action="store_true", help="print the outcome as one JSON object")


def monitor_arguments(args: argparse.Namespace) -> list[str]:
    """The parsed options as the flow module's command line."""
    command = ["--params", args.params]
    for flag, value in (("--model", args.model), ("--inference", args.inference), ("--window-hours", args.window_hours),
                        ("--window-end", args.window_end), ("--reference", args.reference),
                        ("--run-config", args.run_config)):  # fmt: skip
        command += [flag, str(value)] if value is not None else []
    return command + (["--json"] if args.json else [])


def _monitor(args: argparse.Namespace) -> int:
    return launch_flow("flows.monitor", monitor_arguments(args), args.quiet)


def add_monitor_commands(commands) -> None:
    """Register `monitor` on the `decision` subparsers."""
    monitor = commands.add_parser("monitor", help="drift and label-free monitoring of a served model",
                                  description=DESCRIPTION)  # fmt: skip
    add_monitor_arguments(monitor)
    monitor.add_argument("-q", "--quiet", action="store_true",
                         help="no progress on stderr: the flow's console log shows warnings and errors only")  # fmt: skip
    monitor.set_defaults(handler=_monitor)
