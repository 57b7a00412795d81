"""The gate holds a version trained with --allow-unpinned, or less accurate than the champion on any one
question, whatever its figures, and still gives every reason."""

from pipeline.config import PromoteConfig
from pipeline.mlops.promotion import CHAMPION, UNPINNED_REASON, champion_stack, gate
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
