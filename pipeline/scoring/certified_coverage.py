"""Certified coverage as the gate and the registry read it: champion against challenger by how much each automates
under its own certificates on the same held-out decisions, and a version's certificates as tags and metrics.

Each model's automated set is its own certificate's threshold on its own calibrated answers. Per question, the
challenger's coverage minus the champion's is resampled by a paired bootstrap (records, or whole groups where the
rows have a `group`, drawn with replacement; the same draws for every question), and the challenger's realised
error among the answers it automates gets a 95% Clopper-Pearson interval. A question is compared only where both
certificates hold it to the same ε (and the same score error); a model without a certificate for it automates
nothing there.

    rows = coverage_differences(champion, champion_certificates, challenger, challenger_certificates)
    [row.line() for row in rows if row.automates_less]          # what holds a challenger
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.certify import Certificate, clopper_pearson, confidence_and_error
from pipeline.scoring.paired import Scored
from pipeline.scoring.report import bootstrap_means, record_draws, record_index, two_sided

RESAMPLES = 1000


@dataclass(frozen=True)
class CoverageDifference:
    """One question's coverage under each model's certificate on the shared held-out decisions, the
    challenger's minus the champion's with a two-sided paired-bootstrap interval, and the challenger's realised
    error among what it automates with a 95% Clopper-Pearson interval."""

    question: str
    decisions: int
    records: int
    target_error: float | None
    """The ε both certificates hold the question to; None: they differ (`note` says how), nothing compared."""
    champion_coverage: float
    challenger_coverage: float
    gain: float
    """Challenger coverage minus champion coverage: positive when the challenger automates more."""
    gain_low: float
    gain_high: float
    challenger_automated: int
    challenger_error: float | None
    """The challenger's realised error among the held-out answers it automates (None: it automates none)."""
    challenger_error_low: float | None
    challenger_error_high: float | None
    note: str | None = None

    @property
    def automates_less(self) -> bool:
        """The challenger automates less beyond the bootstrap noise (the interval's upper end below 0)."""
        return self.target_error is not None and self.gain_high < 0

    @property
    def error_above_target(self) -> bool:
        """The challenger's realised error is above ε beyond noise (its interval's lower end above ε): its
        certificate does not hold on these rows."""
        low, target = self.challenger_error_low, self.target_error
        return low is not None and target is not None and low > target

    @property
    def automates_more(self) -> bool:
        """The challenger automates more beyond noise (the interval's lower end above 0) at an error the
        held-out rows do not put above ε."""
        return self.target_error is not None and self.gain_low > 0 and not self.error_above_target

    def line(self) -> str:
        """The question and its figures in one line, as the gate's reasons give them."""
        if self.target_error is None:
            return f"{self.question}: {self.note}"
        error = (
            "automates none"
            if self.challenger_error is None
            else f"realised error {self.challenger_error:.3f} [{self.challenger_error_low:.3f}, "
            f"{self.challenger_error_high:.3f}]"
        )
        return (
            f"{self.question}: coverage {self.champion_coverage:.3f} -> {self.challenger_coverage:.3f} "
            f"({self.gain:+.3f}, 95% interval [{self.gain_low:+.3f}, {self.gain_high:+.3f}]) on "
            f"{self.decisions} decisions, {error} at ε {self.target_error:g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def coverage_differences(
    champion: Scored,
    champion_certificates: dict[str, Certificate],
    challenger: Scored,
    challenger_certificates: dict[str, Certificate],
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[CoverageDifference]:
    """One row per question of the decisions both models answered (matched by record and question id), each
    model automating by its own certificates; [] where they share none."""
    ours = _automated(champion, champion_certificates)
    theirs = _automated(challenger, challenger_certificates)
    keys = sorted(ours.keys() & theirs.keys())
    if not keys:
        return []
    automated = np.array([[ours[k][0], theirs[k][0]] for k in keys], dtype=float)
    wrong = np.array([theirs[k][1] for k in keys], dtype=bool)
    record_of = record_index([ours[k][2] for k in keys])
    draws = record_draws(record_of, resamples, np.random.default_rng(seed))
    questions = np.array([k[1] for k in keys])
    rows = []
    for question in sorted(set(questions.tolist())):
        chosen = questions == question
        target, note = _same_target(
            champion_certificates.get(question), challenger_certificates.get(question)
        )
        gain = automated[chosen, 1] - automated[chosen, 0]
        low, high = two_sided(bootstrap_means(gain, record_of[chosen], draws), confidence)
        rows.append(
            _difference(question, automated[chosen], wrong[chosen], (low, high), target, note)
            | {"records": len(np.unique(record_of[chosen]))}
        )
    return [CoverageDifference(**row) for row in rows]


def _difference(
    question: str,
    automated: np.ndarray,
    wrong: np.ndarray,
    interval: tuple[float, float],
    target: float | None,
    note: str | None,
) -> dict[str, Any]:
    chosen = automated[:, 1].astype(bool)
    count, errors = int(chosen.sum()), int(wrong[chosen].sum())
    error_low, error_high = clopper_pearson(errors, count) if count else (None, None)
    return {
        "question": question,
        "decisions": len(automated),
        "target_error": target,
        "champion_coverage": float(automated[:, 0].mean()),
        "challenger_coverage": float(automated[:, 1].mean()),
        "gain": float((automated[:, 1] - automated[:, 0]).mean()),
        "gain_low": interval[0],
        "gain_high": interval[1],
        "challenger_automated": count,
        "challenger_error": errors / count if count else None,
        "challenger_error_low": error_low,
        "challenger_error_high": error_high,
        "note": note,
    }


def _automated(
    scored: Scored, certificates: dict[str, Certificate]
) -> dict[tuple[int, str], tuple[bool, bool, int]]:
    """Per decision (record, question id): whether the model's certificate automates its answer, whether the
    answer is wrong (by the certificate's score error), and what the bootstrap draws (its record or group)."""
    decisions, probabilities = scored
    answers = {}
    for decision, p in zip(decisions, probabilities, strict=True):
        certificate = certificates.get(decision.question_id)
        score_error = certificate.score_error if certificate else "exact"
        qtype = QUESTION_TYPES[decision.qtype]
        confidence, wrong = confidence_and_error(np.asarray(p), decision.label, qtype, score_error)
        automated = certificate is not None and certificate.automates(confidence)
        answers[(decision.record, decision.question_id)] = (automated, wrong, decision.cluster)
    return answers


def _same_target(
    champion: Certificate | None, challenger: Certificate | None
) -> tuple[float | None, str | None]:
    """(the ε both hold the question to, None) or (None, why they are not compared). A model without a
    certificate for the question automates nothing there, at whatever ε the other was certified."""
    if champion is None or challenger is None:
        held = champion or challenger
        return (held.target_error, None) if held else (None, "no certificate on either side")
    if (champion.target_error, champion.score_error) == (challenger.target_error, challenger.score_error):
        return challenger.target_error, None
    return None, (
        f"certified at ε {champion.target_error:g} ({champion.score_error}) by the champion and "
        f"{challenger.target_error:g} ({challenger.score_error}) by the challenger: coverage not compared"
    )


def certificate_tags(certificates: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A registered version's certificates at a glance: `certificate_<question>` with ε, δ, the threshold and
    what it automated on the held-out rows (coverage and realised error with 95% intervals), or why it
    automates nothing; and `certified_questions` (how many of how many)."""
    tags = {f"certificate_{_metric_name(q)}": certificate_line(c) for q, c in sorted(certificates.items())}
    if certificates:
        certified = sum(c.get("threshold") is not None for c in certificates.values())
        tags["certified_questions"] = f"{certified} of {len(certificates)}"
    return tags


def certificate_line(certificate: dict[str, Any]) -> str:
    """One certificate (`Certificate.to_dict`) in a line: ε, δ, threshold, held-out coverage and error."""
    rule = f"ε {certificate['target_error']:g} δ {certificate['delta']:g}"
    if certificate.get("threshold") is None:
        return f"{rule}: automates nothing ({certificate.get('reason') or 'not certified'})"[:5000]
    held = certificate.get("heldout") or {}
    line = f"{rule}: threshold {certificate['threshold']:.4f}"
    if held:
        line += f"; held out: coverage {_with_interval(held, 'coverage')}"
        line += (
            f", error {_with_interval(held, 'error')}"
            if held.get("error") is not None
            else ", none automated"
        )
    return line


def _with_interval(figures: dict[str, Any], name: str) -> str:
    return f"{figures[name]:.3f} [{figures[f'{name}_low']:.3f}, {figures[f'{name}_high']:.3f}]"


def automation_metrics(automation: dict[str, Any]) -> dict[str, float]:
    """The run's held-out automation (`AutomationReport.to_dict`) as MLflow metrics: `coverage_<question>` and
    `automated_error_<question>` (where it automated any), and `coverage` and `automated_error` overall."""
    metrics: dict[str, float] = {}
    blocks = [(f"_{_metric_name(q)}", f) for q, f in automation.get("by_question", {}).items()]
    if automation.get("overall"):
        blocks.append(("", automation["overall"]))
    for suffix, figures in blocks:
        metrics[f"coverage{suffix}"] = float(figures["coverage"])
        if figures.get("error") is not None:
            metrics[f"automated_error{suffix}"] = float(figures["error"])
    return metrics


def _metric_name(question: str) -> str:
    """A question id as MLflow takes it in a metric or tag name (letters, digits, `_ - . /`)."""
    return re.sub(r"[^A-Za-z0-9_\-./]", "_", question)
