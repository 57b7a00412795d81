"""The `retrain` Prefect flow: pins → validate (with the slice, once) → train → calibrate → export → MLflow → register →
smoke test over HTTP → promotion gate → aliases. Every task is a thin call into `pipeline/`.

Task results persist under the project's Prefect home (`.prefect/`, set by the Makefile and `decision
retrain`), cached on their inputs and source, so a rerun after a crash skips the finished tasks, and a train
task killed midway resumes from its last training checkpoint in the run folder. The idempotency key (data +
base snapshot + params + code) names the run folder, the MLflow run and the model version, so the same key
never makes a second run or version (a killed flow's unfinished run is reopened). Retries only where I/O can fail transiently:
the registry and the HTTP smoke test; never training.

It trains only on inputs DVC pins (`dvc.lock`, or a `.dvc` file) and refuses before any task runs otherwise,
naming each path and the command that pins it. `--allow-unpinned` trains anyway: the run and the version are
tagged `allow_unpinned=true`, and the gate holds the version (`decision promote VERSION --force` promotes it).

    python -m flows.retrain                  # params.yaml (what `make run` does)
    python -m flows.retrain --run-config tiny
    python -m flows.retrain --allow-unpinned # data or base not pinned yet: train, never promote by itself
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.runtime import flow_run

from flows.interrupts import EXIT_INTERRUPTED, refused, stoppable_run
from pipeline.cli.main import to_json
from pipeline.cli.tables import console as wide_console
from pipeline.cli.tables import quiet_libraries
from pipeline.config import ConfigError, Params, RetrainConfig, load_params
from pipeline.data import pins
from pipeline.data.read import iter_tables
from pipeline.data.shards import BadSource, UnreadableInput
from pipeline.data.split import SplitData
from pipeline.families import resolve_training
from pipeline.families.base import ModelLayoutError
from pipeline.lineage import (
    TAGGED_SETTINGS,
    DataRevision,
    code_digest,
    git_commit,
    idempotency_key,
    keyed_sections,
    settings_changed,
)
from pipeline.mlops import tracking
from pipeline.mlops.model_card import attach_model_card, model_card
from pipeline.mlops.promotion import CHAMPION, UNPINNED_TAG
from pipeline.mlops.registry import (
    alias_data_revision,
    ensure_experiment,
    registry_lineage,
    tracking_uri,
)
from pipeline.mlops.store import check_tracking_store
from pipeline.rundir import RunBusy, RunFolder
from pipeline.scoring.bag_of_words import BAG_OF_WORDS
from pipeline.scoring.report import report_tags
from pipeline.stages import calibrate as calibrate_stage
from pipeline.stages import export as export_stage
from pipeline.stages import promote as promote_stage
from pipeline.stages import smoke as smoke_stage
from pipeline.stages import train as train_stage
from pipeline.stages import validate as validate_stage
from pipeline.stages.calibrate import CalibrationResult
from pipeline.stages.promote import GateResult
from pipeline.stages.smoke import SmokeResult
from pipeline.stages.validate import ValidateResult
from pipeline.training.controls import RunHooks
from pipeline.training.fit import TrainRun

CACHED = {"cache_policy": INPUTS + TASK_SOURCE, "persist_result": True}
IO_RETRIES = {"retries": 2, "retry_delay_seconds": 5}
LOCAL_UI = "http://127.0.0.1:5000"  # where `make ui` serves the local store


@task(name="verify-pins")
def verify_pins(paths: list[str], lock: str, allow_unpinned: bool = False) -> dict[str, str]:
    if not allow_unpinned:
        return pins.require_pins(paths, lock)
    missing = pins.unpinned(paths, lock)
    if missing:
        get_run_logger().warning(
            "--allow-unpinned: training on inputs DVC does not pin: %s", ", ".join(missing)
        )
    return pins.verify_inputs(paths, lock)


@task(name="validate", **CACHED)
def validate(data: str, row_slice: str | None, config, report_file: str, split: str) -> ValidateResult:
    result = validate_stage.validate_stage(data, config, report_file, row_slice, split_out=split,
                                           report=get_run_logger().info)  # fmt: skip
    rows = [{"reason": reason, "decisions": n} for reason, n in sorted(result.report.skipped.items())]
    usable = f"{result.report.kept} of {result.report.decisions} decisions usable"
    create_table_artifact(rows or [{"reason": "(none)", "decisions": 0}], key="skipped-decisions",
                          description=_with_states(usable, result.report.states))  # fmt: skip
    return result


def _with_states(usable: str, states) -> str:
    """The skip table's description: usable decisions, and the states' sizes where validation measured them."""
    return usable if states is None else f"{usable}; {states.describe()}"


@task(name="train", **CACHED)
def train(run_dir: str, base: str, config, device: str, key: str, tags: dict[str, str],
          inputs: dict[str, dict[str, Any]], pins: dict[str, str]) -> TrainRun:  # fmt: skip
    # No progress bar in the Prefect log: the run logger gets a line every 10 steps or 30 s instead.
    # The MLflow run opens now, so its curves fill in the UI while training runs.
    # With train.nproc > 1 the stage runs on torchrun ranks: rank 0's lines and curves come back here, to this
    # one run (every rank knows its id).
    logger = get_run_logger()
    run_id, live = tracking.open_run(key, flow_run.name, tags)
    watch = tracking.LiveRun(run_id) if live else None
    hooks = RunHooks(logger.info, watch and watch.step, watch and watch.heldout, mlflow_run_id=run_id)
    run = train_stage.train_stage(
        run_dir, base, config, device, hooks, checked={"pins": pins, "inputs": inputs}
    )
    for warning in run.warnings:
        logger.warning("the fine-tune did not learn: %s", warning)
    return run


@task(name="calibrate", **CACHED)
def calibrate(run_dir: str, bag_of_words_rows: int) -> CalibrationResult:
    logger = get_run_logger()
    result = calibrate_stage.calibrate_stage(run_dir, bag_of_words_rows=bag_of_words_rows, say=logger.info)
    words = result.heldout.get(BAG_OF_WORDS)
    if words:
        logger.info("bag of words (TF-IDF + logistic regression) on %s training rows in %.0f s: held-out "
                              "accuracy %.4f, the calibrated fine-tune's %.4f", f"{words['rows']:,}", words["seconds"],
                              words["accuracy"], result.heldout["calibrated"]["accuracy"])  # fmt: skip
    return result


@task(name="export", **CACHED)
def export(run_dir: str, data: str, base: str, config) -> str:
    return export_stage.export_stage(run_dir, RunFolder(run_dir).export, data, base, config).out


@task(name="log-to-mlflow", **CACHED, **IO_RETRIES)
def log_run(record, run_id: str) -> str:
    return tracking.log_training_run(record, run_id)


@task(name="register", **CACHED, **IO_RETRIES)
def register(export_dir: str, name: str, run_id: str, tags: dict[str, str]) -> str:
    return promote_stage.register_stage(export_dir, name, run_id, tags)


@task(name="model-card", **IO_RETRIES)
def card(record: tracking.TrainingRecord, name: str, version: str, run_id: str) -> None:
    attach_model_card(name, version, run_id, model_card(record, name, version))


@task(name="smoke-test", **IO_RETRIES)
def smoke(name: str, version: str, run_dir: str, n: int) -> SmokeResult:
    run = RunFolder(run_dir)
    heldout = SplitData.load(run.split).split.heldout
    get_run_logger().info("smoke test: serving %s version %s on a loopback port, then up to %d held-out decisions "
                          "over HTTP", name, version, n)  # fmt: skip
    return smoke_stage.smoke_version(name, version, heldout, n, run.expected_answers)


@task(name="promotion-gate", **IO_RETRIES)
def promotion_gate(name: str, version: str, figures: dict[str, Any], smoke_passed: bool, run_dir: str,
                   config, learning_warnings: list[str], unpinned: bool = False) -> GateResult:  # fmt: skip
    """The gate on the run's held-out `figures` (`CalibrationResult.heldout`: the calibrated fine-tune's, and its
    bag of words' where scored)."""
    heldout = SplitData.load(RunFolder(run_dir).split).split.heldout
    words = figures.get(BAG_OF_WORDS, {}).get("accuracy")
    return promote_stage.promotion_stage(name, version, figures["calibrated"], smoke_passed, heldout, config,
                                         learning_warnings, unpinned=unpinned, bag_of_words=words)  # fmt: skip


def _run_name() -> str:
    params = flow_run.parameters
    data = load_params(params.get("params_file", "params.yaml"), params.get("run_config")).retrain.data
    return f"retrain-{pins.data_revision(data)[:8]}-{dt.date.today().isoformat()}"


# A hung run (a stuck smoke-test server, say) must not hold the deployment's single slot forever.
@flow(name="retrain", flow_run_name=_run_name, log_prints=True, timeout_seconds=4 * 3600)
def retrain(
    params_file: str = "params.yaml",
    run_config: str | None = None,
    lock: str = "dvc.lock",
    owner: str | None = None,
    allow_unpinned: bool = False,
    only_new_data: bool = False,
) -> dict[str, Any]:
    """Retrain on the pinned data and base, track, register, smoke-test and (through the gate) promote.

    `owner` tags the run and the version: the Decision API then serves that version by name to the owner's keys.
    `allow_unpinned` trains on inputs DVC does not pin (refused otherwise); the gate then holds the version.
    `only_new_data` (the scheduled deployment's setting) skips the run, with its reason, when the data revision is
    the one the champion was trained on: no new rows arrived, so there is nothing new to learn.
    """
    # A tracking store that is down fails the run now, not after training when the run is logged.
    check_tracking_store(tracking_uri())
    params = load_params(params_file, run_config)
    config = params.retrain
    verified = verify_pins([config.data, config.base], lock, allow_unpinned)
    inputs = pins.pin_status({"data": config.data, "base": config.base}, lock)
    data_md5, base_md5 = pins.data_revision(config.data), pins.current_md5(Path(config.base))
    if only_new_data and (
        skipped := _unchanged_since_champion(config.model_name, config.data, data_md5, run_config)
    ):
        print(skipped)
        return {"skip_reason": skipped, "model": config.model_name, "data_md5": data_md5}
    code = code_digest()
    key = idempotency_key(data_md5, base_md5, keyed_sections(params), code, unpinned=allow_unpinned)
    lineage_tags = {
        "data_md5": data_md5,
        "base_md5": base_md5,
        "code_digest": code,
        "git_commit": _git_commit(),
    }
    revision = _revision(params, key, lineage_tags)
    print(revision.line())
    run_dir = str(Path(config.runs_dir) / key[:16])
    run = RunFolder(run_dir)
    with ExitStack() as held:
        try:
            held.enter_context(run.driven())
        except RunBusy as error:
            return refused(error)
        return _run(params, run, key, revision, verified, inputs, lineage_tags, owner, allow_unpinned)


def _revision(params: Params, key: str, lineage_tags: dict[str, Any]) -> DataRevision:
    """The data revision against the model's last version, with what else changed since (one registry query)."""
    config = params.retrain
    found = registry_lineage(config.model_name, key)
    now = {name: str(value) for name, value in tracking.flat_params(params.sections()).items()}
    now |= {tag: str(lineage_tags[tag]) for tag in TAGGED_SETTINGS if lineage_tags[tag]}
    return DataRevision(config.data, lineage_tags["data_md5"], found.previous, found.previous_revision,
                        found.rerun_of, settings_changed(found.previous_settings, now) if found.previous else ())  # fmt: skip


def _run(params: Params, run: RunFolder, key: str, revision: DataRevision, verified: dict[str, str],
         inputs: dict[str, Any], lineage_tags: dict[str, Any], owner: str | None,
         allow_unpinned: bool) -> dict[str, Any]:  # fmt: skip
    """The run's tasks, from validation to the gate, with its folder held."""
    config, run_dir = params.retrain, str(run.root)
    # Validated and split once: every later task reads the run's split (RunFolder.split).
    validated = validate(config.data, config.slice, params.validate, str(run.validation), str(run.split))
    tags = {**lineage_tags, "idempotency_key": key,
            "data": config.data, "base": config.base, **pins.pin_tags(inputs),
            **_optional_tags(owner, allow_unpinned)}  # fmt: skip
    trained = train(run_dir, config.base, params.train, config.device, key, tags, inputs, verified)
    calibration = calibrate(run_dir, params.train.bag_of_words_rows)
    export_dir = export(run_dir, config.data, config.base, params.train)
    tags |= {"prefect_flow_run_id": str(flow_run.id)}
    record = tracking.TrainingRecord(key, params.sections(), trained.to_dict(), calibration.to_dict(),
                                     validated.to_dict(), config.data, tags["data_md5"], export_dir, run_dir, tags,
                                     flow_run.name)  # fmt: skip
    run_id = log_run(record, trained.mlflow_run_id)
    version = register(
        export_dir,
        config.model_name,
        run_id,
        {**tags, "mlflow_run_id": run_id, **report_tags(calibration.to_dict())},
    )
    card(record, config.model_name, version, run_id)
    smoked = smoke(config.model_name, version, run_dir, config.smoke_decisions)
    verdict = promotion_gate(config.model_name, version, calibration.heldout, smoked.passed,
                             run_dir, params.promote, trained.warnings, allow_unpinned)  # fmt: skip
    summary = _summary(
        config, key, verified, validated, trained, calibration, run_id, version, smoked, verdict
    ) | {"data": revision.to_dict()}
    _publish(summary)
    return summary


def _unchanged_since_champion(name: str, data: str, data_md5: str, run_config: str | None) -> str | None:
    """The one-line reason to skip when the champion was trained on this data revision, else None; the harvest
    command it names is the run's, ready to paste."""
    champion = alias_data_revision(name, CHAMPION)
    if champion is None or champion[1] != data_md5:
        return None
    harvest = "decision harvest" + (f" --run-config {run_config}" if run_config else "")
    return (
        f"skipped: no new rows in {data} since champion {name} version {champion[0]} (data revision "
        f"{data_md5[:8]}); harvest labelled decisions ({harvest}) to give it something to learn"
    )


def _optional_tags(owner: str | None, allow_unpinned: bool) -> dict[str, str]:
    return ({"owner": owner} if owner else {}) | ({UNPINNED_TAG: "true"} if allow_unpinned else {})


def _summary(config: RetrainConfig, key: str, verified: dict[str, str], validated: ValidateResult,
             trained: TrainRun, calibration: CalibrationResult, run_id: str, version: str, smoked: SmokeResult,
             verdict: GateResult) -> dict[str, Any]:  # fmt: skip
    return {
        "model": config.model_name, "version": version, "champion": verdict.champion,
        "promoted": verdict.promote, "gate": verdict.reasons, "mlflow_run_id": run_id,
        "idempotency_key": key, "pins": verified, "inputs": trained.inputs, "family": trained.family,
        "warnings": trained.warnings, "notices": calibration.notices, "rows": validated.report.rows,
        "decisions": validated.report.decisions,
        "skipped": validated.report.skipped, "heldout": calibration.heldout,
        "temperatures": calibration.temperatures, "calibrator": calibration.calibrator,
        "calibration_report": calibration.report, "comparison": verdict.comparison,
        "steps": trained.steps, "world_size": trained.world_size,
        "train_seconds": trained.train_seconds, "s_per_step": trained.s_per_step,
        "smoke": {k: smoked.to_dict()[k] for k in ("passed", "agreement", "max_probability_diff", "trained_agreement",
                                         "trained_max_probability_diff", "failures", "latency_ms")},
    }  # fmt: skip


def _publish(summary: dict[str, Any]) -> None:
    # A tracking server serves its own UI; otherwise `make ui` serves the local store on port 5000.
    store = tracking_uri()
    ui = os.environ.get("MLFLOW_UI_URL") or (store if store.startswith(("http://", "https://")) else LOCAL_UI)
    create_link_artifact(f"{ui}/#/experiments/{ensure_experiment()}/runs/{summary['mlflow_run_id']}",
                         link_text="MLflow run (make ui)", key="mlflow-run")  # fmt: skip
    create_markdown_artifact(before_after_markdown(summary), key="before-after")


def before_after_markdown(summary: dict[str, Any]) -> str:
    """The held-out table (base, fine-tune, calibrated) and the gate's verdict, as markdown."""
    verdict = "promoted to champion" if summary["promoted"] else "held as challenger"
    notices = "".join(f"\n\nNote: {notice}" for notice in summary["notices"])
    return (
        f"{tracking.heldout_table(summary['heldout'])}\n\n"
        f"Version {summary['version']} of `{summary['model']}`: {verdict} ({'; '.join(summary['gate'])}).{notices}"
    )


def _git_commit() -> str:
    return git_commit() or "none"


# What `checked_before_a_run` raises: the run's inputs refused in one line, exit 2.
REFUSED_INPUTS = (ConfigError, pins.PinMismatch, UnreadableInput, ModelLayoutError)


def checked_before_a_run(params_file: str, run_config: str | None, allow_unpinned: bool,
                         lock: str = "dvc.lock") -> Params:  # fmt: skip
    """The run's params, and its data and base pins unless `allow_unpinned`, checked in the calling process: a
    bad run config or an unpinned input is one line and exit 2, before a flow run starts (whose failure Prefect
    would log with its traceback). The flow checks them again, as a deployment runs it without this."""
    params = load_params(params_file, run_config)
    if not allow_unpinned:
        pins.require_pins([params.retrain.data, params.retrain.base], lock)
    _inputs_readable(params)
    return params


def _inputs_readable(params: Params) -> None:
    """The data opens and holds a row, and the base is one its family trains from (pinned or not): otherwise
    BadSource, UnreadableInput, BadBase or ConfigError, in one line, before a flow run logs a traceback."""
    config = params.retrain
    if next(iter_tables(config.data, 1), None) is None:
        raise BadSource(f"{config.data}: no rows; give a data set with decision rows (docs/data-format.md)")
    resolve_training(config.base, params.train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.retrain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--run-config", help="configs/<NAME>.yaml overrides, e.g. tiny")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument(
        "--owner", help="tag the version with its owner (the Decision API serves it to their keys)"
    )
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="train even when DVC does not pin the data or base; the version is then held")  # fmt: skip
    parser.add_argument("--only-new-data", action="store_true",
                        help="skip (saying why) when the champion was trained on this data revision already")  # fmt: skip
    args = parser.parse_args(argv)
    quiet_libraries(args)  # no library progress bars between the flow's log lines where stderr is no terminal
    try:
        checked_before_a_run(args.params, args.run_config, args.allow_unpinned)
    except REFUSED_INPUTS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        with stoppable_run():
            summary = retrain(args.params, args.run_config, owner=args.owner, allow_unpinned=args.allow_unpinned,
                              only_new_data=args.only_new_data)  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the last checkpoint stays, and a rerun resumes from it
        print("retrain: interrupted; a rerun resumes from the last checkpoint", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RunBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if "skip_reason" in summary:
        print(to_json(summary) if args.json else summary["skip_reason"])
        return 0
    if args.json:
        print(to_json(summary))
    else:
        print_summary(summary, args.run_config)
    return 0


def print_summary(summary: dict[str, Any], run_config: str | None = None) -> None:
    from rich.table import Table

    console = wide_console()
    console.print(summary["data"]["line"])
    table = Table(
        title=f"{summary['model']} version {summary['version']}: held-out {summary['heldout']['decisions']} decisions"
    )
    for column in ("model", "accuracy", "record acc.", "ECE", "Brier"):
        table.add_column(column, justify="right" if column != "model" else "left")
    for model in [m for m in tracking.MODELS if m in summary["heldout"]]:  # a bag of words where fitted
        m = summary["heldout"][model]
        table.add_row(
            model.replace("_", " "), *(f"{m[k]:.4f}" for k in ("accuracy", "record_accuracy", "ece", "brier"))
        )
    console.print(table)
    overall = summary["calibration_report"]["overall"]
    console.print(f"calibrator: {summary['calibrator']['kind']} (lowest cross-fitted NLL; fitted on the "
                  f"{summary['calibrator'].get('fitted_on', 'held-out rows')}); calibrated ECE "
                  f"{overall['ece']:.4f}, 95% interval [{overall['ece_low']:.4f}, {overall['ece_high']:.4f}], "
                  f"NLL {overall['nll']:.4f}")  # fmt: skip
    smoke = summary["smoke"]
    failed = (
        ""
        if smoke["passed"]
        else f": {'; '.join(smoke.get('failures') or ['see the version tag smoke_failures'])}"
    )
    console.print(f"smoke test: {'passed' if smoke['passed'] else 'FAILED'}{failed} (agreement {smoke['agreement']}, "
                  f"p50 {smoke['latency_ms']['p50']} ms); gate: {'; '.join(summary['gate'])}")  # fmt: skip
    champion = "none yet" if summary["champion"] is None else f"version {summary['champion']}"
    console.print(f"champion: {champion}; {summary['steps']} steps in "
                  f"{summary['train_seconds']:.0f} s; MLflow run {summary['mlflow_run_id']}")  # fmt: skip
    for warning in summary["warnings"]:
        console.print(f"[bold yellow]warning[/]: the fine-tune did not learn: {warning}")
    for notice in summary["notices"]:
        console.print(f"[bold]note[/]: {notice}")
    serve = f"make serve NAME={run_config}" if run_config else "make serve"
    if summary["champion"] is None:
        console.print(f"[bold yellow]no champion[/]: version {summary['version']} is held as challenger, so "
                      f"{serve} has nothing to serve yet; once the reasons above are understood, decision promote "
                      f"{summary['version']} --name {summary['model']} --force promotes it by hand")  # fmt: skip
    serving = "" if summary["champion"] is None else f"[bold]{serve}[/] (Decision API on @champion), "
    console.print(f"next: [bold]make ui[/] (MLflow UI), {serving}[bold]make schedule[/] (weekly retraining on a "
                  "local Prefect server)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
