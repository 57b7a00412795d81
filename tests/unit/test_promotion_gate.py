"""The gate holds a version trained with --allow-unpinned, or less accurate than the champion on any one
question, or automating less under its certificates on any one, whatever its figures, and still gives every
reason; it promotes one that automates more at its certified error where accuracy ties; every check reads an
interval (a small first version whose ECE interval reaches below the limit is promotable)."""

from dataclasses import replace

from pipeline.config import PromoteConfig
from pipeline.mlops.promotion import CHAMPION, UNPINNED_REASON, champion_stack, gate
from pipeline.scoring.certified_coverage import CoverageDifference
from pipeline.scoring.paired import PairedComparison

GOOD = {"accuracy": 0.9, "ece": 0.01}
# The challenger far better than the champion on the same decisions: everything but the pins says promote.
BETTER = PairedComparison(
    4000,
    champion_nll=0.9,
    challenger_nll=0.3,
    champion_accuracy=0.5,
    challenger_accuracy=0.9,
    nll_gain=0.6,
    nll_gain_low=0.55,
    confidence=0.95,
)


def test_a_version_trained_on_unpinned_inputs_is_held_however_good():
    assert gate(GOOD, BETTER, True, PromoteConfig()).promote
    held = gate(GOOD, BETTER, True, PromoteConfig(), unpinned=True)
    assert not held.promote and held.reasons[0] == UNPINNED_REASON
    assert "--force" in UNPINNED_REASON and any(r.startswith("accuracy 0.9000 >=") for r in held.reasons)
    assert not gate(
        GOOD, None, True, PromoteConfig(), [], unpinned=True
    ).promote  # not even the first version


def test_a_version_less_accurate_on_one_question_is_held_however_good_overall():
    held = gate(GOOD, BETTER, True, PromoteConfig(), worse_questions=["urgency"])
    assert not held.promote
    assert "less accurate than the champion beyond noise on urgency" in held.reasons
    assert gate(GOOD, BETTER, True, PromoteConfig(), worse_questions=[]).promote


def test_with_a_margin_over_the_bag_of_words_a_version_behind_it_is_held_and_without_one_it_is_not_gated():
    demanding = PromoteConfig(min_accuracy_over_bag_of_words=0.05)
    ahead = gate(GOOD, BETTER, True, demanding, bag_of_words=0.80)
    assert ahead.promote and "accuracy 0.9000 >= the bag of words' 0.8000 + 0.05" in ahead.reasons
    behind = gate(GOOD, BETTER, True, demanding, bag_of_words=0.88)
    assert not behind.promote and "accuracy 0.9000 < the bag of words' 0.8800 + 0.05" in behind.reasons
    unmeasured = gate(GOOD, BETTER, True, demanding)  # train.bag_of_words_rows: 0
    assert not unmeasured.promote and any("no bag of words scored" in r for r in unmeasured.reasons)
    shown_only = gate(GOOD, BETTER, True, PromoteConfig(), bag_of_words=0.95)  # the default: not gated on
    assert shown_only.promote and not any("bag of words" in r for r in shown_only.reasons)


def test_rollback_goes_to_the_champion_before_even_where_a_promotion_was_recorded_twice():
    def move(to, why="promoted by hand"):
        return {"alias": CHAMPION, "to": to, "why": why}

    entries = [move("1"), move("2"), move("2"), move("3"), move("2", "rollback from version 3")]
    assert champion_stack(entries) == ["1", "2"]


# Champion and challenger level on NLL and accuracy (both intervals hold 0): nothing to tell them apart but
# what their certificates automate.
LEVEL = PairedComparison(
    400,
    champion_nll=0.40,
    challenger_nll=0.40,
    champion_accuracy=0.80,
    challenger_accuracy=0.80,
    nll_gain=0.0,
    nll_gain_low=-0.02,
    confidence=0.95,
    accuracy_gain_low=-0.03,
    accuracy_gain_high=0.03,
)


def coverage(
    question: str, gain: float, low: float, high: float, error_low: float = 0.01
) -> CoverageDifference:
    return CoverageDifference(
        question=question,
        decisions=400,
        records=400,
        target_error=0.05,
        champion_coverage=0.30,
        challenger_coverage=0.30 + gain,
        gain=gain,
        gain_low=low,
        gain_high=high,
        challenger_automated=int(400 * (0.30 + gain)),
        challenger_error=0.03,
        challenger_error_low=error_low,
        challenger_error_high=0.07,
    )


def test_a_challenger_level_on_accuracy_that_automates_more_is_promoted_and_one_that_automates_less_held():
    more = gate(GOOD, LEVEL, True, PromoteConfig(), coverage=[coverage("urgency", 0.12, 0.06, 0.18)])
    assert more.promote
    assert any(
        r.startswith("automates more than the champion beyond noise on urgency: coverage 0.300 -> 0.420")
        for r in more.reasons
    )
    # Less on one question beyond noise holds it, however much more it automates on another.
    mixed = [coverage("urgency", 0.12, 0.06, 0.18), coverage("topic", -0.08, -0.13, -0.02)]
    less = gate(GOOD, LEVEL, True, PromoteConfig(), coverage=mixed)
    assert not less.promote
    held = [r for r in less.reasons if r.startswith("automates less")]
    assert held == [
        "automates less than the champion beyond noise on topic: coverage 0.300 -> 0.220 (-0.080, 95% interval "
        "[-0.130, -0.020]) on 400 decisions, realised error 0.030 [0.010, 0.070] at ε 0.05"
    ]
    # Within the noise on coverage, and level on NLL: nothing makes it better.
    noise = gate(GOOD, LEVEL, True, PromoteConfig(), coverage=[coverage("urgency", 0.02, -0.01, 0.05)])
    assert not noise.promote
    assert "better than the champion on nothing beyond noise (NLL, certified coverage)" in noise.reasons


def test_more_coverage_at_a_realised_error_above_epsilon_beyond_noise_holds_the_challenger():
    broken = gate(
        GOOD, LEVEL, True, PromoteConfig(), coverage=[coverage("urgency", 0.2, 0.1, 0.3, error_low=0.06)]
    )
    assert not broken.promote
    assert any(r.startswith("realised error above ε beyond noise on urgency") for r in broken.reasons)


def test_a_small_first_version_with_a_wide_ece_interval_is_promotable_and_a_clearly_miscalibrated_one_held():
    # 53 held-out decisions: ECE 0.16 whose interval reaches below 0.05 is not "above 0.05" beyond noise.
    wide = {"accuracy": 0.8, "ece": 0.1604, "ece_low": 0.031, "ece_high": 0.270}
    first = gate(wide, None, True, PromoteConfig())
    assert (
        first.promote and "ECE 0.1604, 95% interval [0.0310, 0.2700]: its lower end <= 0.05" in first.reasons
    )
    clear = gate(wide | {"ece_low": 0.066}, None, True, PromoteConfig())
    assert (
        not clear.promote
        and "ECE 0.1604, 95% interval [0.0660, 0.2700]: its lower end > 0.05" in clear.reasons
    )
    # The first version: its interval above 0.05, but a calibrated model's ECE on 53 decisions reaches
    # 0.179 by chance: not above 0.05 beyond noise, and the line says how many decisions would tell.
    story = wide | {"ece_low": 0.066, "ece_noise": 0.179, "ece_decisions": 53}
    promoted = gate(story, None, True, PromoteConfig())
    assert (
        promoted.promote
        and (
            "ECE 0.1604, 95% interval [0.0660, 0.2700]: not above 0.05 beyond noise (a calibrated model's ECE on 53 "
            "decisions reaches 0.1790 by chance; about 680 held-out decisions would tell an ECE above 0.05 from "
            "chance)"
        )
        in promoted.reasons
    )
    overconfident = gate(story | {"ece": 0.25, "ece_low": 0.12}, None, True, PromoteConfig())
    assert not overconfident.promote and any(
        r.endswith("by chance; about 680 held-out decisions would tell an ECE above 0.05 from chance)")
        and ": above 0.05 beyond noise" in r
        for r in overconfident.reasons
    )


def test_a_lower_accuracy_holds_only_where_the_differences_interval_lies_below_the_allowed_drop():
    within = replace(
        LEVEL, challenger_accuracy=0.78, nll_gain_low=0.01, accuracy_gain_low=-0.05, accuracy_gain_high=0.01
    )
    assert gate(GOOD, within, True, PromoteConfig()).promote  # 2 points lower, but within the noise
    worse = replace(within, accuracy_gain_low=-0.04, accuracy_gain_high=-0.01)
    held = gate(GOOD, worse, True, PromoteConfig())
    assert not held.promote and any(
        r.startswith("accuracy 0.7800 vs champion 0.8000: difference -0.0200") and r.endswith("< -0.005")
        for r in held.reasons
    )
    # The bag of words: held only where the accuracy's interval lies wholly below it plus the margin.
    demanding = PromoteConfig(min_accuracy_over_bag_of_words=0.0)
    close = GOOD | {"accuracy_low": 0.85, "accuracy_high": 0.93}
    assert gate(close, None, True, demanding, bag_of_words=0.92).promote
    assert not gate(close, None, True, demanding, bag_of_words=0.95).promote
