"""A bag of words on the run's own split: what a fine-tune should beat, measured on the same held-out
decisions.

TF-IDF features of each state (words and word pairs, as `contract.state_text` renders it) and one logistic
regression per question id, trained on the rows the fine-tune trained on (the validation split left out) and
scored on the held-out decisions the fine-tune was scored on. On terse, keyword-heavy text it can beat the
default fine-tune (docs/training.md, "Compare with a bag of words on your data"): every run shows it beside
the fine-tune so that a user sees this on their own data without a second tool.

    words = bag_of_words(split.train, split.heldout, decisions, max_rows=50_000)
    detailed_metrics(decisions, words.probabilities)

A question whose training rows hold one label, or whose states share no word, is answered by its labels'
frequencies; a held-out question id no training row asked is answered uniformly.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.dummy import DummyClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from pipeline.data.contract import Record, state_text
from pipeline.scoring.decisions import ScoredDecision

BAG_OF_WORDS = "bag_of_words"
"""Its key beside `base`, `tuned` and `calibrated` in a run's held-out figures."""
UNSEEN_OPTION = 1e-9  # an option no training row chose: never exactly 0, so its log-loss stays finite
MAX_CHARACTERS = 50_000_000
"""The most state text it reads: 20,000 synthetic states of 500 words (60 M characters) peaked at 1.7 GB.
Beyond it, fewer rows, still evenly spaced, so that long states cannot exhaust memory once training is
done."""


@dataclass(frozen=True)
class BagOfWords:
    """The bag of words' probabilities for each held-out decision, and what it was fitted on."""

    probabilities: list[np.ndarray]
    rows: int
    """Training rows it was fitted on (evenly spaced over the training rows beyond `max_rows` or
    `MAX_CHARACTERS`)."""
    seconds: float


@dataclass(frozen=True)
class QuestionModel:
    """One question's classifier over the TF-IDF features of its `vectorizer`, or over nothing (None: its
    labels' frequencies, where it cannot learn)."""

    vectorizer: TfidfVectorizer | None
    classifier: LogisticRegression | DummyClassifier


def bag_of_words(
    train: Sequence[Record], heldout: Sequence[Record], decisions: Sequence[ScoredDecision], max_rows: int
) -> BagOfWords:
    """Fit on up to `max_rows` of the `train` records and answer each of `decisions` (`record` indexes
    `heldout`)."""
    started = time.perf_counter()
    rows = training_rows(train, max_rows)
    models = fit_questions(rows)
    texts = [state_text(record.state) for record in heldout]
    features: dict[int, Any] = {}  # the held-out texts' features, once per vectorizer
    probabilities: list[np.ndarray] = [np.full(d.n_options, 1.0 / d.n_options) for d in decisions]
    asked: dict[str, list[int]] = defaultdict(list)
    for i, decision in enumerate(decisions):
        asked[decision.question_id].append(i)
    for qid, indices in asked.items():
        if qid not in models:
            continue  # no training row asked it: uniform
        model = models[qid]
        answers = _answers(model, [decisions[i].record for i in indices], texts, features)
        for i, row in zip(indices, answers):
            probabilities[i] = _over_options(model.classifier.classes_, row, decisions[i].n_options)
    return BagOfWords(probabilities, len(rows), time.perf_counter() - started)


def evenly_spaced(records: Sequence[Record], max_rows: int) -> list[Record]:
    """All of `records`, or `max_rows` of them evenly spaced in file order (oldest to newest alike)."""
    if len(records) <= max_rows:
        return list(records)
    picks = np.linspace(0, len(records) - 1, max_rows).round().astype(int)
    return [records[i] for i in picks]


def training_rows(
    records: Sequence[Record], max_rows: int, max_characters: int = MAX_CHARACTERS
) -> list[Record]:
    """Up to `max_rows` of `records`, evenly spaced, and fewer where their states hold more than
    `max_characters`."""
    rows = evenly_spaced(records, max_rows)
    characters = sum(len(state_text(record.state)) for record in rows)
    if characters <= max_characters:
        return rows
    return evenly_spaced(rows, max(1, len(rows) * max_characters // characters))


def fit_questions(records: Sequence[Record]) -> dict[str, QuestionModel]:
    """A model per question id asked of `records`. Questions asked of the same rows share one vectorizer (on
    VADER's four, the vectorizer was most of the time)."""
    texts = [state_text(record.state) for record in records]
    asked: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    for index, record in enumerate(records):
        for decision in record.decisions:
            rows, labels = asked[decision.question.id]
            rows.append(index)
            labels.append(decision.gold.label)  # a soft gold's most likely label
    sharing: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for qid, (rows, _) in asked.items():
        sharing[tuple(rows)].append(qid)
    models = {}
    for rows, qids in sharing.items():
        vectorizer, features = _vectorized([texts[i] for i in rows])
        for qid in qids:
            models[qid] = fit_question(vectorizer, features, asked[qid][1])
    return models


def _vectorized(texts: list[str]) -> tuple[TfidfVectorizer | None, Any]:
    """A TF-IDF vectorizer fitted on `texts` and their features, or (None, None) when no word is counted."""
    for min_df in (2, 1):  # a word in two states at least; in one where the rows are few
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=min_df, sublinear_tf=True)
        try:
            return vectorizer, vectorizer.fit_transform(texts)
        except ValueError:  # no word left to count (scikit-learn's "empty vocabulary")
            continue
    return None, None


def fit_question(vectorizer: TfidfVectorizer | None, features, labels: list[int]) -> QuestionModel:
    """Logistic regression on the rows' features; the labels' frequencies where it cannot learn (one label
    only, or no features)."""
    if vectorizer is not None and len(set(labels)) > 1:
        return QuestionModel(vectorizer, LogisticRegression(max_iter=2000).fit(features, labels))
    return QuestionModel(None, DummyClassifier(strategy="prior").fit(np.zeros((len(labels), 1)), labels))


def _answers(model: QuestionModel, rows: list[int], texts: list[str], features: dict[int, Any]) -> np.ndarray:
    """The model's probabilities for the held-out `rows` (indices into `texts`)."""
    if model.vectorizer is None:
        return model.classifier.predict_proba(np.zeros((len(rows), 1)))
    key = id(model.vectorizer)
    if key not in features:
        features[key] = model.vectorizer.transform(texts)
    return model.classifier.predict_proba(features[key][rows])


def _over_options(classes: np.ndarray, row: np.ndarray, n_options: int) -> np.ndarray:
    """A model's probabilities over the labels it saw, spread over the decision's `n_options` (an unseen
    option gets `UNSEEN_OPTION`; a label beyond them, from rows that gave the question more options, is
    dropped)."""
    full = np.full(n_options, UNSEEN_OPTION)
    kept = classes < n_options
    full[classes[kept]] = row[kept]
    return full / full.sum()


def behind_bag_of_words(heldout: dict) -> str | None:
    """One line when a run's calibrated fine-tune answers fewer held-out decisions right than its bag of words
    (`heldout` as `calibration.json` holds it), else None."""
    words, tuned = heldout.get(BAG_OF_WORDS), heldout.get("calibrated")
    if not words or not tuned or tuned["accuracy"] >= words["accuracy"]:
        return None
    return (
        f"a bag of words (TF-IDF + logistic regression, {words['rows']:,} training rows) answers "
        f"{words['accuracy']:.4f} of the held-out decisions right, the fine-tune {tuned['accuracy']:.4f}: "
        "see docs/training.md, 'Compare with a bag of words on your data'"
    )
