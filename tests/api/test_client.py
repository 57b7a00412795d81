"""The real client, typesafe-sdk (with zstd), against a live server: all three question types parse."""

import pytest

from tests.api.conftest import live_server, make_app

typesafe_sdk = pytest.importorskip("typesafe_sdk")


@pytest.fixture(scope="module")
def server_url(served_folder):
    with live_server(make_app(served_folder)) as url:
        yield url


def test_the_typesafe_client_parses_every_answer_type(server_url):
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    with TypeSafeClient(api_key="any-key", base_url=server_url) as client:
        result = client.system_one(
            state="The order came late and the box was broken.",
            questions={
                "tone": Choice(
                    instructions="What is the tone?", criteria={"negative": None, "positive": "happy"}
                ),
                "intensity": Score(instructions="How intense?", criteria=["none", "mild", "strong"]),
                "late": Noul(instructions="The order was late."),
            },
        )
    tone, intensity = result.choices["tone"], result.scores["intensity"]
    assert tone.choice in {"negative", "positive"}
    assert set(intensity.probabilities) == {0, 1, 2}
    assert intensity.legend[2] == "strong"
    assert 0.0 <= result.nouls["late"].noul <= 1.0
    assert result.usage.input_tokens > 0
    # The SDK reads the Jev confidence; the x_ extras (and no confidence on noul) pass its strict models.
    for answer in (tone, intensity):
        p = max(answer.probabilities.values())
        n = len(answer.probabilities)
        assert answer.confidence == pytest.approx((p - 1 / n) / (1 - 1 / n), abs=2e-4)
    # The decision id (body and header) is beside the answers; the SDK's strict models pass it over.
    assert len(result.raw_http_response.json()["x_decision_id"]) == 32
    assert (
        result.raw_http_response.headers["x-decision-id"] == result.raw_http_response.json()["x_decision_id"]
    )
    raw = result.raw_http_response.json()["answers"]
    assert raw["tone"]["x_top_probability"] == max(raw["tone"]["probabilities"].values())
    assert set(raw["late"]) == {"type", "noul", "x_confidence", "x_automate", "x_automate_reason"}


def test_large_bodies_arrive_zstd_compressed_and_are_answered(server_url):
    from typesafe_sdk import Noul, TypeSafeClient

    state = {"turns": [{"role": "user", "text": "the order was late " * 20} for _ in range(8)]}
    with TypeSafeClient(api_key="any-key", base_url=server_url, compression="zstd") as client:
        result = client.system_one(state=state, questions={"late": Noul(instructions="The order was late.")})
        models = client.models.list()
    assert 0.0 <= result.nouls["late"].noul <= 1.0
    assert {"default", "jev-latest"} <= {m.name for m in models.models}


def test_the_client_raises_our_refusals_with_their_message(server_url):
    from typesafe_sdk import Noul, TypeSafeClient, TypeSafeNotFoundError, TypeSafeUnprocessableEntityError

    with TypeSafeClient(api_key="any-key", base_url=server_url) as client:
        with pytest.raises(TypeSafeNotFoundError) as missing:
            client.system_one(state="s", questions={"q": Noul(instructions="?")}, model="no-such-model")
        body = missing.value.body["detail"]
        assert body["error_type"] == "not_found_error" and "no-such-model" in str(missing.value)
        levels_as_a_map = {"type": "score", "criteria": {"0": "low", "1": "high"}}
        with pytest.raises(TypeSafeUnprocessableEntityError) as refused:
            client.system_one(state="s", questions={"q": levels_as_a_map})
    assert "q.criteria" in str(refused.value)
