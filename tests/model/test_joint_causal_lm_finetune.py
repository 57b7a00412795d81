"""`decision finetune` on a causal-LM base (joint family) (tiny random Qwen3 on CPU): train, calibrate,
export, reload, serve."""

import json
import time

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient

from pipeline.cli.main import main
from tests.tiny import write_learnable_rows, write_tiny_causal_lm


@pytest.fixture(scope="module")
def causal_lm_base(tmp_path_factory):
    return write_tiny_causal_lm(tmp_path_factory.mktemp("causal_lm") / "qwen3")


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    return write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 24)


def write_params(folder, method: str, steps: int = 150):
    # A small set seen for many epochs: a random tiny backbone learns slowly in general, but the loss on what
    # it trains on must fall, through the same trainer, calibration and export as any base.
    params = {
        "validate": {"holdout_max_decisions": 6, "holdout_fraction": 0.25},
        "train": {
            "method": method,
            "max_steps": steps,
            "micro_batch": 4,
            "grad_accum": 2,
            "lora_r": 8,
            "lora_alpha": 16,
            "lora_lr": 0.001,
            "full_lr": 0.0005,
            "head_lr": 0.001,
            "log_every": 5,
            "precision": "fp32",
            "epochs": 100,
        },
    }
    path = folder / f"params-{method}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def finetune(base, data, out, params, capsys) -> dict:
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
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_lora_finetune_trains_calibrates_exports_and_serves(causal_lm_base, learnable, tmp_path, capsys):
    from pipeline.data.answers import parse_request
    from pipeline.families.joint.layout import load_joint
    from pipeline.families.joint.predict import answer_joint_requests
    from pipeline.serving.catalog import Catalog
    from pipeline.serving.keys import KeyStore
    from pipeline.serving.server import create_app

    summary = finetune(causal_lm_base, learnable, tmp_path / "export", write_params(tmp_path, "lora"), capsys)
    losses = [loss for _, loss in summary["train"]["losses"]]
    assert summary["train"]["family"] == "joint" and summary["train"]["steps"] == 150
    assert losses[-1] < 0.5 * losses[0], losses  # training lowers the loss
    assert summary["calibration"]["heldout"]["decisions"] >= 1
    assert all(0.5 <= summary["calibration"]["temperatures"][t] <= 5.0 for t in ("choice", "score", "noul"))

    exported = load_joint(summary["export_dir"])
    question = {
        "type": "choice",
        "instructions": "What is the tone?",
        "criteria": {"negative": None, "neutral": None, "positive": None},
    }
    body = {"state": "this product was great", "questions": {"tone": question}}
    expected = answer_joint_requests(exported, [parse_request(body["state"], body["questions"])])[0].answers
    with TestClient(create_app(Catalog(summary["export_dir"]), KeyStore())) as client:
        while client.get("/healthz").status_code != 200:
            time.sleep(0.05)
        served = client.post("/v1/systemone", json=body).json()["answers"]
    np.testing.assert_allclose(
        list(served["tone"]["probabilities"].values()),
        list(expected["tone"]["probabilities"].values()),
        atol=1e-4,
    )


@pytest.mark.slow
def test_qlora_trains_on_the_cpu_with_a_4bit_backbone(causal_lm_base, learnable, tmp_path, capsys):
    pytest.importorskip("bitsandbytes")
    summary = finetune(
        causal_lm_base, learnable, tmp_path / "export", write_params(tmp_path, "qlora", 12), capsys
    )
    assert summary["train"]["method"] == "qlora" and summary["train"]["steps"] == 12 and summary["export_dir"]
    assert all(np.isfinite(loss) for _, loss in summary["train"]["losses"])
    from pipeline.families.joint.layout import load_joint

    exported = load_joint(summary["export_dir"])  # dequantised, 16-bit: loads without bitsandbytes layers
    assert not any("4bit" in type(m).__name__ for m in exported.model.modules())


@pytest.mark.slow
def test_a_causal_lm_export_registers_and_answers_as_an_mlflow_model(
    causal_lm_base, learnable, tmp_path, capsys, monkeypatch
):
    import mlflow.pyfunc

    from pipeline.data.answers import parse_request
    from pipeline.families import load_decision_model
    from pipeline.mlops.registry import register_export, use_store

    summary = finetune(
        causal_lm_base, learnable, tmp_path / "export", write_params(tmp_path, "lora", 5), capsys
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    version = register_export(summary["export_dir"], "causal-lm-model")
    use_store()
    model = mlflow.pyfunc.load_model(f"models:/causal-lm-model/{version}")
    question = {"type": "noul", "instructions": "The text is positive."}
    predicted = model.predict([{"state": "it was great", "questions": {"p": question}}])
    expected = load_decision_model(summary["export_dir"]).answer(
        [parse_request("it was great", {"p": question})]
    )
    assert predicted[0]["answers"] == expected[0].answers  # x_automate and its reason included


def test_optional_loss_terms_come_from_the_train_config_and_are_off_by_default(causal_lm_base, learnable):
    from pipeline.config import ConfigError, TrainConfig
    from pipeline.data.validate import validate_file
    from pipeline.families.joint.layout import load_joint
    from pipeline.families.joint.training import build_examples, collate_examples, summed_loss

    loaded = load_joint(causal_lm_base)
    examples, _ = build_examples(validate_file(learnable).records[:6], loaded.tokenizer, loaded.layout)
    batch = collate_examples(examples, loaded.tokenizer.pad_token_id)
    plain = summed_loss(loaded.model, batch, None).item()
    assert summed_loss(loaded.model, batch, None, TrainConfig()).item() == pytest.approx(plain)
    for knob in ({"label_smoothing": 0.2}, {"brier_weight": 1.0}):
        assert summed_loss(loaded.model, batch, None, TrainConfig(**knob)).item() != pytest.approx(plain), (
            knob
        )
    with pytest.raises(ConfigError, match="label_smoothing"):
        TrainConfig(label_smoothing=1.0)


def test_a_llama_backbone_loads_and_answers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.data.answers import parse_request
    from pipeline.families.joint.layout import load_joint
    from pipeline.families.joint.predict import answer_joint_requests
    from tests.tiny import tiny_bpe_tokenizer

    tokenizer = tiny_bpe_tokenizer()
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    loaded = load_joint(tmp_path / "llama")
    question = {"type": "score", "instructions": "How intense?", "criteria": ["none", "mild", "strong"]}
    answer = answer_joint_requests(loaded, [parse_request("the order was late", {"q": question})])[0]
    assert answer.answers["q"]["type"] == "score" and set(answer.answers["q"]["probabilities"]) == {
        "0",
        "1",
        "2",
    }
