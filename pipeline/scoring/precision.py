"""A lower serving precision against fp32 on the same decisions: what users feel of a quantized model, not
parity to 1e-3.

Each question's (and every decision's) argmax agreement with fp32's answers, and accuracy and ECE of both, each
calibrated by its own calibrator (the int8 one refitted on the int8 model's logits). `verdict` holds the
overall figures to the `quantize:` section's bounds (`QuantizeConfig`): the quantized model serves under `precision: auto` only when it passes.

    figures = compare_precisions(decisions, fp32_probabilities, int8_probabilities)
    passes, why = verdict(figures["overall"], QuantizeConfig())
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from pipeline.config import QuantizeConfig
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import heldout_metrics


def compare_precisions(
    decisions: list[ScoredDecision], reference: list[np.ndarray], candidate: list[np.ndarray]
) -> dict[str, Any]:
    """{"overall": figures, "by_question": {id: figures}}: per set of decisions its count, argmax agreement
    of `candidate` with `reference`, and each one's accuracy and ECE with the changes (candidate - reference)."""
    by_question: dict[str, list[int]] = defaultdict(list)
    for index, decision in enumerate(decisions):
        by_question[decision.question_id].append(index)
    everything = list(range(len(decisions)))
    return {
        "overall": _figures(decisions, reference, candidate, everything),
        "by_question": {
            question: _figures(decisions, reference, candidate, indices)
            for question, indices in sorted(by_question.items())
        },
    }


def _figures(
    decisions: list[ScoredDecision],
    reference: list[np.ndarray],
    candidate: list[np.ndarray],
    indices: list[int],
) -> dict[str, Any]:
    chosen = [decisions[i] for i in indices]
    before = heldout_metrics(chosen, [reference[i] for i in indices])
    after = heldout_metrics(chosen, [candidate[i] for i in indices])
    agreed = [int(np.argmax(reference[i])) == int(np.argmax(candidate[i])) for i in indices]
    return {
        "decisions": len(indices),
        "argmax_agreement": float(np.mean(agreed)) if agreed else float("nan"),
        "accuracy_fp32": before["accuracy"],
        "accuracy": after["accuracy"],
        "accuracy_change": after["accuracy"] - before["accuracy"],
        "ece_fp32": before["ece"],
        "ece": after["ece"],
        "ece_change": after["ece"] - before["ece"],
    }


def verdict(overall: dict[str, Any], bounds: QuantizeConfig) -> tuple[bool, str]:
    """Whether `overall` (`compare_precisions`'s) is within `bounds`, and why in one line."""
    if not overall.get("decisions"):
        return False, "no decisions to measure it on"
    failures = []
    if not overall["argmax_agreement"] >= bounds.min_agreement:
        failures.append(f"argmax agreement {overall['argmax_agreement']:.2%} < {bounds.min_agreement:.0%}")
    if not overall["accuracy_change"] >= -bounds.max_accuracy_drop:
        failures.append(f"accuracy {overall['accuracy_change']:+.4f} (at most -{bounds.max_accuracy_drop})")
    if not overall["ece_change"] <= bounds.max_ece_rise:
        failures.append(f"ECE {overall['ece_change']:+.4f} (at most +{bounds.max_ece_rise})")
    measured = (
        f"argmax agreement {overall['argmax_agreement']:.2%}, accuracy {overall['accuracy_change']:+.4f}, "
        f"ECE {overall['ece_change']:+.4f} against fp32 on {overall['decisions']:,} decisions"
    )
    if failures:
        return False, f"outside its bounds: {'; '.join(failures)} ({measured})"
    return True, f"within its bounds: {measured}"
