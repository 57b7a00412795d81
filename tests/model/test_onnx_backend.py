"""The encoder runtimes behind `decision serve --backend` (ONNX Runtime, OpenVINO): the encoder exported with
dynamic batch and token axes answers as torch does (largest |Δp| <= 1e-4, every argmax the same) for both
families on each runtime, an answer does not depend on its batch-mates, a runtime follows the thread count the
governor sets, `auto` serves the fastest that passes, and a missing runtime, a failed export or a failed
parity check falls back to torch.

The parity tests skip, saying why, where a runtime's extra (`onnx`: onnxruntime and onnx; `openvino`) is not
installed."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from mlflow.pyfunc import PythonModelContext

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families import load_decision_model
from pipeline.families.base import Answered, DecisionModel
from pipeline.families.runtimes import backends
from pipeline.families.runtimes.backends import (
    FP32_PARITY,
    LARGEST_DP,
    PROBES,
    RUNTIMES,
    Parity,
    ParityBound,
    check_parity,
    choose_backend,
)
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE, OnnxEncoder, onnxruntime_missing
from pipeline.families.runtimes.openvino_encoder import OpenVinoEncoder, openvino_missing
from pipeline.mlops.pyfunc import EXPORT_ARTIFACT, DecisionPyfunc
from pipeline.scoring.calibrators import Calibrator
from pipeline.serving.server import ServeOptions, build_app
from pipeline.stages.export import export_folder, with_encoder_graph
from tests.api.conftest import wait_ready
from tests.model.test_batch_independence import MATES, QUESTIONS
from tests.tiny import JOINT_HEAD, load_joint_on

MISSING = onnxruntime_missing()
needs_onnx = pytest.mark.skipif(MISSING is not None, reason=f"the onnx extra is not installed: {MISSING}")
MISSING_BY_RUNTIME = {"onnxruntime": MISSING, "openvino": openvino_missing()}

REQUESTS = [
    *MATES,
    ("the battery died after a day", QUESTIONS),
    ("great " * 30 + "phone, " + "terrible case " * 5, QUESTIONS),
    ("fine", {"level": QUESTIONS["level"]}),
    *PROBES,
]


@pytest.fixture(params=["laya", "joint"])
def model(request, tiny_base) -> DecisionModel:
    if request.param == "laya":
        return load_decision_model(tiny_base)
    return DecisionModel(*load_joint_on(tiny_base))


@pytest.fixture(params=list(RUNTIMES))
def runtime(request) -> str:
    """Each runtime `--backend` can ask for, skipped (saying why) where it is not installed."""
    if MISSING_BY_RUNTIME[request.param] is not None:
        pytest.skip(f"{request.param} cannot run here: {MISSING_BY_RUNTIME[request.param]}")
    return request.param


@pytest.fixture
def onnx_model(model, runtime, tmp_path) -> DecisionModel:
    """The model with its encoder on `runtime` (named onnx_model: both runtimes run the exported ONNX
    graph)."""
    choice = choose_backend(model, runtime, tmp_path / "encoder.onnx")
    assert choice.name == runtime, choice.reason
    return DecisionModel(model.family, model.loaded, model.dtype, choice.encoder)


def answered(model: DecisionModel, bodies) -> list[dict]:
    results = model.answer([parse_request(state, questions) for state, questions in bodies])
    assert all(isinstance(r, Answered) for r in results), results
    return [r.answers for r in results]


def test_runtime_answers_equal_torch_answers_on_varied_requests(model, onnx_model, runtime):
    assert onnx_model.backend == runtime and model.backend == "torch"
    parity = check_parity(model, onnx_model.encoder, REQUESTS)
    assert parity.questions == sum(len(questions) for _, questions in REQUESTS)
    assert parity.largest_dp <= LARGEST_DP + 1e-9 and parity.argmax_agreement == 1.0, parity


def test_a_state_read_in_windows_answers_as_torch_does_on_every_runtime(tiny_base, runtime, tmp_path):
    model = DecisionModel(*load_joint_on(tiny_base, replace(JOINT_HEAD, state_windows=3)))
    choice = choose_backend(model, runtime, tmp_path / "encoder.onnx")
    assert choice.name == runtime, choice.reason
    requests = [("the battery " + "really " * 45 + "died", QUESTIONS), *REQUESTS]
    parity = check_parity(model, choice.encoder, requests)
    assert parity.largest_dp <= LARGEST_DP + 1e-9 and parity.argmax_agreement == 1.0, parity


def test_the_exported_graph_takes_any_batch_and_length(model, onnx_model):
    onnx = pytest.importorskip("onnx")
    encoder = onnx_model.encoder
    inputs = onnx.load(str(encoder.path)).graph.input
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in inputs] == [["batch", "tokens"]] * 2
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


def test_a_runtime_answer_alone_equals_the_same_answer_among_batch_mates(onnx_model):
    body = ("the battery died after a day", QUESTIONS)
    alone = answered(onnx_model, [body])[0]
    for position in range(len(MATES) + 1):
        mixed = answered(onnx_model, [*MATES[:position], body, *MATES[position:]])[position]
        for qid, answer in alone.items():
            np.testing.assert_allclose(
                answer_probabilities(mixed[qid]), answer_probabilities(answer), atol=1e-5
            )


def test_auto_serves_torch_when_no_runtime_can_be_imported(model, tmp_path, monkeypatch):
    for package in ("onnxruntime", "openvino"):
        monkeypatch.setitem(sys.modules, package, None)  # `import onnxruntime` raises ImportError
    auto = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert (auto.name, auto.encoder, auto.fell_back) == ("torch", None, False)
    assert "onnxruntime cannot be imported" in auto.reason and "openvino cannot be imported" in auto.reason
    for runtime in RUNTIMES:
        asked = choose_backend(model, runtime, tmp_path / "encoder.onnx")
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
    assert "graph failed: RuntimeError: unsupported operator" in choice.reason


@needs_onnx
@pytest.mark.skipif(MISSING_BY_RUNTIME["openvino"] is not None, reason="the openvino extra is not installed")
def test_a_graph_that_answers_differently_falls_back_to_torch(model, tmp_path, monkeypatch):
    for runtime in (OnnxEncoder, OpenVinoEncoder):
        exact = runtime.__call__
        monkeypatch.setattr(
            runtime, "__call__", lambda self, ids, mask, exact=exact: exact(self, ids, mask).roll(1, -1)
        )
    choice = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert (choice.name, choice.encoder, choice.fell_back) == ("torch", None, True)
    assert "onnxruntime failed the parity check" in choice.reason
    assert "openvino failed the parity check" in choice.reason


@needs_onnx
def test_bf16_serving_keeps_onnxruntime_out(model, tmp_path):
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


@pytest.mark.parametrize("wanted", ["torch", *RUNTIMES])
def test_healthz_names_the_backend_and_why(tiny_base, torch_threads, wanted):
    expected = "torch" if wanted == "torch" or MISSING_BY_RUNTIME[wanted] else wanted
    with TestClient(build_app(ServeOptions(str(tiny_base), backend=wanted))) as client:
        health = wait_ready(client).get("/healthz").json()
        answer = client.post("/v1/systemone", json={"state": "great phone", "questions": QUESTIONS})
    assert health["backend"] == expected, health["backend_reason"]
    assert health["backend_reason"]
    assert answer.status_code == 200, answer.text


def session_threads(encoder) -> int:
    """The thread count the runtime's current session was built with, as the runtime reports it."""
    session = encoder.sessions.current()
    if isinstance(encoder, OnnxEncoder):
        return session.get_session_options().intra_op_num_threads
    return int(session.get_property("INFERENCE_NUM_THREADS"))


def test_a_runtime_follows_the_thread_count_torch_has(onnx_model, torch_threads):
    encoder = onnx_model.encoder
    ids, mask = torch.randint(5, 150, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    for threads in (1, 2, 1):  # what the governor sets on the inference thread, load coming and going
        torch.set_num_threads(threads)
        encoder(ids, mask)
        assert session_threads(encoder) == threads
    assert sorted(encoder.sessions.counts) == [1, 2]  # built once per count, then reused


def test_auto_serves_the_fastest_that_passes(model, tmp_path, monkeypatch):
    available = [name for name in RUNTIMES if MISSING_BY_RUNTIME[name] is None]
    if not available:
        pytest.skip("no runtime is installed")
    raced = {}

    def race(model, encoders):
        raced.update(encoders)
        return {name: (0.5 if name == available[-1] else 1.0) for name in encoders}

    monkeypatch.setattr(backends, "race", race)
    choice = choose_backend(model, "auto", tmp_path / "encoder.onnx")
    assert set(raced) == {"torch", *available}
    assert choice.name == available[-1] and choice.encoder is raced[available[-1]]
    assert choice.reason.startswith(f"auto: the fastest on the probe requests ({available[-1]} 500.0 ms")


def test_a_real_race_times_every_candidate(model, onnx_model, runtime):
    times = backends.race(model, {"torch": None, runtime: onnx_model.encoder})
    assert set(times) == {"torch", runtime} and all(0 < t < 60 for t in times.values())


def test_the_graph_an_export_ships_is_served_without_exporting_again(model, runtime, tmp_path):
    shipped = tmp_path / "export" / ONNX_FILE
    backends.export_encoder(model.family.served_encoder(model.loaded), shipped)
    choice = choose_backend(model, runtime, tmp_path / "cache" / ONNX_FILE, shipped=shipped)
    assert choice.name == runtime and choice.encoder.path == shipped
    assert not (tmp_path / "cache").exists()


def test_a_stale_shipped_graph_is_replaced_by_a_fresh_export(model, runtime, tmp_path):
    shipped = tmp_path / "export" / ONNX_FILE
    encoder = model.family.served_encoder(model.loaded)
    backends.export_encoder(encoder, shipped)
    with (
        torch.no_grad()
    ):  # the weights change after the graph was written: the graph no longer answers for them
        for parameter in model.loaded.model.parameters():
            parameter.mul_(1.5)
    choice = choose_backend(model, runtime, tmp_path / "cache" / ONNX_FILE, shipped=shipped)
    assert choice.name == runtime and choice.encoder.path == tmp_path / "cache" / ONNX_FILE, choice.reason
    assert "failed the parity check" in choice.reason and str(shipped) in choice.reason


def test_openvino_serves_bf16_no_further_from_fp32_than_torch_bf16(model, tmp_path):
    why_not = openvino_missing(torch.bfloat16)
    if why_not is not None:
        pytest.skip(f"OpenVINO cannot serve bf16 here: {why_not}")
    model.dtype = torch.bfloat16
    choice = choose_backend(model, "openvino", tmp_path / ONNX_FILE)
    assert choice.name == "openvino", choice.reason
    assert "bfloat16" in str(choice.encoder.sessions.current().get_property("INFERENCE_PRECISION_HINT"))
    fp32 = replace(model, dtype=None)
    runtime_gap = backends.measure_parity(fp32, replace(model, encoder=choice.encoder), REQUESTS)
    torch_gap = backends.measure_parity(fp32, model, REQUESTS)
    assert runtime_gap.largest_dp <= max(2 * torch_gap.largest_dp, backends.LARGEST_DP_BF16_FLOOR)


@pytest.mark.parametrize("family", ["laya", "joint"])
def test_decision_export_ships_the_encoder_graph_the_server_then_uses(tiny_base, tmp_path, family):
    if MISSING is not None:
        pytest.skip(f"the onnx extra is not installed: {MISSING}")
    folder = tmp_path / "export"
    if family == "laya":
        export_folder(tiny_base, folder)
    else:
        joint, loaded = load_joint_on(tiny_base)
        with_encoder_graph(joint.export(loaded, folder, Calibrator(), {"family": "joint"}))
    assert (folder / ONNX_FILE).is_file()
    served = load_decision_model(folder)
    choice = choose_backend(served, "onnxruntime", tmp_path / "cache" / ONNX_FILE, shipped=folder / ONNX_FILE)
    assert choice.name == "onnxruntime" and choice.encoder.path == folder / ONNX_FILE, choice.reason


def test_an_export_without_the_onnx_extra_is_whole_without_a_graph(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    result = export_folder(tiny_base, tmp_path / "export")
    assert result.written and not (tmp_path / "export" / ONNX_FILE).exists()
    assert load_decision_model(tmp_path / "export").answer([parse_request(*PROBES[0])])


@pytest.mark.parametrize("wanted", ["torch", *RUNTIMES])
def test_the_mlflow_pyfunc_runs_the_backend_its_model_config_names(tiny_base, tmp_path, wanted):
    folder = Path(export_folder(tiny_base, tmp_path / "export").out)
    pyfunc = DecisionPyfunc()
    pyfunc.load_context(PythonModelContext({EXPORT_ARTIFACT: str(folder)}, {"backend": wanted}))
    expected = "torch" if wanted == "torch" or MISSING_BY_RUNTIME[wanted] else wanted
    assert pyfunc.backend.name == expected, pyfunc.backend.reason
    # The export ships its graph: no scratch folder is left for a signal-stopped server to leak.
    assert not Path(pyfunc._graphs.name).exists()
    [got] = pyfunc.predict(None, [{"state": PROBES[1][0], "questions": PROBES[1][1]}])
    [want] = answered(load_decision_model(folder), [PROBES[1]])
    for qid, answer in want.items():
        np.testing.assert_allclose(
            answer_probabilities(got["answers"][qid]), answer_probabilities(answer), atol=LARGEST_DP + 1e-9
        )


def test_fp32_parity_allows_no_argmax_change_and_bf16_only_changes_on_near_ties():
    exact = Parity(5e-5, 1.0, 9)
    flipped_on_a_tie = Parity(5e-5, 8 / 9, 9, (0.0,))
    assert exact.within(FP32_PARITY) and not flipped_on_a_tie.within(FP32_PARITY)
    assert not Parity(2e-4, 1.0, 9).within(FP32_PARITY)
    bf16 = ParityBound(1e-3, tie=2e-3)
    assert Parity(4e-4, 8 / 9, 9, (6e-4,)).within(bf16)  # a near-tie the allowed move explains
    assert not Parity(4e-4, 8 / 9, 9, (0.3,)).within(bf16)  # a clear answer changed
    assert not Parity(2e-3, 1.0, 9).within(bf16)
