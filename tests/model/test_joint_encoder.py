"""The joint family on an encoder backbone: `decision finetune --family joint` on a Laya-layout base trains
the joint record head on its encoder, exports a joint folder, and the Decision API, `decision evaluate` and
the MLflow model answer from it, with no branch outside the family."""

import json

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient

from pipeline.cli.main import main
from pipeline.data.answers import parse_request
from pipeline.families import load_decision_model, pick_family
from tests.api.conftest import wait_ready
from tests.tiny import write_learnable_rows

QUESTION = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"negative": None, "neutral": None, "positive": None},
}


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    return write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 24)


@pytest.fixture(scope="module")
def joint_export(tiny_base, learnable, tmp_path_factory):
    folder = tmp_path_factory.mktemp("joint")
    params = folder / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "validate": {"holdout_max_decisions": 6, "holdout_fraction": 0.25},
                "train": {
                    "max_steps": 150,
                    "micro_batch": 4,
                    "grad_accum": 2,
                    "lora_r": 8,
                    "lora_alpha": 16,
                    "lora_lr": 0.001,
                    "head_lr": 0.001,
                    "log_every": 5,
                    "precision": "fp32",
                    "epochs": 100,
                    # The head's out-of-fold answers (five more trainings, most of the test's time) are
                    # tests/model/test_out_of_fold.py's to check, not this end-to-end path's.
                    "out_of_fold_below": 0,
                },
            }
        )
    )
    return folder, params


def _finetune(base, data, out, params, capsys, *extra) -> dict:
    code = main(
        [
            "finetune",
            "--data",
            str(data),
            "--base",
            str(base),
            "--out",
            str(out),
            "--params",
            str(params),
            "--device",
            "cpu",
            "--json",
            *extra,
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_the_family_defaults_to_what_the_base_is(tiny_base):
    assert pick_family(tiny_base).name == "laya"
    assert pick_family(tiny_base, "joint").name == "joint"


@pytest.mark.slow
def test_joint_on_an_encoder_trains_exports_serves_and_evaluates(tiny_base, learnable, joint_export, capsys):
    from pipeline.serving.catalog import Catalog
    from pipeline.serving.keys import KeyStore
    from pipeline.serving.server import create_app

    folder, params = joint_export
    summary = _finetune(tiny_base, learnable, folder / "export", params, capsys, "--family", "joint")
    assert summary["train"]["family"] == "joint" and summary["train"]["steps"] == 150
    losses = [loss for _, loss in summary["train"]["losses"]]
    assert losses[-1] < 0.7 * losses[0], losses  # the joint head learns on the encoder
    config = json.loads((folder / "export" / "decision_config.json").read_text())
    assert config["backbone"] == "encoder" and config["family"] == "joint"
    assert (folder / "export" / "head.safetensors").is_file() and not (
        folder / "export" / "rl_agent_config.json"
    ).exists()

    model = load_decision_model(folder / "export")
    assert model.family.name == "joint"
    body = {"state": "this product was great", "questions": {"tone": QUESTION}}
    expected = model.answer([parse_request(body["state"], body["questions"])])[0].answers
    with TestClient(create_app(Catalog(str(folder / "export")), KeyStore())) as client:
        wait_ready(client)
        served = client.post("/v1/systemone", json=body).json()["answers"]
    np.testing.assert_allclose(
        list(served["tone"]["probabilities"].values()),
        list(expected["tone"]["probabilities"].values()),
        atol=1e-4,
    )

    assert main(["evaluate", "--model", str(folder / "export"), "--data", str(learnable), "--json"]) == 0
    strict = lambda constant: pytest.fail(f"--json printed {constant}, which is not JSON")  # noqa: E731
    report = json.loads(capsys.readouterr().out, parse_constant=strict)
    assert report["family"] == "joint" and report["metrics"]["overall"]["decisions"] == 24


def test_qlora_on_an_encoder_backbone_is_refused_by_name(tiny_base):
    from pipeline.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=r"train\.method=qlora: .* has an encoder backbone"):
        pick_family(tiny_base, "joint").load(tiny_base, TrainConfig(method="qlora"))


def test_finetune_refuses_qlora_on_an_encoder_before_reading_the_data(tmp_path, capsys):
    # It was refused once the base loaded, after validation had written OUT.run/.
    from pipeline.cli.main import main
    from tests.tiny import write_tiny_encoder

    base = write_tiny_encoder(tmp_path / "bert", "bert")
    out = tmp_path / "export"
    args = [
        "finetune",
        "--data",
        str(tmp_path / "no-rows-read.jsonl"),
        "--base",
        str(base),
        "--out",
        str(out),
    ]
    assert main([*args, "--method", "qlora"]) == 2
    assert "train.method=qlora: " in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]
