"""Drift and label-free monitoring (`pipeline.flywheel.drift`): per-decision frames, Evidently's verdict on a
shifted window and on one drawn like the reference, expected against measured accuracy, and the gauges read
back."""

import datetime as dt
import json
import math
import random

import numpy as np
import orjson
import pandas as pd
import pytest

from pipeline.data.answers import shape_answers
from pipeline.data.contract import parse_question
from pipeline.flywheel.drift import (
    DecisionRow,
    drift_markdown,
    drift_report,
    features_frame,
    question_columns,
    served_rows,
    window_accuracy,
    write_latest,
)
from pipeline.flywheel.gauges import GAUGES, read_gauges
from pipeline.flywheel.table import ParquetStore, new_decision_id

QUESTIONS = {
    "tone": {"type": "choice", "instructions": "Tone?", "criteria": ["negative", "neutral", "positive"]},
    "late": {"type": "noul", "instructions": "The delivery was late."},
}
PARSED = {qid: parse_question(qid, spec).question for qid, spec in QUESTIONS.items()}
WORDS = "the parcel came late and the support was kind but slow box broken great".split()
T0 = dt.datetime(2026, 12, 3, 10, tzinfo=dt.UTC)


def answered(state, tone, p_late: float, questions=QUESTIONS, decision_id=None) -> DecisionRow:
    """A decision as the API answers it: `tone` the choice probabilities, `p_late` P(true)."""
    probabilities = {"tone": np.asarray(tone), "late": np.asarray([1 - p_late, p_late])}
    asked = {qid: PARSED[qid] for qid in questions}
    return DecisionRow(decision_id, state, questions, shape_answers(asked, probabilities))


def reference_like(n: int, seed: int) -> list[DecisionRow]:
    """Short text states; every tone about as likely, the model unsure to sure."""
    rng, gen = random.Random(seed), np.random.default_rng(seed)
    return [
        answered(" ".join(rng.choices(WORDS, k=rng.randint(5, 20))), gen.dirichlet([2, 2, 2]), rng.random())
        for _ in range(n)
    ]


def shifted(n: int, seed: int) -> list[DecisionRow]:
    """Long JSON-object states, always `positive` and sure of it, never late."""
    rng = random.Random(seed)
    states = [{"order": rng.randint(1, 10**6), "notes": " ".join(rng.choices(WORDS, k=60))} for _ in range(n)]
    return [answered(state, [0.02, 0.03, 0.95], 0.02) for state in states]


def test_a_frame_has_a_row_per_decision_with_state_mix_choice_and_top_probability():
    rows = [
        answered("late again", [0.1, 0.2, 0.7], 0.9),
        answered({"id": 7}, [0.5, 0.3, 0.2], 0.3, questions={"tone": QUESTIONS["tone"]}),
        answered(["hi", "there"], [0.2, 0.6, 0.2], 0.5),
    ]
    frame = features_frame(rows, question_columns(rows))
    assert list(frame.columns) == [
        "state_chars",
        "state_kind",
        "question_mix",
        "chosen.tone",
        "confidence.tone",
        "chosen.late",
        "confidence.late",
    ]
    assert frame["state_chars"].tolist() == [10, len('{"id":7}'), len('["hi","there"]')]
    assert frame["state_kind"].tolist() == ["text", "object", "list"]
    assert frame["question_mix"].tolist() == ["late:noul,tone:choice", "tone:choice", "late:noul,tone:choice"]
    assert frame["chosen.tone"].tolist() == ["positive", "negative", "neutral"]
    assert frame["confidence.tone"].tolist() == [0.7, 0.5, 0.6]
    # The second decision did not ask `late`; a noul at exactly 0.5 picks false, as argmax does.
    assert frame["chosen.late"][0] == "true" and pd.isna(frame["chosen.late"][1])
    assert frame["chosen.late"][2] == "false"
    assert math.isnan(frame["confidence.late"][1]) and frame["confidence.late"][0] == 0.9


def test_question_columns_are_the_most_asked_ids_up_to_the_limit():
    rows = [answered("a", [1, 0, 0], 0.1)] * 2 + [
        answered("b", [1, 0, 0], 0.1, questions={"tone": QUESTIONS["tone"]})
    ]
    assert question_columns(rows) == ["tone", "late"]
    assert question_columns(rows, limit=1) == ["tone"]


def test_served_rows_read_the_inference_tables_json_columns(tmp_path):
    store = ParquetStore(tmp_path)
    row = answered({"order": 12, "text": "late"}, [0.1, 0.1, 0.8], 0.7, decision_id=new_decision_id())
    store.append(
        "decisions",
        [
            {
                "decision_id": row.decision_id,
                "time": T0,
                "model": "decision-model/3",
                "model_version": "3",
                "owner": None,
                "state": orjson.dumps(row.state).decode(),
                "questions": orjson.dumps(row.questions).decode(),
                "answers": orjson.dumps(row.answers).decode(),
                "latency_ms": 12.0,
            }
        ],
    )
    [read] = served_rows(store.decisions())
    assert read == row
    assert features_frame([read], ["tone"])["state_kind"].tolist() == ["object"]


@pytest.fixture(scope="module")
def reference():
    rows = reference_like(400, seed=1)
    return features_frame(rows, question_columns(rows))


def test_a_shifted_window_is_drift_and_its_html_report_is_written(reference, tmp_path):
    window = features_frame(shifted(150, seed=2), ["tone", "late"])
    result = drift_report(window, reference, drift_share=0.5, html=tmp_path / "drift.html")
    assert result.breached and result.share >= 0.5
    assert {"state_chars", "state_kind", "chosen.tone", "confidence.tone", "chosen.late"} <= set(
        result.drifted
    )
    assert "question_mix" not in result.drifted  # the same two questions on both sides
    assert (result.window_decisions, result.reference_decisions) == (150, 400)
    assert result.share == pytest.approx(len(result.drifted) / len(result.columns))
    assert (tmp_path / "drift.html").stat().st_size > 10_000 and result.html == str(tmp_path / "drift.html")


def test_a_window_drawn_like_the_reference_is_not_drift(reference):
    window = features_frame(reference_like(150, seed=5), ["tone", "late"])
    result = drift_report(window, reference, drift_share=0.5)
    assert not result.breached and result.share < 0.5 and len(result.drifted) <= 1
    assert len(result.columns) == 7 and result.not_compared == () and result.html is None
    # Evidently's p-value tests on a few hundred rows: a high score is agreement.
    assert all(c.score > 0.05 for c in result.columns if not c.drifted)


def test_a_question_the_window_never_asked_is_not_compared_but_the_mix_drifts(reference):
    only_tone = {"tone": QUESTIONS["tone"]}
    rows = [
        answered(r.state, list(r.answers["tone"]["probabilities"].values()), 0.5, questions=only_tone)
        for r in reference_like(150, seed=6)
    ]
    result = drift_report(features_frame(rows, ["tone", "late"]), reference, drift_share=0.9)
    assert result.not_compared == ("chosen.late", "confidence.late")
    assert "question_mix" in result.drifted and len(result.columns) == 5 and not result.breached


def test_expected_and_measured_accuracy_per_question_on_a_labelled_set(tmp_path):
    rows = [
        answered("a", [0.8, 0.1, 0.1], 0.9, decision_id="d1"),
        answered("b", [0.2, 0.6, 0.2], 0.3, decision_id="d2"),
        answered("c", [0.1, 0.2, 0.7], 0.6, decision_id="d3"),
        answered("d", [0.5, 0.4, 0.1], 0.2, decision_id="d4"),
    ]
    store = ParquetStore(tmp_path)
    gold = [
        ("d1", "tone", "negative"),
        ("d2", "tone", "positive"),  # right, wrong
        ("d3", "tone", {"label": "positive", "probabilities": [0.1, 0.1, 0.8]}),  # right
        ("d4", "tone", "furious"),  # not an option: not counted
        ("d1", "late", True),
        ("d2", "late", "true"),  # right (0.9 > 0.5), wrong (0.3 picks false)
        ("elsewhere", "tone", "neutral"),
    ]
    store.append(
        "feedback",
        [
            {"decision_id": d, "question_id": q, "gold": json.dumps(g), "labelled_by": "import", "time": T0}
            for d, q, g in gold
        ],
    )
    tone, late = window_accuracy(rows, store.feedback())[::-1]  # sorted by question id: late, tone
    assert (tone.question, tone.decisions, tone.labelled) == ("tone", 4, 3)
    assert tone.expected == pytest.approx((0.8 + 0.6 + 0.7 + 0.5) / 4)
    assert tone.expected_labelled == pytest.approx((0.8 + 0.6 + 0.7) / 3, abs=1e-4)
    assert tone.measured == pytest.approx(2 / 3, abs=1e-4)  # figures are rounded to 4 decimals
    assert (late.decisions, late.labelled, late.measured) == (4, 2, 0.5)
    assert late.expected == pytest.approx((0.9 + 0.7 + 0.6 + 0.8) / 4)


def test_no_feedback_leaves_measured_accuracy_empty(tmp_path):
    for question in window_accuracy(reference_like(5, seed=3), ParquetStore(tmp_path).feedback()):
        assert (question.labelled, question.measured, question.expected_labelled) == (0, None, None)
        assert question.decisions == 5 and 0 < question.expected <= 1


def test_the_gauges_read_back_what_was_written_with_the_reports_age(reference, tmp_path):
    assert read_gauges(tmp_path) == {}
    rows = shifted(120, seed=4)
    feedback = ParquetStore(tmp_path / "none").feedback()
    result = drift_report(
        features_frame(rows, ["tone", "late"]), reference, 0.5, accuracy=window_accuracy(rows, feedback)
    )
    written = write_latest(tmp_path, result, "decision-model/3", T0 - dt.timedelta(hours=24), T0, now=T0)
    assert written == tmp_path / "monitor" / "latest.json"
    assert [p.name for p in written.parent.iterdir()] == ["latest.json"]  # the staged file was renamed
    gauges = read_gauges(tmp_path, now=T0 + dt.timedelta(seconds=90))
    assert set(gauges) == set(GAUGES) - {"measured_accuracy"}  # nothing labelled yet
    assert gauges["report_age_seconds"] == 90.0 and gauges["window_decisions"] == 120.0
    assert gauges["drift_share"] == result.share and gauges["drifted_columns"] == len(result.drifted)
    assert (
        gauges["expected_accuracy"] == pytest.approx((0.95 + 0.98) / 2) and gauges["labelled_decisions"] == 0
    )
    assert all(isinstance(v, float) for v in gauges.values())
    assert "| chosen.tone |" in drift_markdown(result, "decision-model/3", "the last 24 h")
