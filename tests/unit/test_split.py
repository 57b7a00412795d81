"""The held-out split: whole rows (or whole groups), stable under reordering and growth, within its caps."""

import csv
import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli.main import main
from pipeline.config import ValidateConfig
from pipeline.data import synthetic
from pipeline.data.leakage import KeptTogether, StateKeys, near_key, normalised_state, state_keys
from pipeline.data.split import hash_position, split_holdout
from pipeline.data.validate import validate_file, validate_rows
from pipeline.stages.track import run_metrics
from tests.results import run_result, validation


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


def test_rows_added_with_fewer_decisions_never_push_a_held_out_row_into_training():
    # Harvested rows carry the one or two questions labelled: a budget that followed the data's decisions let
    # such rows, hashing low, push rows held out before into training (then a model is gated on rows it read).
    config = ValidateConfig()
    rows = synthetic.generate_rows(300, seed=8)
    before = split_holdout(validate_rows(rows).records, config)
    singles = [
        row
        | {"questions": dict(list(row["questions"].items())[:1]), "gold": dict(list(row["gold"].items())[:1])}
        for row in synthetic.generate_rows(600, seed=9)
    ]
    low = [
        r
        for r, record in zip(singles, validate_rows(singles).records)
        if hash_position(record.content_hash()) < 0.05
    ][:20]
    after = split_holdout(validate_rows(rows + low).records, config)
    assert len(low) == 20 and _ids(before.heldout) <= _ids(after.heldout)


def test_split_respects_its_cap_and_fraction_and_keeps_rows_whole():
    records = validate_rows(synthetic.generate_rows(2000, seed=4)).records
    for config in (ValidateConfig(holdout_max_decisions=60), ValidateConfig(holdout_fraction=0.02)):
        split = split_holdout(records, config)
        decisions = sum(len(r.decisions) for r in split.heldout)
        assert 0 < decisions <= config.holdout_max_decisions
        # The fraction is a threshold on each row's hash: about that share of the rows, as sampling allows.
        assert abs(len(split.heldout) / len(records) - min(config.holdout_fraction, 60 / 6000 * 3)) < 0.02
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
    from pipeline.data.split import ledger_path, read_ledger, record_heldout

    config = load_params("params.yaml").validate
    assert ledger_path(config.data, config) == Path(f"{config.data}.holdout-ledger.txt")  # the data set's own
    ledger = tmp_path / "ledger.txt"
    rows = synthetic.generate_rows(20_000, seed=5)  # 3 decisions a row: the cap binds from ~13,400 rows
    first = split_holdout(validate_rows(rows[:14_000]).records, config, ledger)
    assert sum(len(r.decisions) for r in first.heldout) <= config.holdout_max_decisions
    assert record_heldout(first, ledger) == len(first.heldout)
    assert read_ledger(ledger) == _ids(first.heldout)

    grown = rows[:]
    random.Random(1).shuffle(grown)
    after = split_holdout(validate_rows(grown).records, config, ledger)
    assert _ids(first.heldout) <= _ids(after.heldout) and _ids(first.train) <= _ids(after.train)
    new = _ids(after.heldout) - _ids(first.heldout)
    assert new <= _ids(validate_rows(rows[14_000:]).records)  # only new rows fill what budget is left
    assert sum(len(r.decisions) for r in after.heldout) <= config.holdout_max_decisions
    record_heldout(after, ledger)
    assert _ids(split_holdout(validate_rows(grown).records, config, ledger).heldout) == _ids(after.heldout)

    # Without the ledger the same growth moves rows that were held out into training.
    stateless = split_holdout(validate_rows(grown).records, config)
    assert _ids(first.heldout) - _ids(stateless.heldout)


def _digest(records) -> str:
    return hashlib.sha256("".join(sorted(r.content_hash() for r in records)).encode()).hexdigest()[:16]


def test_rows_of_distinct_states_split_exactly_as_before_the_leakage_check():
    """Digests of the sides the split chose before states were compared (pinned from that code): where no two
    rows share a state or a near-duplicate key, joining them changes nothing, with groups or without."""
    rows = synthetic.generate_rows(3000, seed=21)
    config = ValidateConfig(holdout_max_decisions=600, validation_max_decisions=600)
    plain = split_holdout(validate_rows(rows).records, config)
    assert plain.kept_together == KeptTogether()
    assert (_digest(plain.heldout), _digest(plain.validation)) == ("ae9fb6f488433a12", "bbe88424b985102f")
    grouped = [{**row, "group": f"user-{i % 97}"} for i, row in enumerate(rows)]
    split = split_holdout(validate_rows(grouped).records, config)
    assert (_digest(split.heldout), _digest(split.validation)) == ("2164afebf9da04c8", "86bc04144103c00c")


def _side_of(split) -> dict[str, str]:
    sides = ("train", "validation", "heldout")
    return {r.content_hash(): side for side in sides for r in getattr(split, side)}


def test_rows_sharing_a_state_or_nearly_go_to_one_side_and_are_counted():
    rows = synthetic.generate_rows(600, seed=30)
    # Twins of 40 rows: 20 shouted (one normalised state) and 20 with their words sorted (near-duplicates).
    shouted = [{**row, "state": "  " + row["state"].upper() + "!!"} for row in rows[:20]]
    shuffled = [{**row, "state": ", ".join(sorted(row["state"].split()))} for row in rows[20:40]]
    config = ValidateConfig(holdout_fraction=0.3, holdout_max_decisions=10_000, validation_min_decisions=10)
    records = validate_rows(rows + shouted + shuffled).records
    split = split_holdout(records, config)
    sides = _side_of(split)
    twins = list(zip(records[:40], records[600:], strict=True))
    assert all(sides[a.content_hash()] == sides[b.content_hash()] for a, b in twins)
    assert {sides[a.content_hash()] for a, _ in twins} == {"train", "validation", "heldout"}
    assert split.kept_together == KeptTogether(shared_state_rows=40, near_duplicate_rows=40)
    assert split.summary() | {"shared_state_rows": 40, "near_duplicate_rows": 40} == split.summary()
    assert split_holdout(validate_rows(rows).records, config).kept_together == KeptTogether()


def test_a_state_two_groups_share_joins_the_groups_and_short_or_json_states_match_exactly_only():
    rows = synthetic.generate_rows(200, seed=31)
    grouped = [{**row, "group": f"user-{i % 20}"} for i, row in enumerate(rows)]
    grouped[1] = {**grouped[1], "state": grouped[0]["state"] + "."}  # user-1 asks what user-0 asked
    records = validate_rows(grouped).records
    sides = _side_of(split_holdout(records, ValidateConfig(holdout_fraction=0.3)))
    assert len({sides[r.content_hash()] for r in records if r.group in ('"user-0"', '"user-1"')}) == 1
    assert near_key(normalised_state("late 1")) is None  # too few words to call two texts near-duplicates
    numbers_aside = near_key(normalised_state("Order 1234 arrived late, very late"))
    assert numbers_aside == near_key("late order 77 arrived very")
    assert state_keys({"text": "Late!", "n": 1}) == StateKeys('{"n":1,"text":"Late!"}', None)  # exact only
    assert state_keys({"n": 1, "text": "Late!"}) == state_keys({"text": "Late!", "n": 1})  # key order aside


def test_each_data_set_has_its_ledger_beside_what_dvc_pins_never_inside(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.data.split import ledger_path

    folder = tmp_path / "tickets"
    folder.mkdir()
    (tmp_path / "tickets.dvc").write_text("outs:\n- path: tickets\n")  # `dvc add tickets` pins the folder
    beside = tmp_path / "tickets.holdout-ledger.txt"
    for data in (folder, f"{folder}/*.parquet", folder / "part-0.parquet"):  # the folder, a glob, one shard
        assert ledger_path(data, ValidateConfig()) == beside
    assert ledger_path(tmp_path / "rows.csv", ValidateConfig()) == tmp_path / "rows.csv.holdout-ledger.txt"
    assert ledger_path("hf:owner/name", ValidateConfig()) is None  # nothing pins a Hub data set
    assert ledger_path(folder, ValidateConfig(holdout_ledger="one.txt")) == Path("one.txt")
    with pytest.raises(ConfigError, match=r"validate\.holdout_ledger: .* inside"):
        ledger_path(folder, ValidateConfig(holdout_ledger=str(folder / "ledger.txt")))


def _grouped(rows, groups: int, seed: int = 0):
    """The rows, each with one of `groups` group names (several rows per group)."""
    rng = random.Random(seed)
    return [{**row, "group": f"user-{rng.randrange(groups)}"} for row in rows]


def _sides(split) -> dict[str, set[str]]:
    return {side: {r.group for r in getattr(split, side)} for side in ("train", "validation", "heldout")}


def test_a_group_goes_to_one_side_whole_for_the_held_out_and_the_validation_split():
    rows = _grouped(synthetic.generate_rows(2000, seed=8), groups=120)
    config = ValidateConfig(holdout_max_decisions=600, validation_fraction=0.1, validation_max_decisions=600)
    split = split_holdout(validate_rows(rows).records, config)
    sides = _sides(split)
    assert all(sides.values()), "each side gets groups"
    assert not sides["train"] & sides["heldout"] and not sides["train"] & sides["validation"]
    assert not sides["validation"] & sides["heldout"]
    assert 0 < sum(len(r.decisions) for r in split.heldout) <= 600
    summary = split.summary()
    assert [summary[f"{side}_groups"] for side in sides] == [len(groups) for groups in sides.values()]
    # Reordered, the same groups are held out; a group's key is its cell, whatever its rows hold.
    shuffled = rows[:]
    random.Random(2).shuffle(shuffled)
    assert _sides(split_holdout(validate_rows(shuffled).records, config)) == sides


def test_rows_without_a_group_split_as_they_always_did():
    rows = synthetic.generate_rows(600, seed=9)
    config = ValidateConfig(holdout_max_decisions=10_000, holdout_fraction=0.1)
    plain = split_holdout(validate_rows(rows).records, config)
    ungrouped = [{**row, "group": None if i % 2 else ""} for i, row in enumerate(rows)]  # null or empty: none
    assert _ids(split_holdout(validate_rows(ungrouped).records, config).heldout) == _ids(plain.heldout)
    assert "heldout_groups" not in plain.summary(), "a report without groups reads as before"
    # Grouping some rows leaves the others where they were (no cap binds here).
    some = [{**row, "group": "g"} if i < 50 else row for i, row in enumerate(rows)]
    records = validate_rows(some).records
    grouped = _ids(r for r in records if r.group is not None)
    regrouped = split_holdout(records, config)
    assert _ids(r for r in regrouped.heldout if r.group is None) == _ids(plain.heldout) - grouped


def test_a_ledger_entry_for_any_row_of_a_group_holds_out_the_whole_group(tmp_path):
    rows = _grouped(synthetic.generate_rows(400, seed=10), groups=40)
    records = validate_rows(rows).records
    train_group = next(r.group for r in split_holdout(records, ValidateConfig()).train)
    ledger = tmp_path / "ledger.txt"
    ledger.write_text(next(r.content_hash() for r in records if r.group == train_group) + "\n")
    split = split_holdout(records, ValidateConfig(), ledger)
    assert train_group in _sides(split)["heldout"] and train_group not in _sides(split)["train"]
    assert {r.content_hash() for r in records if r.group == train_group} <= _ids(split.heldout)


def test_group_cells_are_keys_by_value():
    rows = synthetic.generate_rows(4, seed=11)
    cells = ["a", 7, "7", {"b": 1, "a": 2}]
    records = validate_rows([{**row, "group": cell} for row, cell in zip(rows, cells)]).records
    assert [r.group for r in records] == ['"a"', "7", '"7"', '{"a":2,"b":1}']


def test_a_missing_number_in_a_group_column_is_no_group(tmp_path):
    """pandas writes a missing cell of a number column as NaN: those rows are each a group of their own, not
    one group of every row whose group is missing."""
    rows = synthetic.generate_rows(4, seed=13)
    columns = {name: [json.dumps(row[name]) for row in rows] for name in ("state", "questions", "gold")}
    groups = pa.array([3.0, float("nan"), 3.0, None], pa.float64())
    pq.write_table(pa.table({**columns, "group": groups}), tmp_path / "rows.parquet")
    assert [r.group for r in validate_file(tmp_path / "rows.parquet").records] == ["3.0", None, "3.0", None]


def test_a_decision_file_of_any_format_carries_its_group_column(tmp_path):
    rows = [{**row, "group": f"doc-{i // 2}"} for i, row in enumerate(synthetic.generate_rows(6, seed=12))]
    as_text = [{k: v if isinstance(v, str) else json.dumps(v) for k, v in row.items()} for row in rows]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(as_text), tmp_path / "rows.parquet")
    with open(tmp_path / "rows.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(as_text[0]))
        writer.writeheader()
        writer.writerows(as_text)
    expected = [f'"doc-{i // 2}"' for i in range(6)]
    for name in ("rows.jsonl", "rows.parquet", "rows.csv"):
        assert [r.group for r in validate_file(tmp_path / name).records] == expected, name


def test_the_split_s_group_counts_go_to_mlflow_with_the_run():
    rows = _grouped(synthetic.generate_rows(400, seed=14), groups=40)
    split = split_holdout(validate_rows(rows).records, ValidateConfig())
    metrics = run_metrics(run_result(validation=replace(validation(), split=split.summary())))
    assert {k: metrics[k] for k in ("train_groups", "validation_groups", "heldout_groups")} == {
        side: float(len(groups))
        for side, groups in (
            ("train_groups", _sides(split)["train"]),
            ("validation_groups", _sides(split)["validation"]),
            ("heldout_groups", _sides(split)["heldout"]),
        )
    }
    assert sum(metrics[k] for k in ("train_groups", "validation_groups", "heldout_groups")) == 40


def test_the_validation_report_counts_the_groups_and_decision_validate_says_them(tmp_path, capsys):
    rows = synthetic.generate_rows(6, seed=15)
    cells = ["a", "a", "a", "b", None, ""]
    report = validate_rows([{**row, "group": cell} for row, cell in zip(rows, cells)]).report.to_dict()
    assert report["groups"] == {"groups": 2, "rows": 4, "largest": 3}
    assert "groups" not in validate_rows(rows).report.to_dict(), "a report without groups reads as before"
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({**row, "group": cell}) + "\n" for row, cell in zip(rows, cells)))
    assert main(["validate", str(path)]) == 0
    assert "groups: 2 (4 of 6 rows have one; the largest has 3 rows)" in " ".join(
        capsys.readouterr().out.split()
    )
