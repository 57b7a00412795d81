"""The register and promotion-gate stages: a new version gets `challenger`; `champion` moves through the gate.

The gate scores the current champion and the candidate now, as registered and served, on the same held-out
decisions (any family), compares them by a paired bootstrap on NLL and accuracy (`pipeline.scoring.paired`) and
on what each one's own certificates automate, per question (`pipeline.scoring.certified_coverage`), and decides
(`pipeline.mlops.promotion.gate`); the verdict, its reasons and the comparisons are tagged on the version.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import PromoteConfig
from pipeline.data.contract import Record
from pipeline.families.exporting import CERTIFICATES, read_carried
from pipeline.mlops.promotion import (
    CHALLENGER,
    CHAMPION,
    GATE_COVERAGE_TAG,
    GATE_QUESTIONS_TAG,
    GATE_REASONS_TAG,
    GATE_TAG,
    current,
    gate,
    set_alias,
)
from pipeline.mlops.registry import client, download_version, register_export
from pipeline.scoring.certified_coverage import CoverageDifference, coverage_differences
from pipeline.scoring.certify import read_certificates
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
    coverage: list[dict[str, Any]] = field(default_factory=list)
    """Per question, what each one's certificates automate of the same decisions: coverage of each, the
    difference with its interval, the challenger's realised error with its interval
    (`scoring.certified_coverage.CoverageDifference`)."""

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
    automation: str | None = None,
) -> GateResult:
    """Gate `version` against the champion, both scored now on the run's `heldout` records; move `champion`
    when it passes.

    `calibrated`: the candidate's calibrated held-out figures, with their intervals (`candidate_figures`).
    `unpinned`: the version was trained with --allow-unpinned, and the gate holds it. `bag_of_words`: the
    run's bag of words' held-out accuracy (`promote.min_accuracy_over_bag_of_words` gates on it).
    `automation`: what its certificates let it automate (`automation_line`), said among the reasons, never
    gated on: a version that automates nothing still serves its probabilities."""
    champion_version = current(name, CHAMPION)
    if champion_version == version:
        return GateResult(False, ["already the champion"], version, version)
    comparison, questions, coverage = None, [], []
    if champion_version is not None:
        comparison, questions, coverage = compare_versions(
            name, champion_version, version, heldout, config.nll_confidence
        )
    worse = [q.question for q in questions[1:] if q.b_less_accurate]  # [0] is all questions together
    verdict = gate(
        calibrated,
        comparison,
        smoke_passed,
        config,
        learning_warnings=learning_warnings,
        unpinned=unpinned,
        worse_questions=worse,
        bag_of_words=bag_of_words,
        coverage=coverage,
    )
    reasons = verdict.reasons + ([automation] if automation else [])
    _tag_verdict(name, version, verdict.promote, reasons, comparison, questions, coverage)
    if verdict.promote:
        set_alias(name, CHAMPION, version, "promotion gate: " + "; ".join(verdict.reasons))
    return GateResult(
        promote=verdict.promote,
        reasons=reasons,
        champion=current(name, CHAMPION),
        previous_champion=champion_version,
        comparison=comparison and comparison.to_dict(),
        questions=question_rows(questions[1:], coverage),
        coverage=[d.to_dict() for d in coverage],
    )


def _tag_verdict(
    name: str,
    version: str,
    promote: bool,
    reasons: list[str],
    comparison: PairedComparison | None,
    questions: list[QuestionDifference],
    coverage: list[CoverageDifference],
) -> None:
    """The verdict, its reasons and the comparisons as the version's tags (`gate`, `gate_reasons`,
    `gate_<figure>`, `gate_questions`, `gate_coverage`)."""
    tags = {GATE_TAG: "promote" if promote else "hold", GATE_REASONS_TAG: "; ".join(reasons)[:5000]}
    if comparison is not None:
        tags |= {f"gate_{k}": str(v) for k, v in comparison.to_dict().items()}
        automated = {d.question: d for d in coverage}
        tags[GATE_QUESTIONS_TAG] = "; ".join(
            f"{q.question}: {q.accuracy_gain:+.4f} ({q.verdict})" + _coverage_cell(automated.get(q.question))
            for q in questions[1:]
        )[:5000]
        tags[GATE_COVERAGE_TAG] = "; ".join(d.line() for d in coverage)[:5000]
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)


def question_rows(
    questions: list[QuestionDifference], coverage: list[CoverageDifference]
) -> list[dict[str, Any]]:
    """The gate's per-question table: accuracy and NLL of each model with the differences' intervals, and the
    coverage columns (each model's certified coverage, the difference with its interval, the challenger's
    realised error among what it automates) where the question was compared."""
    automated = {d.question: d for d in coverage}
    rows = []
    for q in questions:
        row, d = q.to_dict(), automated.get(q.question)
        if d is not None and d.target_error is not None:
            row |= {
                "champion_coverage": d.champion_coverage,
                "challenger_coverage": d.challenger_coverage,
                "coverage_gain": d.gain,
                "coverage_gain_low": d.gain_low,
                "coverage_gain_high": d.gain_high,
                "challenger_automated_error": d.challenger_error,
                "target_error": d.target_error,
            }
        rows.append(row)
    return rows


def _coverage_cell(d: CoverageDifference | None) -> str:
    if d is None or d.target_error is None:
        return ""
    return f", coverage {d.champion_coverage:.3f} -> {d.challenger_coverage:.3f} ({d.gain:+.3f})"


def candidate_figures(calibrated: dict[str, float], report: dict[str, Any]) -> dict[str, float]:
    """A run's calibrated held-out figures as the gate reads them: the points (`calibrated`) with, from the
    calibration report on the same decisions (`report`, its `overall` block), the 95% intervals of its ECE and
    accuracy, the ECE a calibrated model shows on as many decisions by chance, and how many they are."""
    overall = report.get("overall", {})
    intervals = ("ece_low", "ece_high", "ece_noise", "accuracy_low", "accuracy_high")
    figures = dict(calibrated) | {name: overall[name] for name in intervals if name in overall}
    return figures | ({"ece_decisions": overall["decisions"]} if "decisions" in overall else {})


def automation_line(certificates: dict[str, dict[str, Any]]) -> str | None:
    """What the version's certificates let it automate, in one line, or why they let it automate nothing (too
    few decisions, how many are needed); None for a run without certificates."""
    if not certificates:
        return None
    certified = {q: c for q, c in certificates.items() if c.get("threshold") is not None}
    if not certified:
        why = "; ".join(f"{q}: {c.get('reason')}" for q, c in sorted(certificates.items()))
        return f"its certificates automate nothing: {why}"
    shown = ", ".join(
        f"{q} from confidence {c['threshold']:.3f}"
        + (f" ({c['heldout']['coverage']:.1%} of held-out decisions)" if c.get("heldout") else "")
        for q, c in sorted(certified.items())
    )
    return f"certified to automate {len(certified)} of {len(certificates)} question(s): {shown}"


def compare_versions(
    name: str, champion: str, challenger: str, heldout: list[Record], confidence: float
) -> tuple[PairedComparison, list[QuestionDifference], list[CoverageDifference]]:
    """Both registered versions downloaded and scored now on the same held-out records (harvested held-out
    rows among them), compared decision by decision, overall and per question, and by what each one's own
    certificates (carried in its export; none: it automates nothing) automate of them."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = [download_version(name, v, f"{tmp}/{v}") for v in (champion, challenger)]
        scored = [score_heldout(folder, heldout) for folder in folders]
        certificates = [read_certificates(read_carried(folder, CERTIFICATES)) for folder in folders]
    questions = per_question_differences(scored[0], scored[1], confidence)
    coverage = coverage_differences(scored[0], certificates[0], scored[1], certificates[1])
    return paired_comparison(scored[0], scored[1], confidence), questions, coverage
