"""Re-certification while serving: does each question's certificate still hold on the served window?

A certificate (`scoring.certify`) says the error among the answers it automates is at most ε, with probability
at least 1 - δ. While serving, the decisions the server automated (`x_automate` true in the logged answer; an
answer logged before the flag existed counts as not automated) that have feedback show the realised error.
Per certified question: the automated answers in the window, those with feedback, how many of them the
feedback says were wrong (as the certificate counts an error: a score question judged `off_by_more_than_one`
errs only beyond one level), and the one-sided Clopper-Pearson bounds on that error at the certificate's δ.

A certificate is **broken** when the lower bound is above ε: the labels are evidence, at level δ, that the error
IS above ε. An upper bound above ε alone is not: with no error at all it stays above ε until about log δ /
log(1 - ε) answers are labelled (45 at ε = 0.05, δ = 0.1), so two labels would break every certificate. Such a
window is `unconfirmed` (too few labels to show the error is within ε); `holding` once the upper bound is at
most ε. Valid where the labelled answers are a fair sample of the automated ones (docs/flywheel.md).

    checks = check_certificates(served_rows(window), store.feedback(), certificates)
    [c.question for c in checks if c.broken]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.data.answers import answer_probabilities
from pipeline.flywheel.drift import DecisionRow, gold_label
from pipeline.scoring.certify import (
    Certificate,
    confidence_and_error,
    error_lower_bound,
    error_upper_bound,
)

AUTOMATED = "x_automate"
"""The served answer's field that says the server automated it."""
BROKEN, HOLDING, UNCONFIRMED = "broken", "holding", "unconfirmed"


@dataclass(frozen=True)
class CertificateCheck:
    """One certified question over a served window: its automated answers, those with feedback, their errors,
    and the Clopper-Pearson bounds on the error at the certificate's δ."""

    question: str
    target_error: float
    """The certificate's ε."""
    delta: float
    threshold: float
    automated: int
    """The window's answers to the question the server automated."""
    labelled: int
    """Of them, those with feedback that reads against the question as asked."""
    errors: int
    error_upper_bound: float
    """1.0 while none is labelled."""
    error_lower_bound: float

    @property
    def realised_error(self) -> float | None:
        return self.errors / self.labelled if self.labelled else None

    @property
    def broken(self) -> bool:
        """Evidence, at level δ, that the error among automated answers is above ε (module docstring)."""
        return self.error_lower_bound > self.target_error

    @property
    def status(self) -> str:
        if self.broken:
            return BROKEN
        return HOLDING if self.error_upper_bound <= self.target_error else UNCONFIRMED

    def gauges(self) -> dict[str, float]:
        """The figures `/metrics` shows as `decision_certificate_<name>{question}`."""
        figures = {
            "target_error": self.target_error,
            "automated": float(self.automated),
            "automated_labelled": float(self.labelled),
            "errors": float(self.errors),
            "error_upper_bound": round(self.error_upper_bound, 6),
            "error_lower_bound": round(self.error_lower_bound, 6),
            "broken": float(self.broken),
        }
        if self.realised_error is not None:
            figures["realised_error"] = round(self.realised_error, 6)
        return figures

    def line(self) -> str:
        """`tone broken: 6 wrong of 40 automated with feedback (0.150), bounds 0.081-0.248 at δ 0.1 against ε
        0.05`."""
        if not self.labelled:
            return f"{self.question} {self.status}: none of {self.automated} automated answers has feedback"
        return (
            f"{self.question} {self.status}: {self.errors} wrong of {self.labelled} automated with feedback "
            f"({self.realised_error:.3f}), bounds {self.error_lower_bound:.3f}-{self.error_upper_bound:.3f} "
            f"at δ {self.delta:g} against ε {self.target_error:g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "realised_error": self.realised_error,
            "status": self.status,
            "broken": self.broken,
            "gauges": self.gauges(),
            "line": self.line(),
        }


def check_certificates(
    rows: Sequence[DecisionRow], feedback: pa.Table, certificates: dict[str, Certificate]
) -> tuple[CertificateCheck, ...]:
    """Each certified question of `certificates` (the serving version's) judged on the window `rows`, against
    the gold in `feedback` (`Store.feedback`), in question order."""
    keys = zip(*(feedback.column(name).to_pylist() for name in ("decision_id", "question_id", "gold")))
    golds = {(decision_id, qid): gold for decision_id, qid, gold in keys}
    counts = {q: [0, 0, 0] for q, c in certificates.items() if c.certified}  # automated, labelled, wrong
    for row in rows:
        for qid, answer in row.answers.items():
            if qid not in counts or answer.get(AUTOMATED) is not True:
                continue
            counts[qid][0] += 1
            gold = golds.get((row.decision_id, qid))
            wrong = None if gold is None else answered_wrong(certificates[qid], row, qid, gold)
            if wrong is not None:
                counts[qid][1] += 1
                counts[qid][2] += wrong
    return tuple(_check(certificates[q], *counts[q]) for q in sorted(counts))


def answered_wrong(certificate: Certificate, row: DecisionRow, qid: str, gold: str) -> bool | None:
    """Whether the answer is an error as `certificate` counts one; None when the gold does not read against
    the question, or the question as asked is not the one certified (other options)."""
    judged = gold_label(qid, row.questions.get(qid), gold)
    if judged is None or not certificate.matches(judged[0].type, judged[0].options):
        return None
    probabilities = np.asarray(answer_probabilities(row.answers[qid]), dtype=float)
    return confidence_and_error(probabilities, judged[1], certificate.qtype, certificate.score_error)[1]


def _check(certificate: Certificate, automated: int, labelled: int, errors: int) -> CertificateCheck:
    return CertificateCheck(
        question=certificate.question_id,
        target_error=certificate.target_error,
        delta=certificate.delta,
        threshold=certificate.threshold,
        automated=automated,
        labelled=labelled,
        errors=errors,
        error_upper_bound=error_upper_bound(errors, labelled, certificate.delta),
        error_lower_bound=error_lower_bound(errors, labelled, certificate.delta),
    )


def certificates_markdown(checks: Sequence[CertificateCheck]) -> str:
    """The checks as a markdown table (empty for a model without certificates)."""
    if not checks:
        return ""
    lines = [
        "| question | status | automated | with feedback | wrong | realised error | bounds at δ | ε |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for c in checks:
        error = "-" if c.realised_error is None else f"{c.realised_error:.4f}"
        lines.append(
            f"| {c.question} | {'**broken**' if c.broken else c.status} | {c.automated} | {c.labelled} | "
            f"{c.errors} | {error} | {c.error_lower_bound:.4f}-{c.error_upper_bound:.4f} (δ {c.delta:g}) | "
            f"{c.target_error:g} |"
        )
    return "\n".join(lines)
