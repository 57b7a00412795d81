"""The int8 encoder (`decision quantize`, `--precision int8|auto`): quantized from the export's graph, measured
against fp32 on rows the model never trained on, its calibrator refitted on its own logits; `auto` serves it only
where its report passes, `int8` is refused with the report's figures where it fails, and a quantization or a
graph that fails leaves fp32 serving with one warning line. Both families, on the tiny random models."""

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from mlflow.pyfunc import PythonModelContext

from pipeline.cli.main import main
from pipeline.config import QuantizeConfig
from pipeline.data import synthetic
from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families import load_decision_model
from pipeline.families.runtimes import precision as precision_module
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE, OnnxEncoder, onnxruntime_missing
from pipeline.families.runtimes.precision import Int8Refused, served_precision
from pipeline.families.runtimes.quantize import INT8_GRAPH, INT8_REPORT, QuantizationFailed, read_int8
from pipeline.mlops.pyfunc import EXPORT_ARTIFACT, DecisionPyfunc
from pipeline.scoring.calibrators import Calibrator, choose_calibrator
from pipeline.serving.server import ServeOptions, build_app
from pipeline.stages import quantize as quantize_stage
from pipeline.stages.evaluate import evaluate_model, served_logits
from pipeline.stages.export import export_folder, with_encoder_graph
from pipeline.stages.predict import predict_stage
from pipeline.stages.quantize import Rows, quantize_export
from tests.api.conftest import wait_ready
from tests.model.test_onnx_backend import torch_threads  # noqa: F401  (a fixture)
from tests.tiny import load_joint_on, synthetic_records

pytestmark = pytest.mark.skipif(
    onnxruntime_missing() is not None, reason=f"the onnx extra is not installed: {onnxruntime_missing()}"
)
LENIENT = QuantizeConfig(int8=True, min_agreement=0.5, max_accuracy_drop=0.5, max_ece_rise=0.5)
ROWS = Rows(synthetic_records(48, seed=1), synthetic_records(48, seed=2))


def exported(tiny_base: Path, folder: Path, family: str) -> Path:
    if family == "laya":
        return Path(export_folder(tiny_base, folder).out)
    joint, loaded = load_joint_on(tiny_base)
    return Path(with_encoder_graph(joint.export(loaded, folder, Calibrator(), {"family": "joint"})).out)


@pytest.fixture(scope="module", params=["laya", "joint"])
def quantized_once(request, tiny_base, tmp_path_factory) -> Path:
    """A tiny export of each family with its int8 encoder and a passing report (lenient bounds), made once."""
    folder = exported(tiny_base, tmp_path_factory.mktemp("int8") / "export", request.param)
    result = quantize_export(folder, ROWS, LENIENT)
    assert result.quantized and result.passes, result.why
    return folder


@pytest.fixture
def quantized(quantized_once, tmp_path, monkeypatch) -> Path:
    """A copy of `quantized_once` a test may change, served as on a host with VNNI where int8 is the fastest
    (the race is timed; a test of the choice must not depend on this machine's load)."""
    monkeypatch.setattr(precision_module, "int8_host_problem", lambda: None)
    monkeypatch.setattr(
        precision_module,
        "race",
        lambda model, encoders: {"int8": 1.0} | dict.fromkeys(set(encoders) - {"int8"}, 2.0),
    )
    return Path(shutil.copytree(quantized_once, tmp_path / "export"))


def failing(folder: Path) -> Path:
    """The report as a model outside its bounds would have it."""
    path = folder / INT8_REPORT
    report = json.loads(path.read_text())
    path.write_text(
        json.dumps(report | {"passes": False, "why": "outside its bounds: argmax agreement 90.00%"})
    )
    return folder


def test_the_int8_encoder_is_smaller_and_answers_close_to_fp32(quantized):
    report = json.loads((quantized / INT8_REPORT).read_text())
    assert (quantized / INT8_GRAPH).stat().st_size < (quantized / ONNX_FILE).stat().st_size
    overall = report["overall"]
    assert overall["decisions"] == sum(len(r.decisions) for r in ROWS.check)
    assert overall["argmax_agreement"] >= 0.9, overall
    assert set(report["by_question"]) == {d.question.id for r in ROWS.check for d in r.decisions}
    fp32 = load_decision_model(quantized)
    int8 = replace(load_decision_model(quantized), encoder=OnnxEncoder(quantized / INT8_GRAPH))
    _, reference = served_logits(fp32, ROWS.check)
    _, candidate = served_logits(int8, ROWS.check)
    gaps = [float(np.abs(a - b).max()) for a, b in zip(reference, candidate)]
    assert 0 < max(gaps) < 0.5, max(gaps)  # quantized (not the fp32 graph again), and near it


def test_the_int8_calibrator_is_refitted_on_the_int8_models_own_logits(quantized):
    int8 = read_int8(quantized)
    model = replace(load_decision_model(quantized), encoder=OnnxEncoder(int8.graph))
    decisions, logits = served_logits(model, ROWS.fit)
    kind = load_decision_model(quantized).family.calibrator(load_decision_model(quantized).loaded).kind
    assert int8.calibrator.kind == kind  # fp32's kind of calibrator, its values fitted on int8's logits
    assert (
        int8.calibrator.to_json() == choose_calibrator(decisions, logits, kinds=(kind,)).calibrator.to_json()
    )
    served, choice = served_precision(load_decision_model(quantized), "int8", quantized)
    assert choice.name == "int8" and served.loaded.calibrator == int8.calibrator
    [answered] = served.answer([parse_request(ROWS.check[0].state, ROWS.check[0].request_questions())])
    decision = next(d for d in decisions if d.record == 0)
    want = int8.calibrator.probabilities(
        decision.qtype, decision.question_id, answered.logits[decision.question_id]
    )
    got = answered.answers[decision.question_id]
    probabilities = (
        [1 - got["noul"], got["noul"]] if got["type"] == "noul" else list(got["probabilities"].values())
    )
    np.testing.assert_allclose(probabilities, want, atol=1e-4)


def test_auto_serves_int8_where_its_report_passes_and_fp32_where_it_fails(quantized):
    served, choice = served_precision(load_decision_model(quantized), "auto", quantized)
    assert choice.name == "int8" and served.backend == "onnxruntime", choice.reason
    assert "within its bounds" in choice.reason
    served, choice = served_precision(load_decision_model(failing(quantized)), "auto", quantized)
    assert choice.name == "fp32" and served.encoder is None
    assert "outside its bounds: argmax agreement 90.00%" in choice.reason


def test_auto_keeps_fp32_where_int8_answers_the_probes_slower(quantized, monkeypatch):
    timed = []

    def int8_slowest(model, encoders):
        timed.append(set(encoders))
        return {"int8": 3.0} | dict.fromkeys(set(encoders) - {"int8"}, 1.0)

    monkeypatch.setattr(precision_module, "race", int8_slowest)
    served, choice = served_precision(load_decision_model(quantized), "auto", quantized)
    assert choice.name == "fp32" and served.encoder is None and "slower than fp32" in choice.reason
    assert timed == [{"int8", "fp32 torch", "fp32 onnxruntime"}]  # the export's fp32 graph raced too
    served, choice = served_precision(load_decision_model(quantized), "int8", quantized)
    assert choice.name == "int8"  # asked for by name: served, whatever its speed


def test_int8_asked_for_is_refused_with_the_reports_figures_where_it_fails(quantized):
    with pytest.raises(Int8Refused, match=r"outside its bounds: argmax agreement 90\.00%"):
        served_precision(load_decision_model(failing(quantized)), "int8", quantized)


def test_auto_keeps_fp32_on_a_cpu_without_vnni(quantized, monkeypatch):
    monkeypatch.setattr(precision_module, "int8_host_problem", lambda: "this CPU has no VNNI")
    _, choice = served_precision(load_decision_model(quantized), "auto", quantized)
    assert choice.name == "fp32" and "no VNNI" in choice.reason


def test_an_export_without_a_report_serves_fp32_under_auto_and_refuses_int8(tiny_base, tmp_path):
    folder = exported(tiny_base, tmp_path / "export", "laya")
    _, choice = served_precision(load_decision_model(folder), "auto", folder)
    assert choice.name == "fp32" and "decision quantize" in choice.reason
    with pytest.raises(Int8Refused, match="no int8 report"):
        served_precision(load_decision_model(folder), "int8", folder)


def test_a_quantization_that_fails_leaves_fp32_with_one_warning_line(
    tiny_base, tmp_path, monkeypatch, caplog
):
    def unsupported(graph, out, scheme):
        raise QuantizationFailed("ValueError: an operator it does not take")

    monkeypatch.setattr(quantize_stage, "quantize_graph", unsupported)
    folder = exported(tiny_base, tmp_path / "export", "laya")
    with caplog.at_level(logging.WARNING):
        result = quantize_export(folder, ROWS, LENIENT)
    assert not result.quantized and "an operator it does not take" in result.why
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    _, choice = served_precision(load_decision_model(folder), "auto", folder)
    assert choice.name == "fp32" and "an operator it does not take" in choice.reason


def test_a_graph_the_runtime_cannot_load_falls_back_to_fp32_with_one_warning(quantized, monkeypatch, caplog):
    def unloadable(path):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH")

    monkeypatch.setattr(precision_module, "OnnxEncoder", unloadable)
    with caplog.at_level(logging.WARNING):
        served, choice = served_precision(load_decision_model(quantized), "int8", quantized)
    assert choice.name == "fp32" and choice.fell_back and served.encoder is None
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_a_changed_int8_graph_is_not_served(quantized):
    with (quantized / INT8_GRAPH).open("ab") as graph:
        graph.write(b"\0")
    _, choice = served_precision(load_decision_model(quantized), "auto", quantized)
    assert choice.name == "fp32" and "not the graph its report measured" in choice.reason


@pytest.mark.usefixtures("torch_threads")
def test_healthz_and_models_say_which_precision_answers_and_its_agreement(quantized):
    with TestClient(build_app(ServeOptions(str(quantized)))) as client:  # --precision auto, the default
        health = wait_ready(client).get("/healthz").json()
        listed = client.get("/v1/models").json()["models"]
        answer = client.post(
            "/v1/systemone", json={"state": "great phone", "questions": ROWS.check[0].request_questions()}
        )
    assert health["precision"] == "int8" and health["backend"] == "onnxruntime", health
    assert health["int8"]["passes"] and 0.9 <= health["int8"]["argmax_agreement"] <= 1.0
    assert all(entry["precision"] == "int8" and entry["int8"]["passes"] for entry in listed)
    assert answer.status_code == 200, answer.text


def test_evaluate_at_int8_scores_with_the_int8_calibrator(quantized, tmp_path):
    rows = synthetic.write_rows(synthetic.generate_rows(48, seed=2), tmp_path / "rows.jsonl")  # ROWS.check's
    fp32 = evaluate_model(quantized, rows)
    int8 = evaluate_model(quantized, rows, precision="int8")
    assert (fp32.precision, int8.precision) == ("fp32", "int8")
    assert int8.metrics["overall"]["decisions"] == fp32.metrics["overall"]["decisions"]
    assert int8.metrics["overall"]["loss"] != fp32.metrics["overall"]["loss"]


def test_serve_int8_on_an_export_without_a_report_is_one_line_and_exit_2(tiny_base, tmp_path, capsys):
    folder = exported(tiny_base, tmp_path / "export", "laya")
    code = main(["serve", "--model", str(folder), "--precision", "int8", "--no-inference-log"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no int8 report" in err[0], err


def test_decision_quantize_with_data_halves_the_rows_and_prints_the_verdict(tiny_base, tmp_path, capsys):
    folder = exported(tiny_base, tmp_path / "export", "laya")
    rows = synthetic.write_rows(synthetic.generate_rows(96, seed=3), tmp_path / "rows.jsonl")
    assert main(["quantize", "--model", str(folder), "--data", str(rows), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["quantized"] and printed["overall"]["decisions"] > 0
    report = json.loads((folder / INT8_REPORT).read_text())
    assert report["fitted_on"].startswith("half of the rows given") and report["measured_on"].startswith(
        "the other half"
    )


def test_decision_quantize_without_rows_is_one_line_and_exit_2(tiny_base, tmp_path, capsys):
    folder = exported(tiny_base, tmp_path / "export", "laya")
    assert main(["quantize", "--model", str(folder)]) == 2
    assert "give --data" in capsys.readouterr().err


def test_the_mlflow_model_serves_the_precision_its_model_config_names(quantized):
    pyfunc = DecisionPyfunc()
    pyfunc.load_context(PythonModelContext({EXPORT_ARTIFACT: str(quantized)}, {"precision": "int8"}))
    assert pyfunc.precision.name == "int8" and pyfunc.backend.name == "onnxruntime"
    body = {"state": ROWS.check[0].state, "questions": ROWS.check[0].request_questions()}
    [got] = pyfunc.predict(None, [body])
    [want] = served_precision(load_decision_model(quantized), "int8", quantized)[0].answer(
        [parse_request(body["state"], body["questions"])]
    )
    assert got["answers"] == want.answers


def test_batch_predict_at_int8_answers_as_the_int8_server_does(quantized, tmp_path):
    rows = synthetic.write_rows(synthetic.generate_rows(6, seed=2), tmp_path / "rows.jsonl")
    result = predict_stage(str(quantized), rows, tmp_path / "scores.parquet", precision="int8")
    assert result.scored == 6
    served = served_precision(load_decision_model(quantized), "int8", quantized)[0]
    first = pq.read_table(tmp_path / "scores.parquet").to_pylist()[0]
    record = synthetic_records(6, seed=2)[0]
    [want] = served.answer([parse_request(record.state, record.request_questions())])
    got = json.loads(first["answers"])
    assert got.keys() == want.answers.keys()
    for qid, answer in want.answers.items():  # scored in a batch of six, answered alone: the same
        np.testing.assert_allclose(answer_probabilities(got[qid]), answer_probabilities(answer), atol=1e-4)


def test_an_int8_answer_does_not_depend_on_its_batch_mates(quantized):
    """Activations are scaled per row (block-wise), not per batch: a request alone answers as among others."""
    served = served_precision(load_decision_model(quantized), "int8", quantized)[0]
    requests = [parse_request(r.state, r.request_questions()) for r in ROWS.check[:12]]
    together = served.answer(requests)
    for request, batched in zip(requests, together):
        [alone] = served.answer([request])
        for qid, answer in alone.answers.items():
            np.testing.assert_allclose(
                answer_probabilities(batched.answers[qid]), answer_probabilities(answer), atol=1e-4
            )
