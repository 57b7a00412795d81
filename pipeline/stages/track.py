"""The track stage: one run's result (`stages.result.RunResult`) into its MLflow run: params, the training
curve where it was not logged live, run metrics, tags, the data set as an input, and the run folder's reports
and plots.

One run per idempotency key: logging a key whose run finished returns that run, and a run a killed flow left
unfinished is reopened (`mlops.tracking.open_run`), so a resumed or repeated flow never makes a second run.

    run_id, live = open_run(result.tracked.key, "retrain-1a2b3c4d-2026-12-01", tags)   # when training starts
    track_run(result, run_id)                                                           # when it is calibrated
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.mlops.registry import ensure_experiment, use_store
from pipeline.mlops.tracking import (
    KEY_TAG,
    MODELS,
    RUN_METRICS,
    active_run,
    find_run,
    flat_params,
    heldout_table,
    log_dataset,
)
from pipeline.rundir import RunFolder
from pipeline.scoring.bag_of_words import BAG_OF_WORDS
from pipeline.scoring.certified_coverage import automation_metrics
from pipeline.scoring.plots import loss_curve
from pipeline.scoring.report import report_metrics
from pipeline.stages.result import RunResult
from pipeline.training.fit import TrainRun


def track_run(result: RunResult, run_id: str | None = None) -> str:
    """Log a calibrated run (`result.tracked` says who it is) into `run_id` (opened by `open_run`) or a new
    run, and finish it; a finished run with the same key is returned as it is."""
    import mlflow

    tracked = result.tracked
    opened = active_run(run_id) if run_id is not None else None
    existing = find_run(tracked.key) if run_id is None else None
    if opened is not None and opened.info.status == "FINISHED":
        existing = run_id
    if existing:
        return existing
    use_store()
    where = (
        {"run_id": run_id} if opened else {"experiment_id": ensure_experiment(), "run_name": tracked.run_name}
    )
    with mlflow.start_run(**where) as run:
        mlflow.set_tags({KEY_TAG: tracked.key, **tracked.tags, **run_tags(result)})
        mlflow.log_params(flat_params(tracked.params))
        if not (opened and "loss" in opened.data.metrics):  # not logged live
            _log_steps(result.train.logged_steps)
        _log_validation_checks(result.train.early_stopping or {})
        mlflow.log_metrics(run_metrics(result))
        log_dataset(tracked.data, tracked.data_md5)
        _log_artifacts(result)
        return run.info.run_id


def run_tags(result: RunResult) -> dict[str, str]:
    """What the run's tags say of it beside its lineage: whether it learned, how states were cut, what the
    calibrator was fitted on, which candidate was kept, and its held-out table as the run's description."""
    return (
        learning_tags(result.train)
        | state_tags(result.train)
        | calibration_tags(result)
        | choice_tags(result.train)
        | {"mlflow.note.content": heldout_table(result.heldout)}
    )


def learning_tags(train: TrainRun) -> dict[str, str]:
    """`learned` (true or false) and, when false, `learning_warnings`: the questions it did not learn."""
    if not train.warnings:
        return {"learned": "true"}
    return {"learned": "false", "learning_warnings": "; ".join(train.warnings)[:5000]}


def state_tags(train: TrainRun) -> dict[str, str]:
    """`state_truncation`: what is cut from a state longer than the model's window
    (`contract.STATE_TRUNCATION`)."""
    return {"state_truncation": train.states.truncation} if train.states else {}


def choice_tags(train: TrainRun) -> dict[str, str]:
    """`candidate_kept`: which of the run's candidates it kept (`train.lexicon: auto`: tokens, tfidf or
    ensemble; `both`: ensemble)."""
    kept = (train.choice or {}).get("kept")
    return {"candidate_kept": kept} if kept else {}


def calibration_tags(result: RunResult) -> dict[str, str]:
    """What the calibrator was fitted on: the validation split, or the held-out rows."""
    fitted_on = result.calibration.calibrator.get("fitted_on") if result.calibration else None
    return {"calibrator_fitted_on": fitted_on} if fitted_on else {}


def run_metrics(result: RunResult) -> dict[str, float]:
    """Held-out figures per model, temperatures, the calibration report, skips by reason, the validation
    split's figures, the candidates', train seconds, peak memory, world size, and how the states fit the
    model's window."""
    return (
        heldout_metrics(result.heldout)
        | calibration_metrics(result)
        | split_metrics(result)
        | candidate_metrics(result.train)
        | training_metrics(result.train)
        | state_metrics(result)
    )


def heldout_metrics(heldout: dict[str, Any]) -> dict[str, float]:
    """`{model}_{figure}` for each model scored on the held-out decisions, and the lead over the bag of
    words."""
    metrics = {
        f"{model}_{name}": float(heldout[model][name])
        for model in MODELS
        if model in heldout
        for name in RUN_METRICS
        if name in heldout[model]
    }
    if BAG_OF_WORDS in heldout:  # what the MLflow UI compares runs on: how far the fine-tune is ahead of it
        metrics["accuracy_over_bag_of_words"] = (
            metrics["calibrated_accuracy"] - metrics[f"{BAG_OF_WORDS}_accuracy"]
        )
    return metrics | {"heldout_decisions": float(heldout["decisions"])}


def calibration_metrics(result: RunResult) -> dict[str, float]:
    """Temperatures, the calibration report's figures, what the certificates automate of the held-out
    decisions (`coverage_<question>`, `automated_error_<question>`), and the validation split's calibrated
    figures (cross-fitted over it: what a sweep ranks its trials by)."""
    calibration = result.calibration
    if calibration is None:
        return {}
    metrics = {f"temperature_{qtype}": float(t) for qtype, t in calibration.temperatures.items()}
    metrics |= report_metrics(calibration.report, "calibration")
    metrics |= automation_metrics(calibration.automation)
    if calibration.validation:
        metrics |= {
            "validation_accuracy": float(calibration.validation["accuracy"]),
            "validation_nll": float(calibration.validation["loss"]),
        }
    return metrics


SPLIT_COUNTS = ("shared_state_rows", "near_duplicate_rows", "eval_overlap_rows")
"""The split's leakage counts (`data.leakage`): rows kept on one side because they read the same state as
another, and evaluation rows whose state the training rows hold."""


def split_metrics(result: RunResult) -> dict[str, float]:
    """Skips by reason, where the rows have groups how many of them each side of the split holds, and the
    split's leakage counts."""
    metrics = {f"skipped_{reason}": float(n) for reason, n in result.validation.report.skipped.items()}
    split = result.validation.split
    return metrics | {k: float(n) for k, n in split.items() if k.endswith("_groups") or k in SPLIT_COUNTS}


def candidate_metrics(train: TrainRun) -> dict[str, float]:
    """Each candidate's uncalibrated figures on the validation split, which chose between them."""
    metrics = {}
    for name, figures in (train.choice or {}).get("candidates", {}).items():
        if "accuracy" not in figures:  # `train.lexicon: both` without a validation split: nothing measured
            continue
        metrics[f"candidate_{name}_validation_accuracy"] = float(figures["accuracy"])
        metrics[f"candidate_{name}_validation_loss"] = float(figures["loss"])
    return metrics


def training_metrics(train: TrainRun) -> dict[str, float]:
    """Steps, seconds, memory and scoring speed; data-parallel ranks (`train.nproc`) and rank 0's seconds in
    their gradient all-reduce."""
    return {
        "validation_decisions": float(train.validation_decisions),
        "train_seconds": float(train.train_seconds),
        "s_per_step": float(train.s_per_step),
        "steps": float(train.steps),
        "peak_memory_mb": float(train.peak_memory_mb or 0.0),
        "score_ms_per_decision": float(train.score_ms_per_decision),
        "world_size": float(train.world_size),
        "allreduce_seconds": float(train.allreduce_seconds),
    }


def state_metrics(result: RunResult) -> dict[str, float]:
    """How the states fit the window (`state_rows_truncated`, `state_tokens_dropped`, ... from training) and
    their sizes in characters (`state_chars_longest`, `state_rows_over_chars`, from validation)."""
    states, chars = result.train.states, result.validation.report.states
    metrics = states.metrics() if states else {}
    if chars:
        metrics |= {
            "state_chars_longest": float(chars.longest_chars),
            "state_rows_over_chars": float(chars.rows_over),
        }
    return metrics


def _log_steps(steps: list[dict[str, float]]) -> None:
    import mlflow

    for entry in steps:
        values = {k: float(entry[k]) for k in ("loss", "lr", "s_per_step") if k in entry}
        mlflow.log_metrics(values, step=int(entry["step"]))


def _log_validation_checks(early_stopping: dict[str, Any]) -> None:
    """The validation split's loss at each early-stopping check (a curve beside the training loss) and the
    best step the model kept."""
    import mlflow

    for step, loss in early_stopping.get("checks", []):
        mlflow.log_metric("validation_loss", float(loss), step=int(step))
    if early_stopping.get("checks"):
        mlflow.log_metrics(
            {
                "best_step": float(early_stopping["best_step"]),
                "stopped_at_step": float(early_stopping["ended_at"]),
            }
        )


def _log_artifacts(result: RunResult) -> None:
    import mlflow

    run = RunFolder(result.run_dir)
    mlflow.log_dict(result.validation.to_dict(), "validation/report.json")
    if result.calibration is not None:
        mlflow.log_dict(result.calibration.to_dict(), "calibration/calibration.json")
    # The full report (per question too), the chosen calibrator, the certificates, and the trained model's
    # calibrated answers (what the smoke test compares serving with) stay with the run; the coverage-risk plot
    # is among the calibration's plots.
    kept = (
        run.calibration_report,
        run.calibration_report.with_suffix(".md"),
        run.calibrator,
        run.certificates,
        run.expected_answers,
    )
    for path in kept:
        if path.is_file():
            mlflow.log_artifact(str(path), "calibration")
    for plot in result.calibration.plots if result.calibration else []:
        mlflow.log_artifact(plot, "plots")
    if result.train.logged_steps:
        curve = loss_curve(result.train.logged_steps, run.plots / "loss_curve.png")
        mlflow.log_artifact(str(curve), "plots")
    manifest = Path(result.export_dir or run.export) / "manifest.json"
    if manifest.is_file():
        mlflow.log_artifact(str(manifest), "export")
