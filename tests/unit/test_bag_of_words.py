"""The bag of words every run shows beside its fine-tune: it learns what words say, answers every held-out
decision over that decision's own options, and never fails a run on data it cannot learn from."""

import numpy as np
import pytest

from pipeline.data.validate import validate_rows
from pipeline.scoring.bag_of_words import (
    BAG_OF_WORDS,
    bag_of_words,
    behind_bag_of_words,
    evenly_spaced,
    fit_questions,
    training_rows,
)
from pipeline.scoring.decisions import gold_decisions
from pipeline.scoring.metrics import detailed_metrics

MOOD = {"type": "choice", "instructions": "The mood?", "criteria": {"glad": None, "sad": None}}
TOPIC = {
    "type": "choice",
    "instructions": "The topic?",
    "criteria": {"food": None, "sport": None, "work": None},
}
WORDS = {"glad": ["wonderful", "lovely", "great"], "sad": ["awful", "dreary", "terrible"]}


def _rows(n: int, seed: int, questions=None) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        mood = ["glad", "sad"][i % 2]
        filler = " ".join(rng.choice(["the", "day", "was", "quite", "really", "today"], size=4))
        rows.append(
            {
                "state": f"{filler} {rng.choice(WORDS[mood])} {filler}",
                "questions": questions or {"mood": MOOD},
                "gold": {"mood": mood} | ({"topic": "food"} if questions else {}),
            }
        )
    return rows


def _records(rows):
    return validate_rows(rows).records


def test_it_learns_what_the_words_say_and_answers_over_each_decisions_options():
    train, heldout = _records(_rows(200, 0)), _records(_rows(60, 1))
    decisions = gold_decisions(heldout)
    words = bag_of_words(train, heldout, decisions, max_rows=20_000)
    assert words.rows == 200
    assert [len(p) for p in words.probabilities] == [2] * 60
    assert all(np.isclose(p.sum(), 1.0) for p in words.probabilities)
    assert detailed_metrics(decisions, words.probabilities)["accuracy"] >= 0.95


def test_a_question_it_cannot_learn_is_answered_by_frequencies_and_an_unseen_one_uniformly():
    both = {"mood": MOOD, "topic": TOPIC}
    train = _records(_rows(40, 0, both))  # every training row's topic is food: one label
    unseen = {"state": "quite", "questions": {"weather": MOOD}, "gold": {"weather": "sad"}}
    heldout_rows = [*_rows(6, 1, both), unseen]
    heldout = _records(heldout_rows)
    decisions = gold_decisions(heldout)
    words = bag_of_words(train, heldout, decisions, max_rows=20_000)
    topics = [p for d, p in zip(decisions, words.probabilities) if d.question_id == "topic"]
    assert len(topics) == 6 and all(len(p) == 3 and p[0] > 0.999 for p in topics)  # food, the only label seen
    (weather,) = [p for d, p in zip(decisions, words.probabilities) if d.question_id == "weather"]
    assert np.allclose(weather, [0.5, 0.5])


@pytest.mark.parametrize("state", ["!?", "a", "x y z", {"n": 1}])
def test_states_that_share_no_counted_word_fall_back_to_the_label_frequencies(state):
    rows = [
        {"state": state, "questions": {"mood": MOOD}, "gold": {"mood": m}}
        for m in ["glad", "glad", "glad", "sad"]
    ]
    records = _records(rows)
    words = bag_of_words(records, records, gold_decisions(records), max_rows=20_000)
    assert np.allclose(words.probabilities[0], [0.75, 0.25])


def test_a_label_beyond_a_held_out_questions_options_is_dropped_not_an_error():
    wide = {"mood": {**MOOD, "criteria": {"glad": None, "sad": None, "calm": None}}}
    train = _records(
        [
            {**row, "gold": {"mood": "calm" if i % 3 == 0 else row["gold"]["mood"]}, "questions": wide}
            for i, row in enumerate(_rows(60, 0))
        ]
    )
    heldout = _records(_rows(10, 1))  # the same id asked with two options
    words = bag_of_words(train, heldout, gold_decisions(heldout), max_rows=20_000)
    assert all(len(p) == 2 and np.isclose(p.sum(), 1.0) for p in words.probabilities)


def test_beyond_max_rows_it_fits_on_rows_spread_over_the_whole_file():
    records = _records(_rows(100, 0))
    kept = evenly_spaced(records, 10)
    assert len(kept) == 10 and kept[0] is records[0] and kept[-1] is records[-1]
    assert evenly_spaced(records, 500) == records
    assert bag_of_words(records, records[:4], gold_decisions(records[:4]), max_rows=10).rows == 10


def test_a_line_says_so_only_when_the_fine_tune_is_behind_it():
    figures = {"calibrated": {"accuracy": 0.60}, BAG_OF_WORDS: {"accuracy": 0.65, "rows": 1200}}
    line = behind_bag_of_words(figures)
    assert line is not None and "0.6500" in line and "0.6000" in line and "1,200 training rows" in line
    assert behind_bag_of_words(figures | {"calibrated": {"accuracy": 0.70}}) is None
    assert behind_bag_of_words({"calibrated": {"accuracy": 0.1}}) is None  # no bag of words fitted


def test_questions_asked_of_the_same_rows_share_one_vectorizer_and_others_get_their_own():
    twice = {"mood": MOOD, "again": MOOD}
    rows = [{**row, "gold": row["gold"] | {"again": row["gold"]["mood"]}} for row in _rows(40, 0, twice)]
    shared = fit_questions(_records(rows))
    assert shared["mood"].vectorizer is not None and shared["mood"].vectorizer is shared["again"].vectorizer
    apart = fit_questions(_records(rows + _rows(20, 2)))  # 20 more rows ask mood only
    assert apart["mood"].vectorizer is not apart["again"].vectorizer
    assert len(apart["mood"].vectorizer.idf_) >= len(apart["again"].vectorizer.idf_)


def test_long_states_are_read_up_to_a_character_budget_on_rows_spread_over_the_file():
    records = _records(_rows(100, 0))
    every = sum(len(r.state) for r in records)
    assert training_rows(records, 1_000, max_characters=every) == records
    kept = training_rows(records, 1_000, max_characters=every // 4)
    assert 20 <= len(kept) <= 25 and kept[0] is records[0] and kept[-1] is records[-1]
    assert sum(len(r.state) for r in kept) <= every // 4 + max(len(r.state) for r in records)
    assert len(training_rows(records, 1_000, max_characters=1)) == 1  # never none


def test_gold_decisions_score_a_soft_gold_against_its_distribution_and_a_hard_one_one_hot():
    level = {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]}
    rows = [
        {
            "state": "late parcel",
            "questions": {"mood": MOOD, "urgency": level},
            "gold": {"mood": "sad", "urgency": {"label": 1, "probabilities": [0.2, 0.5, 0.3]}},
        }
    ]
    mood, urgency = gold_decisions(_records(rows))
    assert (mood.label, mood.target, mood.soft, mood.record) == (1, (0.0, 1.0), False, 0)
    assert (urgency.label, urgency.target, urgency.soft) == (1, (0.2, 0.5, 0.3), True)
