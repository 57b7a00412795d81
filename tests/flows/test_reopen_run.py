"""A flow killed with its MLflow run open: the rerun reopens that run (no second one under the key, deleted or
not) and its live curves carry on with one point per step."""

from pipeline.mlops import tracking
from pipeline.mlops.registry import client, ensure_experiment


def test_an_unfinished_run_is_reopened_and_its_curves_continue_without_repeats(mlflow_store):
    first, live = tracking.open_run("k1", "retrain-a", {"owner": "alice"})
    tracking.LiveRun(first).step({"step": 5, "loss": 2.0, "lr": 0.1, "s_per_step": 0.1})
    tracking.LiveRun(first).heldout(0, {"accuracy": 0.3})
    # the flow is killed here: the run stays RUNNING

    again, live_again = tracking.open_run("k1", "retrain-b")
    assert again == first and live and live_again
    rerun = tracking.LiveRun(again)
    rerun.heldout(
        0, {"accuracy": 0.3}
    )  # the resumed loop scores the base again, and logs steps since its checkpoint
    for step in (5, 10):
        rerun.step({"step": step, "loss": 1.0 if step == 10 else 2.0})
    assert [m.step for m in client().get_metric_history(first, "loss")] == [5, 10]
    assert [m.step for m in client().get_metric_history(first, "heldout_accuracy")] == [0]
    runs = client().search_runs([ensure_experiment()], run_view_type=3)  # ALL: deleted runs too
    assert [r.info.run_id for r in runs] == [first] and runs[0].info.status == "RUNNING"


def test_a_finished_run_is_returned_and_not_reopened(mlflow_store):
    run_id, _ = tracking.open_run("k2")
    client().set_terminated(run_id, "FINISHED")
    assert tracking.open_run("k2") == (run_id, False)
