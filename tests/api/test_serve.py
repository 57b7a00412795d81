"""The Decision API in process: every status code, the answer shapes, keys, bodies and batching."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zstandard
from fastapi.testclient import TestClient

from pipeline.families.laya.predict import predict
from pipeline.families.laya_layout import load_model
from pipeline.serving.keys import KeyStore, hash_key
from tests.api.conftest import INTENSITY, POSITIVE, QUESTIONS, TONE, make_app
from tests.api.conftest import wait_ready as ready

STATE = "I love this product, it is great"
KEYS = KeyStore({hash_key("alice-key"): "alice", hash_key("bob-key"): "bob"})


@pytest.fixture(scope="module")
def open_client(served_folder):
    with TestClient(make_app(served_folder)) as client:
        yield ready(client)


@pytest.fixture(scope="module")
def keyed_client(served_folder, tmp_path_factory):
    import shutil

    finetunes = tmp_path_factory.mktemp("finetunes")
    shutil.copytree(served_folder, finetunes / "alice-tune")
    (finetunes / "alice-tune" / "manifest.json").write_text('{"owner": "alice"}')
    with TestClient(make_app(served_folder, keys=KEYS, finetunes=finetunes)) as client:
        yield ready(client)


def ask(client, body=None, **headers):
    return client.post(
        "/v1/systemone", json=body or {"state": STATE, "questions": QUESTIONS}, headers=headers
    )


def test_answers_have_the_wire_shape_and_match_in_process_predictions(open_client, served_folder):
    response = ask(open_client)
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == served_folder.name and body["usage"]["output_tokens"] == 0
    assert body["usage"]["input_tokens"] > 0
    tone, intensity, positive = (body["answers"][q] for q in ("tone", "intensity", "positive"))
    expected = predict(load_model(served_folder), STATE, QUESTIONS)

    automate = {"x_automate", "x_automate_reason"}  # the tiny base has no certificates: never automated
    assert set(tone) == {"type", "choice", "probabilities", "confidence", "x_top_probability"} | automate
    assert tone["type"] == "choice" and list(tone["probabilities"]) == ["negative", "neutral", "positive"]
    np.testing.assert_allclose(list(tone["probabilities"].values()), expected["tone"], atol=1e-4)
    assert tone["choice"] == ["negative", "neutral", "positive"][int(np.argmax(expected["tone"]))]
    assert tone["x_top_probability"] == max(tone["probabilities"].values())
    assert tone["confidence"] == pytest.approx(jev(expected["tone"]), abs=1e-4)

    assert intensity["legend"] == {"0": "none", "1": "mild", "2": "strong"}
    assert list(intensity["probabilities"]) == ["0", "1", "2"]
    assert intensity["score"] == pytest.approx(float(np.dot([0, 1, 2], expected["intensity"])), abs=1e-4)
    assert intensity["confidence"] == pytest.approx(jev(expected["intensity"]), abs=1e-4)
    assert intensity["x_top_probability"] == pytest.approx(float(expected["intensity"].max()), abs=1e-4)

    assert set(positive) == {"type", "noul", "x_confidence"} | automate  # no confidence on a noul answer
    assert {a["x_automate_reason"] for a in (tone, intensity, positive)} == {"not_certified"}
    assert positive["noul"] == pytest.approx(float(expected["positive"][1]), abs=1e-4)
    assert positive["x_confidence"] == pytest.approx(max(positive["noul"], 1 - positive["noul"]), abs=1e-4)
    for value in (tone["confidence"], positive["noul"], intensity["score"], intensity["confidence"]):
        assert value == round(value, 4)


def jev(p) -> float:
    """The Jev confidence written out: (max p - 1/n) / (1 - 1/n)."""
    return (float(np.max(p)) - 1 / len(p)) / (1 - 1 / len(p))


@pytest.mark.parametrize("model", [None, "default", "jev-latest", "jev-preview"])
def test_default_model_names_and_null_criteria_are_accepted(open_client, model):
    body = {"state": {"text": STATE, "turns": [1, 2]}, "questions": {"p": {**POSITIVE, "criteria": None}}}
    if model:
        body["model"] = model
    assert ask(open_client, body).status_code == 200


def test_invalid_requests_get_422_naming_the_field(open_client):
    cases = [
        ({"questions": QUESTIONS}, ["body", "state"]),
        ({"state": None, "questions": QUESTIONS}, ["body", "state"]),
        ({"state": 2**70, "questions": QUESTIONS}, ["body", "state"]),  # found by schemathesis: was a 500
        ({"state": STATE, "questions": {}}, ["body", "questions"]),
        ({"state": STATE, "questions": {"q": {"type": "box"}}}, ["body", "questions", "q", "type"]),
        (
            {"state": STATE, "questions": {"q": {**TONE, "criteria": ["a", "a"]}}},
            ["body", "questions", "q", "criteria"],
        ),
        (
            {"state": STATE, "questions": {"q": {**INTENSITY, "criteria": []}}},
            ["body", "questions", "q", "criteria"],
        ),
        (
            {"state": STATE, "questions": {"q": {**POSITIVE, "criteria": {"maybe": "x"}}}},
            ["body", "questions", "q", "criteria"],
        ),
    ]
    for body, loc in cases:
        response = ask(open_client, body)
        assert response.status_code == 422, body
        details = response.json()["detail"]
        assert any(d["loc"][: len(loc)] == loc and d["msg"] and d["type"] for d in details), (loc, details)


def test_size_limits_answer_413(open_client):
    too_many = {f"q{i}": POSITIVE for i in range(65)}
    assert ask(open_client, {"state": STATE, "questions": too_many}).status_code == 413
    assert ask(open_client, {"state": "x" * 200_001, "questions": QUESTIONS}).status_code == 413
    long_question = {**POSITIVE, "instructions": "y" * 20_001}
    assert ask(open_client, {"state": STATE, "questions": {"q": long_question}}).status_code == 413
    huge = b'{"state": "' + b"z" * (9 * 1024 * 1024) + b'", "questions": {}}'
    response = open_client.post("/v1/systemone", content=huge, headers={"Content-Type": "application/json"})
    assert response.status_code == 413


def test_zstd_bodies_are_decoded_and_bad_encodings_refused(open_client):
    import orjson

    raw = orjson.dumps({"state": STATE * 40, "questions": QUESTIONS})
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    compressed = zstandard.ZstdCompressor().compress(raw)
    assert open_client.post("/v1/systemone", content=compressed, headers=headers).status_code == 200
    assert open_client.post("/v1/systemone", content=b"not zstd", headers=headers).status_code == 400
    gzip_headers = {**headers, "Content-Encoding": "gzip"}
    assert open_client.post("/v1/systemone", content=raw, headers=gzip_headers).status_code == 415
    bomb = zstandard.ZstdCompressor().compress(b" " * (20 * 1024 * 1024))
    assert open_client.post("/v1/systemone", content=bomb, headers=headers).status_code == 413


def test_keys_by_bearer_or_header_and_401_for_unknown(keyed_client):
    assert ask(keyed_client, Authorization="Bearer alice-key").status_code == 200
    assert ask(keyed_client, **{"X-API-Key": "bob-key"}).status_code == 200
    assert ask(keyed_client, Authorization="Bearer nobody").status_code == 401
    assert ask(keyed_client, **{"X-API-Key": "nobody"}).status_code == 401
    assert ask(keyed_client, Authorization="Bearer alice-key", **{"X-API-Key": "bob-key"}).status_code == 401
    assert ask(keyed_client).status_code == 200  # keyless callers get the serving model


def test_the_authorization_header_is_read_as_before(keyed_client):
    # Scheme case, spaces around the key, the same key in both headers, blank headers (as absent).
    for headers in (
        {"Authorization": "bearer alice-key"},
        {"Authorization": "Bearer   alice-key  "},
        {"Authorization": "Bearer alice-key", "X-API-Key": "alice-key"},
        {"X-API-Key": " bob-key "},
        {"Authorization": ""},
        {"X-API-Key": "  "},
    ):
        assert ask(keyed_client, **headers).status_code == 200, headers
    # A header that is not `Bearer <key>` is refused, not taken for a keyless call.
    for authorization in ("Basic YWxpY2U6eA==", "Bearer", "Bearer    ", "alice-key", "Token alice-key"):
        response = ask(keyed_client, Authorization=authorization)
        assert response.status_code == 401, authorization
        assert response.json()["detail"] == {
            "error_type": "authentication_error",
            "message": "Authorization must be 'Bearer <key>'",
        }
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_keyless_caller_gets_403_before_any_unknown_model_answer(keyed_client):
    for name in ("alice-tune", "no-such-model"):
        response = ask(keyed_client, {"model": name, "state": STATE, "questions": QUESTIONS})
        assert response.status_code == 403, name
        assert response.json()["detail"]["error_type"] == "permission_error"


def test_fine_tunes_are_visible_to_their_owner_only(keyed_client):
    body = {"model": "alice-tune", "state": STATE, "questions": QUESTIONS}
    response = ask(keyed_client, body, Authorization="Bearer alice-key")
    assert response.status_code == 200 and response.json()["model"] == "alice-tune"
    assert ask(keyed_client, body, Authorization="Bearer bob-key").status_code == 404
    missing = {**body, "model": "no-such-model"}
    assert ask(keyed_client, missing, Authorization="Bearer alice-key").status_code == 404

    def names(**headers):
        return {m["name"] for m in keyed_client.get("/v1/models", headers=headers).json()["models"]}

    assert "alice-tune" in names(Authorization="Bearer alice-key")
    assert "alice-tune" not in names(Authorization="Bearer bob-key")
    assert names() == {"default", "jev-latest", "jev-preview", keyed_client.get("/healthz").json()["model"]}


def test_503_with_retry_after_while_the_model_loads(served_folder, monkeypatch):
    from pipeline.serving import catalog

    release = threading.Event()
    real_load = catalog.load_decision_model  # what the catalog loads every model with

    def slow_load(folder):
        release.wait(30)
        return real_load(folder)

    monkeypatch.setattr(catalog, "load_decision_model", slow_load)
    with TestClient(make_app(served_folder)) as client:
        for response in (client.get("/healthz"), ask(client), client.get("/v1/models")):
            assert response.status_code == 503 and int(response.headers["Retry-After"]) > 0
        assert ask(client).json()["detail"]["error_type"] == "model_loading"
        # Not an empty list: a client reading /v1/models would conclude the server has no models.
        assert client.get("/v1/models").json()["detail"]["error_type"] == "model_loading"
        # /healthz answers its health body (a probe reads the status), not an error body.
        assert client.get("/healthz").json()["status"] == "loading"
        release.set()
        assert ready(client) and ask(client).status_code == 200


def test_a_full_queue_answers_503_and_a_bad_request_fails_alone(tmp_path, monkeypatch):
    from pipeline.serving import server as serve
    from tests.tiny import write_tiny_base

    gate = threading.Event()
    real = serve._run_batch

    def gated(model, requests):
        gate.wait(30)
        return real(model, requests)

    monkeypatch.setattr(serve, "_run_batch", gated)
    cramped = write_tiny_base(tmp_path / "cramped", max_len=40)  # shorter than a head_max_len (64) of options
    with TestClient(make_app(cramped, max_queue=2)) as client:
        ready(client)
        no_fit = {
            "state": STATE,
            "questions": {"q": {**TONE, "criteria": [f"option{i}" for i in range(250)]}},  # cannot fit
        }
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(ask, client)  # taken by the worker, held at the gate
            time.sleep(0.3)
            queued = [pool.submit(ask, client, no_fit), pool.submit(ask, client)]
            time.sleep(0.3)
            refused = ask(client)
            gate.set()
            statuses = [first.result().status_code, *(f.result().status_code for f in queued)]
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 0
        assert refused.json()["detail"] == {"error_type": "overloaded_error", "message": "the server is busy"}
        assert statuses == [200, 422, 200]
        assert ask(client).status_code == 200


def test_concurrent_requests_share_forward_passes_and_keep_their_answers(served_folder):
    states = [f"{STATE} {'great ' * i}" for i in range(12)]
    expected = [predict(load_model(served_folder), s, QUESTIONS) for s in states]
    with TestClient(make_app(served_folder, max_wait_s=0.05)) as client:
        ready(client)
        with ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(lambda s: ask(client, {"state": s, "questions": QUESTIONS}), states))
        health = client.get("/healthz").json()
    assert all(r.status_code == 200 for r in responses)
    assert health["batches"] < health["requests"]  # some requests shared a pass
    for response, want in zip(responses, expected):
        got = response.json()["answers"]["tone"]["probabilities"]
        np.testing.assert_allclose(list(got.values()), want["tone"], atol=1e-4)
