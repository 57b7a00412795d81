"""Drift and label-free monitoring: served decisions compared with the rows the serving model trained on.

Each side becomes one frame with a row per decision (`features_frame`): the state's length in characters (as
the model reads it) and its kind (text, object, list, other JSON), the question mix (which questions, of which
type), and per question the option chosen and its top probability. The served side's answers are those the API
returned (the inference table); the reference side's are the same model's answers to its own training rows
(`stages.monitor.reference_rows`), so a change in what is chosen, or in how sure the model is, comes from the
traffic.

Evidently's data drift preset compares the two frames column by column and writes its HTML report
(`drift_report`). Without labels the model's calibrated top probability is its expected accuracy; it stands
beside the accuracy measured on the window's decisions that have feedback (`window_accuracy`). The latest
summary is written as JSON where the server reads its gauges (`write_latest`; `gauges.read_gauges`).

    columns = question_columns(reference)
    result = drift_report(features_frame(served, columns), features_frame(reference, columns), 0.5,
                          Path("drift.html"), window_accuracy(served, store.feedback()))
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import warnings
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pandas as pd
import pyarrow as pa

from pipeline.data.answers import answer_probabilities, chosen_option
from pipeline.data.contract import Question, judge_gold, parse_question, state_text
from pipeline.flywheel.gauges import LATEST

STATE_COLUMNS = ("state_chars", "state_kind", "question_mix")
NUMERIC_COLUMNS = ("state_chars",)
CHOSEN, CONFIDENCE = "chosen.", "confidence."  # the per-question columns: `chosen.<qid>`, `confidence.<qid>`


class DecisionRow(NamedTuple):
    """One decision as the monitor reads it: its state, questions as asked and wire answers."""

    decision_id: str | None
    state: Any
    questions: dict[str, Any]
    answers: dict[str, dict[str, Any]]


def served_rows(table: pa.Table) -> list[DecisionRow]:
    """The inference table's decisions (`Store.decisions`), their JSON text columns read."""
    columns = [table.column(name).to_pylist() for name in ("decision_id", "state", "questions", "answers")]
    return [
        DecisionRow(decision_id, orjson.loads(state), orjson.loads(questions), orjson.loads(answers))
        for decision_id, state, questions, answers in zip(*columns)
    ]


def question_columns(rows: Sequence[DecisionRow], limit: int = 20) -> list[str]:
    """The `limit` question ids the rows ask most (ties by id): the ones that get columns of their own."""
    counts = Counter(qid for row in rows for qid in row.answers)
    return sorted(counts, key=lambda qid: (-counts[qid], qid))[:limit]


def state_kind(state: Any) -> str:
    """text, object, list or other (a number, a boolean, null) for a state as the API received it."""
    if isinstance(state, str):
        return "text"
    return {dict: "object", list: "list"}.get(type(state), "other")


def top_probability(answer: dict[str, Any]) -> float:
    """The calibrated probability of the option an answer picks: how often such an answer should be right."""
    return max(answer_probabilities(answer))


def features_frame(rows: Sequence[DecisionRow], question_ids: Sequence[str]) -> pd.DataFrame:
    """One row per decision: state length and kind, question mix, and per question id the chosen option and
    its top probability (missing where the decision did not ask it)."""
    columns = [*STATE_COLUMNS, *(f"{prefix}{qid}" for qid in question_ids for prefix in (CHOSEN, CONFIDENCE))]
    return pd.DataFrame([_features(row, question_ids) for row in rows], columns=columns)


def _features(row: DecisionRow, question_ids: Sequence[str]) -> dict[str, Any]:
    mix = ",".join(
        f"{qid}:{spec.get('type') if isinstance(spec, dict) else '?'}"
        for qid, spec in sorted(row.questions.items())
    )
    features = {
        "state_chars": len(state_text(row.state)),
        "state_kind": state_kind(row.state),
        "question_mix": mix,
    }
    for qid in question_ids:
        answer = row.answers.get(qid)
        features[CHOSEN + qid] = chosen_option(answer) if answer else None
        features[CONFIDENCE + qid] = top_probability(answer) if answer else float("nan")
    return features


@dataclass(frozen=True)
class QuestionAccuracy:
    """One question over the window: answers, expected accuracy (mean top probability), and the accuracy
    measured on the answers that have feedback."""

    question: str
    decisions: int
    expected: float
    labelled: int
    expected_labelled: float | None
    """The mean top probability of the labelled answers alone: those labelled first (the least sure, say) may
    be harder than the window, so `measured` compares with this."""
    measured: float | None


def window_accuracy(rows: Sequence[DecisionRow], feedback: pa.Table) -> tuple[QuestionAccuracy, ...]:
    """Per question: expected accuracy over every answer in `rows`, and measured accuracy over the answers
    whose (decision_id, question_id) has gold in `feedback` (`Store.feedback`); gold that does not fit its
    question is not counted."""
    keys = zip(*(feedback.column(name).to_pylist() for name in ("decision_id", "question_id", "gold")))
    golds = {(decision_id, qid): gold for decision_id, qid, gold in keys}
    tops, judged = defaultdict(list), defaultdict(list)
    for row in rows:
        for qid, answer in row.answers.items():
            tops[qid].append(top_probability(answer))
            gold = golds.get((row.decision_id, qid))
            right = None if gold is None else answered_right(qid, row.questions.get(qid), answer, gold)
            if right is not None:
                judged[qid].append((tops[qid][-1], right))
    return tuple(_accuracy(qid, tops[qid], judged[qid]) for qid in sorted(tops))


def answered_right(qid: str, question: Any, answer: dict[str, Any], gold: str) -> bool | None:
    """Whether the answer picks the gold label (JSON text: a label, or {label, probabilities}); None when the
    gold cannot be read against the question."""
    judged = gold_label(qid, question, gold)
    return None if judged is None else judged[0].options[judged[1]] == chosen_option(answer)


def gold_label(qid: str, question: Any, gold: str) -> tuple[Question, int] | None:
    """The question as asked and the index of its gold option (`gold` JSON text: a label, or {label,
    probabilities}); None when the gold cannot be read against the question."""
    spec = parse_question(qid, question)
    if spec.question is None:
        return None
    try:
        _, _, judged = judge_gold(spec, orjson.loads(gold))
    except orjson.JSONDecodeError:
        return None
    return None if judged is None else (spec.question, judged.label)


def _accuracy(qid: str, tops: list[float], judged: list[tuple[float, bool]]) -> QuestionAccuracy:
    labelled = len(judged)
    return QuestionAccuracy(
        qid,
        len(tops),
        round(sum(tops) / len(tops), 4),
        labelled,
        round(sum(t for t, _ in judged) / labelled, 4) if labelled else None,
        round(sum(right for _, right in judged) / labelled, 4) if labelled else None,
    )


@dataclass(frozen=True)
class ColumnDrift:
    """One compared column: Evidently's method, its score (a p-value or a distance) and its verdict."""

    column: str
    method: str
    score: float
    drifted: bool


@dataclass(frozen=True)
class DriftResult:
    """A window judged against the reference: drifted columns, the share that decides, accuracy per
    question."""

    share: float
    """The share of compared columns Evidently found drifted."""
    threshold: float
    breached: bool
    """share >= threshold: the drift that is reported (as Evidently's own dataset-drift test judges it)."""
    columns: tuple[ColumnDrift, ...]
    not_compared: tuple[str, ...]
    """Columns empty on one side (a question the window never asked): the question mix column shows those."""
    window_decisions: int
    reference_decisions: int
    accuracy: tuple[QuestionAccuracy, ...] = ()
    html: str | None = None

    @property
    def drifted(self) -> list[str]:
        return [c.column for c in self.columns if c.drifted]

    def gauges(self) -> dict[str, float]:
        """The summary figures the server exposes (no age: that is the reader's)."""
        answers = sum(a.decisions for a in self.accuracy)
        labelled = sum(a.labelled for a in self.accuracy)
        figures = {
            "drift_share": self.share,
            "drifted_columns": float(len(self.drifted)),
            "labelled_decisions": float(labelled),
            "window_decisions": float(self.window_decisions),
        }
        if answers:
            figures["expected_accuracy"] = round(
                sum(a.expected * a.decisions for a in self.accuracy) / answers, 4
            )
        if labelled:
            right = sum(a.measured * a.labelled for a in self.accuracy if a.measured is not None)
            figures["measured_accuracy"] = round(right / labelled, 4)
        return figures

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"drifted": self.drifted, "gauges": self.gauges()}


def drift_report(
    current: pd.DataFrame,
    reference: pd.DataFrame,
    drift_share: float,
    html: Path | None = None,
    accuracy: tuple[QuestionAccuracy, ...] = (),
) -> DriftResult:
    """Evidently's data drift preset over the columns both frames have values in; its HTML report saved at
    `html`. `accuracy` (`window_accuracy`) travels with the result."""
    compared = [c for c in current.columns if current[c].notna().any() and reference[c].notna().any()]
    snapshot = _run_evidently(current[compared], reference[compared], drift_share, html)
    share, breached, columns = _read_snapshot(snapshot.dict())
    return DriftResult(
        share=share,
        threshold=drift_share,
        breached=breached,
        columns=columns,
        not_compared=tuple(c for c in current.columns if c not in compared),
        window_decisions=len(current),
        reference_decisions=len(reference),
        accuracy=accuracy,
        html=None if html is None else str(html),
    )


def _run_evidently(current: pd.DataFrame, reference: pd.DataFrame, drift_share: float, html: Path | None):
    with warnings.catch_warnings():
        # Deprecations inside evidently and the packages it imports (pandas' `dropna(inplace=True)`,
        # numpy.core, litestar, plotly), one per column or import: nothing this project can act on, so kept
        # out of its logs.
        warnings.simplefilter("ignore", DeprecationWarning)
        _allow_evidently_import()
        from evidently import DataDefinition, Dataset, Report
        from evidently.presets import DataDriftPreset

        numeric = [c for c in current.columns if c in NUMERIC_COLUMNS or c.startswith(CONFIDENCE)]
        definition = DataDefinition(
            numerical_columns=numeric, categorical_columns=[c for c in current.columns if c not in numeric]
        )
        report = Report([DataDriftPreset(drift_share=drift_share)], include_tests=True)
        snapshot = report.run(
            Dataset.from_pandas(current, data_definition=definition),
            Dataset.from_pandas(reference, data_definition=definition),
        )
        if html is not None:
            snapshot.save_html(str(html))  # evidently writes only when given a str
    return snapshot


def _allow_evidently_import() -> None:
    """evidently 0.7.23 imports `infer_dtype_from_object` from pandas' internals for a legacy column-type test
    this module never runs, and pandas 3 removed it, so `import evidently` fails. The name is put back as a
    function that raises if anything ever calls it: the import works and a real use fails loudly."""
    import pandas.core.dtypes.common as pandas_common

    if not hasattr(pandas_common, "infer_dtype_from_object"):
        pandas_common.infer_dtype_from_object = _removed_in_pandas_3


def _removed_in_pandas_3(dtype: Any) -> type:
    raise NotImplementedError(
        "pandas.core.dtypes.common.infer_dtype_from_object was removed in pandas 3; evidently's "
        "legacy column-type test needs it"
    )


def _read_snapshot(found: dict[str, Any]) -> tuple[float, bool, tuple[ColumnDrift, ...]]:
    """(share drifted, dataset drift, per column) from a snapshot's `dict()`: a `DriftedColumnsCount` and its
    `lt` test, and a `ValueDrift` per column with its `drift` test."""
    failed = {(t["id"], t["metric_config"]["metric_id"]) for t in found["tests"] if _status(t) == "FAIL"}
    share, breached, columns = 0.0, False, []
    for metric in found["metrics"]:
        kind = metric["config"]["type"].rpartition(":")[2]
        if kind == "DriftedColumnsCount":
            share, breached = float(metric["value"]["share"]), ("lt", metric["id"]) in failed
        elif kind == "ValueDrift":
            config = metric["config"]
            columns.append(
                ColumnDrift(
                    config["column"],
                    config["method"],
                    round(float(metric["value"]), 6),
                    ("drift", metric["id"]) in failed,
                )
            )
    return share, breached, tuple(columns)


def _status(test: dict[str, Any]) -> str:
    status = test["status"]
    return str(getattr(status, "value", status))


def drift_markdown(result: DriftResult, model: str, window: str) -> str:
    """The result as markdown: the verdict, the columns, and expected against measured accuracy per
    question."""
    verdict = "**drift**" if result.breached else "no drift"
    lines = [
        f"{model}, {window}: {verdict}: {len(result.drifted)} of {len(result.columns)} columns drifted "
        f"(share {result.share:.2f}, threshold {result.threshold:.2f}); {result.window_decisions} decisions "
        f"against {result.reference_decisions} reference rows.",
        "",
        "| column | method | score | drifted |",
        "|---|---|---:|---|",
    ]
    lines += [
        f"| {c.column} | {c.method} | {c.score:.4g} | {'yes' if c.drifted else ''} |" for c in result.columns
    ]
    lines += [
        "",
        "| question | answers | expected accuracy | labelled | expected (labelled) | measured |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {a.question} | {a.decisions} | {a.expected:.4f} | {a.labelled} | {_figure(a.expected_labelled)} "
        f"| {_figure(a.measured)} |"
        for a in result.accuracy
    ]
    return "\n".join(lines)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def write_latest(
    folder: str | Path,
    result: DriftResult,
    model: str,
    window_start: dt.datetime,
    window_end: dt.datetime,
    now: dt.datetime | None = None,
    certificates: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """The summary at `folder/monitor/latest.json`, written beside and renamed: a reader never sees half of
    it. `certificates` (per question, `CertificateCheck.to_dict()`) are kept beside the drift gauges."""
    target = Path(folder) / LATEST
    target.parent.mkdir(parents=True, exist_ok=True)
    written = (now or dt.datetime.now(dt.UTC)).isoformat()
    summary = {
        "model": model,
        "window_start": window_start.isoformat(),
        "window_end": window_end.isoformat(),
        "written_at": written,
        "gauges": result.gauges(),
        "result": result.to_dict(),
        "certificates": certificates or {},
    }
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".latest-", delete=False) as tmp:
        json.dump(summary, tmp)
    os.replace(tmp.name, target)
    return target
