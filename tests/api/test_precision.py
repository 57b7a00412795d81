"""Serving precision: `decision serve --precision bf16` runs both families' backbones under bf16 autocast
where the CPU runs bf16 natively (answers close to fp32's), and is refused by name where bf16 would be
emulated; auto is the default, and answers at fp32 where the export has no passing int8 report
(tests/model/test_int8.py)."""

import httpx
import numpy as np
import pytest
import torch

from pipeline.cli.main import main
from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.device import PrecisionUnavailable, cpu_has_native_bf16, serving_dtype
from pipeline.families import load_decision_model
from pipeline.families.base import DecisionModel
from pipeline.serving.server import ServeOptions, build_app
from tests.api.conftest import QUESTIONS, live_server
from tests.tiny import load_joint_on

native_bf16 = pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU emulates bf16")
STATES = ["the battery died after a day", "great screen, fast delivery", "ok"]


def probabilities(model: DecisionModel) -> np.ndarray:
    results = model.answer([parse_request(state, QUESTIONS) for state in STATES])
    return np.concatenate([answer_probabilities(r.answers[q]) for r in results for q in QUESTIONS])


def test_auto_is_the_default_and_unknown_precisions_are_refused():
    assert ServeOptions("m").precision == "auto"
    for name in ("fp32", "auto", "int8"):  # int8's encoder is another runtime's: torch runs at fp32
        assert serving_dtype(name, torch.device("cpu")) is None
    with pytest.raises(PrecisionUnavailable, match="auto, fp32, bf16 or int8"):
        serving_dtype("fp16", torch.device("cpu"))


def test_bf16_is_refused_by_name_where_the_cpu_would_emulate_it(monkeypatch, served_folder, capsys):
    monkeypatch.setattr("pipeline.device.cpu_has_native_bf16", lambda: False)
    with pytest.raises(PrecisionUnavailable, match=r"no native bf16.*--precision fp32"):
        serving_dtype("bf16", torch.device("cpu"))
    assert main(["serve", "--model", str(served_folder), "--precision", "bf16"]) == 2
    assert "no native bf16" in capsys.readouterr().err


def linear_output_dtypes(model: DecisionModel) -> set[torch.dtype]:
    """The dtypes every linear layer of the model produced while answering."""
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.loaded.model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        probabilities(model)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@native_bf16
@pytest.mark.parametrize("family", ["laya", "joint"])
def test_bf16_runs_the_backbone_in_bf16_with_answers_close_to_fp32(family, tiny_base):
    model = load_decision_model(tiny_base) if family == "laya" else DecisionModel(*load_joint_on(tiny_base))
    assert linear_output_dtypes(model.to("cpu")) == {torch.float32}
    fp32 = probabilities(model)
    assert torch.bfloat16 in linear_output_dtypes(model.to("cpu", torch.bfloat16))
    np.testing.assert_allclose(probabilities(model), fp32, atol=2e-2)


@native_bf16
def test_a_bf16_server_says_so_and_answers(served_folder):
    app = build_app(ServeOptions(str(served_folder), precision="bf16"))
    with live_server(app) as url:
        assert httpx.get(f"{url}/healthz").json()["precision"] == "bfloat16"
        response = httpx.post(f"{url}/v1/systemone", json={"state": STATES[0], "questions": QUESTIONS})
        assert response.status_code == 200
        [fp32] = load_decision_model(served_folder).answer([parse_request(STATES[0], QUESTIONS)])
        for question in QUESTIONS:
            np.testing.assert_allclose(
                answer_probabilities(response.json()["answers"][question]),
                answer_probabilities(fp32.answers[question]),
                atol=2e-2,
            )
