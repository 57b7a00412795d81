"""Answer shaping: option probabilities to the Decision API's wire answers (docs/serving.md).

Shared by the HTTP server, the smoke test and the MLflow model, so all three answer byte for byte alike:

    choice  {"type": "choice", "choice": id, "probabilities": {id: p}, "confidence": c,
             "x_top_probability": max p}
    score   {"type": "score", "score": sum i*p_i, "legend": {"0": text}, "probabilities": {"0": p},
             "confidence": c, "x_top_probability": max p}
    noul    {"type": "noul", "noul": P(true), "x_confidence": max(p, 1 - p)}

`confidence` is the Jev confidence `c = (max p - 1/n) / (1 - 1/n)` over the n options or levels: 0 for a
uniform answer, 1 for a certain one (a one-level score is certain: 1). A noul answer carries none; fields
beyond the Jev answer start with `x_`. Figures are rounded to 4 decimals; probabilities arrive in model order
(choice in criteria order, score by level, noul false then true).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pipeline.data.contract import (
    MAX_CHOICE_OPTIONS,
    MAX_QUESTION_CHARS,
    MAX_QUESTIONS,
    MAX_SCORE_LEVELS,
    MAX_STATE_CHARS,
    MIN_SCORE_LEVELS,
    QUESTION_TYPES,
    Question,
    QuestionSpec,
    canonical_json,
    parse_question,
    question_chars,
    state_text,
)

DECIMALS = 4
# The Decision API's own floor (docs/serving.md): a question with one option asks nothing. A data row may hold
# one (docs/data-format.md); it trains, but a request with one is refused.
MIN_CHOICE_OPTIONS = 2


def shape_answer(
    question: Question, probabilities: np.ndarray, legend: list[Any] | None = None
) -> dict[str, Any]:
    """The wire answer to one question; `legend` overrides the score level texts (e.g. JSON-valued
    criteria)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if question.type == "noul":
        p_true = float(p[1])
        return {"type": "noul", "noul": _round(p_true), "x_confidence": _round(max(p_true, 1.0 - p_true))}
    by_option = {option: _round(float(v)) for option, v in zip(question.options, p)}
    sureness = {"confidence": _round(jev_confidence(p)), "x_top_probability": _round(float(p.max()))}
    if question.type == "choice":
        return {
            "type": "choice",
            "choice": question.options[int(p.argmax())],
            "probabilities": by_option,
            **sureness,
        }
    texts = legend if legend is not None else question.descriptions
    return {
        "type": "score",
        "score": _round(float(np.dot(np.arange(len(p)), p))),
        "legend": {str(i): text if text is not None else f"level {i}" for i, text in enumerate(texts)},
        "probabilities": by_option,
        **sureness,
    }


def jev_confidence(probabilities: np.ndarray) -> float:
    """`(max p - 1/n) / (1 - 1/n)` over n options: 0 for a uniform answer, 1 for a certain one (and for n = 1,
    where the one option is certain)."""
    n = len(probabilities)
    if n == 1:
        return 1.0
    chance = 1.0 / n
    # Clipped: probabilities that sum to 1 only within float error must not give -0.0 or 1.0000000001.
    return min(1.0, max(0.0, (float(np.max(probabilities)) - chance) / (1.0 - chance)))


def request_limits() -> dict[str, Any]:
    """What one request may hold (docs/serving.md), as `/v1/models` states it; the same figures
    `parse_request` enforces."""
    return {
        "max_questions": MAX_QUESTIONS,
        "choice_options": {"min": MIN_CHOICE_OPTIONS, "max": MAX_CHOICE_OPTIONS},
        "score_levels": {"min": MIN_SCORE_LEVELS, "max": MAX_SCORE_LEVELS},
        "max_question_chars": MAX_QUESTION_CHARS,
        "max_state_chars": MAX_STATE_CHARS,
    }


def shape_answers(
    questions: dict[str, Question],
    probabilities: dict[str, np.ndarray],
    legends: dict[str, list[Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Wire answers for every question, in the order the questions were asked."""
    legends = legends or {}
    return {qid: shape_answer(q, probabilities[qid], legends.get(qid)) for qid, q in questions.items()}


def chosen_option(answer: dict[str, Any]) -> str:
    """The option an answer picks (choice id, most likely score level, "true"/"false" for noul)."""
    if answer["type"] == "noul":
        return "true" if answer["noul"] > 0.5 else "false"  # a tie picks "false", as argmax does
    if answer["type"] == "choice":
        return answer["choice"]
    probabilities = answer["probabilities"]
    return max(probabilities, key=probabilities.__getitem__)


def answer_probabilities(answer: dict[str, Any]) -> list[float]:
    """An answer's probabilities in model order (noul: [P(false), P(true)])."""
    if answer["type"] == "noul":
        return [1.0 - answer["noul"], answer["noul"]]
    return list(answer["probabilities"].values())


def _round(value: float) -> float:
    return round(value, DECIMALS)


class InvalidRequest(ValueError):
    """A request that cannot be answered; `errors` are FastAPI-style `{"loc", "msg", "type"}` entries, and
    `reason` is the reason code of the first (validation's code where it has one: `bad_criteria`, ...; see
    `REFUSALS`)."""

    def __init__(self, errors: list[dict[str, Any]], reason: str = "invalid_request") -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors
        self.reason = reason


class RequestTooLarge(ValueError):
    """A request over the Decision API's size limits (docs/data-format.md, Columns: questions, characters);
    `reason` is `too_many_questions` or `too_long`."""

    def __init__(self, message: str, reason: str = "too_long") -> None:
        super().__init__(message)
        self.reason = reason


# The reason codes of a refused request beyond validation's (`contract.REASONS`): the Decision API takes 2 or
# more choice options where a data row may hold one; text that is no valid Unicode or cannot be written as
# JSON.
REFUSALS = ("too_few_options", "invalid_text")


@dataclass(frozen=True)
class ParsedRequest:
    """A request's state and validated questions, ready for the model."""

    state: Any
    questions: dict[str, Question]
    legends: dict[str, list[Any]]  # score criteria as sent (they may be JSON values, not text)


def request_parts(request: ParsedRequest, max_chars: int) -> list[ParsedRequest]:
    """The request as consecutive groups of its questions (in order, never a question cut) of at most
    `max_chars` question characters each (a longer question alone): each answer depends on its own question
    and the state only, so the parts answer what the whole would, and a server can let other requests run
    between them."""
    parts: list[list[str]] = []
    size = max_chars + 1
    for qid, question in request.questions.items():
        chars = question_chars(question)
        if size + chars > max_chars:
            parts.append([])
            size = 0
        parts[-1].append(qid)
        size += chars
    return [
        ParsedRequest(
            request.state,
            {q: request.questions[q] for q in part},
            {q: request.legends[q] for q in part if q in request.legends},
        )
        for part in parts
    ]


def parse_request(state: Any, questions: dict[str, Any]) -> ParsedRequest:
    """Validate a request's questions against the contract; RequestTooLarge or InvalidRequest naming
    fields."""
    _check_sizes(state, questions)
    parsed, legends, errors, reasons = {}, {}, [], []
    for qid, raw in questions.items():
        try:
            spec = parse_question(str(qid), _as_text_fields(raw))
        except TypeError as error:  # a JSON-valued field orjson cannot write (see state above)
            errors.append(_error(["body", "questions", str(qid)], f"cannot be read as JSON text: {error}"))
            reasons.append("invalid_text")
            continue
        if spec.chars > MAX_QUESTION_CHARS:  # counted as validation counts it (instructions and options)
            raise RequestTooLarge(f"questions.{qid}: {spec.chars} characters, at most {MAX_QUESTION_CHARS}")
        problem = _question_problem(spec)
        if problem:
            errors.append(_error(["body", "questions", str(qid), problem.field], problem.message))
            reasons.append(problem.reason)
            continue
        parsed[str(qid)] = spec.question
        if spec.type == "score":
            legends[str(qid)] = list(raw["criteria"])  # as sent: a level may be a JSON value, not text
    if errors:
        raise InvalidRequest(errors, reasons[0])
    return ParsedRequest(state, parsed, legends)


def _check_sizes(state: Any, questions: dict[str, Any]) -> None:
    _refuse_unpaired_surrogates(state, questions)
    if len(questions) > MAX_QUESTIONS:
        raise RequestTooLarge(
            f"questions: {len(questions)} questions, at most {MAX_QUESTIONS}", "too_many_questions"
        )
    try:
        state_chars = len(state_text(state))
    except TypeError as error:  # orjson: an integer beyond 64 bits, nesting deeper than 254 levels
        raise InvalidRequest(
            [_error(["body", "state"], f"state cannot be read as JSON text: {error}")], "invalid_text"
        ) from None
    if state_chars > MAX_STATE_CHARS:
        raise RequestTooLarge(f"state: {state_chars} characters, at most {MAX_STATE_CHARS}")


SURROGATE = re.compile("[\ud800-\udfff]")  # what is left of a surrogate after JSON decoding is unpaired


def _refuse_unpaired_surrogates(state: Any, questions: dict[str, Any]) -> None:
    """InvalidRequest naming every field whose text holds an unpaired UTF-16 surrogate (JSON can carry one as
    a \\u escape; no UTF-8 text, and so no tokenizer, can)."""
    places = [("state", state)] + [(f"questions.{qid}", raw) for qid, raw in questions.items()]
    bad = [
        where for where, value in places if _has_unpaired_surrogate(value) or _has_unpaired_surrogate(where)
    ]
    if bad:
        raise InvalidRequest(
            [
                _error(
                    ["body", *where.split(".", 1)],
                    "text holds an unpaired surrogate (invalid Unicode); send valid UTF-16 pairs or UTF-8",
                )
                for where in bad
            ],
            "invalid_text",
        )


def _has_unpaired_surrogate(value: Any) -> bool:
    # A walk with a stack, not recursion: a deeply nested state must not exhaust the interpreter's stack here.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _error(loc: list[str], message: str) -> dict[str, Any]:
    return {"loc": loc, "msg": message, "type": "value_error"}


def _as_text_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Instructions and option descriptions sent as JSON values become compact JSON text for the model."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    if isinstance(out.get("instructions"), (dict, list)):
        out["instructions"] = canonical_json(out["instructions"]).decode()
    criteria = out.get("criteria")
    if isinstance(criteria, dict):
        out["criteria"] = {k: _text(v) for k, v in criteria.items()}
    elif isinstance(criteria, list):
        out["criteria"] = [_text(v) for v in criteria]
    return out


def _text(value: Any) -> Any:
    return canonical_json(value).decode() if isinstance(value, (dict, list)) else value


class Problem(NamedTuple):
    """Why a question is refused: its reason code, the field at fault, and the message for the caller."""

    reason: str
    field: str
    message: str


def _question_problem(spec: QuestionSpec) -> Problem | None:
    """The problem of a question the model cannot answer, else None; the first in validation's order of
    codes."""
    if not spec.question_ok:
        return Problem(
            "bad_question",
            "instructions",
            "a question is an object whose instructions are text, a JSON object or list, or null",
        )
    if spec.type not in QUESTION_TYPES:
        return Problem(
            "unknown_question_type",
            "type",
            f"unknown question type {spec.type}; expected one of {', '.join(QUESTION_TYPES)}",
        )
    if not spec.criteria_ok:
        return Problem("bad_criteria", "criteria", _CRITERIA_SHAPES[spec.type])
    if spec.type == "choice" and not MIN_CHOICE_OPTIONS <= spec.n_options <= MAX_CHOICE_OPTIONS:
        limits = f"{MIN_CHOICE_OPTIONS} to {MAX_CHOICE_OPTIONS}"
        reason = "too_few_options" if spec.n_options < MIN_CHOICE_OPTIONS else "too_many_options"
        return Problem(reason, "criteria", f"a choice takes {limits} options, got {spec.n_options}")
    if spec.type == "score" and spec.n_options > MAX_SCORE_LEVELS:
        return Problem("too_many_options", "criteria", f"{spec.n_options} levels, at most {MAX_SCORE_LEVELS}")
    if spec.n_distinct < spec.n_options:
        return Problem("repeated_options", "criteria", "options repeat")
    return None


_CRITERIA_SHAPES = {
    "choice": "choice criteria: a non-empty object {option_id: description or null} or a list of option ids",
    "score": (
        f"score criteria: a list (not an object) of {MIN_SCORE_LEVELS}..{MAX_SCORE_LEVELS} level descriptions; "
        "level i is item i"
    ),
    "noul": 'noul criteria: null or {"true": description, "false": description}',
}
