"""Evaluate a model of any family on decision rows: metrics per question type and overall, reliability and
confusion plots; and the champion's score on a held-out split, as the promotion gate compares it.

The model answers as it would when served: its calibrated temperatures are applied. A LoRA fine-tune folder
(adapters plus head) is evaluated on top of the base it names. What its certificates (`scoring.certify`, in
the export's `certificates.json`) automate on the rows is measured too: coverage and realised error with 95%
intervals, per question and overall (`automation_on`); a model without certificates automates nothing.

    decision evaluate --model runs/export --data data/processed/vader.jsonl --slice 0:2000
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.answers import parse_request
from pipeline.data.contract import Record
from pipeline.data.leakage import FINGERPRINT, overlap_warning, overlapping
from pipeline.data.mapping import Mapping
from pipeline.data.read import RowSlice
from pipeline.data.split import refuse_unusable
from pipeline.data.validate import validate_file
from pipeline.device import pick_device, serving_dtype
from pipeline.families import load_decision_model
from pipeline.families.base import Answered, DecisionModel
from pipeline.families.exporting import CERTIFICATES, read_carried, read_training_states
from pipeline.families.runtimes.precision import PrecisionChoice, served_precision
from pipeline.scoring.certify import Certificate, automation_report, read_certificates
from pipeline.scoring.conformal import conformal_report
from pipeline.scoring.decisions import ScoredDecision, gold_decisions, with_groups
from pipeline.scoring.metrics import metrics_by_type
from pipeline.scoring.plots import reliability_by_type, write_plots
from pipeline.scoring.report import calibration_report
from pipeline.stages.predict import model_folder


@dataclass
class EvaluationReport:
    """A model's figures on decision rows, as served: metrics per type and overall, the calibration report,
    the plots written and, when asked, split-conformal prediction sets (`decision evaluate --json` prints
    it)."""

    model: str
    """The model as given: an export folder, or `models:/NAME@ALIAS` or `models:/NAME/VERSION`."""
    served_as: str
    """The name the API serves it under: NAME/VERSION for a registered version (an alias resolved), else the
    export's name."""
    family: str
    data: str
    rows: int
    decisions: int
    skipped: dict[str, int]
    metrics: dict[str, dict[str, float]]
    calibration: dict[str, Any] | None
    plots: list[str] = field(default_factory=list)
    conformal: dict[str, Any] | None = None
    training_overlap: int | None = None
    """How many of the rows have a state (normalised) the model trained on, by the fingerprints its export
    keeps (`exporting.TRAINING_STATES`); None for a model without them."""
    automation: dict[str, Any] | None = None
    """What the model's certificates automate on the rows (`automation_on`)."""
    precision: str = "fp32"
    """The precision that answered (`runtimes.precision`): fp32, bfloat16 or int8."""

    def to_dict(self) -> dict[str, Any]:
        described = asdict(self)
        return (
            described
            if self.conformal is not None
            else {k: v for k, v in described.items() if k != "conformal"}
        )


def evaluate_model(
    model: str | Path,
    data: str | Path,
    plots_dir: str | Path | None = None,
    row_slice: RowSlice = RowSlice(),
    device: str = "cpu",
    progress: bool = False,
    conformal: float | None = None,
    report: Callable[[str], None] | None = None,
    mapping: Mapping | None = None,
    precision: str = "fp32",
) -> EvaluationReport:
    """Metrics and the calibration report of `model` (an export folder or a registered version, as `decision
    predict` takes it) on every usable decision of `data`, the PNG plots written to `plots_dir`, and with
    `conformal` (alpha) split-conformal prediction sets per type. `progress` shows a tqdm bar while scoring;
    `report` gets a line before and after it. `mapping` reads a plain table's columns as decision rows
    (`pipeline.data.mapping`). `precision` is `decision serve`'s (`runtimes.precision`): an int8 model answers
    with its own calibrator and certificates."""
    say = report or (lambda line: None)
    validated = validate_file(data, row_slice, mapping=mapping)
    refuse_unusable(data, validated.report)  # nothing to score: exit 2 with the reasons, not a table of NaN
    with model_folder(str(model)) as (name, folder):
        overlap = training_overlap(folder, validated.records)
        if warning := overlap_warning(overlap, len(validated.records)):
            say(warning)
        served, chosen = served_model(folder, device, precision)
        say(
            f"scoring {validated.report.kept:,} decisions of {data} with {name} ({model}) on {device} at "
            f"{chosen.name} ({chosen.reason})"
        )
        started = time.perf_counter()
        decisions, skipped, probabilities, family = score_model(served, validated.records, progress)
        certificates = served.automation.certificates
        automation = automation_on(folder, validated.records, decisions, probabilities, certificates)
    say(f"scored {len(decisions):,} decisions in {time.perf_counter() - started:.0f} s")
    evaluation = EvaluationReport(
        model=str(model),
        served_as=name,
        family=family,
        data=str(data),
        rows=validated.report.rows,
        decisions=validated.report.decisions,
        skipped={**validated.report.skipped, **skipped},
        metrics=metrics_by_type(decisions, probabilities),
        calibration=calibration_report(decisions, probabilities) if decisions else None,
        training_overlap=overlap,
        automation=automation,
        precision=chosen.name,
    )
    if conformal is not None:
        evaluation.conformal = conformal_report(decisions, probabilities, conformal)
    if plots_dir is not None:
        options = {d.question.id: d.question.options for r in validated.records for d in r.decisions}
        written = write_plots(decisions, probabilities, options, Path(plots_dir))
        by_type = reliability_by_type(
            decisions, probabilities, Path(plots_dir) / "reliability_by_type.png", "as served"
        )
        evaluation.plots = [str(p) for p in [*written, by_type]]
    return evaluation


def training_overlap(folder: str | Path, records: list[Record]) -> int | None:
    """How many of `records` have a normalised state among those the model in `folder` trained on (the
    export's training-states file); None where the folder keeps none (an older export, a base): nothing is
    checked then."""
    states = read_training_states(folder)
    if states is None:
        return None
    return overlapping((r.state for r in records), np.frombuffer(states, dtype=FINGERPRINT))


def automation_on(
    folder: str | Path,
    records: list[Record],
    decisions: list[ScoredDecision],
    probabilities: list[np.ndarray],
    certificates: dict[str, Certificate] | None = None,
) -> dict[str, Any]:
    """What the certificates the export in `folder` carries (or `certificates`: an int8 model's own) automate
    on these scored rows: per question and
    overall (`overall`), the decisions, how many are automated, coverage and realised error with 95%
    Clopper-Pearson intervals, ε (`certify.automation_report`), and per question whether it is `certified`
    and its threshold. `certified` is false for a model without certificates (coverage 0 everywhere), and a
    question asked with other options than certified is not automated."""
    if certificates is None:
        certificates = read_certificates(read_carried(folder, CERTIFICATES))
    certificates = applicable_certificates(certificates, records)
    score_error = next((c.score_error for c in certificates.values()), "exact")
    report = automation_report(decisions, probabilities, certificates, score_error)
    by_question = {}
    for question, figures in report.by_question.items():
        certificate = certificates.get(question)
        certified = certificate is not None and certificate.certified
        by_question[question] = asdict(figures) | {
            "certified": certified,
            "threshold": certificate.threshold if certified else None,
        }
    return {
        "certified": any(c.certified for c in certificates.values()),
        "by_question": by_question,
        "overall": asdict(report.overall),
    }


def applicable_certificates(
    certificates: dict[str, Certificate], records: list[Record]
) -> dict[str, Certificate]:
    """The certificates whose question every row asks as certified (the same type and options)."""
    asked: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for record in records:
        for decision in record.decisions:
            asked.setdefault(decision.question.id, set()).add(
                (decision.question.type, tuple(decision.question.options))
            )
    return {
        question: certificate
        for question, certificate in certificates.items()
        if all(certificate.matches(qtype, options) for qtype, options in asked.get(question, ()))
    }


def score_records(
    model_dir: str | Path,
    records: list[Record],
    device: str = "cpu",
    progress: bool = False,
    precision: str = "fp32",
) -> tuple[list[ScoredDecision], dict[str, int], list[np.ndarray], str]:
    """(decisions, skipped by reason, probabilities, family name) of `model_dir` on `records`, as served at
    `precision` (`score_model`)."""
    model, _ = served_model(model_dir, device, precision)
    return score_model(model, records, progress)


def served_model(model_dir: str | Path, device: str, precision: str) -> tuple[DecisionModel, PrecisionChoice]:
    """The model in `model_dir` on `device` ("auto": cuda where there is one) at `precision`
    (`runtimes.precision`), and the precision it got with why."""
    device = pick_device(device)
    model = load_decision_model(model_dir).to(device, serving_dtype(precision, device))
    return served_precision(model, precision, model_dir)


def score_model(
    model: DecisionModel, records: list[Record], progress: bool = False
) -> tuple[list[ScoredDecision], dict[str, int], list[np.ndarray], str]:
    """(decisions, skipped by reason, probabilities, family name) of `model` on `records`, as served: at fp32
    in torch through the family's scoring passes, else through the served answer path (`served_logits`). The
    decisions carry their rows' groups: intervals then draw whole groups, and conformal halves keep them
    apart."""
    family = model.family
    if model.encoder is None and model.dtype is None:
        device = next(model.loaded.model.parameters()).device
        examples, skipped = family.build_examples(model.loaded, records)
        decisions, logits = family.score(model.loaded, examples, device, 64, progress)
    else:
        decisions, logits = served_logits(model, records)
        unanswered = len(gold_decisions(records)) - len(decisions)
        skipped = {"the served model could not answer the row": unanswered} if unanswered else {}
    probabilities = family.served_probabilities(model.loaded, decisions, logits)
    return with_groups(decisions, [record.group for record in records]), skipped, probabilities, family.name


REQUESTS_PER_PASS = 64  # rows answered together: the server's batches are of this order


def served_logits(
    model: DecisionModel, records: list[Record]
) -> tuple[list[ScoredDecision], list[np.ndarray]]:
    """Every usable decision of `records` with the model's raw logits for it, through the served answer path
    (its precision, its encoder runtime), `REQUESTS_PER_PASS` rows at a time; a row the model cannot answer is
    left out, with its decisions."""
    by_record: dict[int, list[ScoredDecision]] = {}
    for decision in gold_decisions(records):
        by_record.setdefault(decision.record, []).append(decision)
    decisions, logits = [], []
    for start in range(0, len(records), REQUESTS_PER_PASS):
        chunk = records[start : start + REQUESTS_PER_PASS]
        requests = [parse_request(r.state, r.request_questions()) for r in chunk]
        answered = model.family.answer(model.loaded, requests, model.dtype, model.encoder)
        for offset, result in enumerate(answered):
            if not isinstance(result, Answered):
                continue
            for decision in by_record.get(start + offset, []):
                decisions.append(decision)
                logits.append(np.asarray(result.logits[decision.question_id], dtype=np.float64))
    return decisions, logits


def score_heldout(
    model_dir: str | Path, heldout: list[Record], device: str = "cpu"
) -> tuple[list[ScoredDecision], list[np.ndarray]]:
    """The decisions of a run's held-out records and `model_dir`'s probabilities for them, as served: what the
    gate compares, champion and challenger alike."""
    decisions, _, probabilities, _ = score_records(model_dir, heldout, device)
    return decisions, probabilities
