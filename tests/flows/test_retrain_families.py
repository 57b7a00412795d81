"""The retrain flow is family-free: a tiny random causal LM (the joint family) goes through pins, validation,
training, calibration, export, MLflow, registration, the HTTP smoke test and the gate, and the gate scores a
joint champion; `decision evaluate` scores the registered version. Two joint heads answering together (the
default `train.lexicon: both`) go through it as one model."""

import json

import pytest

from tests.flows.conftest import write_tiny_params
from tests.tiny import write_learnable_rows, write_tiny_base, write_tiny_causal_lm

pytestmark = pytest.mark.slow


def test_a_causal_lm_base_is_retrained_registered_smoke_tested_and_gated(
    prefect_harness, mlflow_store, tmp_path, capsys
):
    from flows.retrain import retrain
    from pipeline.cli.main import main
    from pipeline.mlops.registry import client, download_version

    base = write_tiny_causal_lm(tmp_path / "qwen3")
    data = write_learnable_rows(tmp_path / "rows.jsonl", 60)
    first_params = write_tiny_params(tmp_path, data, base, validate={"holdout_max_decisions": 12})
    first = retrain(str(first_params), lock=str(tmp_path / "dvc.lock"))
    assert (
        first.train.family == "joint"
        and first.release.version == "1"
        and first.release.smoke.passed
        and first.release.promoted
    )
    tags = client().get_model_version("tiny-model", "1").tags
    assert tags["smoke"] == "passed" and tags["gate"] == "promote"

    second_params = write_tiny_params(
        tmp_path, data, base, validate={"holdout_max_decisions": 12}, train={"max_steps": 2}
    )
    second = retrain(str(second_params), lock=str(tmp_path / "dvc.lock"))
    assert second.release.version == "2" and second.release.smoke.passed
    assert any(
        "champion" in reason for reason in second.release.gate.reasons
    )  # the joint champion was scored by the gate

    folder = download_version("tiny-model", "2", tmp_path / "v2")
    assert json.loads((folder / "decision_config.json").read_text())["family"] == "joint"
    assert main(["evaluate", "--model", str(folder), "--data", str(data), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "joint" and report["metrics"]["overall"]["decisions"] == 60


def test_two_heads_answering_together_go_through_the_flow_as_one_model(
    prefect_harness, mlflow_store, tmp_path
):
    """params.yaml's default (`train.lexicon: both`): the flow trains a tokens head and a tfidf head on the
    tiny encoder, exports them as one model, serves it over HTTP as it was trained (the smoke test) and
    records both."""
    from flows.retrain import retrain
    from pipeline.mlops.registry import client, download_version

    data = write_learnable_rows(tmp_path / "rows.jsonl", 120)
    base = write_tiny_base(tmp_path / "base")
    train = {"family": "joint", "method": "head", "lexicon": "both", "head_width": 32, "max_steps": 6}
    # A validation split of ~32 decisions, on which each head and the two together are measured.
    params = write_tiny_params(tmp_path, data, base, train=train, validate={"validation_fraction": 0.3})
    result = retrain(str(params), lock=str(tmp_path / "dvc.lock"))
    assert result.release.smoke.passed and result.release.smoke.trained_agreement >= 0.995
    folder = download_version("tiny-model", result.release.version, tmp_path / "v1")
    head = json.loads((folder / "decision_config.json").read_text())["head"]
    assert [member["bigrams"] > 0 for member in head["members"]] == [False, True]
    run = client().get_run(result.tracked.mlflow_run_id)
    assert run.data.tags["candidate_kept"] == "ensemble"
    assert {f"candidate_{name}_validation_accuracy" for name in ("tokens", "tfidf", "ensemble")} <= set(
        run.data.metrics
    )
