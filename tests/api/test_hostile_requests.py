"""Hostile requests against a live server: each is answered (422 naming the field, or 200), never a 5xx or a
reset connection, its batch-mates are answered normally, and the server keeps serving on the same
connection."""

import json
import socket
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import QUESTIONS, live_server, make_app

pytestmark = pytest.mark.slow


def _nested(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


# Raw bodies (bytes), so that what no JSON encoder here would write (lone surrogates) reaches the server as
# sent.
HOSTILE = {
    "unpaired surrogate in the state": b'{"state": "bad \\ud800 text", "questions": %s}',
    "unpaired low surrogate in an instruction": (
        b'{"state": "ok", "questions": {"t": {"type": "noul", "instructions": "x \\udc00 y"}}}'
    ),
    "NUL and control characters": b'{"state": "a\\u0000b\\u0001\\u001f\\u007f c", "questions": %s}',
    "text that tokenizes to nothing": b'{"state": "\\u200b\\u200b \\u0301", "questions": %s}',
    "an empty state": b'{"state": "", "questions": %s}',
    "one 200,000-character word": b'{"state": "%s", "questions": %%s}' % (b"x" * 200_000),
    "deeply nested JSON state": b'{"state": %s, "questions": %%s}' % json.dumps(_nested(300)).encode(),
    "a number as the state": b'{"state": 12345678901234567890123, "questions": %s}',
    "a boolean as the state": b'{"state": true, "questions": %s}',
    "a number as instructions": b'{"state": "ok", "questions": {"t": {"type": "noul", "instructions": 7}}}',
    "a boolean as an option": (
        b'{"state": "ok", "questions": {"t": {"type": "choice", "criteria": {"a": true, "b": null}}}}'
    ),
}


def _body(template: bytes) -> bytes:
    return template.replace(b"%s", json.dumps(QUESTIONS).encode()) if b"%s" in template else template


@pytest.fixture(scope="module", params=["laya", "joint"])
def server(request, served_folder, tmp_path_factory):
    """A live server on the tiny model of each family (the joint one: a fresh head on the same encoder)."""
    folder = served_folder
    if request.param == "joint":
        from pipeline.families.joint.layout import export_joint
        from pipeline.scoring.calibrators import Calibrator
        from tests.tiny import load_joint_on

        folder = tmp_path_factory.mktemp("joint") / "export"
        export_joint(load_joint_on(served_folder)[1], folder, Calibrator(), {"source_digest": "hostile"})
    with live_server(make_app(folder)) as url:
        yield url


def _post(http: httpx.Client, body: bytes) -> httpx.Response:
    return http.post("/v1/systemone", content=body, headers={"Content-Type": "application/json"})


def _assert_answered(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code == 422:
        assert response.json()["detail"], response.text  # names what is wrong


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_request_gets_an_answer_and_the_connection_keeps_serving(server, name):
    with httpx.Client(base_url=server, timeout=60) as http:
        _assert_answered(_post(http, _body(HOSTILE[name])))
        after = _post(http, json.dumps({"state": "a fine day", "questions": QUESTIONS}).encode())
        assert after.status_code == 200 and set(after.json()["answers"]) == set(QUESTIONS)


def test_hostile_requests_do_not_fail_their_batch_mates(server):
    good = json.dumps({"state": "a fine day", "questions": QUESTIONS}).encode()
    bodies = [good if i % 2 else _body(template) for i, template in enumerate(list(HOSTILE.values()) * 2)]
    results: list[httpx.Response | BaseException] = [None] * len(bodies)  # type: ignore[list-item]

    def send(i: int) -> None:
        try:
            with httpx.Client(base_url=server, timeout=120) as http:
                results[i] = _post(http, bodies[i])
        except BaseException as error:  # a reset connection is what this test looks for
            results[i] = error

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for body, result in zip(bodies, results):
        assert isinstance(result, httpx.Response), result
        if body is good:
            assert result.status_code == 200, result.text[:300]
        else:
            _assert_answered(result)


# Text that includes what JSON can carry and a tokenizer may refuse: surrogates (category Cs) and control
# characters.
HOSTILE_TEXT = st.text(
    st.characters(codec=None, categories=["Cs", "Cc", "Cf", "Mn", "Zs", "L", "N", "P"]), max_size=60
)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
    max_leaves=8,
)
QUESTION = st.fixed_dictionaries(
    {"type": st.sampled_from(["choice", "score", "noul"])},
    optional={
        "instructions": JSON_VALUE,
        "criteria": JSON_VALUE
        | st.lists(HOSTILE_TEXT, max_size=5)
        | st.dictionaries(HOSTILE_TEXT, st.none() | HOSTILE_TEXT, max_size=5),
    },
)
REQUEST = st.fixed_dictionaries(
    {"state": JSON_VALUE, "questions": st.dictionaries(HOSTILE_TEXT, QUESTION, min_size=1, max_size=4)}
)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=REQUEST)
def test_fuzzed_requests_never_get_a_5xx_or_a_reset(server, request):
    # ensure_ascii writes every surrogate as a \u escape, so the server parses exactly the text generated
    body = json.dumps(request, ensure_ascii=True).encode()
    with httpx.Client(base_url=server, timeout=60) as http:
        _assert_answered(_post(http, body))


def test_a_body_declared_over_the_limit_is_refused_at_once_not_waited_for(server):
    # The headers promise 100 MB and no byte follows: a server that reads before it checks would wait forever.
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n"
        )
        answer = b""  # recv times out (a failure) if no answer comes
        while b"request_too_large" not in answer and (chunk := connection.recv(4096)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
