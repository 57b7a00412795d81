"""Calibrator choice by cross-fitted NLL, its file, and every reader applying the identical transform."""

import json
from dataclasses import replace

import numpy as np
import pytest

from pipeline.config import ValidateConfig
from pipeline.data import synthetic
from pipeline.data.split import Split, SplitData, TrainSource
from pipeline.data.validate import validate_rows
from pipeline.rundir import RunFolder
from pipeline.scoring.calibration import softmax
from pipeline.scoring.calibrators import (
    QUESTION_TEMPERATURE,
    TYPE_TEMPERATURE,
    VECTOR_SCALING,
    Calibrator,
    QuestionTransform,
    choose_calibrator,
    mean_nll,
)
from pipeline.scoring.decisions import ScoredDecision, gold_decisions, with_groups
from pipeline.scoring.heldout import HeldOut, load_heldout, save_heldout
from pipeline.stages import calibrate as calibrate_module
from pipeline.stages.calibrate import calibrate_stage
from pipeline.stages.train import train_stage
from tests.tiny import JOINT_HEAD, write_learnable_rows


def _decisions(rng, n, k, question_id, transform, qtype=0, first_record=0):
    """Logits and labels drawn from softmax(transform(logits)): the calibrator that undoes it is known."""
    logits = [rng.normal(0, 2.5, size=k) for _ in range(n)]
    labels = [int(rng.choice(k, p=softmax(transform(z)))) for z in logits]
    decisions = [
        ScoredDecision(qtype, y, first_record + i, question_id, tuple(np.eye(k)[y]))
        for i, y in enumerate(labels)
    ]
    return decisions, logits


def test_two_questions_miscalibrated_in_opposite_directions_get_their_own_temperatures():
    rng = np.random.default_rng(0)
    hot, hot_logits = _decisions(rng, 1500, 3, "hot", lambda z: z / 3.0)
    cold, cold_logits = _decisions(rng, 1500, 3, "cold", lambda z: z / 0.6, first_record=1500)
    choice = choose_calibrator(hot + cold, hot_logits + cold_logits)
    assert choice.calibrator.kind in (QUESTION_TEMPERATURE, VECTOR_SCALING)
    assert choice.nll[QUESTION_TEMPERATURE] < choice.nll[TYPE_TEMPERATURE] - 0.01
    if choice.calibrator.kind == QUESTION_TEMPERATURE:
        assert choice.calibrator.questions["hot"].temperature == pytest.approx(3.0, rel=0.15)
        assert choice.calibrator.questions["cold"].temperature == pytest.approx(0.6, rel=0.15)
    assert "lowest cross-fitted NLL" in choice.calibrator.notes["chosen"]


def test_a_biased_class_prior_is_what_vector_scaling_corrects_and_it_is_chosen():
    rng = np.random.default_rng(1)
    bias = np.array([1.5, 0.0, -1.5])
    decisions, logits = _decisions(rng, 3000, 3, "tone", lambda z: z + bias)
    choice = choose_calibrator(decisions, logits)
    assert choice.calibrator.kind == VECTOR_SCALING
    assert (
        choice.nll[VECTOR_SCALING]
        < min(choice.nll[TYPE_TEMPERATURE], choice.nll[QUESTION_TEMPERATURE]) - 0.02
    )
    fitted = choice.calibrator.questions["tone"]
    assert np.subtract(fitted.bias, np.mean(fitted.bias)) == pytest.approx(bias - bias.mean(), abs=0.3)


def test_too_few_decisions_per_question_leave_only_the_type_temperature():
    rng = np.random.default_rng(2)
    decisions, logits = [], []
    for q in range(40):  # 40 questions of 20 decisions each: none is large enough for its own transform
        d, z = _decisions(rng, 20, 3, f"q{q}", lambda z: z / 2.0, first_record=20 * q)
        decisions += d
        logits += z
    choice = choose_calibrator(decisions, logits)
    assert set(choice.nll) == {TYPE_TEMPERATURE} and choice.calibrator.kind == TYPE_TEMPERATURE
    assert choice.calibrator.temperatures[0] == pytest.approx(2.0, rel=0.2)


def test_the_winner_is_scored_cross_fitted_not_in_sample():
    rng = np.random.default_rng(3)
    decisions, logits = _decisions(rng, 1200, 3, "q", lambda z: z / 2.0)
    choice = choose_calibrator(decisions, logits)
    in_sample = choice.calibrator.apply(decisions, logits)
    assert mean_nll(decisions, choice.cross_fitted) != pytest.approx(mean_nll(decisions, in_sample), abs=1e-9)


def test_the_file_round_trips_and_a_reused_id_with_other_options_falls_back_to_its_type():
    calibrator = Calibrator(
        VECTOR_SCALING,
        (1.5, 1.0, 0.8),
        {
            "tone": QuestionTransform(0, 3, weights=(0.5, 1.0, 2.0), bias=(0.1, 0.0, -0.1)),
            "flag": QuestionTransform(2, 2, temperature=2.0),
        },
    )
    again = Calibrator.from_json(json.loads(json.dumps(calibrator.to_json())))
    z = np.array([1.0, -0.5, 0.25])
    assert again.probabilities(0, "tone", z) == pytest.approx(softmax(z * [0.5, 1.0, 2.0] + [0.1, 0.0, -0.1]))
    assert again.probabilities(0, "tone", z[:2]) == pytest.approx(softmax(z[:2], 1.5))  # 2 options, not 3
    assert again.probabilities(1, "flag", z[:2]) == pytest.approx(softmax(z[:2], 1.0))  # another type
    assert again.probabilities(2, "flag", z[:2]) == pytest.approx(softmax(z[:2], 2.0))
    with pytest.raises(ValueError, match="unknown calibrator kind"):
        Calibrator.from_json({"kind": "isotonic", "temperatures": {}})


QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "what tone",
        "criteria": {"negative": None, "neutral": "none", "positive": None},
    },
    "good": {"type": "noul", "instructions": "it is good", "criteria": None},
}
RICHER = Calibrator(QUESTION_TEMPERATURE, (1.5, 1.0, 2.0), {"tone": QuestionTransform(0, 3, temperature=3.0)})


def _raw(loaded, state):
    """The model's uncalibrated probabilities per question (its calibration removed)."""
    from dataclasses import replace

    from pipeline.families.laya.predict import predict

    plain = replace(loaded, calibrator=None, config={**loaded.config, "temperature": [1.0, 1.0, 1.0]})
    return predict(plain, state, QUESTIONS)


def test_a_laya_export_keeps_a_richer_calibrator_and_laya_agent_gets_its_type_temperatures(
    tiny_base, tmp_path
):
    import laya

    from pipeline.families.laya.export import export_model
    from pipeline.families.laya.predict import predict
    from pipeline.families.laya_layout import load_model

    manifest = export_model(
        load_model(tiny_base), tmp_path / "export", RICHER, {"source_digest": "x"}
    ).manifest
    assert manifest["calibrator"]["kind"] == QUESTION_TEMPERATURE
    assert "laya.Agent applies only the per-type temperatures" in manifest["calibrator"]["other_readers"]
    ours = load_model(tmp_path / "export")
    state = "this is great"
    raw, served = _raw(ours, state), predict(ours, state, QUESTIONS)
    logit = np.log(raw["tone"])
    np.testing.assert_allclose(served["tone"], softmax(logit, 3.0), atol=1e-6)  # its own temperature
    np.testing.assert_allclose(served["good"], softmax(np.log(raw["good"]), 2.0), atol=1e-6)  # its type's
    agent = laya.Agent(str(tmp_path / "export"), device="cpu").system_one(state, QUESTIONS)["answers"]
    theirs = [agent["tone"]["probabilities"][k] for k in ("negative", "neutral", "positive")]
    np.testing.assert_allclose(
        theirs, softmax(logit, 1.5), atol=2e-3
    )  # folded: the choice type's temperature
    assert np.abs(softmax(logit, 3.0) - softmax(logit, 1.5)).max() > 0.01, (
        "the two must differ for this to test"
    )


def test_a_joint_export_answers_with_its_calibrator(tiny_base, tmp_path):
    import torch

    from pipeline.data.answers import answer_probabilities, parse_request
    from pipeline.data.validate import validate_rows
    from pipeline.families import load_decision_model
    from pipeline.families.joint.layout import export_joint
    from tests.tiny import load_joint_on

    family, loaded = load_joint_on(tiny_base)
    sharp = Calibrator(
        QUESTION_TEMPERATURE, (1.0, 1.0, 0.05), {"tone": QuestionTransform(0, 3, temperature=0.02)}
    )
    export_joint(loaded, tmp_path / "export", sharp, {"source_digest": "a"})
    model = load_decision_model(tmp_path / "export")
    state = "okay product"
    record = validate_rows(
        [{"state": state, "questions": QUESTIONS, "gold": {"tone": "neutral", "good": True}}]
    ).records
    decisions, logits = family.score(
        model.loaded, family.build_examples(model.loaded, record)[0], torch.device("cpu")
    )
    served = model.answer([parse_request(state, QUESTIONS)])[0].answers
    for decision, z in zip(decisions, logits):
        expected = sharp.probabilities(decision.qtype, decision.question_id, z)
        got = answer_probabilities(served[decision.question_id])
        np.testing.assert_allclose(got, expected, atol=1e-4)  # answers carry 4 decimals
        assert np.abs(expected - softmax(z)).max() > 0.01, (
            "the calibrator must change the answer for this to test"
        )


@pytest.mark.parametrize("damage", ["missing", "edited"])
def test_a_missing_or_edited_calibrator_file_is_a_clear_error_naming_it(tiny_base, tmp_path, damage):
    from pipeline.families.base import ModelLayoutError
    from pipeline.families.laya.export import export_model
    from pipeline.families.laya_layout import load_model

    export_model(load_model(tiny_base), tmp_path / "export", RICHER, {"source_digest": "x"})
    path = tmp_path / "export" / "calibrator.json"
    if damage == "missing":
        path.unlink()
    else:
        path.write_text(path.read_text().replace("3.0", "9.0"))
    with pytest.raises(ModelLayoutError, match=r"calibrator\.json: (missing|its bytes differ)"):
        load_model(tmp_path / "export")


def _labels_shared_by_groups(rng):
    """8 groups of 40 rows, every row of a group with its group's label (one speech, one era), 6 groups of 8
    with option 0: the label prior of any few groups is far from another few's."""
    decisions, logits, groups = [], [], []
    for g, label in enumerate([0, 0, 0, 1, 0, 0, 0, 1]):
        for _ in range(40):
            z = rng.normal(0, 1.0, 3)
            z[label] += 1.0
            decisions.append(ScoredDecision(0, label, len(groups), "era", tuple(np.eye(3)[label])))
            logits.append(z)
            groups.append(f"speech {g}")
    return decisions, logits, groups


def test_cross_fitting_keeps_a_group_on_one_side_so_a_bias_learnt_from_its_labels_cannot_win():
    decisions, logits, groups = _labels_shared_by_groups(np.random.default_rng(0))
    grouped = with_groups(decisions, groups)
    for group in set(groups):
        assert len({d.half for d, g in zip(grouped, groups) if g == group}) == 1
    # Rows apart, both halves share every group's labels and a per-option bias looks like a gain; groups
    # apart, the bias one half's groups teach is measured on the other half's, as the served model meets new
    # groups.
    assert choose_calibrator(decisions, logits).calibrator.kind == VECTOR_SCALING
    choice = choose_calibrator(grouped, logits)
    assert choice.calibrator.kind != VECTOR_SCALING
    assert choice.nll[VECTOR_SCALING] > choice.nll[TYPE_TEMPERATURE]


@pytest.mark.parametrize("grouped", [True, False])
def test_the_calibrate_stage_cross_fits_by_the_groups_saved_with_the_logits(grouped, tmp_path):
    decisions, logits, groups = _labels_shared_by_groups(np.random.default_rng(0))
    run = RunFolder(tmp_path)
    items = with_groups(decisions, groups) if grouped else decisions
    scored = HeldOut(items, None, logits, {"era": ("a", "b", "c")})
    save_heldout(run.validation_logits, scored)
    save_heldout(run.heldout, replace(scored, base_logits=logits))
    calibrator = calibrate_stage(tmp_path).calibrator  # no split.pkl: the groups come with the logits
    assert (calibrator["kind"] == VECTOR_SCALING) is not grouped
    # the temperature's interval draws what the cross-fit keeps apart: the 8 groups, or the 320 rows
    spreads = json.loads(RunFolder(tmp_path).calibration.read_text())["calibrator"]["temperature_intervals"]
    spread = spreads["choice"]
    assert (spread["drawn"], spread["clusters"]) == (("groups", 8) if grouped else ("rows", 320))
    assert spread["low"] < spread["temperature"] < spread["high"]


def test_a_small_validation_split_gets_a_note_naming_the_temperature_s_interval(tmp_path):
    rng = np.random.default_rng(4)
    run = RunFolder(tmp_path)
    for size, path in ((24, run.validation_logits), (400, run.heldout)):
        logits = [rng.normal(0, 4.0, 3) for _ in range(size)]  # over-confident: labels drawn at T = 3
        labels = [int(rng.choice(3, p=softmax(z, 3.0))) for z in logits]
        items = [ScoredDecision(0, y, i, "q", tuple(np.eye(3)[y])) for i, y in enumerate(labels)]
        save_heldout(path, HeldOut(items, logits, logits, {"q": ("a", "b", "c")}))
    notes = calibrate_stage(tmp_path).notices
    assert len(notes) == 1 and "choice T" in notes[0] and "from 24 decisions in 24 rows" in notes[0]


def test_held_out_files_keep_the_groups_and_older_files_read_as_ungrouped(tmp_path):
    decisions, logits, groups = _labels_shared_by_groups(np.random.default_rng(0))
    grouped = with_groups(decisions, groups)
    path = save_heldout(tmp_path / "heldout.npz", HeldOut(grouped, None, logits, {"era": ("a", "b", "c")}))
    assert load_heldout(path).items == grouped
    with np.load(path) as saved:  # as the train stage wrote it before groups were saved
        np.savez_compressed(tmp_path / "older.npz", **{k: saved[k] for k in saved.files if k != "group"})
    assert load_heldout(tmp_path / "older.npz").items == decisions


def test_the_train_stage_saves_each_decision_with_its_row_s_group(tiny_base, tmp_path):
    rows = [json.loads(line) for line in write_learnable_rows(tmp_path / "rows.jsonl", 80, seed=2).open()]
    for i, row in enumerate(rows):
        row["group"] = f"customer {i // 4}"
    source = synthetic.write_rows(rows, tmp_path / "grouped.jsonl")
    split = ValidateConfig(holdout_fraction=0.25, validation_fraction=0.25, validation_min_decisions=5)
    data = TrainSource(source, split_config=split).validated()
    run = RunFolder(tmp_path / "run")
    data.save(run.split)
    train_stage(run.root, tiny_base, replace(JOINT_HEAD, epochs=1, threads=1, lexicon="tokens"), "cpu")
    for saved, records in ((run.heldout, data.split.heldout), (run.validation_logits, data.split.validation)):
        items = load_heldout(saved).items
        assert items and all(d.group >= 0 for d in items)
        keys = [records[d.record].group for d in items]
        # one number per group key, and the same key wherever the number is the same
        assert (
            len(set(zip(keys, (d.group for d in items)))) == len(set(keys)) == len({d.group for d in items})
        )


def test_rows_without_groups_keep_their_halves():
    decisions, _, _ = _labels_shared_by_groups(np.random.default_rng(0))
    assert with_groups(decisions, [None] * len(decisions)) == decisions
    assert [d.half for d in decisions] == [d.record % 2 for d in decisions]


def test_the_calibrate_stage_scores_a_bag_of_words_on_the_same_decisions_and_says_when_it_is_ahead(tmp_path):
    rows = [json.loads(line) for line in write_learnable_rows(tmp_path / "rows.jsonl", 160, seed=3).open()]
    validated = validate_rows(rows)
    train, heldout = validated.records[:120], validated.records[120:]
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    SplitData(validated.report, Split(train, heldout)).save(run.split)
    items = gold_decisions(heldout)
    # A fine-tune that learned nothing: its logits are noise.
    noise = [np.random.default_rng(i).normal(size=d.n_options) for i, d in enumerate(items)]
    options = {d.question.id: d.question.options for record in heldout for d in record.decisions}
    save_heldout(run.heldout, HeldOut(items, noise, noise, options))
    result = calibrate_stage(run.root, bag_of_words_rows=100)
    words = result.heldout["bag_of_words"]
    assert words["rows"] == 100 and words["accuracy"] > result.heldout["calibrated"]["accuracy"]
    assert [n for n in result.notices if "bag of words" in n] == [result.notices[0]]
    assert json.loads(run.calibration.read_text())["heldout"]["bag_of_words"]["accuracy"] == words["accuracy"]
    off = calibrate_stage(run.root, bag_of_words_rows=0)
    assert "bag_of_words" not in off.heldout and not any("bag of words" in n for n in off.notices)


def test_runs_on_one_split_fit_the_bag_of_words_once_and_read_it_back(tmp_path, monkeypatch):
    rows = [json.loads(line) for line in write_learnable_rows(tmp_path / "rows.jsonl", 160, seed=3).open()]
    validated = validate_rows(rows)
    train, heldout = validated.records[:120], validated.records[120:]
    items = gold_decisions(heldout)
    noise = [np.random.default_rng(i).normal(size=d.n_options) for i, d in enumerate(items)]
    options = {d.question.id: d.question.options for record in heldout for d in record.decisions}
    trials = []
    for name in ("trial-0", "trial-1"):  # a sweep's trials: the same split copied into each run folder
        run = RunFolder(tmp_path / name)
        run.root.mkdir()
        SplitData(validated.report, Split(train, heldout)).save(run.split)
        save_heldout(run.heldout, HeldOut(items, noise, noise, options))
        trials.append(run)
    cache, said = tmp_path / "sweep", []
    first = calibrate_stage(trials[0].root, bag_of_words_rows=100, bag_of_words_cache=cache)
    monkeypatch.setattr(calibrate_module, "bag_of_words", lambda *a, **k: pytest.fail("fitted again"))
    second = calibrate_stage(trials[1].root, bag_of_words_rows=100, say=said.append, bag_of_words_cache=cache)
    same = [json.dumps(run.heldout["bag_of_words"], sort_keys=True) for run in (first, second)]  # NaN-aware
    assert same[0] == same[1] and "as fitted once" in said[-1]
    with pytest.raises(
        pytest.fail.Exception, match="fitted again"
    ):  # another row cap is another bag of words
        calibrate_stage(trials[1].root, bag_of_words_rows=50, bag_of_words_cache=cache)
