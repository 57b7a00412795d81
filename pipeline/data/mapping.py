"""Turn a plain table into decision rows: which column is the state, which columns are gold for which
question.

A mapping (a YAML file, a params.yaml `validate.mapping`, or the flags of the common case) names the state
column (several columns make a JSON-object state `{column: value}`) and, per question, the column holding its
labels, its type, instructions and options: given, or taken from the labels found; optionally an `id` column
and a `group` column (rows with equal cells are held out together). It is applied to the cells of the row
slice only (the slice is taken on the Arrow table first), and the mapped rows then go through validation like
the rows of any decision file, so unusable ones are counted by reason.

    decision map --data tickets.csv --state-column text --label-column label --preview 5
    decision validate tickets.csv --mapping tickets.mapping.yaml
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.contract import (
    MAX_CHOICE_OPTIONS,
    MAX_LEVEL_DIGITS,
    MAX_SCORE_LEVELS,
    QUESTION_TYPES,
    criteria_of,
)
from pipeline.data.read import RawColumns, RowSlice, TableCells, read_cells
from pipeline.yaml_files import YamlFileError, load_yaml_file

_MAPPING_KEYS = ("state", "questions", "id", "group")
_QUESTION_KEYS = ("column", "type", "instructions", "options")
# Label cells a yes/no (noul) question accepts, compared in lower case; booleans too.
NOUL_LABELS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


class MappingError(ValueError):
    """A mapping that cannot apply (an unknown key, a wrong type, a column the table lacks, a label outside
    the given options); the message names the thing and what to do."""


@dataclass(frozen=True)
class QuestionMapping:
    """One question asked of every row: its gold labels are the cells of `column`."""

    column: str
    type: str = "choice"
    instructions: str | None = None
    options: tuple[str, ...] | None = None
    """Label values (as text) in the model's order; a score's levels low to high. None: the labels found."""
    descriptions: tuple[str | None, ...] | None = None
    """One per option (None: no description); noul: (false, true)."""


@dataclass(frozen=True)
class Mapping:
    """A table's columns as decision rows: the state and the questions (with their gold columns)."""

    state: str | tuple[str, ...]
    """One column (its cell is the state), or several (the state is the object {column: cell})."""
    questions: dict[str, QuestionMapping]
    id: str | None = None
    """A column that names each row (kept in `decision map` output, ignored by training)."""
    group: str | None = None
    """A column whose equal cells make a group: its rows go to one side of the held-out and validation
    splits."""

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the mapping reads, each once."""
        state = (self.state,) if isinstance(self.state, str) else self.state
        named = (
            *state,
            *(q.column for q in self.questions.values()),
            *([self.id] if self.id else []),
            *([self.group] if self.group else []),
        )
        return tuple(dict.fromkeys(named))

    @property
    def unlabelled_columns(self) -> tuple[str, ...]:
        """The columns scoring reads: the state's and the id's. Label columns are not read (unlabelled rows
        have none)."""
        state = (self.state,) if isinstance(self.state, str) else self.state
        return tuple(dict.fromkeys((*state, *([self.id] if self.id else []))))


@dataclass(frozen=True)
class MappedColumns:
    """A mapped slice: decision cells for validation, the mapping with every option fixed, each question's
    label counts (by label text) and the row ids where the mapping names an id column."""

    columns: RawColumns
    mapping: Mapping
    counts: dict[str, dict[str, int]]
    ids: list[Any] | None = None


def load_mapping(value: str | Path | dict) -> Mapping:
    """A mapping from a YAML file (a path) or an already parsed one (a dict, e.g. inline in params.yaml)."""
    if isinstance(value, dict):
        return mapping_from_dict(value, "mapping")
    return mapping_from_dict(mapping_content(value), str(value))


def mapping_content(value: str | Path | dict) -> Any:
    """What a mapping says, as parsed YAML: a file's content (so a run keyed on it changes when the file is
    edited), or the dict itself."""
    if isinstance(value, dict):
        return value
    path = Path(value)
    if path.is_dir():
        raise MappingError(f"mapping {path}: a folder; give the mapping's YAML file (docs/data-format.md)")
    if not path.is_file():
        raise MappingError(f"mapping {path}: no such file (write one as docs/data-format.md shows)")
    try:
        return load_yaml_file(path)
    except YamlFileError as error:  # not UTF-8, not YAML, a question or column key given twice
        raise MappingError(f"mapping {error}") from None


def flags_mapping(
    state_columns: list[str],
    label_column: str,
    question: str | None = None,
    type: str = "choice",
    instructions: str | None = None,
    options: list[str] | None = None,
) -> dict[str, Any]:
    """The mapping the flags of the common case stand for (one or more state columns, one question whose
    labels are `label_column`), as YAML would write it: `load_mapping` checks it."""
    raw_question = {"column": label_column, "type": type, "instructions": instructions, "options": options}
    state = state_columns[0] if len(state_columns) == 1 else list(state_columns)
    return {"state": state, "questions": {question or label_column: raw_question}}


def mapping_from_dict(raw: Any, where: str) -> Mapping:
    """Check a parsed mapping and build it; every problem is collected and raised once, each naming its
    key."""
    if not isinstance(raw, dict):
        raise MappingError(f"{where}: expected a mapping with keys state and questions, got {raw!r:.80}")
    problems = _unknown_keys(raw, _MAPPING_KEYS, where)
    state = raw.get("state")
    if not (_is_name(state) or (isinstance(state, list) and state and all(map(_is_name, state)))):
        problems.append(f"{where}: state: expected a column name or a list of column names, got {state!r}")
    questions = raw.get("questions")
    if not isinstance(questions, dict) or not questions:
        problems.append(
            f"{where}: questions: expected {{question_id: {{column, type, ...}}}}, got {questions!r}"
        )
        questions = {}
    for key in ("id", "group"):
        if raw.get(key) is not None and not _is_name(raw.get(key)):
            problems.append(f"{where}: {key}: expected a column name, got {raw.get(key)!r}")
    built = {}
    for qid, spec in questions.items():
        if not str(qid).strip():
            problems.append(f"{where}: questions: a question id is empty; name each question")
        question, found = _question(str(qid), spec, f"{where}: questions.{qid}")
        problems += found
        built[str(qid)] = question
    problems += _columns_used_twice(state, built, where) if not problems else []
    if problems:
        raise MappingError("; ".join(problems))
    return Mapping(state if isinstance(state, str) else tuple(state), built, raw.get("id"), raw.get("group"))


def _columns_used_twice(
    state: str | list[str], questions: dict[str, QuestionMapping], where: str
) -> list[str]:
    """A state column named twice, or a label column that is also read as the state (every row would be its
    own option): each a mistake a run would train on silently."""
    states = [state] if isinstance(state, str) else list(state)
    problems = [
        f"{where}: state: column {name!r} named twice"
        for name in sorted({n for n in states if states.count(n) > 1})
    ]
    problems += [
        f"{where}: questions.{qid}.column: {q.column!r} is also the state; a question's labels come "
        "from a column of their own"
        for qid, q in questions.items()
        if q.column in states
    ]
    return problems


def _question(qid: str, spec: Any, where: str) -> tuple[QuestionMapping | None, list[str]]:
    if not isinstance(spec, dict):
        return None, [f"{where}: expected {{column, type, instructions, options}}, got {spec!r:.80}"]
    problems = _unknown_keys(spec, _QUESTION_KEYS, where)
    column, qtype, instructions = spec.get("column"), spec.get("type") or "choice", spec.get("instructions")
    if not _is_name(column):
        problems.append(f"{where}.column: expected the name of the column holding its labels, got {column!r}")
    if qtype not in QUESTION_TYPES:
        problems.append(f"{where}.type: expected one of {', '.join(QUESTION_TYPES)}, got {qtype!r}")
    if instructions is not None and not isinstance(instructions, str):
        problems.append(f"{where}.instructions: expected text, got {instructions!r}")
    options, descriptions, problem = _options(spec.get("options"), qtype)
    if problem:
        problems.append(f"{where}.options: {problem}")
    if problems:
        return None, problems
    return QuestionMapping(column, qtype, instructions, options, descriptions), []


def _options(raw: Any, qtype: str) -> tuple[tuple | None, tuple | None, str | None]:
    """(option texts, descriptions, problem) from a mapping's `options`: a list of labels, or {label:
    text}."""
    if raw is None:
        return (("false", "true"), (None, None), None) if qtype == "noul" else (None, None, None)
    if qtype == "noul":
        keys = {_noul_key(k): v for k, v in raw.items()} if isinstance(raw, dict) else None
        if (
            keys is None
            or not set(keys) <= {"false", "true"}
            or not all(_is_description(v) for v in keys.values())
        ):
            return (
                None,
                None,
                f"a noul question's options are {{true: description, false: description}}, got {raw!r}",
            )
        return ("false", "true"), (keys.get("false"), keys.get("true")), None
    if isinstance(raw, list) and raw and all(_is_label(v) for v in raw):
        texts = tuple(question_label(v, qtype) for v in raw)
        return texts, texts if qtype == "score" else (None,) * len(texts), _repeated(texts)
    if isinstance(raw, dict) and raw and all(map(_is_label, raw)) and all(map(_is_description, raw.values())):
        texts = tuple(question_label(v, qtype) for v in raw)
        return texts, tuple(raw.values()), _repeated(texts)
    return None, None, f"expected a list of labels or {{label: description}}, got {raw!r:.80}"


def _noul_key(key: Any) -> str:
    """A noul option's key as false/true: `true`, `yes` or `1` alike (the labels a noul question reads)."""
    text = label_text(key).lower()
    return _noul_option(text) if text in NOUL_LABELS else text


def _repeated(texts: tuple[str, ...]) -> str | None:
    twice = [t for t, n in Counter(texts).items() if n > 1]
    return f"{', '.join(map(repr, twice))} given twice" if twice else None


def _unknown_keys(raw: dict, known: tuple[str, ...], where: str) -> list[str]:
    unknown = [str(k) for k in raw if k not in known]
    return [f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})"] if unknown else []


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _is_label(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not is_blank(value)


def _is_description(value: Any) -> bool:
    return value is None or isinstance(value, str)


WHOLE_NUMBER_TEXT = re.compile(r"^(-?\d+)\.0+$")  # "3.0": the whole number 3, as a float cell 3.0 reads


def is_blank(value: Any) -> bool:
    """A cell that holds no label: null, NaN or empty text."""
    return (
        value is None
        or (isinstance(value, str) and not value.strip())
        or (isinstance(value, float) and math.isnan(value))
    )


def label_text(value: Any) -> str:
    """A label cell as the text its option is named by: `3`, `3.0`, `"3"` and `"3.0"` alike (a CSV's cells are
    text), booleans `true`/`false`, text without the spaces around it (`" positive"` is `positive`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    text = str(value).strip()
    integral = WHOLE_NUMBER_TEXT.match(text)
    return integral.group(1) if integral else text


WHOLE_NUMBER = re.compile(r"^[-+]?[0-9]+$")


def question_label(value: Any, qtype: str) -> str:
    """A label cell as its question's option text: a score's whole numbers by value (`02`, `+2` and `2` are
    level 2), every other label as `label_text` gives it (choice ids such as zip codes keep their zeros)."""
    text = label_text(value)
    if qtype == "score" and WHOLE_NUMBER.match(text) and len(text) <= MAX_LEVEL_DIGITS:
        return str(int(text))
    return text


def read_mapped(
    path: str | Path, mapping: Mapping, row_slice: RowSlice = RowSlice()
) -> tuple[MappedColumns, int]:
    """The slice of a table mapped to decision cells (only the mapped columns are read), and the file's row
    count. Raises MappingError for a column the table lacks or a label outside given options."""
    table = read_cells(path, mapping.columns, row_slice)
    require_columns(mapping.columns, table.columns, str(path))
    where = str(path) if row_slice == RowSlice() else f"rows {row_slice} of {path}"
    return map_cells(table, mapping, where), table.total


def require_columns(names: tuple[str, ...], found: tuple[str, ...], where: str) -> None:
    """MappingError naming each of `names` not among the table's columns `found`, and the columns it has."""
    missing = [name for name in names if name not in found]
    if missing and not found:
        raise MappingError(
            f"{where}: the mapping names column(s) {', '.join(map(repr, missing))}, and no row of it has "
            "columns: JSON lines hold one JSON object per line (a JSON array or indented JSON is not JSONL; "
            "pandas writes it with to_json(orient='records', lines=True))"
        )
    if missing:
        raise MappingError(
            f"{where}: the mapping names column(s) {', '.join(map(repr, missing))} that the table lacks (its "
            f"columns: {', '.join(found[:20])}); fix the mapping's state or column"
        )


def map_cells(table: TableCells, mapping: Mapping, where: str = "the table") -> MappedColumns:
    """Decision cells from a table's cells: the state per row, the same questions on every row, and gold from
    each question's column (a blank cell: no gold for that question in that row)."""
    cells = table.cells
    counts = {qid: _label_counts(qid, q, cells[q.column], where) for qid, q in mapping.questions.items()}
    fixed = replace(
        mapping,
        questions={qid: _fixed_options(qid, q, counts[qid], where) for qid, q in mapping.questions.items()},
    )
    questions = orjson.dumps(request_questions(fixed)).decode()
    gold_columns = {qid: _gold_cells(cells[q.column], q) for qid, q in fixed.questions.items()}
    n = len(cells[mapping.columns[0]])
    gold = [{qid: g[i] for qid, g in gold_columns.items() if g[i] is not None} for i in range(n)]
    group = cells[mapping.group] if mapping.group else None
    columns = RawColumns(state_cells(cells, mapping.state), [questions] * n, gold, group)
    return MappedColumns(columns, fixed, counts, cells[mapping.id] if mapping.id else None)


def _cell_key(value: Any) -> Any:
    """A label cell as a dict key: a boolean as its text (Python counts `true` and `1` as one key), a list or
    an object as its JSON text in a tuple, which no label cell is (Arrow hands over no tuples)."""
    if isinstance(value, bool):
        return label_text(value)
    return (label_text(value),) if isinstance(value, (dict, list)) else value


def _label_counts(qid: str, question: QuestionMapping, values: list[Any], where: str) -> dict[str, int]:
    """How often each label occurs, by its text (distinct cells are converted once, not every row).
    MappingError for cells that hold a list or an object: no question type has such a label."""
    merged: Counter[str] = Counter()
    compound: Counter[str] = Counter()
    for key, count in Counter(map(_cell_key, values)).items():
        if isinstance(key, tuple):
            compound[key[0]] += count
        elif not is_blank(key):
            merged[question_label(key, question.type)] += count
    if compound:
        shown = ", ".join(
            f"{t[:60]}{'...' if len(t) > 60 else ''} ({n} row{'s' if n > 1 else ''})"
            for t, n in compound.most_common(3)
        )
        raise MappingError(
            f"question {qid!r}: column {question.column!r} holds lists or objects, not labels, in {where}: "
            f"{shown}; a label is one text, number or true/false per cell (for several tags per row, map a "
            "noul question per tag)"
        )
    return dict(merged)


def _fixed_options(
    qid: str, question: QuestionMapping, counts: dict[str, int], where: str
) -> QuestionMapping:
    """The question with its options fixed: given ones checked against the labels found, or the labels
    found."""
    if question.type == "noul":
        unknown = {t: n for t, n in counts.items() if t.strip().lower() not in NOUL_LABELS}
        _refuse_unknown(
            qid, question, unknown, where, "a noul question's labels are true/false, yes/no or 1/0"
        )
        return question
    if question.options is not None:
        unknown = {t: n for t, n in counts.items() if t not in question.options}
        _refuse_unknown(
            qid,
            question,
            unknown,
            where,
            "add them to its options, or leave options out to take them from the labels",
        )
        return question
    if not counts:
        raise MappingError(
            f"question {qid!r}: column {question.column!r} holds no label in {where}; give its "
            "options in the mapping"
        )
    options = (
        _levels(qid, question, counts) if question.type == "score" else _choice_options(qid, question, counts)
    )
    descriptions = options if question.type == "score" else (None,) * len(options)
    return replace(question, options=options, descriptions=descriptions)


def unlabelled_mapping(mapping: Mapping, trained: dict[str, list[str]] | None, model: str) -> Mapping:
    """The mapping with every question's options fixed without reading a label (unlabelled rows have none):
    the options it gives, a noul's false/true, else the options `model` records it was trained with
    (`trained`, by question id: its manifest's `mapping_options`). MappingError naming every question left
    without options."""
    trained = trained or {}
    fixed, unknown = {}, []
    for qid, question in mapping.questions.items():
        if question.options is None and qid in trained:
            options = tuple(map(label_text, trained[qid]))
            descriptions = options if question.type == "score" else (None,) * len(options)
            question = replace(question, options=options, descriptions=descriptions)
        if question.options is None:
            unknown.append(f"{qid!r} (labels in column {question.column!r})")
        fixed[qid] = question
    if unknown:
        raise MappingError(
            f"question(s) {', '.join(unknown)} take their options from the labels, which unlabelled rows do "
            f"not have, and {model} does not record the options it was trained with; list them in the "
            "mapping (options: [...]) or with --options"
        )
    return replace(mapping, questions=fixed)


def _refuse_unknown(
    qid: str, question: QuestionMapping, unknown: dict[str, int], where: str, fix: str
) -> None:
    if unknown:
        shown = ", ".join(
            f"{t!r} ({n} row{'s' if n > 1 else ''})"
            for t, n in sorted(unknown.items(), key=lambda i: -i[1])[:10]
        )
        raise MappingError(
            f"question {qid!r}: column {question.column!r} holds labels that are not among its "
            f"options in {where}: {shown}; {fix}"
        )


def _choice_options(qid: str, question: QuestionMapping, counts: dict[str, int]) -> tuple[str, ...]:
    """A choice's options from its labels, in order; MappingError where there are more than a choice may have
    (an id, a free-text or an amount column taken for a label: every decision would be skipped)."""
    if len(counts) > MAX_CHOICE_OPTIONS:
        raise MappingError(
            f"question {qid!r}: column {question.column!r} holds {len(counts):,} different labels, and a "
            f"choice has at most {MAX_CHOICE_OPTIONS} options; is it the label column? (the most common: "
            f"{', '.join(repr(t) for t, _ in Counter(counts).most_common(5))})"
        )
    return tuple(sorted(counts, key=_option_order))


def _levels(qid: str, question: QuestionMapping, counts: dict[str, int]) -> tuple[str, ...]:
    """A score's levels from its labels: whole numbers give every level from the smallest to the largest found
    (ratings 1..5 stay five levels when no row says 4), other numbers the labels found by value. Text labels
    are refused (MappingError): their order ("low", "high", "medium") is the user's to give, not the
    alphabet's; so are labels that would make more levels than a score has."""
    words = [text for text in counts if _option_order(text)[0]]
    if words:
        raise MappingError(
            f"question {qid!r} is a score and column {question.column!r} holds labels that are not numbers "
            f"({', '.join(map(repr, sorted(words)[:10]))}): list its levels lowest first in the mapping "
            "(options: [...]) or with --options"
        )
    whole = all(WHOLE_NUMBER.match(text) and len(text) <= MAX_LEVEL_DIGITS for text in counts)
    low, high = min(counts, key=_option_order), max(counts, key=_option_order)
    levels = int(high) - int(low) + 1 if whole else len(counts)
    if levels > MAX_SCORE_LEVELS:
        said = f"span {low}..{high}" if whole else f"are {len(counts)} different numbers"
        raise MappingError(
            f"question {qid!r} is a score and the labels of column {question.column!r} {said}: {levels:,} "
            f"levels, and a score has at most {MAX_SCORE_LEVELS}; list its levels in the mapping (options: "
            "[...]), or map it as a choice"
        )
    if whole:
        return tuple(str(level) for level in range(int(low), int(high) + 1))
    return tuple(sorted(counts, key=_option_order))


def _option_order(text: str) -> tuple:
    """Numbers by value (so score levels 1..10 stay in order), then text."""
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def request_questions(mapping: Mapping) -> dict[str, dict[str, Any]]:
    """The questions every mapped row asks, as the row format and a Decision API request write them; each
    question's options fixed (by `map_cells` or `unlabelled_mapping`)."""
    return {qid: _question_json(q) for qid, q in mapping.questions.items()}


def _question_json(question: QuestionMapping) -> dict[str, Any]:
    """The question as the row format writes it (docs/data-format.md, "Questions"); a score's level the
    mapping leaves undescribed is described by its label."""
    descriptions = question.descriptions
    if question.type == "score":
        descriptions = tuple(d if d is not None else o for o, d in zip(question.options, descriptions))
    criteria = criteria_of(question.type, question.options, descriptions)
    return {"type": question.type, "instructions": question.instructions, "criteria": criteria}


def _gold_cells(values: list[Any], question: QuestionMapping) -> list[Any]:
    """Each row's gold entry for the question (None for a blank cell): an option id, a level, or
    true/false."""
    if question.type == "noul":
        entry = lambda text: NOUL_LABELS[text.strip().lower()]  # noqa: E731
    elif question.type == "score":
        entry = {text: level for level, text in enumerate(question.options)}.__getitem__
    else:
        entry = lambda text: text  # noqa: E731
    cache: dict[Any, Any] = {}
    gold = []
    for value in values:
        key = _cell_key(value)
        if key not in cache:
            cache[key] = None if is_blank(key) else entry(question_label(key, question.type))
        gold.append(cache[key])
    return gold


def state_cells(cells: dict[str, list[Any]], state: str | tuple[str, ...]) -> list[Any]:
    """The state per row: the one column's cell, or {column: cell} (None when every cell is blank)."""
    if isinstance(state, str):
        return cells[state]
    values = zip(*(cells[name] for name in state))
    return [None if all(map(is_blank, row)) else dict(zip(state, row)) for row in values]


def decision_rows(mapped: MappedColumns, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` mapped rows (all with None) as the row format writes them, `id` first where
    mapped."""
    columns = mapped.columns
    count = len(columns) if limit is None else min(limit, len(columns))
    questions = orjson.loads(columns.questions[0]) if count else {}
    ids = mapped.ids if mapped.ids is not None else None
    return [
        ({"id": ids[i]} if ids is not None else {})
        | {"state": columns.state[i], "questions": questions, "gold": columns.gold[i]}
        | ({"group": columns.group[i]} if columns.group is not None else {})
        for i in range(count)
    ]


def write_rows(mapped: MappedColumns, out: str | Path) -> Path:
    """Write the mapped rows as a decision file (`.jsonl`, or `.parquet` with JSON-text cells), written beside
    and renamed into place, so a failed write never leaves half a file at `out`."""
    out = Path(out)
    if out.suffix.lower() not in (".jsonl", ".parquet"):
        raise MappingError(f"{out}: write mapped rows to a .jsonl or .parquet file")
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(f".{out.name}.partial")
    try:
        if out.suffix.lower() == ".jsonl":
            _write_jsonl(mapped, staged)
        else:
            _write_parquet(mapped, staged)
        os.replace(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    return out


def _write_jsonl(mapped: MappedColumns, path: Path) -> None:
    columns = mapped.columns
    questions = orjson.Fragment(columns.questions[0]) if len(columns) else None
    with path.open("wb") as handle:
        for i in range(len(columns)):
            row = {"id": mapped.ids[i]} if mapped.ids is not None else {}
            row |= {"state": columns.state[i], "questions": questions, "gold": columns.gold[i]}
            if columns.group is not None:
                row["group"] = columns.group[i]
            handle.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def _write_parquet(mapped: MappedColumns, path: Path) -> None:
    columns = mapped.columns

    def text(value: Any) -> Any:
        return value if isinstance(value, str) or value is None else orjson.dumps(value).decode()

    table = {"id": _arrow_column(mapped.ids)} if mapped.ids is not None else {}
    table |= {
        "state": pa.array([text(state) for state in columns.state], pa.large_string()),
        "questions": pa.array(columns.questions, pa.large_string()),
        "gold": pa.array([orjson.dumps(gold).decode() for gold in columns.gold], pa.large_string()),
    }
    if columns.group is not None:
        table["group"] = _arrow_column(columns.group)
    pq.write_table(pa.table(table), path)


def _arrow_column(values: list[Any]) -> pa.Array:
    """An id or group column as Arrow types it, or as text where its cells mix types (`1` beside `"B-2"`)."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([None if v is None else label_text(v) for v in values], pa.large_string())


def option_counts(mapped: MappedColumns) -> dict[str, dict[str, int]]:
    """Per question, how many rows give each option (in model order; a noul's labels counted as
    false/true)."""
    counted = {}
    for qid, question in mapped.mapping.questions.items():
        by_option = Counter()
        for text, count in mapped.counts[qid].items():
            by_option[_noul_option(text) if question.type == "noul" else text] += count
        counted[qid] = {option: by_option[option] for option in question.options}
    return counted


def _noul_option(text: str) -> str:
    return "true" if NOUL_LABELS[text.strip().lower()] else "false"
