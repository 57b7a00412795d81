"""Out-of-fold answers of the training rows, where the validation split is small: each training decision
answered once by a model trained on the other folds, rows that belong together in one fold, the run's own
model untouched by the folds, and the calibrate stage fitting on them with the validation split's."""

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.config import ConfigError, TrainConfig, ValidateConfig
from pipeline.data import synthetic
from pipeline.data.split import TrainSource, folds_of_rows
from pipeline.rundir import RunFolder
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.heldout import HeldOut, load_heldout, pooled, save_heldout
from pipeline.stages.calibrate import calibrate_stage
from pipeline.stages.train import train_stage
from pipeline.training import out_of_fold
from pipeline.training.controls import RunHooks
from pipeline.training.fit import fit
from tests.tiny import JOINT_HEAD, synthetic_records, write_learnable_rows

SPLIT = ValidateConfig(holdout_fraction=0.25, validation_fraction=0.2, validation_min_decisions=5)
CONFIG = replace(JOINT_HEAD, epochs=4, threads=1, lexicon="tokens")
FOLDS = replace(CONFIG, out_of_fold_below=10_000, out_of_fold_folds=3)


@pytest.fixture(scope="module")
def grouped_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rows")
    rows = [json.loads(line) for line in write_learnable_rows(folder / "rows.jsonl", 90, seed=5).open()]
    for i, row in enumerate(rows):
        row["group"] = f"customer {i // 3}"
    return synthetic.write_rows(rows, folder / "grouped.jsonl")


def test_rows_that_belong_together_share_a_fold_and_the_folds_are_balanced():
    records = synthetic_records(60, seed=1)
    grouped = [replace(r, group=f"g{i // 4}") for i, r in enumerate(records)]
    folds = folds_of_rows(grouped, 3)
    assert set(folds) == {0, 1, 2}
    for group in {r.group for r in grouped}:
        assert len({f for r, f in zip(grouped, folds) if r.group == group}) == 1
    assert sorted(np.bincount(folds)) == [20, 20, 20]  # 15 groups of 4 rows dealt 5 to each fold
    assert folds_of_rows(grouped, 3) == folds  # the same rows, the same folds


def test_each_training_decision_is_answered_once_out_of_fold_and_the_run_s_model_is_as_without(
    tiny_base, grouped_rows
):
    data = TrainSource(grouped_rows, split_config=SPLIT).validated()
    lines: list[str] = []
    with_folds = fit(data, tiny_base, FOLDS, "cpu", RunHooks(report=lines.append))
    answered = with_folds.out_of_fold
    train_decisions = sum(len(r.decisions) for r in data.split.train)
    assert len(answered.decisions) == len(answered.logits) == train_decisions
    assert sorted(d.record for d in answered.decisions) == list(range(len(data.split.train)))
    assert (
        with_folds.run.out_of_fold["folds"] == 3
        and with_folds.run.out_of_fold["decisions"] == train_decisions
    )
    assert sum(line.startswith("out of fold ") for line in lines) == 3
    assert any(line.startswith("fold 2/3: train head: step") for line in lines)  # each fold's progress
    # Out of fold, the answers are better than chance (the rows are learnable) but were not trained on.
    right = np.mean([int(np.argmax(z)) == d.label for d, z in zip(answered.decisions, answered.logits)])
    assert right > 0.5
    alone = fit(data, tiny_base, CONFIG, "cpu")
    assert alone.run.out_of_fold["skipped"].startswith("off")
    for ours, theirs in zip(with_folds.tuned_logits, alone.tuned_logits):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)  # the folds leave the run's model as it would be


def test_a_method_that_retrains_the_backbone_answers_nothing_out_of_fold_and_says_why(
    tiny_base, grouped_rows
):
    data = TrainSource(grouped_rows, split_config=SPLIT).validated()
    lines: list[str] = []
    trained = fit(
        data, tiny_base, replace(FOLDS, method="lora", max_steps=2), "cpu", RunHooks(report=lines.append)
    )
    assert trained.out_of_fold.decisions == []
    assert "only train.method head" in trained.run.out_of_fold["skipped"]
    assert any("only train.method head" in line for line in lines)


def test_the_train_stage_saves_them_and_the_calibrate_stage_fits_and_certifies_on_them(
    tiny_base, grouped_rows, tmp_path
):
    data = TrainSource(grouped_rows, split_config=SPLIT).validated()
    run = RunFolder(tmp_path / "run")
    data.save(run.split)
    train_stage(run.root, tiny_base, FOLDS, "cpu")
    saved = load_heldout(run.out_of_fold).items
    assert len(saved) == sum(len(r.decisions) for r in data.split.train) and all(d.group >= 0 for d in saved)
    validation = load_heldout(run.validation_logits).items
    result = calibrate_stage(run.root)
    fitted_on = result.calibrator["fitted_on"]
    assert fitted_on.startswith(f"validation split: {len(validation):,} decisions")
    assert f"training rows answered out of fold: {len(saved):,} decisions" in fitted_on
    assert {c["fit_decisions"] for c in result.certificates.values()} == {len(validation) + len(saved)}
    train_stage(run.root, tiny_base, CONFIG, "cpu")  # a run without them leaves no stale file behind
    assert not run.out_of_fold.exists()


def test_pooled_sets_keep_rows_and_groups_of_different_sets_apart():
    def decision(record: int, group: int) -> ScoredDecision:
        return ScoredDecision(0, 0, record, "q", (1.0, 0.0), group=group)

    first = HeldOut(
        [decision(0, 0), decision(1, -1), decision(1, -1)], None, [np.zeros(2)] * 3, {"q": ("a", "b")}
    )
    second = HeldOut([decision(0, 0), decision(2, 1)], None, [np.ones(2)] * 2, {"r": ("c", "d")})
    both = pooled([first, second])
    assert [(d.record, d.group) for d in both.items] == [(0, 0), (1, -1), (1, -1), (2, 1), (4, 2)]
    assert len(both.tuned_logits) == 5 and both.options == {"q": ("a", "b"), "r": ("c", "d")}


def test_the_file_round_trips(tmp_path):
    items = [ScoredDecision(0, 1, 0, "q", (0.0, 1.0), group=3)]
    save_heldout(tmp_path / "oof.npz", HeldOut(items, None, [np.array([0.1, 0.2])], {"q": ("a", "b")}))
    assert load_heldout(tmp_path / "oof.npz").items == items


@pytest.mark.parametrize("values", [{"out_of_fold_below": -1}, {"out_of_fold_folds": 1}])
def test_bad_settings_are_refused_by_name(values):
    with pytest.raises(ConfigError, match=r"train\.out_of_fold"):
        TrainConfig(**values)


def test_every_fold_starts_from_the_weights_the_run_started_with(tiny_base, grouped_rows, monkeypatch):
    # A fold that went on from the fold before would answer rows that fold trained on: out of fold no more.
    started_from: list[list[float]] = []
    train_best = out_of_fold.train_best

    def recording(fold, *args, **kwargs):
        started_from.append([float(v.double().sum()) for v in fold.loaded.model.state_dict().values()])
        return train_best(fold, *args, **kwargs)

    monkeypatch.setattr(out_of_fold, "train_best", recording)
    data = TrainSource(grouped_rows, split_config=SPLIT).validated()
    fit(data, tiny_base, FOLDS, "cpu")
    assert len(started_from) == 3 and started_from[0] == started_from[1] == started_from[2]
