"""`decision sweep`: the Prefect `sweep` flow (flows/sweep.py) in its own process.

decision sweep --space sweeps/vader.yaml                      # the space file's budget
decision sweep --space sweeps/vader.yaml --trials 20 --minutes 30 --repeat-best 3
"""

from __future__ import annotations

import argparse

from pipeline.cli.launch import launch_flow
from pipeline.cli.options import FLOW_QUIET_HELP, add_output_flags, number_option
from pipeline.cli.retrain import RUN_CONFIG_HELP
from pipeline.cli.runner import refuse
from pipeline.strict_json import to_json

DESCRIPTION = (
    "Search train.* settings from a YAML space file (docs/sweeps.md) with Optuna: TPE sampling, a median "
    "pruner on each trial's validation curve, every trial an MLflow child run under one parent run, all on "
    "one validated split. Trials are ranked on the validation split only; the best goes on through export, "
    "registration, its model card, the smoke test and the promotion gate as a challenger. A killed sweep "
    "resumes when run again (the same space and params)."
)
SEEDS = number_option(int, lambda n: n >= 0, "0 (off) or a whole number of seeds, e.g. 3")


def add_sweep(commands) -> None:
    """`decision sweep` on the `decision` subparsers."""
    sweep = commands.add_parser(
        "sweep", help="search training settings with Optuna; register the best trial", description=DESCRIPTION
    )
    sweep.add_argument("--space", required=True, metavar="FILE", help="the search space (docs/sweeps.md)")
    sweep.add_argument("--params", default="params.yaml", help="the params file")
    sweep.add_argument("--run-config", help=RUN_CONFIG_HELP)
    sweep.add_argument(
        "--trials", type=int, metavar="N", help="the trial budget (default: the space file's `trials:`)"
    )
    sweep.add_argument(
        "--minutes",
        type=float,
        metavar="M",
        help="the wall-clock budget: no trial starts after M minutes (default: the space file's `minutes:`)",
    )
    sweep.add_argument(
        "--parallel",
        type=int,
        metavar="P",
        help="trials at once (default: the space file's `parallel:`, or 1)",
    )
    sweep.add_argument(
        "--repeat-best",
        type=SEEDS,
        default=0,
        metavar="N",
        help="then train the best settings with N other seeds: mean and std of accuracy and ECE",
    )
    sweep.add_argument(
        "--storage",
        metavar="URL",
        help="the Optuna study's storage, e.g. postgresql://... (default: SQLite in the sweep's folder)",
    )
    sweep.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="train even when DVC does not pin the data or base; the version is then held",
    )
    add_output_flags(sweep, FLOW_QUIET_HELP)
    sweep.set_defaults(handler=handle_sweep)


def sweep_parameters(args: argparse.Namespace) -> dict:
    """The sweep flow's parameters, by name, from the parsed options."""
    return {
        "space_file": args.space,
        "params_file": args.params,
        "run_config": args.run_config,
        "trials": args.trials,
        "minutes": args.minutes,
        "parallel": args.parallel,
        "repeat_best": args.repeat_best,
        "storage": args.storage,
        "allow_unpinned": args.allow_unpinned,
    }


def handle_sweep(args: argparse.Namespace) -> int:
    from pipeline.config import load_params
    from pipeline.stages.start import REFUSED_INPUTS, check_inputs
    from pipeline.sweep import study
    from pipeline.sweep.report import SweepSummary
    from pipeline.sweep.space import load_space

    try:  # one line, no run: the inputs, the space and its budget, the storage
        params = load_params(args.params, args.run_config)
        check_inputs(params, allow_unpinned=args.allow_unpinned)
        load_space(args.space, params).with_budget(args.trials, args.minutes, args.parallel)
        if args.storage is not None:
            study.check_storage(args.storage)
    except REFUSED_INPUTS as error:
        return refuse(args, error)
    launched = launch_flow("flows.sweep", sweep_parameters(args), args.quiet)
    if launched.result is not None:
        print(to_json(launched.result) if args.json else SweepSummary.from_dict(launched.result).text())
    return launched.code
