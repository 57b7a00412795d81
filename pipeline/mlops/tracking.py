"""MLflow tracking's mechanics: a run per idempotency key, live training curves, params and metrics in one
call, the data set as an input, a shadow's and a harvest's figures (what a training run logs is
`stages.track`).

One run per idempotency key (data md5 + base md5 + params + code digest): logging the same key again finds the
finished run and returns it, and a flow killed before its run finished reopens that run, so a resumed or
repeated flow never makes a second run. The run opens when training
starts (`open_run`) and gets the training curve as it goes (`LiveRun`: loss, lr and s/step per logging step,
held-out figures at a few points), so the MLflow UI shows a live run; the track stage then adds the rest and
finishes it.

    run_id, live = open_run(key, "retrain-1a2b3c4d-2026-12-01", tags)
    trained = fit(data, base, config, hooks=RunHooks(on_log=LiveRun(run_id).step, on_eval=LiveRun(run_id).heldout))
    track_run(result, run_id)          # pipeline.stages.track: the rest, and the run finishes
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

from pipeline.mlops.registry import client, ensure_experiment, use_store
from pipeline.scoring.bag_of_words import BAG_OF_WORDS

KEY_TAG = "idempotency_key"
MODELS = ("base", "tuned", "calibrated", BAG_OF_WORDS)
"""What a run's held-out figures hold, in this order: the bag of words only where the run fitted one."""
_DATASET_LOCK = threading.Lock()
RUN_METRICS = ("accuracy", "record_accuracy", "ece", "brier", "loss")


def runs_under(key: str) -> list:
    """The runs logged under this key that MLflow's default search shows (deleted runs are not shown)."""
    return client().search_runs([ensure_experiment()], f"tags.{KEY_TAG} = '{key}'")


def find_run(key: str) -> str | None:
    """The finished run logged under this key, if any; a run under it that did not finish is deleted."""
    runs = runs_under(key)
    for run in runs:
        if run.info.status == "FINISHED":
            return run.info.run_id
    for run in runs:  # a crash mid-logging: its half-logged run gives way to the retry's complete one
        client().delete_run(run.info.run_id)
    return None


def open_run(key: str, run_name: str | None = None, tags: dict[str, str] | None = None) -> tuple[str, bool]:
    """The run for `key` and whether it is live: the finished run (not live), else the run a killed flow left
    unfinished under the key, running again (its curves continue where they stopped), else a new running one.
    Any further unfinished runs under the key are deleted, so the key shows one run."""
    runs = runs_under(key)
    finished = [run for run in runs if run.info.status == "FINISHED"]
    if finished:
        return finished[0].info.run_id, False
    if runs:
        kept, *extra = runs  # newest first: the run the last attempt logged to
        for run in extra:
            client().delete_run(run.info.run_id)
        client().update_run(kept.info.run_id, status="RUNNING")
        return kept.info.run_id, True
    use_store()
    run = client().create_run(ensure_experiment(), tags={KEY_TAG: key, **(tags or {})}, run_name=run_name)
    return run.info.run_id, True


def record_shadow(served_name: str, summary: dict[str, Any]) -> None:
    """A shadow summary as metrics of the challenger version's run (`NAME/VERSION`) and tags on the
    version."""
    name, _, version = served_name.rpartition("/")
    if not name:
        return  # a folder, not a registry version: nothing to record it on
    found = client().get_model_version(name, version)
    values = {
        "shadow_agreement": summary["agreement"],
        "shadow_mean_abs_diff": summary["mean_abs_diff"],
        "shadow_scored": summary["scored"],
        "shadow_latency_p50_ms": (summary["challenger_latency_ms"] or {}).get("p50"),
    }
    for key, value in values.items():
        if value is not None:
            if found.run_id:
                client().log_metric(found.run_id, key, float(value), step=int(summary["scored"]))
            client().set_model_version_tag(name, version, key, f"{float(value):.6g}")


class LiveRun:
    """Callbacks that log a training run's progress to its MLflow run as it happens.

    A run reopened after a kill already holds the steps logged before it; a resumed training loop logs the
    steps since its checkpoint again, so each metric skips steps at or below the last one the run holds (one
    point per step, not two).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        held = client().get_run(run_id).data.metrics
        self.last_step = {
            name: max(m.step for m in client().get_metric_history(run_id, name)) for name in held
        }

    def step(self, entry: dict[str, float]) -> None:
        """One logging step of the training loop: loss, lr, s/step."""
        self._log(
            {k: float(entry[k]) for k in ("loss", "lr", "s_per_step") if k in entry}, int(entry["step"])
        )

    def heldout(self, step: int, metrics: dict[str, float]) -> None:
        """Held-out figures at a training step (0: the base)."""
        names = ("loss", "accuracy", "record_accuracy", "ece")
        self._log({f"heldout_{k}": float(metrics[k]) for k in names if k in metrics}, step)

    def _log(self, values: dict[str, float], step: int) -> None:
        new = {k: v for k, v in values.items() if step > self.last_step.get(k, -1)}
        if new:
            log_values(self.run_id, metrics=new, step=step)
        self.last_step |= dict.fromkeys(new, step)


def log_values(
    run_id: str,
    params: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    step: int = 0,
    timestamp_ms: int | None = None,
) -> None:
    """Params and metrics (at `step`, stamped `timestamp_ms` or now) into a run in one call; MLflow splits it
    where its batch limits say."""
    import time

    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    client().log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, step) for k, v in (metrics or {}).items()],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
    )


def active_run(run_id: str):
    """The run (one read of it), or None when it is gone or deleted."""
    from mlflow.exceptions import MlflowException

    try:
        run = client().get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage == "active" else None


def heldout_table(heldout: dict[str, Any]) -> str:
    """The held-out table (base, fine-tune, calibrated; a bag of words where fitted) as markdown: the run's
    description."""
    lines = ["| model | accuracy | record accuracy | ECE | Brier |", "|---|---|---|---|---|"]
    for model in [m for m in MODELS if m in heldout]:
        m = heldout[model]
        lines.append(
            f"| {model.replace('_', ' ')} | {m['accuracy']:.4f} | {m['record_accuracy']:.4f} | "
            f"{m['ece']:.4f} | {m['brier']:.4f} |"
        )
    return "\n".join([*lines, "", f"{heldout['decisions']:,} held-out decisions."])


def flat_params(params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`section.name` for every setting, exactly as params.yaml spells it."""
    return {
        f"{section}.{name}": value for section, values in params.items() for name, value in values.items()
    }


def log_dataset(data: str, data_md5: str) -> None:
    """The active run's training data as an MLflow data set input: its path and its DVC md5 as the digest."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with (
        warnings.catch_warnings()
    ):  # a file URI "can be interpreted in multiple ways": all of them local files
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(Path(data).resolve().as_uri())
    dataset = MetaDataset(source, name=Path(data).name, digest=data_md5)
    # MLflow's SQL store finds or inserts the data set in two steps: two runs logging the same one at once (a
    # sweep's parallel trials) both insert, and the second fails on the unique key. One at a time in a
    # process, and once again where another process won the race (the second try finds the row).
    with _DATASET_LOCK:
        try:
            mlflow.log_input(dataset, context="training")
        except mlflow.exceptions.MlflowException:
            mlflow.log_input(dataset, context="training")


HARVEST_EXPERIMENT = "harvest"


def log_harvest(summary: dict[str, Any], decision_ids: list[str]) -> str:
    """One run in the `harvest` experiment: the data set and its revisions, the counts, the date range and the
    model versions the rows came from as params and metrics, and every harvested decision id as an
    artifact."""
    experiment = ensure_experiment(HARVEST_EXPERIMENT)
    run = client().create_run(
        experiment,
        run_name=f"harvest-{(summary.get('revision') or 'none')[:8]}",
        tags={"dataset": summary["dataset"], "models": ",".join(summary["models"])},
    )
    params = {
        k: summary[k]
        for k in (
            "dataset",
            "revision",
            "previous_revision",
            "shard",
            "first_decision",
            "last_decision",
            "committed",
        )
        if summary.get(k) is not None
    }
    metrics = {k: summary[k] for k in ("rows", "labels", "heldout", "already_harvested", "not_logged")}
    metrics |= {f"skipped_{reason}": n for reason, n in summary["skipped"].items()}
    log_values(run.info.run_id, params | {"models": ",".join(summary["models"]) or "-"}, metrics)
    client().log_text(run.info.run_id, "".join(f"{i}\n" for i in decision_ids), "harvest/decision_ids.txt")
    client().set_terminated(run.info.run_id)
    return run.info.run_id
