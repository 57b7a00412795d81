"""The retrain flow is family-free: a tiny random causal LM (the joint family) goes through pins, validation,
training, calibration, export, MLflow, registration, the HTTP smoke test and the gate, and the gate scores a
joint champion; `decision evaluate` scores the registered version."""

import json

import pytest

from tests.flows.conftest import write_tiny_params
from tests.tiny import write_learnable_rows, write_tiny_causal_lm

pytestmark = pytest.mark.slow


def test_a_causal_lm_base_is_retrained_registered_smoke_tested_and_gated(prefect_harness, mlflow_store, tmp_path,
                                                                       capsys):  # fmt: skip
    from flows.retrain import retrain
    from pipeline.cli.main import main
    from pipeline.mlops.registry import client, download_version

    base = write_tiny_causal_lm(tmp_path / "qwen3")
    data = write_learnable_rows(tmp_path / "rows.jsonl", 60)
    first_params = write_tiny_params(tmp_path, data, base, validate={"holdout_max_decisions": 12})
    first = retrain(str(first_params), lock=str(tmp_path / "dvc.lock"))
    assert (
        first["family"] == "joint"
        and first["version"] == "1"
        and first["smoke"]["passed"]
        and first["promoted"]
    )
    tags = client().get_model_version("tiny-model", "1").tags
    assert tags["smoke"] == "passed" and tags["gate"] == "promote"

    second_params = write_tiny_params(tmp_path, data, base, validate={"holdout_max_decisions": 12},
                                      train={"max_steps": 2})  # fmt: skip
    second = retrain(str(second_params), lock=str(tmp_path / "dvc.lock"))
    assert second["version"] == "2" and second["smoke"]["passed"]
    assert any("champion" in reason for reason in second["gate"])  # the joint champion was scored by the gate

    folder = download_version("tiny-model", "2", tmp_path / "v2")
    assert json.loads((folder / "decision_config.json").read_text())["family"] == "joint"
    assert main(["evaluate", "--model", str(folder), "--data", str(data), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "joint" and report["metrics"]["overall"]["decisions"] == 60
