"""Layer plans as data: what a spec means on N layers, and errors that name the bad entry before any model
loads."""

import argparse
import re

import pytest

from pipeline.cli.options import parse_layer_plan
from pipeline.config import ConfigError, TrainConfig, section_config
from pipeline.layer_plans import LayerPlanError, resolve_plan


def test_indices_are_the_visits_and_ranges_repeat_over_the_native_order():
    assert resolve_plan([0, 1, 1, 2, 3], 4).visits == (0, 1, 1, 2, 3)
    assert resolve_plan([[2, 4, 2]], 6).visits == (0, 1, 2, 3, 2, 3, 4, 5)
    assert resolve_plan([(0, 4, 2)], 4).visits == (0, 1, 2, 3) * 2  # the whole stack twice
    assert resolve_plan([(0, 1, 3), (2, 3, 2)], 3).visits == (0, 0, 0, 1, 2, 2)
    assert resolve_plan([(1, 2, 1)], 3).is_identity  # one pass is the first visit only
    assert resolve_plan([0, 1, 2, 3], 6).skipped == (4, 5)
    assert resolve_plan(None, 6) is None


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ([0, 1, 6, 2], "train.layer_plan[2]: layer 6 is out of range for a backbone of 6 layers"),
        ([0, -1], "train.layer_plan[1]: layer index must be >= 0, got -1"),
        ([], "empty plan"),
        ([[1, 9, 2]], "train.layer_plan[0]: range end 9 is past the last layer"),
        ([[3, 1, 2]], "train.layer_plan[0]: a range needs 0 <= start < end"),
        ([[0, 2, 0]], "passes counts the first visit and must be >= 1"),
        ([[0, 3, 2], [2, 4, 2]], "train.layer_plan[1]: ranges must be in order and must not overlap"),
        ([0, [1, 2, 2]], "either layer indices or (start, end, passes) ranges"),
        ([[1, 2]], "a repeat range is (start, end, passes)"),
    ],
)
def test_bad_plans_are_refused_naming_the_entry(spec, named):
    with pytest.raises(
        LayerPlanError, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        resolve_plan(spec, 6)


def test_every_bad_index_is_named_at_once():
    with pytest.raises(LayerPlanError) as caught:
        resolve_plan([7, 0, 8], 4)
    assert "layer_plan[0]: layer 7" in str(caught.value) and "layer_plan[2]: layer 8" in str(caught.value)


def test_the_train_section_takes_a_plan_from_yaml_lists_and_refuses_a_bad_shape_by_key():
    config = section_config("train", {"layer_plan": [[2, 4, 2]]})
    assert config.layer_plan == ((2, 4, 2),) and hash(config)  # frozen and hashable
    assert section_config("train", {"layer_plan": [0, 1, 1]}).layer_plan == (0, 1, 1)
    assert TrainConfig().layer_plan is None
    with pytest.raises(ConfigError, match=re.escape("train.layer_plan: an empty plan")):
        section_config("train", {"layer_plan": []})
    with pytest.raises(ConfigError, match=re.escape("train.layer_plan: expected")):
        section_config("train", {"layer_plan": "0,1,2"})


def test_the_cli_flag_reads_indices_or_json_ranges():
    assert parse_layer_plan("0,1,1,2") == [0, 1, 1, 2]
    assert parse_layer_plan("[[2, 4, 2]]") == [[2, 4, 2]]
    for bad in ("0,one", "[1, 2", '{"a": 1}'):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_layer_plan(bad)
