"""Re-certification while serving (`pipeline.flywheel.recertify`): the automated answers of a window with
feedback, counted as the certificate counts an error, bounded by one-sided Clopper-Pearson at δ; broken only when
the lower bound passes ε."""

import json

import pyarrow as pa
import pytest

from pipeline.flywheel.drift import DecisionRow
from pipeline.flywheel.recertify import BROKEN, HOLDING, UNCONFIRMED, check_certificates
from pipeline.scoring.certify import error_lower_bound, error_upper_bound
from tests.tiny import tone_certificate

TONE = {
    "type": "choice",
    "instructions": "Tone?",
    "criteria": {"negative": None, "neutral": None, "positive": None},
}


def tone_answer(p_negative: float, automated: bool | None) -> dict:
    rest = (1.0 - p_negative) / 2
    answer = {
        "type": "choice",
        "choice": "negative" if p_negative > rest else "neutral",
        "probabilities": {"negative": p_negative, "neutral": rest, "positive": rest},
    }
    return answer if automated is None else answer | {"x_automate": automated}


def window(n: int, automated: bool | None = True) -> list[DecisionRow]:
    return [
        DecisionRow(f"d{i}", "ticket", {"tone": TONE}, {"tone": tone_answer(0.9, automated)})
        for i in range(n)
    ]


def feedback(golds: dict[str, str]) -> pa.Table:
    return pa.table(
        {
            "decision_id": list(golds),
            "question_id": ["tone"] * len(golds),
            "gold": [json.dumps(g) for g in golds.values()],
        }
    )


def test_six_wrong_of_forty_automated_answers_break_a_five_percent_certificate():
    rows = window(50)
    golds = {f"d{i}": "neutral" if i < 6 else "negative" for i in range(40)}  # 10 automated, no feedback
    [check] = check_certificates(rows, feedback(golds), {"tone": tone_certificate(0.8)})
    assert (check.automated, check.labelled, check.errors) == (50, 40, 6)
    assert check.realised_error == pytest.approx(0.15)
    assert (
        check.error_lower_bound == pytest.approx(error_lower_bound(6, 40, 0.1))
        and check.error_lower_bound > 0.05
    )
    assert check.error_upper_bound == pytest.approx(error_upper_bound(6, 40, 0.1))
    assert check.broken and check.status == BROKEN
    assert check.line().startswith("tone broken: 6 wrong of 40 automated with feedback (0.150), bounds 0.0")
    gauges = check.to_dict()["gauges"]
    assert (
        gauges["broken"] == 1.0 and gauges["automated_labelled"] == 40.0 and gauges["realised_error"] == 0.15
    )


def test_few_labels_or_few_errors_do_not_break_a_certificate():
    """One error in three labels is no evidence at δ that the error is above ε (the upper bound alone would
    break it; one in two would: at ε a first error that soon is rarer than δ); none wrong in 60 holds it;
    nothing labelled leaves it unconfirmed, with no realised error."""
    certificates = {"tone": tone_certificate(0.8)}
    golds = {"d0": "neutral", "d1": "negative", "d2": "negative"}
    [three] = check_certificates(window(3), feedback(golds), certificates)
    assert three.error_upper_bound > 0.05 and not three.broken and three.status == UNCONFIRMED
    [two] = check_certificates(window(2), feedback({"d0": "neutral", "d1": "negative"}), certificates)
    assert two.broken  # 1 - 0.9 ** (1 / 2) = 0.051 > 0.05
    right = feedback({f"d{i}": "negative" for i in range(60)})
    [held] = check_certificates(window(60), right, certificates)
    assert held.errors == 0 and held.error_lower_bound == 0.0 and held.status == HOLDING
    [none] = check_certificates(window(5), feedback({}), certificates)
    assert (
        none.realised_error is None
        and "realised_error" not in none.gauges()
        and none.error_upper_bound == 1.0
    )
    assert none.line() == "tone unconfirmed: none of 5 automated answers has feedback"


def test_only_automated_answers_to_the_certified_question_as_certified_count():
    wrong = feedback({f"d{i}": "neutral" for i in range(40)})
    # Not automated (false, or logged before the field existed): the certificate did not answer for them.
    for flag in (False, None):
        [check] = check_certificates(window(40, automated=flag), wrong, {"tone": tone_certificate(0.8)})
        assert check.automated == 0 and not check.broken
    # Asked with other options than certified: another question, not counted.
    [other] = check_certificates(window(40), wrong, {"tone": tone_certificate(0.8, options=("a", "b", "c"))})
    assert other.automated == 40 and other.labelled == 0
    # A question without a certificate (threshold None) is not checked at all.
    assert check_certificates(window(40), wrong, {"tone": tone_certificate(None)}) == ()
