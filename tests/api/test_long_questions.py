"""The Decision API on the laya family with questions at the contract's edges: a choice among 200 options
(read in several sequences, one softmax) and a score of one level."""

import numpy as np
import pytest
from fastapi.testclient import TestClient

from pipeline.data.answers import parse_request
from pipeline.families.laya.predict import predict, request_items
from pipeline.families.laya_layout import load_model
from tests.api.conftest import TONE, make_app
from tests.api.conftest import wait_ready as ready

STATE = "the order was late and the box was broken"
MANY = {
    "type": "choice",
    "instructions": "which product is it about",
    "criteria": {f"product-{i}": f"product number {i}" for i in range(200)},
}
ONE_LEVEL = {"type": "score", "instructions": "how late was it", "criteria": ["late"]}


@pytest.fixture(scope="module")
def client(served_folder):
    with TestClient(make_app(served_folder)) as client:
        yield ready(client)


def test_a_200_option_question_is_answered_with_one_distribution_and_every_token_counted(
    client, served_folder
):
    questions = {"many": MANY, "tone": TONE}
    response = client.post("/v1/systemone", json={"state": STATE, "questions": questions})
    assert response.status_code == 200, response.text
    body = response.json()
    answer = body["answers"]["many"]
    assert list(answer["probabilities"]) == list(MANY["criteria"])
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=200 * 5e-5)
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)

    loaded = load_model(served_folder)
    expected = predict(loaded, STATE, questions)["many"]
    np.testing.assert_allclose(list(answer["probabilities"].values()), expected, atol=1e-4)
    items = request_items(loaded, STATE, list(parse_request(STATE, questions).questions.values()))
    assert len(items[0].parts) > 1
    assert body["usage"]["input_tokens"] == sum(len(part) for item in items for part in item.parts)


def test_a_one_level_score_is_answered_with_certainty(client):
    response = client.post("/v1/systemone", json={"state": STATE, "questions": {"late": ONE_LEVEL}})
    assert response.status_code == 200, response.text
    answer = response.json()["answers"]["late"]
    assert (
        answer["probabilities"] == {"0": 1.0} and answer["score"] == 0.0 and answer["legend"] == {"0": "late"}
    )
