"""`decision retrain`: the Prefect `retrain` flow (flows/retrain.py) in its own process: what `make run` does.

decision retrain                         # params.yaml: pins, validate, train, calibrate, export, register, gate
decision retrain --run-config tiny --json
decision retrain --allow-unpinned        # data or base not pinned yet: the version is then held

The run's inputs are checked here first (a bad config, an unpinned or changed input, data with no rows, a base
no family trains from: one line, exit 2, before a flow run starts); the flow's own process checks them once
more.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.launch import launch_flow
from pipeline.cli.options import FLOW_QUIET_HELP, add_output_flags
from pipeline.cli.runner import refuse
from pipeline.cli.tables import automation_table, console
from pipeline.strict_json import to_json

OWNER_HELP = "tag the version with its owner: the Decision API serves it by name (NAME/VERSION) to their keys"
RUN_CONFIG_HELP = "configs/<NAME>.yaml overrides, e.g. tiny"


def add_retrain(commands) -> None:
    """`decision retrain` on the `decision` subparsers."""
    retrain = commands.add_parser(
        "retrain",
        help="run the Prefect retrain flow (what make run does)",
        description="Pins, validation, slice, training, calibration, export, MLflow, registration, smoke "
        "test, promotion gate; reruns skip finished work. Exit 2 when the inputs are refused (before a flow "
        "run starts) or another process runs the same run; 130 when interrupted (a rerun resumes).",
    )
    retrain.add_argument("--params", default="params.yaml", help="the params file")
    retrain.add_argument("--run-config", help=RUN_CONFIG_HELP)
    retrain.add_argument("--owner", help=OWNER_HELP)
    retrain.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="train even when dvc.lock is missing or does not pin the data or base (refused otherwise); the "
        "run and version are tagged allow_unpinned=true and the gate holds the version: decision promote "
        "VERSION --force promotes it",
    )
    retrain.add_argument(
        "--only-new-data",
        action="store_true",
        help="skip (saying why) when the champion was trained on this data revision already (what the "
        "scheduled and automated retrains do)",
    )
    add_output_flags(retrain, FLOW_QUIET_HELP)
    retrain.set_defaults(handler=handle_retrain)


def handle_retrain(args: argparse.Namespace) -> int:
    parameters = {
        "params_file": args.params,
        "run_config": args.run_config,
        "owner": args.owner,
        "allow_unpinned": args.allow_unpinned,
        "only_new_data": args.only_new_data,
    }
    return retrain(args, parameters, args.json, args.quiet)


def retrain(
    args: argparse.Namespace, parameters: dict[str, Any], as_json: bool = False, quiet: bool = False
) -> int:
    """Check the run's inputs here, then run the flow on `parameters` (its own, by name) and print its result;
    the flow's exit code."""
    from pipeline.config import load_params
    from pipeline.stages.result import RunResult
    from pipeline.stages.start import REFUSED_INPUTS, check_inputs

    params_file, run_config = parameters.get("params_file", "params.yaml"), parameters.get("run_config")
    try:
        check_inputs(
            load_params(params_file, run_config), allow_unpinned=parameters.get("allow_unpinned", False)
        )
    except REFUSED_INPUTS as error:
        return refuse(args, error)
    launched = launch_flow("flows.retrain", parameters, quiet)
    if launched.result is None:
        return launched.code
    if as_json:
        print(to_json(launched.result))
    elif "skip_reason" in launched.result:
        print(launched.result["skip_reason"])
    else:
        print_summary(RunResult.from_dict(launched.result), run_config)
    return launched.code


def print_summary(result, run_config: str | None = None) -> None:
    """What a user reads after `make run`: the data's revision, the held-out table, the calibrator, the smoke
    test and the gate, the champion, warnings, and the next commands."""
    from rich.table import Table

    from pipeline.mlops.tracking import MODELS

    out, release, train = console(), result.release, result.train
    out.print(result.tracked.revision.line())
    heldout = result.heldout
    table = Table(
        title=f"{release.model} version {release.version}: held-out {heldout['decisions']} decisions"
    )
    for column in ("model", "accuracy", "record acc.", "ECE", "Brier"):
        table.add_column(column, justify="right" if column != "model" else "left")
    for model in [m for m in MODELS if m in heldout]:  # a bag of words where fitted
        figures = (f"{heldout[model][k]:.4f}" for k in ("accuracy", "record_accuracy", "ece", "brier"))
        table.add_row(model.replace("_", " "), *figures)
    out.print(table)
    if result.calibration.certificates:
        out.print(automation_table(result.calibration.certificates))
    out.print(_calibrator_line(result.calibration))
    out.print(f"{_smoke_line(release.smoke)}; gate: {'; '.join(release.gate.reasons)}")
    champion = "none yet" if release.gate.champion is None else f"version {release.gate.champion}"
    out.print(
        f"champion: {champion}; {train.steps} steps in {train.train_seconds:.0f} s; MLflow run "
        f"{result.tracked.mlflow_run_id}"
    )
    for warning in train.warnings:
        out.print(f"[bold yellow]warning[/]: the fine-tune did not learn: {warning}")
    for notice in result.calibration.notices:
        out.print(f"[bold]note[/]: {notice}")
    _print_next(out, release, run_config)


def _calibrator_line(calibration) -> str:
    overall, calibrator = calibration.report["overall"], calibration.calibrator
    return (
        f"calibrator: {calibrator['kind']} (lowest cross-fitted NLL; fitted on the "
        f"{calibrator.get('fitted_on', 'held-out rows')}); calibrated ECE {overall['ece']:.4f}, 95% interval "
        f"[{overall['ece_low']:.4f}, {overall['ece_high']:.4f}], NLL {overall['nll']:.4f}"
    )


def _smoke_line(smoke) -> str:
    failed = (
        "" if smoke.passed else f": {'; '.join(smoke.failures or ['see the version tag smoke_failures'])}"
    )
    return (
        f"smoke test: {'passed' if smoke.passed else 'FAILED'}{failed} (agreement {smoke.agreement}, "
        f"p50 {smoke.latency_ms['p50']} ms)"
    )


def _print_next(out, release, run_config: str | None) -> None:
    """The next commands: serving where there is a champion, else how to promote the held version by hand."""
    serve = f"make serve NAME={run_config}" if run_config else "make serve"
    if release.gate.champion is None:
        out.print(
            f"[bold yellow]no champion[/]: version {release.version} is held as challenger, so {serve} has "
            f"nothing to serve yet; once the reasons above are understood, decision promote "
            f"{release.version} --name {release.model} --force promotes it by hand"
        )
    serving = "" if release.gate.champion is None else f"[bold]{serve}[/] (Decision API on @champion), "
    out.print(
        f"next: [bold]make ui[/] (MLflow UI), {serving}[bold]make schedule[/] (weekly retraining on a "
        "local Prefect server)"
    )
