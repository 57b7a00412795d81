"""The `sweep` Prefect flow: a search over `train.*` settings with Optuna (TPE, and a median pruner on each trial's
validation curve), every trial an MLflow child run under one parent run with the same params and metrics as
`make run`, all on one validated split; then the best trial (by its validation figure, never a held-out one) goes on
through export, registration, the model card, the smoke test and the promotion gate, as a challenger.

    python -m flows.sweep --space sweeps/vader.yaml                 # the space file's budget
    python -m flows.sweep --space sweeps/vader.yaml --trials 20 --minutes 30 --repeat-best 3

A killed sweep resumes where it stopped: run the same command again. The Optuna study is kept beside the trials
(`runs/sweeps/<key>/optuna.db`, or `--storage URL`); finished trials are not run again, and the trial the kill
interrupted is asked again with the same settings, its training resumed from its checkpoint and its MLflow run
reopened. `--repeat-best N` then trains the best settings with N other seeds and reports the mean and standard
deviation of accuracy, record accuracy and ECE: the noise floor a difference between fine-tunes must beat.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.interrupts import EXIT_INTERRUPTED, refused, stoppable_run
from flows.retrain import (
    REFUSED_INPUTS,
    card,
    checked_before_a_run,
    export,
    promotion_gate,
    register,
    smoke,
    validate,
    verify_pins,
)
from pipeline.cli.main import to_json
from pipeline.cli.sweep import add_sweep_arguments
from pipeline.cli.tables import quiet_libraries
from pipeline.config import ConfigError, Params, load_params
from pipeline.data import pins
from pipeline.data.split import SplitData
from pipeline.lineage import code_digest, git_commit, idempotency_key, keyed_sections
from pipeline.mlops import tracking
from pipeline.mlops.registry import client, tracking_uri
from pipeline.mlops.store import check_tracking_store
from pipeline.rundir import RunFolder
from pipeline.scoring.report import report_tags
from pipeline.stages import calibrate as calibrate_stage
from pipeline.stages import train as train_stage
from pipeline.sweep import report, study
from pipeline.sweep.space import SearchSpace, apply, load_space
from pipeline.training.controls import RunControls, RunHooks

SWEEPS_FOLDER = "sweeps"


def _run_name() -> str:
    space = Path(flow_run.parameters["space_file"]).stem
    return f"sweep-{space}-{dt.date.today().isoformat()}"


@task(name="trial", task_run_name="{role}-{number}", cache_policy=NO_CACHE)
def run_trial(number: int, trial: optuna.Trial | None, settings: dict[str, Any], params: Params, folder: str,
              sweep_key: str, tags: dict[str, str], checked: dict[str, Any], role: str = "trial") -> report.TrialRow:  # fmt: skip
    """Train and calibrate one trial's settings on the sweep's split, and log it as a child of the parent run.

    Its run folder and MLflow run are keyed by its settings within the sweep: asked again after a kill, it resumes
    from its training checkpoint into the same run; a run already finished is read back, not trained again."""
    logger = get_run_logger()
    trial_params = apply(params, settings)
    key = idempotency_key(tags["data_md5"], tags["base_md5"], keyed_sections(trial_params) | {"sweep": sweep_key},
                          code_digest())  # fmt: skip
    run = RunFolder(Path(folder) / key[:16])
    _share_split(Path(folder), run)
    name = f"{role}-{number}"
    run_tags = tags | {"mlflow.parentRunId": tags["sweep_parent_run"], "sweep_role": role, "sweep_trial": str(number),
                       "sweep_settings": json.dumps(settings, sort_keys=True)}  # fmt: skip
    run_id, live = tracking.open_run(key, name, run_tags)
    if not live:  # finished before the kill: its figures are in its run
        logger.info("%s: finished earlier (MLflow run %s), read back", name, run_id)
        return _read_back(number, settings, run, run_id)
    watch = tracking.LiveRun(run_id)
    hooks = RunHooks(logger.info, watch.step, watch.heldout, mlflow_run_id=run_id)
    controls = RunControls(prune=study.pruning_callback(trial) if trial is not None else None)
    trained = train_stage.train_stage(str(run.root), trial_params.retrain.base, trial_params.train,
                                      trial_params.retrain.device, hooks, controls, checked)  # fmt: skip
    calibration = calibrate_stage.calibrate_stage(
        str(run.root),
        bag_of_words_rows=trial_params.train.bag_of_words_rows,
        say=logger.info,
        bag_of_words_cache=Path(folder),
    )  # every trial's MLflow run shows the same bag of words (the sweep's one split), fitted by the first
    record = tracking.TrainingRecord(key, trial_params.sections(), trained.to_dict(), calibration.to_dict(),
                                     json.loads(run.validation.read_text()), trial_params.retrain.data,
                                     tags["data_md5"], str(run.export), str(run.root), run_tags, name)  # fmt: skip
    tracking.log_training_run(record, run_id)
    pruned = (trained.early_stopping or {}).get("pruned_at") is not None
    row = report.TrialRow(number, "pruned" if pruned else "finished", settings, tracking.run_metrics(record),
                          report.question_accuracy(json.loads(run.calibration_report.read_text())), run_id,
                          run_dir=str(run.root), key=key)  # fmt: skip
    client().set_tag(run_id, "sweep_trial_state", row.state)
    return row


@task(name="tag-version", retries=2, retry_delay_seconds=5)
def tag_version(name: str, version: str, tags: dict[str, str]) -> None:
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)


def _share_split(folder: Path, run: RunFolder) -> None:
    """The sweep's one validated split (and its report) in the trial's run folder, where every stage reads it."""
    run.root.mkdir(parents=True, exist_ok=True)
    sweep = RunFolder(folder)
    for source, target in ((sweep.split, run.split), (sweep.validation, run.validation)):
        if not target.exists():
            shutil.copyfile(source, target)


def _read_back(number: int, settings: dict[str, Any], run: RunFolder, run_id: str) -> report.TrialRow:
    found = client().get_run(run_id)
    state = found.data.tags.get("sweep_trial_state", "finished")
    questions = report.question_accuracy(json.loads(run.calibration_report.read_text()))
    return report.TrialRow(number, state, settings, dict(found.data.metrics), questions, run_id,
                           run_dir=str(run.root), key=found.data.tags.get(tracking.KEY_TAG))  # fmt: skip


# A sweep is many trainings: a day's cap, not the retrain flow's four hours.
@flow(name="sweep", flow_run_name=_run_name, log_prints=True, timeout_seconds=24 * 3600)
def sweep(space_file: str, params_file: str = "params.yaml", run_config: str | None = None, lock: str = "dvc.lock",
          trials: int | None = None, minutes: float | None = None, parallel: int | None = None,
          repeat_best: int = 0, storage: str | None = None, allow_unpinned: bool = False) -> dict[str, Any]:  # fmt: skip
    """Search `space_file`'s settings, then register the best trial as a challenger (the gate decides on it)."""
    check_tracking_store(tracking_uri())
    params = load_params(params_file, run_config)
    space = load_space(space_file, params).with_budget(trials, minutes, parallel)
    config = params.retrain
    verified = verify_pins([config.data, config.base], lock, allow_unpinned)
    inputs = pins.pin_status({"data": config.data, "base": config.base}, lock)
    data_md5, base_md5 = pins.data_revision(config.data), pins.current_md5(Path(config.base))
    key = idempotency_key(data_md5, base_md5, keyed_sections(params) | {"sweep_space": space.text}, code_digest(),
                          unpinned=allow_unpinned)  # fmt: skip
    folder = Path(config.runs_dir) / SWEEPS_FOLDER / key[:16]
    tags = {"git_commit": git_commit() or "none", "data_md5": data_md5, "base_md5": base_md5, "data": config.data,
            "base": config.base, "sweep": key[:16], "sweep_objective": space.objective, **pins.pin_tags(inputs),
            **({"allow_unpinned": "true"} if allow_unpinned else {})}  # fmt: skip
    with ExitStack() as held:
        try:  # before the split is written: one process drives a sweep
            held.enter_context(study.SweepLock(folder))
        except study.SweepBusy as error:
            return refused(error)
        return _swept(params, space, space_file, folder, key, tags, {"pins": verified, "inputs": inputs},
                      storage, repeat_best)  # fmt: skip


def _swept(params: Params, space: SearchSpace, space_file: str, folder: Path, key: str, tags: dict[str, str],
           checked: dict[str, Any], storage: str | None, repeat_best: int) -> dict[str, Any]:  # fmt: skip
    """The sweep with its folder held: validate once, search, register the best trial; the summary."""
    config, sweep_run = params.retrain, RunFolder(folder)
    validated = validate(
        config.data, config.slice, params.validate, str(sweep_run.validation), str(sweep_run.split)
    )
    if not SplitData.load(sweep_run.split).split.validation:
        raise ConfigError("a sweep ranks its trials on the validation split, and this data gave none: raise "
                          "validate.validation_fraction, or lower validate.validation_min_decisions")  # fmt: skip
    study_storage = study.storage_url(folder, storage)
    study.check_storage(study_storage)  # before the parent run opens: a bad URL leaves no run behind
    parent_id, _ = tracking.open_run(key, flow_run.name, tags | {"sweep_role": "parent"})
    tags["sweep_parent_run"] = parent_id
    _log_parent_setup(parent_id, params, space, space_file)
    searched = study.open_study(space, key, study_storage)
    rows = _search(searched, space, params, str(folder), key, tags, checked)
    best = study.best_trial(searched)
    summary = {"sweep": key[:16], "folder": str(folder), "parent_run_id": parent_id,
               "storage": study_storage, "objective": space.objective,
               "trials": [row.to_dict() for row in rows], "best": None}  # fmt: skip
    if best is not None:
        best_row = next(row for row in rows if row.number == best.number)
        floor = (
            _repeat(best_row, repeat_best, params, str(folder), key, tags, checked) if repeat_best else None
        )
        summary["best"] = _challenger(best_row, params, validated, tags, space, floor)
        summary["noise_floor"] = floor
    _finish_parent(parent_id, rows, best and best.number, space, summary, folder)
    return summary


def _search(searched: optuna.Study, space: SearchSpace, params: Params, folder: str, key: str,
            tags: dict[str, str], checked: dict[str, Any]) -> list[report.TrialRow]:  # fmt: skip
    """Ask, run and tell trials until the budget is spent, `space.parallel` at a time; every trial's row, the
    ones finished before a resume included."""
    logger = get_run_logger()
    baseline = space.baseline(params)
    if not searched.trials and baseline is not None:  # trial 0: params.yaml's own settings, the baseline
        searched.enqueue_trial(baseline, user_attrs={"baseline": True})
    requeued = study.requeue_interrupted(searched)
    if requeued:
        logger.info("resuming: trial(s) %s were interrupted; their settings run again", requeued)
    rows = _earlier_rows(searched, space)
    budget = study.Budget(space.trials, space.minutes, time.monotonic())
    runner = ThreadPoolTaskRunner(max_workers=space.parallel)
    with runner:
        while (count := min(space.parallel, budget.left(searched))) > 0:
            asked = [searched.ask(space.distributions) for _ in range(count)]
            futures = [runner.submit(run_trial, {"number": trial.number, "trial": trial,
                                                 "settings": space.overrides(trial.params), "params": params,
                                                 "folder": folder, "sweep_key": key, "tags": tags, "checked": checked,
                                                 "role": "trial"})
                       for trial in asked]  # fmt: skip
            for trial, future in zip(asked, futures, strict=True):
                rows.append(_tell(searched, space, trial, future, logger))
    return sorted(rows, key=lambda row: row.number)


def _tell(searched: optuna.Study, space: SearchSpace, trial: optuna.Trial, future, logger) -> report.TrialRow:
    """The trial's outcome to Optuna (its value, pruned, or failed) and to the log; its row."""
    try:
        row = future.result()
    except Exception as error:  # a trial that crashes fails alone; the sweep goes on
        searched.tell(trial, state=optuna.trial.TrialState.FAIL)
        logger.warning("trial %d failed: %s", trial.number, error)
        return report.TrialRow(trial.number, "failed", space.overrides(trial.params), error=str(error)[:500])
    row = replace(row, baseline=bool(trial.user_attrs.get("baseline")))
    trial.set_user_attr("run_dir", row.run_dir)
    trial.set_user_attr("run_id", row.run_id)
    if row.state == "pruned":
        searched.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        searched.tell(trial, study.objective_value(space, row.metrics))
    logger.info("trial %d %s: %s %s, held-out accuracy %.4f", trial.number, row.state, space.objective,
                _figure(row.metrics.get(space.objective)), row.metrics.get("calibrated_accuracy", float("nan")))  # fmt: skip
    return row


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _earlier_rows(searched: optuna.Study, space: SearchSpace) -> list[report.TrialRow]:
    """Rows of the trials a previous process finished, pruned or failed, read back from their runs; a trial a kill
    interrupted is left out (its settings were asked again under a new number)."""
    trials = searched.get_trials(deepcopy=False)
    interrupted = {t.user_attrs["requeued_from"] for t in trials if "requeued_from" in t.user_attrs}
    states = {"COMPLETE": "finished", "PRUNED": "pruned", "FAIL": "failed"}
    rows = []
    for trial in trials:
        if trial.state.name not in states or trial.number in interrupted:
            continue
        settings, baseline = space.overrides(trial.params), bool(trial.user_attrs.get("baseline"))
        run_id, run_dir = trial.user_attrs.get("run_id"), trial.user_attrs.get("run_dir")
        if run_id and run_dir and RunFolder(run_dir).calibration_report.exists():
            rows.append(
                replace(_read_back(trial.number, settings, RunFolder(run_dir), run_id), baseline=baseline)
            )
        else:
            rows.append(report.TrialRow(trial.number, states[trial.state.name], settings, error="no run recorded",
                                        baseline=baseline))  # fmt: skip
    return rows


def _repeat(best: report.TrialRow, seeds: int, params: Params, folder: str, key: str, tags: dict[str, str],
            checked: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    """The best settings trained with `seeds` other seeds (children of the parent, tagged `sweep_role=repeat`):
    their mean and standard deviation. The best trial itself is left out: it was chosen, so its figure is biased."""
    first = best.settings.get("train.seed", params.train.seed)
    runs = []
    for offset in range(1, seeds + 1):
        settings = best.settings | {"train.seed": first + offset}
        row = run_trial(number=offset, trial=None, settings=settings, params=params, folder=folder, sweep_key=key,
                        tags=tags, checked=checked, role="repeat")  # fmt: skip
        runs.append(row.metrics)
    floor = report.noise_floor(runs)
    get_run_logger().info("noise floor of the best settings: %s", report.describe_noise(floor))
    return floor


def _challenger(best: report.TrialRow, params: Params, validated, tags: dict[str, str], space: SearchSpace,
                floor: dict[str, float] | None) -> dict[str, Any]:  # fmt: skip
    """The best trial through export, registration, its model card, the smoke test and the gate."""
    trial_params, run = apply(params, best.settings), RunFolder(best.run_dir)
    config = trial_params.retrain
    export_dir = export(str(run.root), config.data, config.base, trial_params.train)
    calibration = json.loads(run.calibration.read_text())
    version_tags = tags | {"sweep_trial": str(best.number), "sweep_settings": json.dumps(best.settings, sort_keys=True),
                           "mlflow_run_id": best.run_id, **report_tags(calibration)}  # fmt: skip
    # The same inputs register once (Prefect's cache): a rerun that adds --repeat-best tags that version.
    version = register(export_dir, config.model_name, best.run_id, version_tags)
    if floor is not None:
        version_tags["sweep_repeat"] = report.describe_noise(floor)
        tag_version(config.model_name, version, {"sweep_repeat": version_tags["sweep_repeat"]})
    train = json.loads(run.train_summary.read_text())
    record = tracking.TrainingRecord(best.key or best.run_id, trial_params.sections(), train, calibration, validated.to_dict(),
                                     config.data, tags["data_md5"], export_dir, str(run.root), version_tags,
                                     f"trial-{best.number}")  # fmt: skip
    card(record, config.model_name, version, best.run_id)
    smoked = smoke(config.model_name, version, str(run.root), config.smoke_decisions)
    verdict = promotion_gate(config.model_name, version, calibration["heldout"], smoked.passed,
                             str(run.root), trial_params.promote, train.get("warnings", []),
                             tags.get("allow_unpinned") == "true")  # fmt: skip
    return {"trial": best.number, "settings": best.settings, "model": config.model_name, "version": version,
            "promoted": verdict.promote, "champion": verdict.champion, "gate": verdict.reasons,
            "smoke_passed": smoked.passed, "mlflow_run_id": best.run_id, "metrics": best.metrics,
            "objective": {space.objective: best.metrics.get(space.objective)}}  # fmt: skip


def _log_parent_setup(parent_id: str, params: Params, space: SearchSpace, space_file: str) -> None:
    """The parent's params: params.yaml's (as every run logs them) and the space's budget, objective and file."""
    logged = client().get_run(parent_id).data.params
    values = tracking.flat_params(params.sections()) | {"sweep.objective": space.objective,
                                                         "sweep.space": Path(space_file).name,
                                                         "sweep.pruner": space.pruner}  # fmt: skip
    # A resumed sweep's parent has them already (MLflow refuses a param logged again with another value).
    tracking.log_values(
        parent_id, params={name: value for name, value in values.items() if name not in logged}
    )
    client().log_text(parent_id, space.text, "sweep/space.yaml")


def _finish_parent(parent_id: str, rows: list[report.TrialRow], best: int | None, space: SearchSpace,
                   summary: dict[str, Any], folder: Path) -> None:  # fmt: skip
    """The summary table as the parent's description and artifacts, the plots, the counts and the best figures,
    and the same as Prefect artifacts; the parent then ends."""
    table = report.summary_markdown(rows, best, space.objective)
    tally = {
        state: sum(1 for row in rows if row.state == state) for state in ("finished", "pruned", "failed")
    }
    metrics = {f"trials_{state}": float(n) for state, n in tally.items()}
    if best is not None:
        best_row = next(row for row in rows if row.number == best)
        metrics |= {
            f"best_{name}": float(best_row.metrics[name])
            for name in report.COLUMNS
            if name in best_row.metrics
        }
    for name, value in (summary.get("noise_floor") or {}).items():
        metrics[f"repeat_{name}"] = float(value)
    plots = [report.tradeoff_plot(rows, best, folder / "plots" / "sweep_tradeoff.png"),
             report.question_plot(rows, best, folder / "plots" / "sweep_questions.png")]  # fmt: skip
    tracking_client = client()
    tracking.log_values(parent_id, metrics=metrics)
    tracking_client.set_tag(parent_id, "mlflow.note.content", table)
    tracking_client.log_text(parent_id, table, "sweep/summary.md")
    tracking_client.log_dict(parent_id, summary, "sweep/summary.json")
    for plot in filter(None, plots):
        tracking_client.log_artifact(parent_id, str(plot), "plots")
    tracking_client.set_terminated(parent_id)
    create_markdown_artifact(table, key="sweep-summary")
    create_table_artifact([{"trial": row.number, "state": row.state, **row.settings,
                            **{name: row.metrics.get(name) for name in report.COLUMNS}} for row in rows],
                          key="sweep-trials")  # fmt: skip
    summary["plots"] = [str(plot) for plot in plots if plot]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_sweep_arguments(parser)
    args = parser.parse_args(argv)
    quiet_libraries(args)  # no library progress bars between the flow's log lines where stderr is no terminal
    try:
        params = checked_before_a_run(args.params, args.run_config, args.allow_unpinned)
        load_space(args.space, params).with_budget(
            args.trials, args.minutes, args.parallel
        )  # one line, no run
        if args.storage is not None:
            study.check_storage(args.storage)
        with stoppable_run():
            summary = sweep(args.space, args.params, args.run_config, trials=args.trials, minutes=args.minutes,
                            parallel=args.parallel, repeat_best=args.repeat_best, storage=args.storage,
                            allow_unpinned=args.allow_unpinned)  # fmt: skip
    except (*REFUSED_INPUTS, study.SweepBusy) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a rerun resumes the study, the interrupted trial first
        print("sweep: interrupted; a rerun resumes the study", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(to_json(summary) if args.json else _text(summary))
    return 0


def _text(summary: dict[str, Any]) -> str:
    rows = [report.TrialRow(**row) for row in summary["trials"]]
    best = summary["best"]
    lines = [report.summary_markdown(rows, best and best["trial"], summary["objective"])]
    if summary.get("noise_floor"):
        lines.append(f"noise floor of the best settings: {report.describe_noise(summary['noise_floor'])}")
    if best:
        verdict = "promoted to champion" if best["promoted"] else "held as challenger"
        lines.append(f"best trial {best['trial']}: {best['model']} version {best['version']}, {verdict} "
                     f"({'; '.join(best['gate'])})")  # fmt: skip
    lines.append(
        f"parent MLflow run {summary['parent_run_id']}; plots: {', '.join(summary.get('plots', []))}"
    )
    lines.append(
        "next: make ui (the parent run's description holds this table; select its children and Compare)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
