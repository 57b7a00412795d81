"""`decision sweep`: the Prefect `sweep` flow (flows/sweep.py) in its own process.

decision sweep --space sweeps/vader.yaml                      # the space file's budget
decision sweep --space sweeps/vader.yaml --trials 20 --minutes 30 --repeat-best 3
"""

from __future__ import annotations

import argparse

from pipeline.cli.registry import launch_flow
from pipeline.cli.tables import number_option

DESCRIPTION = (
    "Search train.* settings from a YAML space file (docs/sweeps.md) with Optuna: TPE sampling, a median pruner "
    "on each trial's validation curve, every trial an MLflow child run under one parent run, all on one "
    "validated split. Trials are ranked on the validation split only; the best goes on through export, "
    "registration, its model card, the smoke test and the promotion gate as a challenger. A killed sweep "
    "resumes when run again (the same space and params)."
)


SEEDS = number_option(int, lambda n: n >= 0, "0 (off) or a whole number of seeds, e.g. 3")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's options (`decision sweep` and `python -m flows.sweep` share them)."""
    parser.add_argument("--space", required=True, metavar="FILE", help="the search space (docs/sweeps.md)")
    parser.add_argument("--params", default="params.yaml", help="the params file")
    parser.add_argument("--run-config", help="configs/<NAME>.yaml overrides, e.g. tiny")
    parser.add_argument(
        "--trials", type=int, metavar="N", help="the trial budget (default: the space file's `trials:`)"
    )
    parser.add_argument("--minutes", type=float, metavar="M",
                        help="the wall-clock budget: no trial starts after M minutes (default: the space file's `minutes:`)")  # fmt: skip
    parser.add_argument(
        "--parallel",
        type=int,
        metavar="P",
        help="trials at once (default: the space file's `parallel:`, or 1)",
    )
    parser.add_argument("--repeat-best", type=SEEDS, default=0, metavar="N",
                        help="then train the best settings with N other seeds: mean and std of accuracy and ECE")  # fmt: skip
    parser.add_argument("--storage", metavar="URL",
                        help="the Optuna study's storage, e.g. postgresql://... (default: SQLite in the sweep's folder)")  # fmt: skip
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="train even when DVC does not pin the data or base; the version is then held")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object on stdout (progress stays on stderr)")  # fmt: skip


def sweep_arguments(args: argparse.Namespace) -> list[str]:
    """The parsed options as the flow module's command line."""
    command = ["--space", args.space, "--params", args.params]
    for flag, value in (("--run-config", args.run_config), ("--trials", args.trials), ("--minutes", args.minutes),
                        ("--parallel", args.parallel), ("--storage", args.storage)):  # fmt: skip
        command += [flag, str(value)] if value is not None else []
    command += ["--repeat-best", str(args.repeat_best)] if args.repeat_best else []
    command += ["--allow-unpinned"] if args.allow_unpinned else []
    return command + (["--json"] if args.json else [])


def _sweep(args: argparse.Namespace) -> int:
    return launch_flow("flows.sweep", sweep_arguments(args), args.quiet)


def add_sweep_commands(commands) -> None:
    """Register `sweep` on the `decision` subparsers."""
    sweep = commands.add_parser("sweep", help="search training settings with Optuna; register the best trial",
                                description=DESCRIPTION)  # fmt: skip
    add_sweep_arguments(sweep)
    sweep.add_argument("-q", "--quiet", action="store_true",
                       help="no progress on stderr: the flow's console log shows warnings and errors only")  # fmt: skip
    sweep.set_defaults(handler=_sweep)
