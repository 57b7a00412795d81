"""The ONNX Runtime backend (`decision serve --backend`): the encoder exported with dynamic batch and token axes
answers as torch does (largest |Δp| <= 1e-4, every argmax the same) for both families, an answer does not
depend on its batch-mates, and a missing runtime, a failed export or a failed parity check falls back to torch.

The parity tests skip, saying why, where the `onnx` extra (onnxruntime, onnx) is not installed."""

import sys

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families import load_decision_model
from pipeline.families.base import Answered, DecisionModel
from pipeline.families.onnx_encoder import OnnxEncoder, onnxruntime_missing
from pipeline.serving import backends
from pipeline.serving.backends import LARGEST_DP, PROBES, check_parity, choose_backend
from pipeline.serving.server import ServeOptions, build_app
from tests.api.conftest import wait_ready
from tests.model.test_batch_independence import MATES, QUESTIONS
from tests.tiny import load_joint_on

MISSING = onnxruntime_missing()
needs_onnx = pytest.mark.skipif(MISSING is not None, reason=f"the onnx extra is not installed: {MISSING}")

REQUESTS = [
    *MATES,
    ("the battery died after a day", QUESTIONS),
    ("great " * 30 + "phone, " + "terrible case " * 5, QUESTIONS),
    ("fine", {"level": QUESTIONS["level"]}),
    *PROBES,
]  # fmt: skip


@pytest.fixture(params=["laya", "joint"])
def model(request, tiny_base) -> DecisionModel:
    if request.param == "laya":
        return load_decision_model(tiny_base)
    return DecisionModel(*load_joint_on(tiny_base))


@pytest.fixture
def onnx_model(model, tmp_path) -> DecisionModel:
    choice = choose_backend(model, "onnxruntime", tmp_path / "encoder.onnx")
    assert choice.name == "onnxruntime", choice.reason
    return DecisionModel(model.family, model.loaded, model.dtype, choice.encoder)


def answered(model: DecisionModel, bodies) -> list[dict]:
    results = model.answer([parse_request(state, questions) for state, questions in bodies])
    assert all(isinstance(r, Answered) for r in results), results
    return [r.answers for r in results]


@needs_onnx
def test_onnx_answers_equal_torch_answers_on_varied_requests(model, onnx_model):
    assert onnx_model.backend == "onnxruntime" and model.backend == "torch"
    parity = check_parity(model, onnx_model.encoder, REQUESTS)
    assert parity.questions == sum(len(questions) for _, questions in REQUESTS)
    assert parity.largest_dp <= LARGEST_DP + 1e-9 and parity.argmax_agreement == 1.0, parity


@needs_onnx
def test_the_onnx_graph_takes_any_batch_and_length(model, onnx_model):
    encoder = onnx_model.encoder
    assert [i.shape for i in encoder.session.get_inputs()] == [["batch", "tokens"]] * 2
    torch_pass = model.family.served_encoder(model.loaded)
    for rows, tokens in [(1, 3), (5, 40), (17, 9)]:
        ids = torch.randint(5, 150, (rows, tokens))
        mask = torch.ones_like(ids)
        mask[0, tokens // 2 :] = 0  # one padded row: the real tokens' states must not see the padding
        with torch.inference_mode():
            want = torch_pass(ids, mask)
        got = encoder(ids, mask)
        assert got.shape == want.shape
        real = mask.bool()
        torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-4)


@needs_onnx
def test_an_onnx_answer_alone_equals_the_same_answer_among_batch_mates(onnx_model):
    body = ("the battery died after a day", QUESTIONS)
    alone = answered(onnx_model, [body])[0]
    for position in range(len(MATES) + 1):
        mixed = answered(onnx_model, [*MATES[:position], body, *MATES[position:]])[position]
        for qid, answer in alone.items():
            np.testing.assert_allclose(
                answer_probabilities(mixed[qid]), answer_probabilities(answer), atol=1e-5
            )


def test_auto_serves_torch_when_onnxruntime_cannot_be_imported(model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    auto = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert (auto.name, auto.encoder, auto.fell_back) == ("torch", None, False)
    assert "onnxruntime cannot be imported" in auto.reason
    asked = choose_backend(model, "onnxruntime", tmp_path / "encoder.onnx")
    assert (asked.name, asked.fell_back) == ("torch", True)  # asked for: the log warns
    assert not (tmp_path / "encoder.onnx").exists()


def test_torch_asked_for_exports_nothing(model, tmp_path):
    choice = choose_backend(model, "torch", tmp_path / "encoder.onnx")
    assert (choice.name, choice.encoder) == ("torch", None)
    assert not (tmp_path / "encoder.onnx").exists()


@needs_onnx
def test_a_failed_export_falls_back_to_torch(model, tmp_path, monkeypatch):
    def broken(encoder, path):
        raise RuntimeError("unsupported operator")

    monkeypatch.setattr(backends, "export_encoder", broken)
    choice = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert (choice.name, choice.fell_back) == ("torch", True)
    assert "the ONNX export failed: RuntimeError: unsupported operator" in choice.reason


@needs_onnx
def test_a_graph_that_answers_differently_falls_back_to_torch(model, tmp_path, monkeypatch):
    exact = OnnxEncoder.__call__
    monkeypatch.setattr(OnnxEncoder, "__call__", lambda self, ids, mask: exact(self, ids, mask).roll(1, -1))
    choice = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert (choice.name, choice.encoder, choice.fell_back) == ("torch", None, True)
    assert "failed the parity check" in choice.reason


@needs_onnx
def test_bf16_serving_keeps_torch(model, tmp_path):
    model.dtype = torch.bfloat16
    choice = choose_backend(model, "onnxruntime", tmp_path / "encoder.onnx")
    assert (choice.name, choice.fell_back) == ("torch", True)
    assert "--precision bf16" in choice.reason


@pytest.fixture
def torch_threads():
    """Put the test process's torch thread count back (building a server's app sets it)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("wanted", ["torch", "onnxruntime"])
def test_healthz_names_the_backend_and_why(tiny_base, torch_threads, wanted):
    expected = "torch" if wanted == "torch" or MISSING else "onnxruntime"
    with TestClient(build_app(ServeOptions(str(tiny_base), backend=wanted))) as client:
        health = wait_ready(client).get("/healthz").json()
        answer = client.post("/v1/systemone", json={"state": "great phone", "questions": QUESTIONS})
    assert health["backend"] == expected, health["backend_reason"]
    assert health["backend_reason"]
    assert answer.status_code == 200, answer.text
