"""The training data set as an MLflow input: a run that loses the store's find-or-insert race still logs
it."""

import mlflow
from mlflow.exceptions import MlflowException

from pipeline.mlops.registry import use_store
from pipeline.mlops.tracking import log_dataset


def test_a_data_set_another_run_inserted_at_the_same_moment_is_still_logged(tmp_path, monkeypatch):
    # Two runs logging one data set at once both insert it, and the second fails on the store's unique key
    # (a sweep's parallel trials did: "UNIQUE constraint failed: datasets.experiment_id, datasets.name, ...").
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = tmp_path / "rows.jsonl"
    data.write_text("{}\n")
    real, calls = mlflow.log_input, []

    def racing(dataset, context=None, **kwargs):
        calls.append(context)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id")
        return real(dataset, context=context, **kwargs)

    monkeypatch.setattr(mlflow, "log_input", racing)
    use_store()  # the store MLFLOW_TRACKING_URI names, as every run the pipeline logs
    with mlflow.start_run() as run:
        log_dataset(str(data), "a3a105e9")
    [logged] = mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs
    assert calls == ["training", "training"] and logged.dataset.digest == "a3a105e9"
    assert logged.dataset.name == "rows.jsonl"
