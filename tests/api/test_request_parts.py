"""A request with many question characters is answered in parts (`request_parts`): the same answers as in one
pass, and a request that comes meanwhile runs between the parts instead of waiting for all of them."""

import threading
import time

import pytest
from fastapi.testclient import TestClient

from pipeline.data.answers import parse_request
from tests.api.conftest import QUESTIONS, make_app, wait_ready

HEAVY = {
    f"q{i}": {
        "type": "choice",
        "instructions": f"Which one, {i}?",
        "criteria": [f"option {i}.{k} " + "word " * 8 for k in range(40)],
    }
    for i in range(6)
}  # fmt: skip  (each question about 2,000 characters)
STATE = "a long day at the office"


@pytest.fixture()
def client(served_folder):
    with TestClient(make_app(served_folder, part_chars=5_000)) as client:
        yield wait_ready(client)


def test_the_parts_answer_what_one_pass_over_the_whole_request_answers(client):
    batches = client.app.state.batcher.batches
    response = client.post("/v1/systemone", json={"state": STATE, "questions": HEAVY})
    assert response.status_code == 200
    answers = response.json()["answers"]
    assert list(answers) == list(HEAVY)  # in the request's order
    assert client.app.state.batcher.batches - batches == 3  # two questions of ~2,000 characters a part
    whole = client.app.state.catalog.serving.model.answer([parse_request(STATE, HEAVY)])[0].answers
    for qid, answer in answers.items():
        assert answer["probabilities"] == pytest.approx(whole[qid]["probabilities"], abs=2e-4)  # 4 decimals


def test_a_request_sent_meanwhile_runs_between_the_parts(client):
    batcher = client.app.state.batcher
    run_batch, order = batcher._run_batch, []

    def recorded(key, requests):
        order.extend(
            "heavy" if set(r.questions) <= set(HEAVY) else "light" for r in requests
        )  # one batch may hold both
        time.sleep(0.3)  # each part takes a while, as a big one does on a busy machine
        return run_batch(key, requests)

    batcher._run_batch = recorded
    heavy = threading.Thread(
        target=lambda: client.post("/v1/systemone", json={"state": STATE, "questions": HEAVY})
    )
    heavy.start()
    while not order:  # the first part is running
        time.sleep(0.01)
    light = client.post("/v1/systemone", json={"state": STATE, "questions": QUESTIONS})
    heavy.join()
    assert light.status_code == 200
    assert order.count("heavy") == 3 and order.index("light") < len(order) - 1, order  # before the last part
