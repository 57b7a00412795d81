"""`decision smoke`: held-out decisions over HTTP agree with in-process predictions, and a mismatch fails."""

import json

import pytest

from pipeline.cli.main import main
from pipeline.data.split import TrainSource
from pipeline.stages.smoke import heldout_requests, smoke_test
from tests.api.conftest import live_server, make_app
from tests.tiny import write_tiny_base


def _heldout(data):
    """The held-out records of `data` under params.yaml's default split (what a run's split holds)."""
    return TrainSource(data).validated().split.heldout


@pytest.fixture(scope="module")
def server_url(served_folder):
    with live_server(make_app(served_folder)) as url:
        yield url


def test_smoke_passes_against_the_folder_it_serves(server_url, served_folder, synthetic_train_file, capsys):
    code = main(
        [
            "smoke",
            "--url",
            server_url,
            "--data",
            str(synthetic_train_file),
            "--n",
            "20",
            "--model-dir",
            str(served_folder),
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["passed"]
    assert result["decisions"] >= 20 and result["agreement"] == 1.0
    assert result["max_probability_diff"] < 1e-4  # only the 4-decimal rounding of the wire format
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p95"]


def test_smoke_fails_when_the_server_answers_for_another_model(server_url, synthetic_train_file, tmp_path):
    other = write_tiny_base(tmp_path / "other", seed=5)
    bodies = heldout_requests(_heldout(synthetic_train_file), 40)
    result = smoke_test(server_url, bodies, other)
    assert not result.passed and result.max_probability_diff > 1e-3
    code = main(
        [
            "smoke",
            "--url",
            server_url,
            "--data",
            str(synthetic_train_file),
            "--n",
            "20",
            "--model-dir",
            str(other),
        ]
    )
    assert code == 1


def test_smoke_fails_clearly_when_the_server_is_unreachable(synthetic_train_file, served_folder):
    result = smoke_test(
        "http://127.0.0.1:9", heldout_requests(_heldout(synthetic_train_file), 8), served_folder
    )
    assert not result.passed and any("ConnectError" in f for f in result.failures)


def test_a_model_folder_or_expected_answers_that_cannot_be_read_is_refused_before_any_request(
    synthetic_train_file, tmp_path, capsys, monkeypatch
):
    import pipeline.stages.smoke as smoke

    monkeypatch.setattr(smoke, "_send_all", lambda *args: pytest.fail("a request was sent"))
    not_npz = tmp_path / "expected_answers.npz"
    not_npz.write_text("not arrays")
    refusals = {
        ("--model-dir", str(tmp_path / "nope")): "--model-dir ",
        ("--model-dir", str(tmp_path)): "not a model folder",
        ("--expected", str(tmp_path / "missing.npz")): "no such file",
        ("--expected", str(not_npz)): "not a run's expected answers",
    }
    for flags, words in refusals.items():
        code = main(["smoke", "--url", "http://127.0.0.1:9", "--data", str(synthetic_train_file), *flags])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and words in lines[0] and flags[1] in lines[0], lines


def test_held_out_questions_are_asked_with_their_options_in_the_order_the_model_was_trained_on():
    # A record's questions_json is canonical (keys sorted): asked from it, {shipping, billing, product} came
    # back as billing, product, shipping, and the served probabilities, compared by position with the trained
    # model's, failed every run whose options were a map out of alphabetical order.
    from pipeline.data.validate import validate_rows

    team = {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"shipping": "parcels", "billing": None, "product": "how it works"},
    }
    urgency = {"type": "score", "instructions": "How urgent?", "criteria": ["later", None, "now"]}
    row = {
        "state": "charged twice",
        "questions": {"urgency": urgency, "team": team, "spare": {"type": "noul"}},
        "gold": {"team": "billing", "urgency": 2},
    }
    [record] = validate_rows([row]).records
    [body] = heldout_requests([record], 10)
    assert body["questions"] == {"urgency": urgency, "team": team}
    assert list(body["questions"]["team"]["criteria"]) == ["shipping", "billing", "product"]
    assert list(record.request_questions()) == [
        "urgency",
        "team",
        "spare",
    ]  # what the monitor's reference asks
