"""Layer plans through both families: loaded with a plan, exported with it (the Laya export materialised, so
`laya.Agent` answers as ours; the joint export in plan form), served with it, and refused clearly before
training when they cannot run."""

import json

import numpy as np
import pytest
import torch
import yaml

from pipeline.cli.main import main
from pipeline.config import TrainConfig
from pipeline.data.answers import parse_request
from pipeline.families import load_decision_model, pick_family
from pipeline.families.base import DecisionModel
from pipeline.families.laya.predict import predict
from pipeline.families.planned_layers import apply_layer_plan, current_plan, physical_layers
from pipeline.scoring.calibrators import Calibrator
from tests.api.conftest import QUESTIONS, live_server, make_app
from tests.tiny import write_learnable_rows, write_tiny_base, write_tiny_causal_lm

LAYERS = 4
STATES = ["this is great", {"turns": ["i hate the order", "it was late"]}, "okay product"]


@pytest.fixture(scope="module")
def deep_base(tmp_path_factory):
    return write_tiny_base(tmp_path_factory.mktemp("deep") / "base", seed=5, layers=LAYERS)


@pytest.fixture(scope="module")
def bases(deep_base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("causal_lms")
    return {
        "encoder": deep_base,
        "qwen3": write_tiny_causal_lm(folder / "qwen3", seed=3, layers=LAYERS),
        "llama": write_tiny_causal_lm(folder / "llama", seed=4, layers=LAYERS, arch="llama"),
    }


def _agent(folder, state):
    import laya

    answers = laya.Agent(str(folder), device="cpu").system_one(state, QUESTIONS)["answers"]
    return {
        "tone": [answers["tone"]["probabilities"][k] for k in ("negative", "neutral", "positive")],
        "intensity": [answers["intensity"]["probabilities"][str(i)] for i in range(3)],
        "positive": [1 - answers["positive"]["noul"], answers["positive"]["noul"]],
    }


def _probabilities(model: DecisionModel, state) -> np.ndarray:
    answers = model.answer([parse_request(state, QUESTIONS)])[0].answers
    return np.array(
        [p for a in answers.values() for p in (a.get("probabilities") or {"p": a["noul"]}).values()]
    )


@pytest.mark.parametrize("plan", [[0, 1, 2], [0, 1, 1, 2, 3]], ids=["skip", "repeat"])
def test_a_laya_export_is_materialised_and_laya_agent_answers_as_ours(deep_base, tmp_path, plan):
    family = pick_family(deep_base)
    loaded = family.load(deep_base, TrainConfig(layer_plan=tuple(plan)))
    native = family.load(deep_base)
    for model in (loaded.model, native.model):  # layers that matter, so a changed stack shows in the answers
        with torch.no_grad():
            for layer in physical_layers(model.encoder):
                layer.output.dense.weight.mul_(4.0)
    assert current_plan(loaded.model.encoder).visits == tuple(plan)
    result = family.export(loaded, tmp_path / "export", Calibrator(), {"family": "laya"})

    assert result.manifest["layer_plan"] == {
        "visits": plan,
        "physical_layers": LAYERS,
        "form": "materialised",
    }
    encoder_config = json.loads((tmp_path / "export" / "encoder" / "config.json").read_text())
    assert encoder_config["num_hidden_layers"] == len(plan)
    reloaded = load_decision_model(tmp_path / "export")
    assert current_plan(reloaded.loaded.model.encoder) is None  # the stack itself runs like the plan
    moved = 0.0
    for state in STATES:
        ours = predict(loaded, state, QUESTIONS)
        for qid, theirs in _agent(tmp_path / "export", state).items():
            np.testing.assert_allclose(
                ours[qid], theirs, atol=2e-3
            )  # laya rounds to 4 decimals; fp16 weights
        np.testing.assert_allclose(
            _probabilities(reloaded, state), _probabilities(DecisionModel(family, loaded), state), atol=2e-3
        )
        moved = max(moved, max(np.abs(ours[q] - predict(native, state, QUESTIONS)[q]).max() for q in ours))
    assert moved > 0.02, "the plan must change the answers, or this test could not fail"


@pytest.mark.parametrize("kind", ["encoder", "qwen3", "llama"])
def test_a_joint_export_keeps_its_plan_serves_it_and_none_restores_native(bases, tmp_path, kind):
    family = pick_family(bases[kind], "joint")
    config = TrainConfig(family="joint", method="lora", head_width=32, layer_plan=((1, 3, 2),))
    loaded = family.load(bases[kind], config)
    with torch.no_grad():  # a head that answers unevenly, so a changed backbone shows in the probabilities
        for parameter in loaded.model.head.parameters():
            parameter.mul_(4.0)
        for (
            parameter
        ) in loaded.model.lm.parameters():  # the export writes the backbone in fp16: the same values
            parameter.copy_(parameter.half().float())
    family.export(loaded, tmp_path / "export", Calibrator(), {"family": "joint"})
    saved = json.loads((tmp_path / "export" / "decision_config.json").read_text())
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert saved["layer_plan"] == [0, 1, 2, 1, 2, 3] and manifest["layer_plan"]["form"] == "plan"

    reloaded, trained = load_decision_model(tmp_path / "export"), DecisionModel(family, loaded)
    planned = [_probabilities(reloaded, s) for s in STATES]
    for state, answer in zip(STATES, planned):
        np.testing.assert_allclose(
            answer, _probabilities(trained, state), atol=2e-4
        )  # answers carry 4 decimals
    apply_layer_plan(reloaded.loaded.model.lm, None)
    apply_layer_plan(loaded.model.lm, None)
    native = [_probabilities(reloaded, s) for s in STATES]
    for state, answer in zip(STATES, native):
        np.testing.assert_allclose(answer, _probabilities(trained, state), atol=2e-4)
    assert max(np.abs(p - n).max() for p, n in zip(planned, native)) > 0.02


def test_the_server_answers_with_the_exports_plan(bases, tmp_path):
    import httpx

    family = pick_family(bases["qwen3"], "joint")
    loaded = family.load(
        bases["qwen3"], TrainConfig(family="joint", head_width=32, layer_plan=(0, 1, 1, 2, 3))
    )
    family.export(loaded, tmp_path / "export", Calibrator(), {"family": "joint"})
    expected = load_decision_model(tmp_path / "export")
    with live_server(make_app(tmp_path / "export")) as url:
        for state in STATES:
            body = httpx.post(
                f"{url}/v1/systemone", json={"state": state, "questions": QUESTIONS}, timeout=30
            ).json()
            served = [
                p
                for a in body["answers"].values()
                for p in (a.get("probabilities") or {"p": a["noul"]}).values()
            ]
            np.testing.assert_allclose(served, _probabilities(expected, state), atol=1e-4)


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    return write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 24)


def _params(folder, **train):
    params = folder / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "validate": {"holdout_max_decisions": 6, "holdout_fraction": 0.25},
                "train": {
                    "max_steps": 12,
                    "micro_batch": 4,
                    "grad_accum": 1,
                    "lora_r": 4,
                    "lora_alpha": 8,
                    "head_width": 32,
                    "log_every": 4,
                    "precision": "fp32",
                    "epochs": 10,
                    **train,
                },
            }
        )
    )
    return params


@pytest.mark.slow
@pytest.mark.parametrize("family", ["laya", "joint"])
def test_finetune_with_a_plan_trains_exports_and_records_it(deep_base, learnable, tmp_path, capsys, family):
    params = _params(tmp_path, method="lora")
    code = main(
        [
            "finetune",
            "--data",
            str(learnable),
            "--base",
            str(deep_base),
            "--out",
            str(tmp_path / "out"),
            "--params",
            str(params),
            "--device",
            "cpu",
            "--json",
            "--family",
            family,
            "--layer-plan",
            "[[1, 3, 2]]",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train"]["steps"] == 12 and all(
        np.isfinite(loss) for _, loss in summary["train"]["losses"]
    )
    export = tmp_path / "out"
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["layer_plan"]["visits"] == [0, 1, 2, 1, 2, 3]
    model = load_decision_model(export)
    if family == "laya":  # a native six-layer stack, which laya.Agent reads as it is
        assert manifest["layer_plan"]["form"] == "materialised"
        for qid, theirs in _agent(export, STATES[0]).items():
            np.testing.assert_allclose(predict(model.loaded, STATES[0], QUESTIONS)[qid], theirs, atol=2e-3)
    else:
        assert manifest["layer_plan"]["form"] == "plan"
        assert current_plan(model.loaded.model.lm).visits == (0, 1, 2, 1, 2, 3)


def _train(base, data, folder, plan) -> int:
    return main(
        [
            "train",
            "--data",
            str(data),
            "--base",
            str(base),
            "--out",
            str(folder / "out"),
            "--params",
            str(_params(folder)),
            "--device",
            "cpu",
            "--layer-plan",
            plan,
        ]
    )


def test_an_index_out_of_range_is_refused_by_name_before_any_training(deep_base, learnable, tmp_path, capsys):
    assert _train(deep_base, learnable, tmp_path, "0,9") != 0
    assert (
        "train.layer_plan[1]: layer 9 is out of range for a backbone of 4 layers" in capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()


def test_an_empty_plan_is_refused_by_name_before_any_model_loads(deep_base, learnable, tmp_path, capsys):
    assert _train(deep_base, learnable, tmp_path, "[]") == 2
    assert "train.layer_plan: an empty plan" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_causal_lm_that_cannot_run_a_plan_is_refused_before_training(tmp_path, learnable, capsys):
    base = write_tiny_causal_lm(
        tmp_path / "sliding", layers=LAYERS, use_sliding_window=True, sliding_window=8, max_window_layers=2
    )
    assert (
        _train(base, learnable, tmp_path, "0,1,1,2,3") != 0
        and "mixes attention types" in capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()
