"""The retrain flow with `train.nproc: 2`: the train task runs the stage on two torchrun ranks (gloo), and the
run is one MLflow run, logged live from rank 0's steps, that reports the world size."""

import pytest

from tests.flows.conftest import write_tiny_params

pytestmark = pytest.mark.slow


def test_the_flow_trains_on_two_ranks_into_one_mlflow_run(
    prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base
):
    from flows.retrain import retrain
    from pipeline.mlops.registry import client, ensure_experiment

    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, train={"nproc": 2})
    summary = retrain(str(params), lock=str(tmp_path / "dvc.lock"))

    assert summary.train.world_size == 2 and summary.train.steps == 4 and summary.release.smoke.passed
    runs = client().search_runs([ensure_experiment()])
    assert [run.info.run_id for run in runs] == [summary.tracked.mlflow_run_id]  # no rank opened a second run
    run = runs[0]
    assert run.data.metrics["world_size"] == 2 and run.data.params["train.nproc"] == "2"
    assert run.info.status == "FINISHED"
    # Rank 0's logging steps and held-out checkpoints, relayed to the flow's live run as they happened.
    assert [m.step for m in client().get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    heldout = client().get_metric_history(run.info.run_id, "heldout_accuracy")
    assert sorted(m.step for m in heldout) == [0, 1, 3, 4]
