"""The register and promotion-gate stages: a new version gets `challenger`; `champion` moves through the gate.

The gate scores the current champion and the candidate now, as registered and served, on the same held-out
decisions (any family), compares them by a paired bootstrap on NLL (`pipeline.scoring.paired`) and decides
(`pipeline.mlops.promotion.gate`); the verdict, its reasons and the comparison are tagged on the version.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import PromoteConfig
from pipeline.data.contract import Record
from pipeline.mlops.promotion import (
    CHALLENGER,
    CHAMPION,
    GATE_QUESTIONS_TAG,
    GATE_REASONS_TAG,
    GATE_TAG,
    current,
    gate,
    set_alias,
)
from pipeline.mlops.registry import client, download_version, register_export
from pipeline.scoring.paired import (
    PairedComparison,
    QuestionDifference,
    paired_comparison,
    per_question_differences,
)
from pipeline.stages.evaluate import score_heldout


def register_stage(export_dir: str | Path, name: str, run_id: str, tags: dict[str, str]) -> str:
    """Register the export as a new version (or find the one with the same idempotency key); it gets
    `challenger`."""
    version = register_export(export_dir, name, run_id, tags)
    set_alias(name, CHALLENGER, version, "new version")
    return version


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict on a version, with every reason, and where `champion` points after it."""

    promote: bool
    reasons: list[str]
    champion: str | None
    previous_champion: str | None = None
    comparison: dict[str, Any] | None = None
    """Champion and challenger scored now on the same decisions (None: no champion yet)."""
    questions: list[dict[str, Any]] = field(default_factory=list)
    """The same comparison per question (A the champion, B the challenger): accuracy and NLL gains with
    intervals."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def promotion_stage(
    name: str,
    version: str,
    calibrated: dict[str, float],
    smoke_passed: bool,
    heldout: list[Record],
    config: PromoteConfig,
    learning_warnings: list[str] | None = None,
    unpinned: bool = False,
    bag_of_words: float | None = None,
) -> GateResult:
    """Gate `version` against the champion, both scored now on the run's `heldout` records; move `champion`
    when it passes.

    `unpinned`: the version was trained with --allow-unpinned, and the gate holds it. `bag_of_words`: the
    run's bag of words' held-out accuracy (`promote.min_accuracy_over_bag_of_words` gates on it)."""
    champion_version = current(name, CHAMPION)
    if champion_version == version:
        return GateResult(False, ["already the champion"], version, version)
    comparison, questions = None, []
    if champion_version is not None:
        comparison, questions = compare_versions(
            name, champion_version, version, heldout, config.nll_confidence
        )
    worse = [q.question for q in questions[1:] if q.b_less_accurate]  # [0] is all questions together
    verdict = gate(
        calibrated, comparison, smoke_passed, config, learning_warnings, unpinned, worse, bag_of_words
    )
    tags = {GATE_TAG: "promote" if verdict.promote else "hold", GATE_REASONS_TAG: "; ".join(verdict.reasons)}
    if comparison is not None:
        tags |= {f"gate_{k}": str(v) for k, v in comparison.to_dict().items()}
        tags[GATE_QUESTIONS_TAG] = "; ".join(
            f"{q.question}: {q.accuracy_gain:+.4f} ({q.verdict})" for q in questions[1:]
        )
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)
    if verdict.promote:
        set_alias(name, CHAMPION, version, "promotion gate: " + "; ".join(verdict.reasons))
    return GateResult(
        verdict.promote,
        verdict.reasons,
        current(name, CHAMPION),
        champion_version,
        comparison and comparison.to_dict(),
        [q.to_dict() for q in questions[1:]],
    )


def compare_versions(
    name: str, champion: str, challenger: str, heldout: list[Record], confidence: float
) -> tuple[PairedComparison, list[QuestionDifference]]:
    """Both registered versions downloaded and scored now on the same held-out records (harvested held-out
    rows among them), compared decision by decision, overall and per question."""
    with tempfile.TemporaryDirectory() as tmp:
        scored = [
            score_heldout(download_version(name, v, f"{tmp}/{v}"), heldout) for v in (champion, challenger)
        ]
    questions = per_question_differences(scored[0], scored[1], confidence)
    return paired_comparison(scored[0], scored[1], confidence), questions
