"""The review queue: the logged decisions a model was least sure of, not yet labelled, as a file to label.

Per answered question: the margin (top probability minus the runner-up; a noul's |2p - 1|), the entropy of its
distribution, and the size of its split-conformal prediction set. The conformal threshold comes from the
decisions of the same model that already have feedback (nonconformity 1 - P(gold), the quantile at 1 - alpha),
which is valid where those labels came from ordinary traffic; with fewer than `MIN_CALIBRATION` labels there
is no set. Ranked by margin (smallest first), ties by entropy. The file (JSONL or CSV) has one row per
question with an empty `label` column; `decision feedback import` reads it back once labelled.

Before them, first: the answers the server automated (`x_automate` true in the logged answer) whose feedback
says they were wrong, with that feedback (`feedback`, `automated_wrong` true). Each is an error the
certificate let through: check it, and label it again where the feedback itself was wrong (a label re-sent
replaces the earlier one); they count towards the certificate's re-check (`recertify`).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from pipeline.data.answers import answer_probabilities
from pipeline.data.contract import QuestionSpec, judge_gold, parse_question
from pipeline.flywheel.recertify import AUTOMATED
from pipeline.flywheel.table import Store, is_model
from pipeline.scoring.conformal import conformal_threshold, prediction_set

MIN_CALIBRATION = 30
ORDERS = ("margin", "entropy", "set_size")


@dataclass(frozen=True)
class ReviewItem:
    decision_id: str
    question: str
    model: str
    time: str
    state: Any
    options: list[str]
    answer: str
    margin: float
    entropy: float
    set_size: int | None
    automated: bool = False
    """The server automated the answer (`x_automate`)."""
    feedback: str | None = None
    """The feedback already given (an automated-but-wrong answer's label, as text); None for the unlabelled."""

    @property
    def automated_wrong(self) -> bool:
        return self.feedback is not None

    def row(self) -> dict[str, Any]:
        return {**self.__dict__, "label": ""}


class UnknownModel(ValueError):
    """No logged decision is of the model asked for, while others are."""


def review_queue(
    store: Store, model: str, top: int, order: str = "margin", alpha: float = 0.1
) -> list[ReviewItem]:
    """The `top` least sure answered questions of `model` (a name, or NAME/VERSION) without feedback yet.
    UnknownModel where the log holds decisions, none of them `model`'s (a typo would read as nothing to
    label)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    logged = store.decisions().to_pylist()
    decisions = [row for row in logged if is_model(row["model"], model)]
    if logged and not decisions:
        names = sorted({row["model"].split("/")[0] for row in logged})
        raise UnknownModel(
            f"{model}: no logged decision of this model; the log holds {', '.join(names[:10])}"
            + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        )
    labelled = {(r["decision_id"], r["question_id"]): r["gold"] for r in store.feedback().to_pylist()}
    answered = _answers(decisions)
    threshold = _threshold(answered, labelled, alpha)
    items = [_item(a, threshold) for a in answered if (a.row["decision_id"], a.qid) not in labelled]
    items += [
        replace(_item(a, threshold), feedback=gold)
        for a in answered
        if (gold := labelled.get((a.row["decision_id"], a.qid))) is not None and automated_wrong(a, gold)
    ]
    if order == "set_size":
        items.sort(key=lambda it: (not it.automated_wrong, -(it.set_size or 0), it.margin))
    elif order == "entropy":
        items.sort(key=lambda it: (not it.automated_wrong, -it.entropy, it.margin))
    else:
        items.sort(key=lambda it: (not it.automated_wrong, it.margin, -it.entropy))
    return items[:top]


def automated_wrong(answer: _Answer, gold: str) -> bool:
    """Whether the server automated `answer` and the feedback `gold` (JSON text) names another option."""
    if answer.automated is not True:
        return False
    ok, _, judged = judge_gold(answer.spec, orjson.loads(gold))
    return ok and judged is not None and judged.label != int(answer.probabilities.argmax())


def write_queue(items: list[ReviewItem], out: str | Path) -> Path:
    """JSONL (one object per line) or, for a .csv name, CSV with the state as JSON text; written beside and
    renamed into place, so `out` is whole or as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [item.row() for item in items]
    staged = out.with_name(f".{out.name}.partial")
    try:
        with staged.open("w", newline="", encoding="utf-8") as handle:
            if out.suffix.lower() == ".csv":
                writer = csv.DictWriter(handle, fieldnames=[*ReviewItem.__dataclass_fields__, "label"])
                writer.writeheader()
                for row in rows:
                    writer.writerow(
                        {**row, "state": _text(row["state"]), "options": "|".join(row["options"])}
                    )
            else:
                handle.write("".join(json.dumps(row) + "\n" for row in rows))
        staged.replace(out)
    finally:
        staged.unlink(missing_ok=True)
    return out


class _Answer(NamedTuple):
    """One answered question of a logged decision, read once for both the threshold and the queue."""

    row: dict[str, Any]
    state: Any
    qid: str
    spec: QuestionSpec
    probabilities: np.ndarray
    automated: bool


def _answers(decisions: list[dict[str, Any]]) -> list[_Answer]:
    answered = []
    for row in decisions:
        questions, state = orjson.loads(row["questions"]), orjson.loads(row["state"])
        for qid, answer in orjson.loads(row["answers"]).items():
            spec = parse_question(qid, questions.get(qid))
            if spec.question is not None:
                probabilities = np.asarray(answer_probabilities(answer), dtype=float)
                automated = answer.get(AUTOMATED) is True
                answered.append(_Answer(row, state, qid, spec, probabilities, automated))
    return answered


def _item(answer: _Answer, threshold: float | None) -> ReviewItem:
    p, options = answer.probabilities, answer.spec.question.options
    top2 = np.sort(p)[-2:] if len(p) > 1 else np.array([0.0, p[0]])
    set_size = None if threshold is None else len(prediction_set(p, threshold))
    return ReviewItem(
        decision_id=answer.row["decision_id"],
        question=answer.qid,
        model=answer.row["model"],
        time=answer.row["time"].isoformat(),
        state=answer.state,
        options=list(options),
        answer=options[int(p.argmax())],
        margin=float(top2[1] - top2[0]),
        entropy=_entropy(p),
        set_size=set_size,
        automated=answer.automated,
    )


def _threshold(answered: list[_Answer], labelled: dict[tuple[str, str], str], alpha: float) -> float | None:
    """The split-conformal threshold from this model's labelled answers, None with too few of them."""
    scores = []
    for answer in answered:
        gold = labelled.get((answer.row["decision_id"], answer.qid))
        if gold is None:
            continue
        ok, _, judged = judge_gold(answer.spec, orjson.loads(gold))
        if ok and judged is not None:
            scores.append(1.0 - answer.probabilities[judged.label])
    return conformal_threshold(np.asarray(scores), alpha) if len(scores) >= MIN_CALIBRATION else None


def _entropy(p: np.ndarray) -> float:
    q = p[p > 0]
    return float(-(q * np.log(q)).sum())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
