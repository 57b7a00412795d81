"""Certified automation as served (docs/serving.md, Automation): every answer says `x_automate` and, when false,
why (`below_threshold`, `novel_state`, `not_certified`); `/v1/models` lists each question's certificate and the
novelty gate; states unlike the training states (planted out of scope) are never automated."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from benchmarks.bench_novelty import planted_states
from pipeline.data.contract import state_text
from pipeline.families import load_decision_model
from pipeline.families.exporting import (
    CERTIFICATES,
    MANIFEST,
    NOVELTY,
    read_manifest,
    with_carried,
    write_files,
)
from pipeline.scoring.certify import Certificate, certificates_json
from pipeline.scoring.novelty import fit_novelty, novelty_bytes
from tests.api.conftest import QUESTIONS, make_app, wait_ready
from tests.tiny import synthetic_records

HELDOUT = {
    "decisions": 400,
    "automated": 300,
    "errors": 9,
    "coverage": 0.75,
    "coverage_low": 0.70,
    "coverage_high": 0.79,
    "error": 0.03,
    "error_low": 0.014,
    "error_high": 0.056,
    "target_error": 0.05,
}


def certificate(
    question_id: str, qtype: str, options: tuple[str, ...], threshold: float | None
) -> Certificate:
    return Certificate(
        question_id=question_id,
        qtype=qtype,
        target_error=0.05,
        delta=0.05,
        threshold=threshold,
        fit_decisions=500,
        automated=0 if threshold is None else 350,
        options=options,
        heldout=HELDOUT,
        reason="too few decisions to certify: 12, at least 59 needed" if threshold is None else None,
    )


# tone automates at 0.5 and up; positive (noul) would need 0.999; intensity is not certified.
CERTIFICATES_BY_QUESTION = {
    "tone": certificate("tone", "choice", ("negative", "neutral", "positive"), 0.5),
    "positive": certificate("positive", "noul", ("false", "true"), 0.999),
    "intensity": certificate("intensity", "score", ("0", "1", "2"), None),
}


@pytest.fixture(scope="module")
def states() -> dict[str, list]:
    """The tiny tests' synthetic states (reviews of a few dozen words), split as the calibrate stage would:
    a bank, the threshold's validation states, and held-out states served in scope."""
    distinct = list({state_text(r.state): r.state for r in synthetic_records(700, seed=5)}.values())
    return {"bank": distinct[:350], "validation": distinct[350:550], "heldout": distinct[550:650]}


@pytest.fixture(scope="module")
def certified_folder(served_folder, states, tmp_path_factory) -> Path:
    """The tiny model as an export carrying certificates and a novelty gate fitted on its own state vectors."""
    folder = tmp_path_factory.mktemp("certified") / "export"
    shutil.copytree(served_folder, folder)
    model = load_decision_model(folder)
    gate = fit_novelty(
        model.state_vectors(states["bank"]), model.state_vectors(states["validation"]), quantile=0.99
    )
    manifest, files = read_manifest(folder), {}
    manifest, files = with_carried(
        manifest, files, CERTIFICATES, certificates_json(CERTIFICATES_BY_QUESTION).encode()
    )
    manifest, files = with_carried(manifest, files, NOVELTY, novelty_bytes(gate))
    write_files(folder, files)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def certified(certified_folder):
    with TestClient(make_app(certified_folder)) as client:
        yield wait_ready(client)


def ask(client, state, questions=QUESTIONS) -> dict:
    response = client.post("/v1/systemone", json={"state": state, "questions": questions})
    assert response.status_code == 200, response.text
    return response.json()["answers"]


def test_a_certified_question_automates_its_confident_answers_in_scope(certified, states):
    automated = 0
    for state in states["heldout"][:20]:
        tone = ask(certified, state)["tone"]
        if tone["x_top_probability"] >= 0.5:
            automated += tone["x_automate"]
        else:
            assert tone == tone | {"x_automate": False, "x_automate_reason": "below_threshold"}
    assert automated >= 15  # a few held-out states may be flagged novel (1% of validation states are)


def test_an_answer_below_its_threshold_and_an_uncertified_question_say_why(certified, states):
    answers = ask(certified, states["heldout"][0])
    assert answers["positive"]["x_automate"] is False
    assert answers["positive"]["x_automate_reason"] == "below_threshold"  # the tiny model's noul is unsure
    assert answers["intensity"] == answers["intensity"] | {
        "x_automate": False,
        "x_automate_reason": "not_certified",
    }
    assert "x_automate_reason" not in answers["tone"] or answers["tone"]["x_automate"] is False


def test_a_question_asked_with_other_options_than_certified_is_not_certified(certified, states):
    other = {"tone": {**QUESTIONS["tone"], "criteria": {"negative": None, "positive": None}}}
    assert ask(certified, states["heldout"][0], other)["tone"]["x_automate_reason"] == "not_certified"


def test_a_model_without_certificates_automates_nothing(served_folder, states):
    with TestClient(make_app(served_folder)) as client:
        answers = ask(wait_ready(client), states["heldout"][0])
        listed = client.get("/v1/models").json()["models"][0]
    assert {a["x_automate_reason"] for a in answers.values()} == {"not_certified"}
    assert not any(a["x_automate"] for a in answers.values())
    assert listed["certificates"] == {} and listed["novelty"] is None


@pytest.mark.parametrize("state", ["", "   ", "\n\t ", "?!", {}])
def test_a_state_that_cannot_be_embedded_is_answered_but_never_automated(certified, state):
    tone = ask(certified, state)["tone"]
    assert tone["x_automate"] is False and tone["x_automate_reason"] == "novel_state"
    assert sum(tone["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)  # still answered


def test_planted_out_of_scope_states_are_flagged_and_in_scope_ones_mostly_not(certified_folder, states):
    model = load_decision_model(certified_folder)
    gate = model.automation.gate
    in_scope = gate.novel(model.state_vectors(states["heldout"])).mean()
    assert in_scope <= 0.05, in_scope
    planted = planted_states()
    shares = {
        kind: gate.novel(model.state_vectors(kind_states)).mean() for kind, kind_states in planted.items()
    }
    every = np.concatenate([gate.novel(model.state_vectors(s)) for s in planted.values()])
    # A random tiny encoder, whose few dozen words spell other text letter by letter, still tells most of them
    # apart; benchmarks/bench_novelty.py measures the shares on the embedded MiniLM encoder.
    assert every.mean() >= 0.7, shares
    assert min(shares.values()) >= 0.3, shares  # no kind slips through whole


def test_a_planted_state_is_served_with_novel_state(certified):
    for state in planted_states()["JSON records"][:2] + planted_states()["random characters"][:2]:
        tone = ask(certified, state)["tone"]
        assert tone["x_automate"] is False and tone["x_automate_reason"] == "novel_state", state


def test_the_models_listing_shows_each_certificate_and_the_gate(certified):
    listed = certified.get("/v1/models").json()["models"]
    serving = next(m for m in listed if m["description"] == "the serving model")
    tone = serving["certificates"]["tone"]
    assert (tone["epsilon"], tone["delta"], tone["threshold"], tone["certified"]) == (0.05, 0.05, 0.5, True)
    assert tone["options"] == ["negative", "neutral", "positive"] and tone["type"] == "choice"
    assert tone["heldout"]["coverage"] == 0.75 and tone["heldout"]["error"] == 0.03
    assert tone["heldout"]["error_high"] == 0.056
    intensity = serving["certificates"]["intensity"]
    assert (
        intensity["certified"] is False
        and intensity["threshold"] is None
        and "too few" in intensity["reason"]
    )
    assert serving["novelty"]["quantile"] == 0.99 and serving["novelty"]["bank"] == 350
    assert all(m["certificates"] == serving["certificates"] for m in listed if m["name"] in ("default",))


def test_the_offline_path_marks_answers_as_the_server_does(certified, certified_folder, states):
    from pipeline.serving.offline import answer_rows, row_request

    rows = [row_request(0, "a", states["heldout"][1], QUESTIONS), row_request(1, "b", "  ", QUESTIONS)]
    scored = answer_rows(load_decision_model(certified_folder), rows, batch_size=8)
    assert scored[0].answers == ask(certified, states["heldout"][1])
    assert scored[1].answers["tone"]["x_automate_reason"] == "novel_state"


def test_the_joint_family_hands_back_the_state_vectors_its_answer_computed(tiny_base, states):
    from pipeline.data.answers import parse_request
    from pipeline.families.base import DecisionModel
    from tests.tiny import load_joint_on

    model = DecisionModel(*load_joint_on(tiny_base))
    requests = [parse_request(state, QUESTIONS) for state in states["heldout"][:6]]
    served = np.stack([a.state_vector for a in model.family.answer(model.loaded, requests)])
    # The gate reads a served state as the bank's states were read, and needs no pass of its own.
    np.testing.assert_allclose(served, model.state_vectors(states["heldout"][:6]), atol=1e-5)
