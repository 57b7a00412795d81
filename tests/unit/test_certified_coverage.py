"""Champion against challenger by certified coverage (`scoring.certified_coverage`): on synthetic answers of a
model calibrated by construction, a lower certified threshold automates more beyond the paired bootstrap's noise,
a higher one less, the same certificates tie exactly, a threshold whose error is above ε is caught by its
interval, and certificates at different ε are not compared; a version's certificates as tags, metrics, the
model card and the summary table."""

from dataclasses import replace

import numpy as np
import pytest

from pipeline.cli.finetune import print_finetuned
from pipeline.cli.retrain import print_summary
from pipeline.data.contract import QUESTION_TYPE_IDS
from pipeline.scoring.certified_coverage import (
    automation_metrics,
    certificate_tags,
    coverage_differences,
)
from pipeline.scoring.certify import Certificate
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.paired import per_question_differences
from pipeline.stages.card import model_card
from pipeline.stages.promote import automation_line, candidate_figures, question_rows
from tests.results import calibration, release, run_result

RECORDS, EPSILON = 600, 0.1


def calibrated_answers(seed: int = 0, groups: int = 0):
    """Two yes/no questions per record, confidence uniform on [0.5, 1], each answer right with that
    probability: the same answers for both models (only their certificates differ)."""
    rng = np.random.default_rng(seed)
    decisions, probabilities = [], []
    for record in range(RECORDS):
        for question in ("a", "b"):
            confidence = rng.uniform(0.5, 1.0)
            label = int(rng.uniform() < confidence)  # the answer is option 1: right with P = confidence
            group = record % groups if groups else -1
            target = (1.0 - label, float(label))
            decisions.append(
                ScoredDecision(QUESTION_TYPE_IDS["noul"], label, record, question, target, group=group)
            )
            probabilities.append(np.array([1.0 - confidence, confidence]))
    return decisions, probabilities


def certificate(question: str, threshold: float | None, epsilon: float = EPSILON) -> Certificate:
    return Certificate(
        question_id=question,
        qtype="noul",
        target_error=epsilon,
        delta=0.1,
        threshold=threshold,
        fit_decisions=500,
        reason=None if threshold is not None else "too few decisions to certify: 40, at least 59 needed",
    )


def rows(champion: dict[str, Certificate], challenger: dict[str, Certificate], scored=None):
    scored = scored or calibrated_answers()
    return {row.question: row for row in coverage_differences(scored, champion, scored, challenger)}


def test_a_lower_certified_threshold_automates_more_beyond_noise_and_a_higher_one_less():
    champion = {"a": certificate("a", 0.95), "b": certificate("b", 0.9)}
    challenger = {"a": certificate("a", 0.9), "b": certificate("b", 0.95)}
    a, b = rows(champion, challenger).values()
    assert a.challenger_coverage == pytest.approx(0.2, abs=0.05) and a.champion_coverage == pytest.approx(
        0.1, abs=0.04
    )
    assert 0 < a.gain_low < a.gain < a.gain_high and a.automates_more and not a.automates_less
    assert a.challenger_error_low <= EPSILON and not a.error_above_target  # within ε, by its interval
    assert b.gain_high < 0 and b.automates_less and not b.automates_more
    assert a.decisions == b.decisions == RECORDS == a.records
    line = a.line()
    assert line.startswith(f"a: coverage {a.champion_coverage:.3f} -> {a.challenger_coverage:.3f} (+0.")
    assert (
        "95% interval [+0." in line and "on 600 decisions, realised error 0.0" in line and "at ε 0.1" in line
    )


def test_the_same_certificates_tie_exactly_and_a_seed_reproduces_the_interval():
    same = {"a": certificate("a", 0.9), "b": certificate("b", 0.9)}
    tied = rows(same, same)
    assert all(r.gain == r.gain_low == r.gain_high == 0 for r in tied.values())
    assert not any(r.automates_more or r.automates_less for r in tied.values())
    champion, challenger = {"a": certificate("a", 0.95)}, {"a": certificate("a", 0.9)}
    assert rows(champion, challenger)["a"] == rows(champion, challenger)["a"]


def test_a_threshold_whose_held_out_error_is_above_epsilon_beyond_noise_is_caught():
    # Automating everything: the error is about 25%, its interval far above ε = 0.1.
    row = rows({"a": certificate("a", 0.95)}, {"a": certificate("a", 0.5)})["a"]
    assert row.challenger_error == pytest.approx(0.25, abs=0.05) and row.challenger_error_low > EPSILON
    assert row.error_above_target and not row.automates_more  # more coverage, but not at the certified error


def test_certificates_at_different_epsilon_are_not_compared_and_a_missing_one_automates_nothing():
    compared = rows({"a": certificate("a", 0.95, epsilon=0.05)}, {"a": certificate("a", 0.9)})
    row = compared["a"]
    assert row.target_error is None and not (row.automates_more or row.automates_less)
    assert "ε 0.05" in row.line() and "not compared" in row.line()
    # An older champion without certificates automates nothing: the certified challenger automates more.
    fresh = rows({}, {"a": certificate("a", 0.9)})
    assert fresh["a"].champion_coverage == 0 and fresh["a"].automates_more
    assert fresh["b"].target_error is None and fresh["b"].gain == 0  # neither certified b


def test_with_groups_whole_groups_are_drawn_so_the_interval_widens():
    champion, challenger = {"a": certificate("a", 0.95)}, {"a": certificate("a", 0.9)}
    by_record = rows(champion, challenger)["a"]
    by_group = rows(champion, challenger, calibrated_answers(groups=3))["a"]
    assert by_group.records == 3 and by_record.records == RECORDS
    assert by_group.gain == by_record.gain
    assert by_group.gain_high - by_group.gain_low != by_record.gain_high - by_record.gain_low


CERTIFICATES = {
    "a": certificate("a", 0.9).to_dict()
    | {
        "heldout": {
            "coverage": 0.2,
            "coverage_low": 0.15,
            "coverage_high": 0.26,
            "error": 0.03,
            "error_low": 0.01,
            "error_high": 0.08,
        }
    },
    "b": certificate("b", None).to_dict(),
}
AUTOMATION = {
    "by_question": {
        "a": {"coverage": 0.2, "error": 0.03},
        "b": {"coverage": 0.0, "error": None},
    },
    "overall": {"coverage": 0.1, "error": 0.03},
}


def test_a_versions_tags_and_run_metrics_carry_its_certificates():
    tags = certificate_tags(CERTIFICATES)
    assert tags["certificate_a"] == (
        "ε 0.1 δ 0.1: threshold 0.9000; held out: coverage 0.200 [0.150, 0.260], error 0.030 [0.010, 0.080]"
    )
    assert tags["certificate_b"].startswith("ε 0.1 δ 0.1: automates nothing (too few decisions to certify")
    assert tags["certified_questions"] == "1 of 2"
    metrics = automation_metrics(AUTOMATION)
    assert metrics == {
        "coverage_a": 0.2,
        "automated_error_a": 0.03,
        "coverage_b": 0.0,
        "coverage": 0.1,
        "automated_error": 0.03,
    }


def test_the_model_card_and_the_summary_say_what_each_question_may_automate(capsys):
    result = run_result(calibration=calibration(certificates=CERTIFICATES, automation=AUTOMATION))
    card = model_card(result, "tickets", "1")
    automation = card.split("## Automation")[1].split("\n## ")[0]
    assert "| a | 0.1 | 0.1 | 0.9000 | 0.2000 [0.1500, 0.2600] | 0.0300 [0.0100, 0.0800] |" in automation
    assert "| b | 0.1 | 0.1 | - | - | - |" in automation
    assert "- b automates nothing: too few decisions to certify: 40, at least 59 needed" in automation
    for show in (
        lambda: print_summary(replace(result, release=release(model="tickets")), "tickets"),
        lambda: print_finetuned(result),
    ):  # make run's summary, `decision finetune`'s
        show()
        printed = " ".join(capsys.readouterr().out.split())
        assert "Certified automation" in printed and "0.200 [0.150, 0.260]" in printed
        assert "0.030 [0.010, 0.080]" in printed and "too few decisions" in printed


def test_the_gate_reads_the_reports_intervals_and_says_what_the_certificates_automate():
    figures = candidate_figures(
        {"accuracy": 0.8, "ece": 0.16}, {"overall": {"ece_low": 0.03, "ece_high": 0.27}}
    )
    assert figures == {"accuracy": 0.8, "ece": 0.16, "ece_low": 0.03, "ece_high": 0.27}
    assert automation_line(CERTIFICATES) == (
        "certified to automate 1 of 2 question(s): a from confidence 0.900 (20.0% of held-out decisions)"
    )
    nothing = automation_line({"b": CERTIFICATES["b"]})
    assert (
        nothing
        == "its certificates automate nothing: b: too few decisions to certify: 40, at least 59 needed"
    )
    assert automation_line({}) is None


def test_the_gates_per_question_table_keeps_accuracy_and_gains_coverage_columns():
    scored = calibrated_answers()
    champion, challenger = {"a": certificate("a", 0.95)}, {"a": certificate("a", 0.9)}
    questions = per_question_differences(scored, scored)[1:]
    table = {
        row["question"]: row
        for row in question_rows(questions, coverage_differences(scored, champion, scored, challenger))
    }
    a, b = table["a"], table["b"]
    assert (
        a["accuracy_gain"] == 0
        and a["coverage_gain_low"] > 0
        and a["challenger_coverage"] > a["champion_coverage"]
    )
    assert "accuracy_gain" in b and "coverage_gain" not in b  # neither model certified b: nothing to compare
