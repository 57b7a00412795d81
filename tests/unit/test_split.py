"""The held-out split: whole rows, stable under reordering and growth, within its caps."""

import random
from dataclasses import replace

from pipeline.config import ValidateConfig
from pipeline.data import synthetic
from pipeline.data.split import split_holdout
from pipeline.data.validate import validate_rows


def _ids(records):
    return {r.content_hash() for r in records}


def test_split_is_stable_when_rows_are_reordered_or_added():
    rows = synthetic.generate_rows(600, seed=1)
    config = ValidateConfig(holdout_max_decisions=10_000, holdout_fraction=0.1)
    before = split_holdout(validate_rows(rows).records, config)
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    grown = shuffled + synthetic.generate_rows(300, seed=2)
    after = split_holdout(validate_rows(grown).records, config)
    assert _ids(before.heldout) <= _ids(after.heldout)
    assert _ids(before.train) <= _ids(after.train)
    assert _ids(before.heldout) == _ids(split_holdout(validate_rows(shuffled).records, config).heldout)


def test_split_respects_both_caps_and_keeps_rows_whole():
    records = validate_rows(synthetic.generate_rows(2000, seed=4)).records
    for config in (ValidateConfig(holdout_max_decisions=60), ValidateConfig(holdout_fraction=0.02)):
        split = split_holdout(records, config)
        decisions = sum(len(r.decisions) for r in split.heldout)
        assert 0 < decisions <= min(config.holdout_max_decisions, config.holdout_fraction * 6000)
        assert not _ids(split.heldout) & _ids(split.train)
        assert not _ids(split.validation) & (_ids(split.train) | _ids(split.heldout))
        assert len(split.train) + len(split.validation) + len(split.heldout) == len(records)


def test_the_validation_split_is_carved_from_training_rows_within_its_caps_and_stable_under_reordering():
    rows = synthetic.generate_rows(2000, seed=6)
    config = ValidateConfig(holdout_max_decisions=300, validation_fraction=0.1, validation_max_decisions=450)
    split = split_holdout(validate_rows(rows).records, config)
    carved = sum(len(r.decisions) for r in split.validation)
    assert 400 < carved <= 450  # the cap binds (10% of ~5,700 training decisions would be ~570)
    assert not _ids(split.validation) & (_ids(split.train) | _ids(split.heldout))
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    assert _ids(split_holdout(validate_rows(shuffled).records, config).validation) == _ids(split.validation)
    fraction_bound = split_holdout(
        validate_rows(rows).records, replace(config, validation_max_decisions=10_000)
    )
    assert sum(len(r.decisions) for r in fraction_bound.validation) <= 0.1 * 6000


def test_no_validation_split_below_its_minimum_or_when_turned_off():
    records = validate_rows(synthetic.generate_rows(200, seed=7)).records  # ~600 decisions: 10% is ~54
    assert split_holdout(records, ValidateConfig(validation_min_decisions=100)).validation == []
    assert split_holdout(records, ValidateConfig(validation_fraction=0.0)).validation == []
    assert split_holdout(records, ValidateConfig(validation_min_decisions=20)).validation


def test_tiny_sets_hold_out_one_row_but_never_the_last():
    records = validate_rows(synthetic.generate_rows(3, seed=5)).records
    split = split_holdout(records, ValidateConfig())
    assert len(split.heldout) == 1 and len(split.train) == 2
    single = split_holdout(records[:1], ValidateConfig())
    assert single.heldout == [] and len(single.train) == 1


def test_with_the_shipped_params_a_row_held_out_once_stays_held_out_as_the_data_grows_past_the_cap(tmp_path):
    from pipeline.config import load_params
    from pipeline.data.split import read_ledger, record_heldout

    shipped = load_params("params.yaml").validate
    assert shipped.holdout_ledger, "params.yaml ships a ledger"
    config = replace(shipped, holdout_ledger=str(tmp_path / "ledger.txt"))
    rows = synthetic.generate_rows(20_000, seed=5)  # 3 decisions a row: the cap binds from ~13,400 rows
    first = split_holdout(validate_rows(rows[:14_000]).records, config)
    assert sum(len(r.decisions) for r in first.heldout) <= shipped.holdout_max_decisions
    assert record_heldout(first, config.holdout_ledger) == len(first.heldout)
    assert read_ledger(config.holdout_ledger) == _ids(first.heldout)

    grown = rows[:]
    random.Random(1).shuffle(grown)
    after = split_holdout(validate_rows(grown).records, config)
    assert _ids(first.heldout) <= _ids(after.heldout) and _ids(first.train) <= _ids(after.train)
    new = _ids(after.heldout) - _ids(first.heldout)
    assert new <= _ids(validate_rows(rows[14_000:]).records)  # only new rows fill what budget is left
    assert sum(len(r.decisions) for r in after.heldout) <= shipped.holdout_max_decisions
    record_heldout(after, config.holdout_ledger)
    assert _ids(split_holdout(validate_rows(grown).records, config).heldout) == _ids(after.heldout)

    # Without the ledger the same growth moves rows that were held out into training.
    stateless = split_holdout(validate_rows(grown).records, replace(config, holdout_ledger=None))
    assert _ids(first.heldout) - _ids(stateless.heldout)
