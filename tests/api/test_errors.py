"""Every refusal of the Decision API has one body shape (docs/serving.md), and `--require-key` refuses keyless
callers.

422: FastAPI's `{"detail": [{"loc", "msg", "type"}]}`; every other error: `{"detail": {"error_type",
"message"}}`.
"""

import json

import pytest
import zstandard
from fastapi.testclient import TestClient

from pipeline.cli.main import main
from pipeline.serving.keys import KeyStore, hash_key
from tests.api.conftest import INTENSITY, POSITIVE, QUESTIONS, make_app
from tests.api.conftest import wait_ready as ready

STATE = "I love this product, it is great"
KEYS = KeyStore({hash_key("alice-key"): "alice"})


@pytest.fixture(scope="module")
def keyed_client(served_folder):
    with TestClient(make_app(served_folder, keys=KEYS)) as client:
        yield ready(client)


@pytest.fixture(scope="module")
def strict_client(served_folder):
    with TestClient(make_app(served_folder, keys=KEYS, require_key=True)) as client:
        yield ready(client)


def ask(client, body=None, **headers):
    return client.post(
        "/v1/systemone", json=body or {"state": STATE, "questions": QUESTIONS}, headers=headers
    )


def refusal(response, status: int, error_type: str) -> str:
    """The message of a refusal, once its status and `{"detail": {"error_type", "message"}}` body are
    checked."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert set(detail) == {"error_type", "message"} and detail["error_type"] == error_type, detail
    assert isinstance(detail["message"], str) and detail["message"]
    return detail["message"]


def test_401_403_and_404_name_their_error_type(keyed_client):
    assert "unknown API key" in refusal(
        ask(keyed_client, Authorization="Bearer nobody"), 401, "authentication_error"
    )
    both = ask(keyed_client, Authorization="Bearer alice-key", **{"X-API-Key": "other"})
    refusal(both, 401, "authentication_error")
    assert both.headers["WWW-Authenticate"] == "Bearer"
    other = {"model": "no-such-model", "state": STATE, "questions": QUESTIONS}
    assert "default model" in refusal(ask(keyed_client, other), 403, "permission_error")
    assert "no-such-model" in refusal(
        ask(keyed_client, other, Authorization="Bearer alice-key"), 404, "not_found_error"
    )


def test_413_from_the_contract_and_from_the_body_limit(keyed_client):
    too_many = {"state": STATE, "questions": {f"q{i}": POSITIVE for i in range(65)}}
    assert "at most 64" in refusal(ask(keyed_client, too_many), 413, "request_too_large")
    huge = b'{"state": "' + b"z" * (9 * 1024 * 1024) + b'", "questions": {}}'
    response = keyed_client.post("/v1/systemone", content=huge, headers={"Content-Type": "application/json"})
    refusal(response, 413, "request_too_large")


def test_bad_encodings_unknown_routes_and_methods(keyed_client):
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    refusal(
        keyed_client.post("/v1/systemone", content=b"not zstd", headers=headers), 400, "invalid_request_error"
    )
    gzip = {**headers, "Content-Encoding": "gzip"}
    refusal(keyed_client.post("/v1/systemone", content=b"{}", headers=gzip), 415, "unsupported_media_type")
    refusal(keyed_client.get("/v1/nothing-here"), 404, "not_found_error")
    refusal(keyed_client.get("/v1/systemone"), 405, "method_not_allowed")
    refusal(keyed_client.get("/v1/shadow"), 404, "not_found_error")  # no --shadow challenger
    bomb = zstandard.ZstdCompressor().compress(b" " * (20 * 1024 * 1024))
    refusal(keyed_client.post("/v1/systemone", content=bomb, headers=headers), 413, "request_too_large")


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"]
)
def test_a_body_sent_as_anything_but_json_is_a_415_saying_what_to_send(keyed_client, content_type):
    body = json.dumps({"state": STATE, "questions": QUESTIONS})
    response = keyed_client.post("/v1/systemone", content=body, headers={"Content-Type": content_type})
    assert "application/json" in refusal(response, 415, "unsupported_media_type")


def test_a_body_sent_with_no_content_type_is_read_as_json(keyed_client):
    body = json.dumps({"state": STATE, "questions": QUESTIONS}).encode()
    request = keyed_client.build_request("POST", "/v1/systemone", content=body)  # raw bytes: no Content-Type
    assert "content-type" not in request.headers and keyed_client.send(request).status_code == 200


def _strict(text: str):
    """Parse as a strict client does (JSON.parse, orjson): NaN and Infinity are no JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the body"))


@pytest.mark.parametrize(
    "body",
    [b'{"state": NaN}', b'{"state": "ok", "questions": {"q": {"type": "bogus", "instructions": Infinity}}}'],
)
def test_a_422_quoting_a_non_finite_number_is_still_strict_json(keyed_client, body):
    response = keyed_client.post("/v1/systemone", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and _strict(response.text)["detail"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"state": "ok", "questions": {"q": {"type": "noul"}, "q": {"type": "choice", "criteria": ["a", "b"]}}}',
        b'{"state": "ok", "state": "other", "questions": {"q": {"type": "noul"}}}',
    ],
)
def test_a_key_given_twice_is_a_422_not_a_question_dropped_unsaid(keyed_client, body):
    # json.loads keeps the last of two equal keys: the first question would go unanswered, with a 200
    response = keyed_client.post("/v1/systemone", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body"] and "given twice" in detail["msg"]


def test_a_422_quotes_at_most_a_few_hundred_characters_of_the_input(keyed_client):
    state = "z" * 200_000  # a body with no questions: the missing field's error quotes the input
    response = ask(keyed_client, {"state": state})
    assert response.status_code == 422 and len(response.content) < 2_000
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "questions"] and "characters)" in detail["input"]


def test_422_keeps_the_fastapi_list_and_names_the_field(keyed_client):
    as_map = {"q": {**INTENSITY, "criteria": {"0": "none", "1": "mild", "2": "strong"}}}
    response = ask(keyed_client, {"state": STATE, "questions": as_map})
    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "questions", "q", "criteria"] and detail["type"] == "value_error"
    assert "list" in detail["msg"]
    one_option = {"q": {"type": "choice", "criteria": ["only"]}}
    [detail] = ask(keyed_client, {"state": STATE, "questions": one_option}).json()["detail"]
    assert detail["loc"] == ["body", "questions", "q", "criteria"] and "2 to 255 options" in detail["msg"]


@pytest.mark.parametrize(
    ("question", "field", "said"),
    [
        ({"type": "choice", "criteria": 5}, "criteria", "choice criteria: a non-empty object"),
        ({"type": "score", "criteria": "none, mild"}, "criteria", "score criteria: a list"),
        ({"type": "noul", "criteria": [True]}, "criteria", "noul criteria: null or"),
        (
            {"type": "choice", "instructions": 7, "criteria": ["a", "b"]},
            "instructions",
            "text, a JSON object or list",
        ),
    ],
)
def test_a_field_of_the_wrong_json_type_is_one_error_saying_what_the_question_type_takes(
    keyed_client, question, field, said
):
    # pydantic's check of a union gave one error per branch, each naming a Python type
    # ("dict[str,nullable[...]]")
    response = ask(keyed_client, {"state": STATE, "questions": {"q": question}})
    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "questions", "q", field] and said in detail["msg"]


def test_a_fault_in_the_model_is_a_500_with_the_same_shape(served_folder, monkeypatch):
    from pipeline.serving import server as serve

    def broken(model, requests):
        raise RuntimeError("the accelerator fell over")

    monkeypatch.setattr(serve, "_run_batch", broken)
    with TestClient(make_app(served_folder)) as client:
        ready(client)
        assert "RuntimeError" in refusal(ask(client), 500, "internal_error")


def test_require_key_refuses_every_keyless_request_with_401(strict_client):
    for model in (None, "default", "jev-latest", "no-such-model"):
        body = {"state": STATE, "questions": QUESTIONS} | ({"model": model} if model else {})
        assert "requires an API key" in refusal(ask(strict_client, body), 401, "authentication_error"), model
    refusal(strict_client.get("/v1/models"), 401, "authentication_error")
    assert ask(strict_client, Authorization="Bearer alice-key").status_code == 200
    assert ask(strict_client, **{"X-API-Key": "alice-key"}).status_code == 200
    assert strict_client.get("/healthz").status_code == 200  # probes need no key


def test_without_require_key_a_keyless_caller_keeps_the_default_model(keyed_client):
    assert ask(keyed_client).status_code == 200
    assert (
        ask(keyed_client, {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}).status_code == 200
    )


def test_require_key_without_keys_is_refused_before_serving(served_folder, monkeypatch, capsys):
    monkeypatch.delenv("DECISION_API_KEYS", raising=False)
    with pytest.raises(ValueError, match="--require-key"):
        make_app(served_folder, require_key=True)
    assert main(["serve", "--model", str(served_folder), "--require-key"]) == 2
    assert "--require-key" in capsys.readouterr().err


def test_the_require_key_flag_reaches_the_server_config(served_folder, monkeypatch):
    from pipeline.serving import server as serve

    started = []
    monkeypatch.setattr(serve, "run_server", lambda options, *args: started.append(options))
    monkeypatch.setenv("DECISION_API_KEYS", f"alice={hash_key('alice-key')}")
    assert main(["serve", "--model", str(served_folder), "--require-key"]) == 0
    assert main(["serve", "--model", str(served_folder)]) == 0
    assert [options.config.require_key for options in started] == [True, False]
    assert serve.ServeOptions.from_env(started[0].to_env()).config.require_key  # what each worker reads


def test_serve_logs_where_the_project_params_say_review_and_harvest_read(
    served_folder, tmp_path, monkeypatch
):
    # --inference-log defaulted to ./inference whatever flywheel.inference said: review and harvest then read
    # a log the server never wrote.
    from pipeline.serving import server as serve

    started = []
    monkeypatch.setattr(serve, "run_server", lambda options, *args: started.append(options))
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--model", str(served_folder)]) == 0  # no params.yaml here
    (tmp_path / "params.yaml").write_text("flywheel:\n  inference: logs/served\n")
    assert main(["serve", "--model", str(served_folder)]) == 0
    assert main(["serve", "--model", str(served_folder), "--inference-log", "elsewhere"]) == 0
    assert main(["serve", "--model", str(served_folder), "--no-inference-log"]) == 0
    wheres = [options.inference_log.where for options in started]
    assert wheres == ["inference", "logs/served", "elsewhere", None]
    (tmp_path / "params.yaml").write_text("flywheel:\n  inference_log: typo\n")
    assert main(["serve", "--model", str(served_folder)]) == 2 and len(started) == 4
