"""`decision harvest`: the Prefect `harvest` flow (flows/harvest.py) in its own process: labelled served
decisions become a new pinned revision of the run's data set. The target and the inference log are checked
here first (one line, exit 2).

decision harvest --run-config tickets                      # into the data set configs/tickets.yaml trains on
decision harvest --run-config tickets --inference postgresql://...  --json
"""

from __future__ import annotations

import argparse

from pipeline.cli.launch import launch_flow
from pipeline.cli.options import FLOW_QUIET_HELP, INFERENCE_HELP, add_output_flags
from pipeline.cli.runner import refuse
from pipeline.strict_json import to_json

ANY_MODEL = "any"


def add_harvest(commands) -> None:
    """`decision harvest` on the `decision` subparsers."""
    harvest = commands.add_parser(
        "harvest",
        help="labelled decisions into a new pinned revision of the run's data set (the harvest flow)",
        description="Run the Prefect flow `harvest`: join feedback to the inference log, validate the rows, "
        "write one new shard into the data set, pin it (dvc add, a git commit), record it in MLflow.",
    )
    harvest.add_argument(
        "--run-config", metavar="NAME", help="configs/NAME.yaml: its retrain.data is the target"
    )
    harvest.add_argument("--dataset", help="a folder of shards (default: the run's retrain.data)")
    harvest.add_argument("--inference", metavar="DIR|URL", help=INFERENCE_HELP)
    harvest.add_argument(
        "--model",
        metavar="NAME",
        help="whose labelled decisions: a served model's name or NAME/VERSION (default: the run's "
        f"retrain.model_name; {ANY_MODEL!r}: every model's)",
    )
    harvest.add_argument("--no-commit", action="store_true", help="pin with DVC but make no git commit")
    harvest.add_argument("--params", default="params.yaml", help="the params file")
    add_output_flags(harvest, FLOW_QUIET_HELP)
    harvest.set_defaults(handler=handle_harvest)


def harvest_parameters(args: argparse.Namespace) -> dict:
    """The harvest flow's parameters, by name, from the parsed options."""
    return {
        "params_file": args.params,
        "run_config": args.run_config,
        "inference": args.inference,
        "dataset": args.dataset,
        "commit": not args.no_commit,
        "model": args.model,
    }


def handle_harvest(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_params
    from pipeline.data.read import UnreadableInput
    from pipeline.flywheel.harvest import HarvestRefused
    from pipeline.flywheel.table import missing_log
    from pipeline.stages.harvest import check_target

    try:
        params = load_params(args.params, args.run_config)
        check_target(args.dataset or params.retrain.data, params.validate)
        if missing := missing_log(args.inference or params.flywheel.inference):
            raise HarvestRefused(missing)
    except (HarvestRefused, UnreadableInput, ConfigError) as error:
        return refuse(args, error)
    launched = launch_flow("flows.harvest", harvest_parameters(args), args.quiet)
    if launched.result is not None:
        rows = launched.result["rows"]
        said = f"{rows} {'row' if rows == 1 else 'rows'} harvested into {launched.result['dataset']}"
        print(to_json(launched.result) if args.json else said)
    return launched.code
