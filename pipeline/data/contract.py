"""The decision-row contract (docs/data-format.md): limits, reason codes, and parsing of one row.

`parse_questions` turns a `questions` cell (native or JSON text) into per-question specs (shape, type, options
in model order, size) and `judge_gold` checks one gold entry against a spec. Neither raises on bad input, and
neither decides a skip: the rules that turn these facts into reason codes are the pandera schema in
`pipeline.data.validate`. What validation keeps is a `Record` of `Decision`s, defined here so that the model
families read records without importing the schema (a GPU machine without pandera trains them).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

QUESTION_TYPES = ("choice", "score", "noul")
# The type id every model family embeds and every per-type figure is indexed by (choice 0, score 1, noul 2).
QUESTION_TYPE_IDS = {name: i for i, name in enumerate(QUESTION_TYPES)}
SCORE_TYPE_ID = QUESTION_TYPE_IDS["score"]
MAX_QUESTIONS = 64
MAX_QUESTION_CHARS = 20_000
MAX_STATE_CHARS = 200_000
MAX_CHOICE_OPTIONS = 255
MIN_SCORE_LEVELS, MAX_SCORE_LEVELS = 1, 10  # docs/serving.md; a 1-level score is answered P(level 0) = 1
NOUL_OPTIONS = ("false", "true")  # the order the model scores them in (docs/training.md, Model families)
PROBABILITY_TOLERANCE = 1e-3
_NOUL_LABELS = {label: i for i, label in enumerate(NOUL_OPTIONS)}

# Stable reason codes, in the order that decides which one a decision is counted under when several apply.
ROW_REASONS = ("invalid_json", "missing_state", "missing_questions", "missing_gold", "too_many_questions")
REASONS = (
    *ROW_REASONS,
    "bad_question",
    "unknown_question_type",
    "bad_criteria",
    "too_many_options",
    "repeated_options",
    "too_long",
    "no_gold_for_question",
    "gold_label_not_an_option",
    "gold_probabilities_invalid",
)


class Unreadable(ValueError):
    """A cell that should hold JSON could not be parsed."""


@dataclass(frozen=True, slots=True)
class Question:
    """A question normalised to its ordered options (choice: criteria order, score: by level, noul: false,
    true)."""

    id: str
    type: str
    instructions: str
    options: tuple[str, ...]
    descriptions: tuple[str | None, ...]


class Gold(NamedTuple):
    """The gold answer: an index into the question's options, and the soft target over them when given."""

    label: int
    probabilities: tuple[float, ...] | None  # None: a hard label (the target is one-hot on `label`)


class Decision(NamedTuple):
    """One usable decision: a question of a row with its gold answer."""

    row: int
    question: Question
    gold: Gold


@dataclass(frozen=True)
class Record:
    """A row with at least one usable decision; `row` is its index in the file (not in the slice)."""

    row: int
    state: Any
    decisions: tuple[Decision, ...]
    gold: dict[str, Any]
    questions_json: bytes  # the row's questions as canonical JSON
    group: str | None = None
    """The row's `group` as canonical JSON (`group_key`): rows that share it are held out, or carved for
    validation, together; None: the row goes alone."""

    def request_questions(self) -> dict[str, Any]:
        """The row's questions as a request asks them again: each usable decision's in file order with its
        options in model order (`question_request`), then the row's other questions as `questions_json` holds
        them."""
        asked = {d.question.id: question_request(d.question) for d in self.decisions}
        return asked | {qid: q for qid, q in orjson.loads(self.questions_json).items() if qid not in asked}

    def content_hash(self) -> str:
        """blake2b of the row's canonical JSON: the same content gives the same hash in any file form."""
        canonical = orjson.dumps(
            {"state": self.state, "questions": orjson.Fragment(self.questions_json), "gold": self.gold},
            option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
        )
        return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def group_key(cell: Any) -> str | None:
    """A `group` cell as the key its rows share: its canonical JSON (so `7` and `"7"` are two groups, as a
    number column and a text column would keep them apart); None for an absent, null, NaN (a missing number in
    a table written by pandas) or empty cell: a row of its own."""
    if cell is None or cell == "" or (isinstance(cell, float) and math.isnan(cell)):
        return None
    return orjson.dumps(cell, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()


class QuestionSpec(NamedTuple):
    """What validation knows about one question definition; parsed once per distinct `questions` cell."""

    id: str
    question_ok: bool
    type: str | None
    criteria_ok: bool
    n_options: int
    n_distinct: int
    chars: int
    question: Question | None
    option_index: dict[str, int] | None


class ParsedQuestions(NamedTuple):
    """A parsed `questions` cell: a row-level error code, or its question specs and canonical JSON bytes."""

    error: str | None
    specs: tuple[QuestionSpec, ...]
    canonical: bytes


def parse_json_cell(value: Any) -> Any:
    """Return the native value of a cell that holds JSON text, or the value itself when it is already
    native."""
    if isinstance(value, (bytes, str)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise Unreadable(str(error)) from None
    return value


def parse_state(value: Any) -> Any:
    """A state is any JSON value; a string is plain text unless it is a JSON object or list written as
    text."""
    if isinstance(value, str):
        stripped = value.lstrip()
        if stripped[:1] == "{":
            return parse_json_cell(value)
        if stripped[:1] == "[":
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError:
                return value  # text that happens to open with a bracket, e.g. "[laughs] ..."
    return value


STATE_TRUNCATION = "end"
"""What every family does with a state longer than the room its sequence leaves it: the state's first tokens
are kept and its end is cut (`families.base.cut_state`). Training counts the rows cut and the tokens dropped
(`training.state_fit`); docs/data-format.md, States."""
LONG_STATE_CHARS = 1_000
"""Validation counts the states longer than this many characters: about 250 tokens of English prose, the stock
MiniLM's 256-token window. Validation has no tokenizer; training counts each model's tokens."""


@dataclass(frozen=True)
class StateSizes:
    """The readable rows' states in characters, as the model reads them (`state_text`): validation has no
    tokenizer, so the token counts and what a model's window cuts come with training
    (`training.state_fit`)."""

    rows: int
    longest_chars: int
    rows_over: int
    """States longer than `over_chars`."""
    over_chars: int = LONG_STATE_CHARS

    def describe(self) -> str:
        """One line: the longest state and how many are over `over_chars`."""
        return (
            f"states: the longest is {self.longest_chars:,} characters; {self.rows_over:,} of {self.rows:,} "
            f"rows over {self.over_chars:,} (about 250 tokens; training counts each model's tokens)"
        )


@dataclass(frozen=True)
class GroupSizes:
    """The readable rows' `group` cells: how many groups, how many rows have one, and the largest group's
    rows."""

    groups: int
    rows: int
    largest: int

    def describe(self, readable: int) -> str:
        """One line, with `readable` the rows that could be read."""
        return (
            f"groups: {self.groups:,} ({self.rows:,} of {readable:,} rows have one; the largest has "
            f"{self.largest:,} rows): each group's rows go to one side of the held-out and validation splits"
        )


def state_text(state: Any) -> str:
    """The state as the model reads it: text stays text, anything else becomes compact JSON (orjson: keys in
    the row's order, no spaces, non-ASCII kept, NaN and infinities as null); docs/data-format.md, States."""
    return state if isinstance(state, str) else orjson.dumps(state).decode()


def is_missing(value: Any) -> bool:
    """None, NaN (an empty CSV or Parquet cell) or the empty string."""
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def parse_questions(cell: Any) -> ParsedQuestions:
    """Parse a `questions` cell (native or JSON text) into specs; never raises."""
    try:
        questions = parse_json_cell(cell)
    except Unreadable:
        return ParsedQuestions("invalid_json", (), b"")
    if is_missing(questions) or not isinstance(questions, dict) or not questions:
        return ParsedQuestions("missing_questions", (), b"")
    specs = tuple(parse_question(str(qid), spec) for qid, spec in questions.items())
    error = "too_many_questions" if len(specs) > MAX_QUESTIONS else None
    return ParsedQuestions(error, specs, canonical_json(questions))


def parse_question(qid: str, spec: Any) -> QuestionSpec:
    """One question definition to its spec: shape, type, options in model order, size."""
    if not isinstance(spec, dict) or not isinstance(spec.get("instructions", ""), (str, type(None))):
        return _unaskable_spec(qid, question_ok=False, shown_type=None)
    qtype = spec.get("type")
    shown_type = qtype if isinstance(qtype, str) else repr(qtype)
    options, descriptions = _options(qtype, spec.get("criteria")) if qtype in QUESTION_TYPES else (None, [])
    if options is None:
        return _unaskable_spec(qid, question_ok=True, shown_type=shown_type)
    instructions = spec.get("instructions") or ""
    question = Question(qid, qtype, instructions, tuple(options), tuple(descriptions))
    index = {option: i for i, option in enumerate(options)}
    return QuestionSpec(
        id=qid,
        question_ok=True,
        type=qtype,
        criteria_ok=True,
        n_options=len(options),
        n_distinct=len(index),
        chars=question_chars(question),
        question=question,
        option_index=index,
    )


def _unaskable_spec(qid: str, question_ok: bool, shown_type: str | None) -> QuestionSpec:
    """The spec of a question that cannot be asked (a definition of the wrong shape, or a type or criteria
    that give no options): no question, nothing to count."""
    return QuestionSpec(
        id=qid,
        question_ok=question_ok,
        type=shown_type,
        criteria_ok=False,
        n_options=0,
        n_distinct=0,
        chars=0,
        question=None,
        option_index=None,
    )


def question_request(question: Question) -> dict[str, Any]:
    """The question as a request asks it, its options in model order: what the model was trained on. A
    record's `questions_json` is canonical (keys sorted), so it would ask a choice's option map in another
    order."""
    criteria = criteria_of(question.type, question.options, question.descriptions)
    return {"type": question.type, "instructions": question.instructions, "criteria": criteria}


def criteria_of(qtype: str, options: Sequence[str], descriptions: Sequence[str | None]) -> Any:
    """A question's criteria as the row format and a request write them, in option order: a score's level
    descriptions, a noul's described sides (or null), a choice's option ids, or {option: description} where
    any option has one."""
    if qtype == "score":
        return list(descriptions)
    if qtype == "noul":
        return {o: d for o, d in zip(NOUL_OPTIONS, descriptions) if d is not None} or None
    if any(d is not None for d in descriptions):
        return dict(zip(options, descriptions))
    return list(options)


def question_chars(question: Question) -> int:
    """A question's characters as the limits count them: its instructions, option ids and descriptions."""
    return len(question.instructions) + sum(
        len(o) + len(d or "") for o, d in zip(question.options, question.descriptions)
    )


def judge_gold(spec: QuestionSpec, entry: Any) -> tuple[bool, bool, Gold | None]:
    """(label_ok, probabilities_ok, Gold or None) for one gold entry of a well-formed question."""
    if not isinstance(entry, dict):
        label = _label_index(spec, entry)
        return label is not None, True, None if label is None else Gold(label, None)
    label_value = entry.get("label")
    soft = _soft_target(spec, entry)
    label = _label_index(spec, label_value) if label_value is not None else None
    if label is None and label_value is None and soft:
        label = max(range(len(soft)), key=soft.__getitem__)  # a soft-only entry: the consensus label
    label_ok = label is not None or (label_value is None and soft is False)
    if label is None or soft is False:
        return label_ok, soft is not False, None
    return True, True, Gold(label, soft)


def _options(qtype: str, criteria: Any) -> tuple[list[str] | None, list[str | None]]:
    """Option ids and descriptions in model order, or (None, []) when the criteria have the wrong shape."""
    if qtype == "choice":
        return _choice_options(criteria)
    if qtype == "score":
        return _score_options(criteria)
    return _noul_options(criteria)


def _choice_options(criteria: Any) -> tuple[list[str] | None, list[str | None]]:
    if isinstance(criteria, list):
        if not criteria or not all(isinstance(o, str) and o for o in criteria):
            return None, []
        return list(criteria), [None] * len(criteria)
    if isinstance(criteria, dict) and criteria:
        if not all(isinstance(d, (str, type(None))) for d in criteria.values()) or "" in criteria:
            return None, []
        return [str(o) for o in criteria], list(criteria.values())
    return None, []


def _score_options(criteria: Any) -> tuple[list[str] | None, list[str | None]]:
    # A list only (docs/data-format.md; the Decision API too): a level is its position, and a map's keys are
    # no order a reader agrees on.
    if not isinstance(criteria, list) or len(criteria) < MIN_SCORE_LEVELS:
        return None, []
    if not all(isinstance(d, (str, type(None))) for d in criteria):
        return None, []
    return [str(i) for i in range(len(criteria))], list(criteria)


def _noul_options(criteria: Any) -> tuple[list[str] | None, list[str | None]]:
    if criteria is None or criteria == {}:
        return list(NOUL_OPTIONS), [None, None]
    if not isinstance(criteria, dict) or not set(criteria) <= set(NOUL_OPTIONS):
        return None, []
    if not all(isinstance(d, (str, type(None))) for d in criteria.values()):
        return None, []
    return list(NOUL_OPTIONS), [criteria.get(o) for o in NOUL_OPTIONS]


def _label_index(spec: QuestionSpec, value: Any) -> int | None:
    if spec.type == "noul":
        if isinstance(value, bool):
            return int(value)
        return _NOUL_LABELS.get(value.strip().lower()) if isinstance(value, str) else None
    if spec.type == "score":
        level = _integral(value)
        return level if level is not None and 0 <= level < spec.n_options else None
    if isinstance(value, str):
        return spec.option_index.get(value)
    level = _integral(value) if isinstance(value, int) else None  # an integer label names the option "7"
    return spec.option_index.get(str(level)) if level is not None else None


MAX_LEVEL_DIGITS = 18  # beyond any option count, and short of Python's 4,300-digit limit on int <-> str


def _integral(value: Any) -> int | None:
    """An integer label as a number, or None: booleans, fractions, lists, objects and numbers of more than
    `MAX_LEVEL_DIGITS` digits are no level (a list or a 5,000-digit string is refused, not a crash)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value.bit_length() <= 60 else None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    digits = value.strip().lstrip("-") if isinstance(value, str) else ""
    if digits.isdigit() and len(digits) <= MAX_LEVEL_DIGITS:
        return int(value)
    return None


def _soft_target(spec: QuestionSpec, entry: dict) -> tuple[float, ...] | bool | None:
    """The soft distribution in option order; None when absent, False when present but invalid."""
    raw = entry.get("probabilities")
    if raw is None and "noul" in entry:
        p_true = entry["noul"]
        if spec.type != "noul" or not _is_probability(p_true):
            return False
        return (1.0 - p_true, float(p_true))
    if raw is None:
        return None
    if isinstance(raw, dict):
        if not spec.option_index.keys() >= raw.keys():
            raw = {str(key): value for key, value in raw.items()}  # e.g. integer level keys of a score
            if not spec.option_index.keys() >= raw.keys():
                return False
        values = [raw.get(option, 0.0) for option in spec.question.options]
    elif isinstance(raw, list) and len(raw) == spec.n_options:
        values = raw
    else:
        return False
    return _distribution(values)


def _distribution(values: list) -> tuple[float, ...] | bool:
    """The values as a normalised distribution, or False unless they are probabilities summing to 1."""
    if any(isinstance(v, bool) for v in values):  # true is no probability, though Python sums it as 1
        return False
    try:
        total = sum(values)  # NaN or inf make the total fail the test below; text raises TypeError
        valid = abs(total - 1.0) <= PROBABILITY_TOLERANCE and min(values) >= 0.0 and max(values) <= 1.0
    except TypeError:
        return False
    if not valid:
        return False
    return tuple(v / total for v in values)


def _is_probability(value: Any) -> bool:
    return type(value) in (float, int) and 0.0 <= value <= 1.0  # also rejects NaN, inf and booleans


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: equal content gives equal bytes, whatever the key order or cell form."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
