"""The `sweep` Prefect flow: a search over `train.*` settings with Optuna (TPE, and a median pruner on each
trial's validation curve), every trial an MLflow child run under one parent run with the same params and
metrics as `make run`, all on one validated split; then the best trial (by its validation figure, never a
held-out one) goes on through export, registration, the model card, the smoke test and the promotion gate, as
a challenger. Each trial returns its `RunResult` (kept in its run folder); the sweep returns its
`SweepSummary`.

    decision sweep --space sweeps/vader.yaml                 # the space file's budget, this flow in its own process
    decision sweep --space sweeps/vader.yaml --trials 20 --minutes 30 --repeat-best 3

A killed sweep resumes where it stopped: run the same command again. The Optuna study is kept beside the
trials (`runs/sweeps/<key>/optuna.db`, or `--storage URL`); finished trials are not run again, and the trial
the kill interrupted is asked again with the same settings, its training resumed from its checkpoint and its
MLflow run reopened. `--repeat-best N` then trains the best settings with N other seeds and reports the mean
and standard deviation of accuracy, record accuracy and ECE: the noise floor a difference between fine-tunes
must beat.
"""

from __future__ import annotations

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

from flows.interrupts import refused
from flows.launched import run_launched
from flows.retrain import card, export, promotion_gate, register, smoke, validate
from pipeline.config import ConfigError, Params
from pipeline.data.split import SplitData
from pipeline.lineage import idempotency_key, keyed_sections
from pipeline.mlops import tracking
from pipeline.mlops.registry import client
from pipeline.rundir import RunBusy, RunFolder
from pipeline.scoring.certified_coverage import certificate_tags
from pipeline.scoring.report import report_tags
from pipeline.stages import calibrate as calibrate_stage
from pipeline.stages import train as train_stage
from pipeline.stages.result import Release, RunResult, Tracked
from pipeline.stages.start import REFUSED_INPUTS, RunStart, start_run
from pipeline.stages.track import run_metrics, track_run
from pipeline.stages.validate import ValidateResult
from pipeline.sweep import report, study
from pipeline.sweep.space import SearchSpace, apply, load_space
from pipeline.training.controls import RunControls, RunHooks

SWEEPS_FOLDER = "sweeps"


def _run_name() -> str:
    space = Path(flow_run.parameters["space_file"]).stem
    return f"sweep-{space}-{dt.date.today().isoformat()}"


@task(name="trial", task_run_name="{role}-{number}", cache_policy=NO_CACHE)
def run_trial(
    number: int,
    trial: optuna.Trial | None,
    settings: dict[str, Any],
    params: Params,
    folder: str,
    start: RunStart,
    tags: dict[str, str],
    role: str = "trial",
) -> RunResult:
    """Train and calibrate one trial's settings on the sweep's split, and log it as a child of the parent run.

    Its run folder and MLflow run are keyed by its settings within the sweep: asked again after a kill, it
    resumes from its training checkpoint into the same run; a run already finished is read back, not trained
    again."""
    logger = get_run_logger()
    trial_params = apply(params, settings)
    keyed = keyed_sections(trial_params) | {"sweep": start.key}
    key = idempotency_key(start.data_md5, start.base_md5, keyed, start.code)
    run = RunFolder(Path(folder) / key[:16])
    _share_split(Path(folder), run)
    name = f"{role}-{number}"
    run_tags = tags | {
        "mlflow.parentRunId": tags["sweep_parent_run"],
        "sweep_role": role,
        "sweep_trial": str(number),
        "sweep_settings": json.dumps(settings, sort_keys=True),
    }
    run_id, live = tracking.open_run(key, name, run_tags)
    if not live:  # finished before the kill: its result is in its run folder
        logger.info("%s: finished earlier (MLflow run %s), read back", name, run_id)
        return RunResult.load(run.result)
    watch = tracking.LiveRun(run_id)
    hooks = RunHooks(logger.info, watch.step, watch.heldout, mlflow_run_id=run_id)
    controls = RunControls(prune=study.pruning_callback(trial) if trial is not None else None)
    config = trial_params.retrain
    trained = train_stage.train_stage(
        str(run.root), config.base, trial_params.train, config.device, hooks, controls, start.checked
    )
    calibration = calibrate_stage.calibrate_stage(
        str(run.root),
        bag_of_words_rows=trial_params.train.bag_of_words_rows,
        say=logger.info,
        bag_of_words_cache=Path(folder),
        certify_config=trial_params.certify,
    )  # every trial's MLflow run shows the same bag of words (the sweep's one split), fitted by the first
    tracked = Tracked(
        key=key,
        params=trial_params.sections(),
        data=config.data,
        data_md5=start.data_md5,
        tags=run_tags,
        run_name=name,
        mlflow_run_id=run_id,
    )
    validation = ValidateResult.from_dict(json.loads(run.validation.read_text()))
    result = RunResult(
        run_dir=str(run.root), validation=validation, train=trained, calibration=calibration, tracked=tracked
    ).saved(run.result)
    track_run(result, run_id)
    client().set_tag(run_id, "sweep_trial_state", _state(result))
    return result


def _state(result: RunResult) -> str:
    """finished, or pruned (stopped by the pruner on its validation curve)."""
    return "pruned" if (result.train.early_stopping or {}).get("pruned_at") is not None else "finished"


def _row(number: int, settings: dict[str, Any], result: RunResult) -> report.TrialRow:
    """A trial's row in the sweep's table, from its result."""
    questions = report.question_accuracy(json.loads(RunFolder(result.run_dir).calibration_report.read_text()))
    return report.TrialRow(
        number=number,
        state=_state(result),
        settings=settings,
        metrics=run_metrics(result),
        questions=questions,
        run_id=result.tracked.mlflow_run_id,
        run_dir=result.run_dir,
        key=result.tracked.key,
    )


@task(name="tag-version", retries=2, retry_delay_seconds=5)
def tag_version(name: str, version: str, tags: dict[str, str]) -> None:
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)


def _share_split(folder: Path, run: RunFolder) -> None:
    """The sweep's one validated split (and its report) in the trial's run folder, where every stage reads
    it."""
    run.root.mkdir(parents=True, exist_ok=True)
    sweep = RunFolder(folder)
    for source, target in ((sweep.split, run.split), (sweep.validation, run.validation)):
        if not target.exists():
            shutil.copyfile(source, target)


# A sweep is many trainings: a day's cap, not the retrain flow's four hours.
@flow(name="sweep", flow_run_name=_run_name, log_prints=True, timeout_seconds=24 * 3600)
def sweep(
    space_file: str,
    params_file: str = "params.yaml",
    run_config: str | None = None,
    lock: str = "dvc.lock",
    trials: int | None = None,
    minutes: float | None = None,
    parallel: int | None = None,
    repeat_best: int = 0,
    storage: str | None = None,
    allow_unpinned: bool = False,
) -> report.SweepSummary:
    """Search `space_file`'s settings, then register the best trial as a challenger (the gate decides on
    it)."""
    start = start_run(params_file, run_config, lock, allow_unpinned)
    space = load_space(space_file, start.params).with_budget(trials, minutes, parallel)
    start = start.keyed_with({"sweep_space": space.text})
    folder = start.folder(SWEEPS_FOLDER)
    tags = start.tags | {"sweep": start.key[:16], "sweep_objective": space.objective}
    with ExitStack() as held:
        try:  # before the split is written: one process drives a sweep
            held.enter_context(RunFolder(folder).driven("sweep"))
        except RunBusy as error:
            return refused(error)
        return _swept(start, space, space_file, folder, tags, storage, repeat_best)


def _swept(
    start: RunStart,
    space: SearchSpace,
    space_file: str,
    folder: Path,
    tags: dict[str, str],
    storage: str | None,
    repeat_best: int,
) -> report.SweepSummary:
    """The sweep with its folder held: validate once, search, register the best trial; the summary."""
    params, sweep_run = start.params, RunFolder(folder)
    config = params.retrain
    validate(config.data, config.slice, params.validate, str(sweep_run.validation), str(sweep_run.split))
    if not SplitData.load(sweep_run.split).split.validation:
        raise ConfigError(
            "a sweep ranks its trials on the validation split, and this data gave none: raise "
            "validate.validation_fraction, or lower validate.validation_min_decisions"
        )
    study_storage = study.storage_url(folder, storage)
    study.check_storage(study_storage)  # before the parent run opens: a bad URL leaves no run behind
    parent_id, _ = tracking.open_run(start.key, flow_run.name, tags | {"sweep_role": "parent"})
    tags = tags | {"sweep_parent_run": parent_id}
    _log_parent_setup(parent_id, params, space, space_file)
    searched = study.open_study(space, start.key, study_storage)
    rows = _search(searched, space, str(folder), start, tags)
    best = study.best_trial(searched)
    best_row = next((row for row in rows if best is not None and row.number == best.number), None)
    floor = (
        _repeat(best_row, repeat_best, params, str(folder), start, tags) if best_row and repeat_best else None
    )
    summary = report.SweepSummary(
        sweep=start.key[:16],
        folder=str(folder),
        parent_run_id=parent_id,
        storage=study_storage,
        objective=space.objective,
        trials=rows,
        best=best_row,
        release=_challenger(best_row, params, tags, floor) if best_row else None,
        noise_floor=floor,
    )
    return _finish_parent(summary, space, folder)


def _search(
    searched: optuna.Study, space: SearchSpace, folder: str, start: RunStart, tags: dict[str, str]
) -> list[report.TrialRow]:
    """Ask, run and tell trials until the budget is spent, `space.parallel` at a time; every trial's row, the
    ones finished before a resume included."""
    logger = get_run_logger()
    baseline = space.baseline(start.params)
    if not searched.trials and baseline is not None:  # trial 0: params.yaml's own settings, the baseline
        searched.enqueue_trial(baseline, user_attrs={"baseline": True})
    requeued = study.requeue_interrupted(searched)
    if requeued:
        logger.info("resuming: trial(s) %s were interrupted; their settings run again", requeued)
    rows = _earlier_rows(searched, space)
    budget = study.Budget(space.trials, space.minutes, time.monotonic())
    with ThreadPoolTaskRunner(max_workers=space.parallel) as runner:
        while (count := min(space.parallel, budget.left(searched))) > 0:
            asked = [searched.ask(space.distributions) for _ in range(count)]
            futures = [
                runner.submit(run_trial, _trial_parameters(trial, space, folder, start, tags))
                for trial in asked
            ]
            for trial, future in zip(asked, futures, strict=True):
                rows.append(_tell(searched, space, trial, future, logger))
    return sorted(rows, key=lambda row: row.number)


def _trial_parameters(
    trial: optuna.Trial, space: SearchSpace, folder: str, start: RunStart, tags: dict[str, str]
) -> dict[str, Any]:
    """`run_trial`'s parameters for an asked trial."""
    return {
        "number": trial.number,
        "trial": trial,
        "settings": space.overrides(trial.params),
        "params": start.params,
        "folder": folder,
        "start": start,
        "tags": tags,
        "role": "trial",
    }


def _tell(searched: optuna.Study, space: SearchSpace, trial: optuna.Trial, future, logger) -> report.TrialRow:
    """The trial's outcome to Optuna (its value, pruned, or failed) and to the log; its row."""
    settings = space.overrides(trial.params)
    try:
        row = _row(trial.number, settings, future.result())
    except Exception as error:  # a trial that crashes fails alone; the sweep goes on
        searched.tell(trial, state=optuna.trial.TrialState.FAIL)
        logger.warning("trial %d failed: %s", trial.number, error)
        return report.TrialRow(trial.number, "failed", settings, error=str(error)[:500])
    row = replace(row, baseline=bool(trial.user_attrs.get("baseline")))
    trial.set_user_attr("run_dir", row.run_dir)
    trial.set_user_attr("run_id", row.run_id)
    if row.state == "pruned":
        searched.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        searched.tell(trial, study.objective_value(space, row.metrics))
    logger.info(
        "trial %d %s: %s %s, held-out accuracy %.4f",
        trial.number,
        row.state,
        space.objective,
        _figure(row.metrics.get(space.objective)),
        row.metrics.get("calibrated_accuracy", float("nan")),
    )
    return row


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _earlier_rows(searched: optuna.Study, space: SearchSpace) -> list[report.TrialRow]:
    """Rows of the trials a previous process finished, pruned or failed, read back from their run folders; a
    trial a kill interrupted is left out (its settings were asked again under a new number)."""
    trials = searched.get_trials(deepcopy=False)
    interrupted = {t.user_attrs["requeued_from"] for t in trials if "requeued_from" in t.user_attrs}
    states = {"COMPLETE": "finished", "PRUNED": "pruned", "FAIL": "failed"}
    rows = []
    for trial in trials:
        if trial.state.name not in states or trial.number in interrupted:
            continue
        settings, baseline = space.overrides(trial.params), bool(trial.user_attrs.get("baseline"))
        run_dir = trial.user_attrs.get("run_dir")
        if run_dir and RunFolder(run_dir).result.exists():
            row = _row(trial.number, settings, RunResult.load(RunFolder(run_dir).result))
        else:
            row = report.TrialRow(trial.number, states[trial.state.name], settings, error="no run recorded")
        rows.append(replace(row, baseline=baseline))
    return rows


def _repeat(
    best: report.TrialRow, seeds: int, params: Params, folder: str, start: RunStart, tags: dict[str, str]
) -> dict[str, float]:
    """The best settings trained with `seeds` other seeds (children of the parent, tagged
    `sweep_role=repeat`): their mean and standard deviation. The best trial itself is left out: it was chosen,
    so its figure is biased."""
    first = best.settings.get("train.seed", params.train.seed)
    runs = []
    for offset in range(1, seeds + 1):
        settings = best.settings | {"train.seed": first + offset}
        result = run_trial(
            number=offset,
            trial=None,
            settings=settings,
            params=params,
            folder=folder,
            start=start,
            tags=tags,
            role="repeat",
        )
        runs.append(run_metrics(result))
    floor = report.noise_floor(runs)
    get_run_logger().info("noise floor of the best settings: %s", report.describe_noise(floor))
    return floor


def _challenger(
    best: report.TrialRow, params: Params, tags: dict[str, str], floor: dict[str, float] | None
) -> Release:
    """The best trial through export, registration, its model card, the smoke test and the gate."""
    trial_params, run = apply(params, best.settings), RunFolder(best.run_dir)
    config = trial_params.retrain
    result = RunResult.load(run.result)
    export_dir = export(str(run.root), config.data, config.base, trial_params.train)
    version_tags = tags | {
        "sweep_trial": str(best.number),
        "sweep_settings": json.dumps(best.settings, sort_keys=True),
        "mlflow_run_id": best.run_id,
        **report_tags(result.calibration.to_dict()),
        **certificate_tags(result.calibration.certificates),
    }
    # The same inputs register once (Prefect's cache): a rerun that adds --repeat-best tags that version.
    version = register(export_dir, config.model_name, best.run_id, version_tags)
    if floor is not None:
        version_tags["sweep_repeat"] = report.describe_noise(floor)
        tag_version(config.model_name, version, {"sweep_repeat": version_tags["sweep_repeat"]})
    tracked = replace(result.tracked, tags=result.tracked.tags | version_tags)
    result = replace(result, export_dir=export_dir, tracked=tracked)
    card(result, config.model_name, version, best.run_id)
    smoked = smoke(config.model_name, version, str(run.root), config.smoke_decisions)
    unpinned = tags.get("allow_unpinned") == "true"
    verdict = promotion_gate(
        result, config.model_name, version, smoked.passed, trial_params.promote, unpinned
    )
    release = Release(model=config.model_name, version=version, smoke=smoked, gate=verdict)
    replace(result, release=release).saved(run.result)
    return release


def _log_parent_setup(parent_id: str, params: Params, space: SearchSpace, space_file: str) -> None:
    """The parent's params: params.yaml's (as every run logs them) and the space's budget, objective and
    file."""
    logged = client().get_run(parent_id).data.params
    values = tracking.flat_params(params.sections()) | {
        "sweep.objective": space.objective,
        "sweep.space": Path(space_file).name,
        "sweep.pruner": space.pruner,
    }
    # A resumed sweep's parent has them already (MLflow refuses a param logged again with another value).
    tracking.log_values(
        parent_id, params={name: value for name, value in values.items() if name not in logged}
    )
    client().log_text(parent_id, space.text, "sweep/space.yaml")


def _finish_parent(summary: report.SweepSummary, space: SearchSpace, folder: Path) -> report.SweepSummary:
    """The summary table as the parent's description and artifacts, the plots, the counts and the best
    figures, and the same as Prefect artifacts; the parent then ends. The summary, with its plots."""
    rows, best = summary.trials, summary.best
    number = best.number if best else None
    table = report.summary_markdown(rows, number, space.objective)
    tally = {
        state: sum(1 for row in rows if row.state == state) for state in ("finished", "pruned", "failed")
    }
    metrics = {f"trials_{state}": float(n) for state, n in tally.items()}
    if best is not None:
        metrics |= {
            f"best_{name}": float(best.metrics[name]) for name in report.COLUMNS if name in best.metrics
        }
    metrics |= {f"repeat_{name}": float(value) for name, value in (summary.noise_floor or {}).items()}
    plots = [
        report.tradeoff_plot(rows, number, folder / "plots" / "sweep_tradeoff.png"),
        report.question_plot(rows, number, folder / "plots" / "sweep_questions.png"),
    ]
    summary = replace(summary, plots=[str(plot) for plot in plots if plot])
    parent, tracking_client = summary.parent_run_id, client()
    tracking.log_values(parent, metrics=metrics)
    tracking_client.set_tag(parent, "mlflow.note.content", table)
    tracking_client.log_text(parent, table, "sweep/summary.md")
    tracking_client.log_dict(parent, summary.to_dict(), "sweep/summary.json")
    for plot in summary.plots:
        tracking_client.log_artifact(parent, plot, "plots")
    tracking_client.set_terminated(parent)
    create_markdown_artifact(table, key="sweep-summary")
    trial_table = [
        {
            "trial": row.number,
            "state": row.state,
            **row.settings,
            **{name: row.metrics.get(name) for name in report.COLUMNS},
        }
        for row in rows
    ]
    create_table_artifact(trial_table, key="sweep-trials")
    return summary


REFUSED = (*REFUSED_INPUTS, RunBusy)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision sweep` starts it (`flows.launched`)."""
    return run_launched(sweep, "sweep", REFUSED, "a rerun resumes the study", argv)


if __name__ == "__main__":
    sys.exit(main())
