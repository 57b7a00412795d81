"""`decision compare A B`: two models scored as served on the same decision rows and compared decision by
decision, per question, with a paired record bootstrap (`scoring.paired.per_question_differences`).

A and B are export folders (a `finetune` or a run's export) or registered versions (`models:/NAME@ALIAS`,
`models:/NAME/VERSION`). The rows are DATA's held-out split under `validate` (the rows a run of the same data
reports on and the gate compares on) or, with `all_rows`, every usable row. Each model's certificates are
measured on the same rows (`evaluate.automation_on`): coverage and realised error with 95% intervals.

    decision compare models:/decision-model@champion models:/decision-model/7 --data data/processed/vader.jsonl
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ValidateConfig
from pipeline.data.split import TrainSource
from pipeline.families import is_complete_export
from pipeline.families.base import ModelLayoutError
from pipeline.mlops.registry import RegistryError, registered_version
from pipeline.scoring.paired import QuestionDifference, per_question_differences
from pipeline.stages.evaluate import automation_on, score_records
from pipeline.stages.predict import model_folder


@dataclass(frozen=True)
class Comparison:
    """What `decision compare` prints: the two models, the rows, and one difference per question (all
    first)."""

    a: str
    b: str
    data: str
    rows: str
    """Which rows: "held-out" (DATA's held-out split) or "all"."""
    records: int
    confidence: float
    questions: list[QuestionDifference] = field(default_factory=list)
    served_as: tuple[str, str] = ("", "")
    """A's and B's names as the API serves them: NAME/VERSION for a registered version (an alias resolved)."""
    automation: tuple[dict[str, Any], dict[str, Any]] | None = None
    """What A's and B's certificates automate on the rows (`evaluate.automation_on`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "a_served_as": self.served_as[0],
            "b_served_as": self.served_as[1],
            "data": self.data,
            "rows": self.rows,
            "records": self.records,
            "confidence": self.confidence,
            "questions": [q.to_dict() for q in self.questions],
            "automation": None if self.automation is None else dict(zip(("a", "b"), self.automation)),
        }


# A plain base would be scored with a fresh, untrained head.
NOT_AN_EXPORT = (
    "not an export (a base, or a fine-tune not exported yet?); compare exports: a run's export/ folder, "
    "or decision finetune --out"
)


def _check_present(side: str, source: str) -> None:
    """RegistryError or ModelLayoutError naming `side` where `source` is neither a registered version nor an
    export folder."""
    try:
        if registered_version(source) is not None:
            return
    except RegistryError as error:
        raise RegistryError(f"{side} ({source}): {error}") from error
    if not Path(source).is_dir():
        raise ModelLayoutError(f"{side} ({source}): no such folder (or use models:/NAME@ALIAS)")
    if not is_complete_export(Path(source)):
        raise ModelLayoutError(f"{side} ({source}): {NOT_AN_EXPORT}")


def compare_models(
    a: str,
    b: str,
    data: str | Path,
    split: ValidateConfig = ValidateConfig(),
    all_rows: bool = False,
    confidence: float = 0.95,
    device: str = "cpu",
    report: Callable[[str], None] | None = None,
) -> Comparison:
    """Score `a` and `b` on the same rows of `data` as served, and compare them per question. ValueError for
    data with no rows to compare on; RegistryError or ModelLayoutError, naming A or B, for a model that cannot
    be read."""
    say = report or (lambda line: None)
    for side, source in (("A", a), ("B", b)):  # both, before the data is read and A is scored
        _check_present(side, source)
    validated = TrainSource(data, split_config=split).validated()
    records = validated.split.every_record() if all_rows else validated.split.heldout
    if not records:
        usable = len(validated.split.every_record())
        raise ValueError(
            f"{data}: no held-out rows to compare on ({usable} usable row(s), too few for a held-out "
            "split under validate); give --all-rows to compare on every usable row"
        )
    scored, names, automation = [], [], []
    for side, source in (("A", a), ("B", b)):
        try:
            with model_folder(source) as (name, folder):
                if not is_complete_export(folder):  # a registered version is fetched only here
                    raise ModelLayoutError(f"{folder}: {NOT_AN_EXPORT}")
                say(f"scoring {sum(len(r.decisions) for r in records):,} decisions with {name}")
                decisions, _, probabilities, _ = score_records(folder, records, device)
                automation.append(automation_on(folder, records, decisions, probabilities))
        except (RegistryError, ModelLayoutError) as error:  # which of the two could not be read
            raise type(error)(f"{side} ({source}): {error}") from error
        scored.append((decisions, probabilities))
        names.append(name)
    differences = per_question_differences(scored[0], scored[1], confidence)
    return Comparison(
        a=a,
        b=b,
        data=str(data),
        rows="all" if all_rows else "held-out",
        records=len(records),
        confidence=confidence,
        questions=differences,
        served_as=(names[0], names[1]),
        automation=(automation[0], automation[1]),
    )
