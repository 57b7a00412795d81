"""Did the fine-tune learn? Per question, its held-out accuracy against the untrained base and against always
answering the question's most common training label (the class prior). A fine-tune no better than either on a
question is reported plainly, tagged in MLflow, and never promoted (`promote.refuse_unlearned`).

    prior = majority_labels(split.train)
    warnings = learning_warnings(decisions, base_logits, tuned_logits, prior)
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from pipeline.scoring.decisions import ScoredDecision


def majority_labels(records) -> dict[str, int]:
    """The most common gold label of each question id among validated (training) records."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        for decision in record.decisions:
            counts[decision.question.id][decision.gold.label] += 1
    return {qid: counter.most_common(1)[0][0] for qid, counter in counts.items()}


def learning_warnings(
    decisions: list[ScoredDecision],
    base_logits: list[np.ndarray],
    tuned_logits: list[np.ndarray],
    majority: dict[str, int],
) -> list[str]:
    """One line per question whose fine-tuned held-out accuracy is no better than the base's or the
    prior's."""
    by_question: dict[str, list[int]] = defaultdict(list)
    for i, decision in enumerate(decisions):
        by_question[decision.question_id].append(i)
    warnings = []
    for qid, chosen in sorted(by_question.items()):
        tuned = _accuracy([decisions[i] for i in chosen], [tuned_logits[i] for i in chosen])
        base = _accuracy([decisions[i] for i in chosen], [base_logits[i] for i in chosen])
        prior = float(np.mean([decisions[i].label == majority.get(qid, -1) for i in chosen]))
        if tuned <= base:
            warnings.append(
                f"question {qid!r}: fine-tuned accuracy {tuned:.4f} is no better than the base's {base:.4f}"
            )
        if tuned <= prior:
            warnings.append(
                f"question {qid!r}: fine-tuned accuracy {tuned:.4f} is no better than always answering "
                f"its most common training label ({prior:.4f})"
            )
    return warnings


def _accuracy(decisions: list[ScoredDecision], logits: list[np.ndarray]) -> float:
    return float(np.mean([int(np.argmax(z)) == d.label for d, z in zip(decisions, logits)]))
