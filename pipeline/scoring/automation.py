"""Which served answers may be acted on without a person: `x_automate` on every answer, and when false its
`x_automate_reason` (docs/serving.md, Automation).

An answer is automated where the model's export holds a certificate for its question (`scoring.certify`) that
matches the question as asked (its type and options) and is certified, the answer's confidence reaches the
certificate's threshold, and the state is not novel (`scoring.novelty`: no letter or digit to read, or farther
from the training states than the gate allows). The confidence is read from the served probabilities (what
the caller sees, rounded to 4 decimals) as `certify.confidence_and_error` reads it: a choice's or score's top
probability, a noul's max(P(true), P(false)).

    automation = Automation(read_certificates(text), read_novelty(data))
    answers = automation.marked(request, answers, novel=False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.data.answers import ParsedRequest, answer_probabilities
from pipeline.data.contract import Question
from pipeline.scoring.certify import Certificate, confidence_and_error
from pipeline.scoring.novelty import NoveltyGate, embeddable

BELOW_THRESHOLD = "below_threshold"
NOVEL_STATE = "novel_state"
NOT_CERTIFIED = "not_certified"
REASONS = (BELOW_THRESHOLD, NOVEL_STATE, NOT_CERTIFIED)


@dataclass(frozen=True)
class Automation:
    """A model's certificates by question id and its novelty gate (None: only unreadable states are novel)."""

    certificates: dict[str, Certificate] = field(default_factory=dict)
    gate: NoveltyGate | None = None

    def certificate_for(self, question: Question) -> Certificate | None:
        """The certified rule for the question as asked; None where there is none, it certifies nothing, or it
        was certified for another type or other options."""
        found = self.certificates.get(question.id)
        if found is None or not found.certified or not found.matches(question.type, question.options):
            return None
        return found

    def needs_state(self, request: ParsedRequest) -> bool:
        """Whether any question of the request could be automated, so its state is worth the gate's look."""
        return any(self.certificate_for(q) is not None for q in request.questions.values())

    def novel_states(
        self,
        requests: list[ParsedRequest],
        state_vectors: Callable[[list[Any]], np.ndarray],
        given: list[np.ndarray | None] | None = None,
    ) -> list[bool]:
        """Per request, whether its state is novel: nothing to read (`embeddable`), longer than the gate allows,
        or (for a request the gate's verdict could change: one with a certified question) farther than it allows. A state's vector is
        taken from `given` (the answer's own pass), else read by `state_vectors`, the missing ones in one pass."""
        novel = [not embeddable(r.state) for r in requests]
        if self.gate is None:
            return novel
        novel = [flag or self.gate.too_long(r.state) for flag, r in zip(novel, requests)]
        looked = [i for i, r in enumerate(requests) if not novel[i] and self.needs_state(r)]
        vectors = list(given) if given is not None else [None] * len(requests)
        missing = [i for i in looked if vectors[i] is None]
        if missing:
            for i, vector in zip(missing, state_vectors([requests[i].state for i in missing])):
                vectors[i] = vector
        if looked:
            flags = self.gate.novel(np.stack([vectors[i] for i in looked]))
            for i, flag in zip(looked, flags):
                novel[i] = bool(flag)
        return novel

    def marked(
        self, request: ParsedRequest, answers: dict[str, dict[str, Any]], novel: bool
    ) -> dict[str, dict[str, Any]]:
        """The answers, each with `x_automate` and, when false, `x_automate_reason`."""
        return {
            qid: answer | self._verdict(request.questions[qid], answer, novel)
            for qid, answer in answers.items()
        }

    def _verdict(self, question: Question, answer: dict[str, Any], novel: bool) -> dict[str, Any]:
        certificate = self.certificate_for(question)
        if certificate is None:
            return _refused(NOT_CERTIFIED)
        if novel:
            return _refused(NOVEL_STATE)
        probabilities = np.asarray(answer_probabilities(answer), dtype=np.float64)
        confidence, _ = confidence_and_error(probabilities, 0, certificate.qtype, certificate.score_error)
        return {"x_automate": True} if certificate.automates(confidence) else _refused(BELOW_THRESHOLD)

    def listing(self) -> dict[str, Any]:
        """Each question's certificate as `/v1/models` lists it (ε, δ, threshold, held-out coverage and error),
        and the novelty gate."""
        return {
            "certificates": {q: certificate_listing(c) for q, c in sorted(self.certificates.items())},
            "novelty": self.gate.summary() if self.gate is not None else None,
        }


def certificate_listing(certificate: Certificate) -> dict[str, Any]:
    """One certificate as listed: its rule, and what it automated on the held-out rows."""
    held = certificate.heldout or {}
    return {
        "type": certificate.qtype,
        "options": list(certificate.options),
        "epsilon": certificate.target_error,
        "delta": certificate.delta,
        "threshold": certificate.threshold,
        "certified": certificate.certified,
        "reason": certificate.reason,
        "score_error": certificate.score_error,
        "heldout": {
            key: held.get(key)
            for key in ("decisions", "automated", "coverage", "coverage_low", "coverage_high", "error")
        }
        | {"error_low": held.get("error_low"), "error_high": held.get("error_high")},
    }


def _refused(reason: str) -> dict[str, Any]:
    return {"x_automate": False, "x_automate_reason": reason}
