"""Outcomes sent back for logged decisions: `POST /v1/feedback` and `decision feedback import FILE`.

An item is `{"decision_id": ID, "gold": {question_id: label or {label, probabilities}}}`; a body is one item
or a list of them. Each gold entry is checked with the training rows' contract (`contract.judge_gold`) against
the question as it was asked: an unknown question, a label that is not an option or probabilities that are not
a distribution are refused by name. Only the owner of the key that made a decision (or an admin key) may label
it. A request is stored whole or not at all, and a re-sent (decision, question) replaces the earlier label.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.data.contract import judge_gold, parse_question
from pipeline.data.mapping import label_text
from pipeline.flywheel.table import Store, utc_now

IMPORTER = "import"
MAX_ITEMS = 10_000
MAX_ERRORS = 20  # problems an answer names; the rest are counted
MAX_ID_CHARACTERS = 200  # far past the server's 32 hex characters


@dataclass(frozen=True)
class Labeller:
    """Who sends feedback: a key's owner, whether that key is an admin's, and whether the server is open."""

    owner: str | None
    admin: bool = False
    open_server: bool = False

    def may_label(self, decision_owner: str | None) -> bool:
        if self.admin or self.open_server:
            return True
        return self.owner is not None and self.owner == decision_owner


LINES = "lines"
"""An item read from a file's flat rows keeps, under this key, the line each question's label came from."""


class FeedbackRefused(ValueError):
    """Nothing was stored: `status` (403, 404 or 422) and one error per problem, each naming where it is."""

    def __init__(self, status: int, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.status, self.errors = status, errors


def parse_items(body: Any) -> list[dict[str, Any]]:
    """The items of a feedback body (one object or a list), each with a decision_id and a non-empty gold."""
    items = body if isinstance(body, list) else [body]
    errors = []
    if not items:
        errors.append(_error(["body"], "no feedback items"))
    if len(items) > MAX_ITEMS:
        raise FeedbackRefused(422, [_error(["body"], f"{len(items)} items, at most {MAX_ITEMS} per request")])
    for i, item in enumerate(items):
        where = ["body", i] if isinstance(body, list) else ["body"]
        if not isinstance(item, dict):
            errors.append(_error(where, 'expected {"decision_id": ..., "gold": {question_id: label}}'))
            continue
        if not isinstance(item.get("decision_id"), str) or not item["decision_id"]:
            errors.append(_error([*where, "decision_id"], "a decision id (a string) is required"))
        gold = item.get("gold")
        if not isinstance(gold, dict) or not gold:
            errors.append(
                _error(
                    [*where, "gold"], "gold must be an object {question_id: label or {label, probabilities}}"
                )
            )
    if errors:
        raise FeedbackRefused(422, errors)
    return items


def check_feedback(
    items: list[dict[str, Any]],
    logged: dict[str, dict[str, Any]],
    who: Labeller,
    labelled_by: str | None = None,
) -> list[dict[str, Any]]:
    """The feedback rows to store, or FeedbackRefused naming every problem (403 before 404 before 422).

    `logged` maps decision ids to their inference-table rows (as `Store.decisions` returns them).
    """
    forbidden, unknown, invalid, rows = [], [], [], {}
    now = utc_now()
    for i, item in enumerate(items):
        where = ["body", i] if len(items) > 1 else ["body"]
        decision = logged.get(item["decision_id"])
        if decision is None:
            unknown.append(
                _error(
                    [*where, "decision_id"],
                    f"no logged decision {_shown(item['decision_id'])} "
                    "(unknown, not logged under sampling, or written to another inference log)",
                )
            )
            continue
        if not who.may_label(decision["owner"]):
            made = "without an API key" if decision["owner"] is None else "with another key"
            forbidden.append(
                _error(
                    [*where, "decision_id"],
                    f"decision {_shown(item['decision_id'])} was made "
                    f"{made}: only its owner's keys or an admin key may label it",
                )
            )
            continue
        questions = orjson.loads(decision["questions"])
        for qid, entry in item["gold"].items():
            problem = gold_problem(questions, qid, entry)
            if problem:
                invalid.append(_error([*where, "gold", _cut(qid)], problem))
                continue
            # A label given again for the same question, later in the body, replaces the earlier one (as a
            # later request's does): one row per (decision, question), so every store keeps the last.
            rows[item["decision_id"], qid] = {
                "decision_id": item["decision_id"],
                "question_id": qid,
                "gold": _json(entry),
                "time": now,
                "labelled_by": labelled_by if labelled_by is not None else who.owner,
            }
    for status, errors in ((403, forbidden), (404, unknown), (422, invalid)):
        if errors:
            raise FeedbackRefused(status, _at_most(forbidden + unknown + invalid))
    return list(rows.values())


def _at_most(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first `MAX_ERRORS` problems and a count of the rest: a body with a million bad entries gets a short
    answer."""
    if len(errors) <= MAX_ERRORS:
        return errors
    rest = _error(["body"], f"and {len(errors) - MAX_ERRORS:,} more problems of these kinds; fix these first")
    return [*errors[:MAX_ERRORS], rest]


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 1] + "…"


def gold_problem(questions: dict[str, Any], qid: str, entry: Any) -> str | None:
    """Why a gold entry does not fit the question as it was asked, or None."""
    if qid not in questions:
        asked = ", ".join(map(_shown, list(questions)[:MAX_ERRORS]))
        return f"the decision asked no question {_shown(qid)} (it asked: {asked})"
    spec = parse_question(qid, questions[qid])
    if spec.question is None:
        return f"question {qid!r} cannot take gold"
    label_ok, probabilities_ok, _ = judge_gold(spec, entry)
    options = ", ".join(map(repr, spec.question.options))
    if not label_ok:
        shown = entry.get("label") if isinstance(entry, dict) else entry
        return f"{_shown(shown)} is not an option of {qid!r} (options: {options})"
    if not probabilities_ok:
        return f"probabilities must give each option of {qid!r} ({options}) a value in [0, 1], summing to 1"
    try:
        _json(entry)
    except orjson.JSONEncodeError as error:  # in an extra field: a 70-bit integer, a lone surrogate, nesting
        return f"the gold entry of {qid!r} holds a value that cannot be stored as JSON ({error})"
    return None


SHOWN_CHARACTERS = 80


def _shown(value: Any) -> str:
    """A label as an error message quotes it: at most `SHOWN_CHARACTERS`, whatever it is (a 5,000-digit
    number's repr raises)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<{type(value).__name__}>"
    return _cut(text)


def store_feedback(
    store: Store,
    items: list[dict[str, Any]],
    who: Labeller,
    labelled_by: str | None = None,
    flush: Callable[[], Any] | None = None,
) -> int:
    """Check `items` against the logged decisions and store them whole; how many labels were stored.

    `flush` writes decisions the server answered but has not written yet, so a decision labelled the moment it
    was answered is found.
    """
    if malformed := [
        _error(
            ["body", i, "decision_id"] if len(items) > 1 else ["body", "decision_id"],
            f"{_shown(item['decision_id'])} is no decision id (the X-Decision-Id of an answer)",
        )
        for i, item in enumerate(items)
        if not _plausible_id(item["decision_id"])
    ]:
        raise FeedbackRefused(
            422, _at_most(malformed)
        )  # before any store is asked (PostgreSQL refuses a NUL)
    ids = {item["decision_id"] for item in items}
    logged = _logged(store, ids)
    if flush is not None and len(logged) < len(ids):
        flush()
        logged = _logged(store, ids)
    rows = check_feedback(items, logged, who, labelled_by)
    store.append("feedback", rows)
    return len(rows)


def _plausible_id(decision_id: str) -> bool:
    """Printable and short: what any store can look up (the server's ids are 32 hex characters)."""
    return 0 < len(decision_id) <= MAX_ID_CHARACTERS and decision_id.isprintable()


def _logged(store: Store, ids: set[str]) -> dict[str, dict[str, Any]]:
    return {row["decision_id"]: row for row in store.decisions(ids=ids).to_pylist()}


def read_feedback_file(path: str | Path) -> list[dict[str, Any]]:
    """Items from a labelled file: JSONL of items (or of {decision_id, question, label}), or a CSV with
    decision_id, question and label columns (what `decision review` writes; rows with no label are
    skipped)."""
    path = Path(path)
    if not path.exists():
        raise ValueError("no such file")
    if path.is_dir():
        raise ValueError("a folder; give the labelled .jsonl or .csv file")
    try:
        return _read_labelled(path)
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text (byte {error.start}); save it as UTF-8") from None


def _read_labelled(path: Path) -> list[dict[str, Any]]:
    if path.suffix.lower() == ".csv":
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return _grouped(enumerate(csv.DictReader(handle), 2))  # line 1 is the header
    numbered = [
        (number, _line(text, number))
        for number, text in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1)
        if text.strip()
    ]
    flat = [(number, line) for number, line in numbered if isinstance(line, dict) and "gold" not in line]
    items = [
        _with_lines(line, number)
        for number, line in numbered
        if not (isinstance(line, dict) and "gold" not in line)
    ]
    return items + _grouped(flat)


def _with_lines(item: Any, number: int) -> Any:
    """An item line (`{decision_id, gold}`) with its line number under each question, as flat rows keep
    theirs."""
    if not isinstance(item, dict):
        return item
    gold = item.get("gold")
    return item | {LINES: {str(q): number for q in gold} if isinstance(gold, dict) and gold else {"": number}}


def _line(text: str, number: int) -> dict[str, Any]:
    try:
        line = json.loads(text)
    except json.JSONDecodeError as error:  # its own position is within the line: say which line of the file
        raise ValueError(f"line {number} is not JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(line, dict):
        raise ValueError(
            f"line {number} is JSON {type(line).__name__}, not an object: each line is "
            '{"decision_id", "question", "label"} or {"decision_id", "gold"}'
        )
    return line


def _grouped(rows: Iterable[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Flat (decision_id, question, label) rows, with their line numbers, as items, one per decision;
    unlabelled rows skipped. ValueError naming the first line that lacks a decision id, a question or a label
    field."""
    items: dict[str, dict[str, Any]] = {}
    for number, row in rows:
        question = row.get("question") or row.get("question_id")
        if not row.get("decision_id") or not question or "label" not in row:
            fields = ", ".join(_shown(key) for key, value in row.items() if value not in (None, "")) or "none"
            raise ValueError(
                f"line {number}: a labelled row needs decision_id, question and label (its filled "
                f"fields: {fields})"
            )
        label = row["label"]
        if label is None or (isinstance(label, str) and not label.strip()):
            continue
        decision_id = str(row["decision_id"])
        item = items.setdefault(decision_id, {"decision_id": decision_id, "gold": {}, LINES: {}})
        # A file's label as a table's cell reads (` 2.0 ` is the score level 2, as the API's 2.0 is).
        item["gold"][str(question)] = label_text(label) if isinstance(label, str) else label
        item[LINES][str(question)] = number
    return list(items.values())


def located(refused: FeedbackRefused, items: list[dict[str, Any]]) -> str:
    """A refusal of a file's items with each problem at the file's line (`line 6, question 'tone': ...`),
    where the items came from flat rows (`read_feedback_file` keeps their lines); as the API says it
    otherwise."""
    said = []
    for error in refused.errors:
        loc = error["loc"]
        index = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0 if len(items) == 1 else None
        lines = items[index].get(LINES) if index is not None and index < len(items) else None
        question = loc[-1] if "gold" in loc[:-1] else None
        if not lines:
            said.append(f"{'.'.join(map(str, loc))}: {error['msg']}")
        elif question is not None and question in lines:
            said.append(f"line {lines[question]}, question {question!r}: {error['msg']}")
        else:
            numbers = sorted(set(lines.values()))
            said.append(
                f"line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}: {error['msg']}"
            )
    return "; ".join(said)


def _error(loc: list[Any], message: str) -> dict[str, Any]:
    return {"loc": loc, "msg": message, "type": "value_error"}


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()
