"""`train.lexicon: auto`: a `tokens` head and a `tfidf` head trained one after the other on the same frozen
features, each as its own run would train it, and the one (or the two together) with the lowest validation
loss kept; where there is nothing to choose (no validation split, a LoRA run, a trained head) it is `tokens`.
`both` keeps the two together."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.config import ValidateConfig
from pipeline.data.answers import parse_request
from pipeline.data.split import TrainSource
from pipeline.families.joint.head import HeadEnsemble
from pipeline.families.joint.predict import answer_joint_requests
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.metrics import heldout_metrics
from pipeline.stages.track import choice_tags, run_metrics
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.fit import fit
from tests.invariance import INTENSITY, STATE, TOL, TONE, probabilities
from tests.results import run_result
from tests.tiny import JOINT_HEAD, load_joint_on, write_learnable_rows

CONFIG = replace(JOINT_HEAD, epochs=3, threads=1, lexicon="auto")
SPLIT = ValidateConfig(holdout_fraction=0.2, validation_fraction=0.25, validation_min_decisions=10)


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    return write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 96, seed=3)


@pytest.fixture(scope="module")
def data(rows_file):
    return TrainSource(rows_file, split_config=SPLIT).validated()


def _validation_figures(trained) -> dict[str, float]:
    return heldout_metrics(trained.validation, plain_probabilities(trained.validation_logits))


def test_each_candidate_trains_as_its_own_run_would_and_the_lowest_validation_loss_is_kept(tiny_base, data):
    lines: list[str] = []
    chosen = fit(data, tiny_base, CONFIG, "cpu", RunHooks(report=lines.append))
    candidates = chosen.run.choice["candidates"]
    assert set(candidates) == {"tokens", "tfidf", "ensemble"}
    alone = {name: fit(data, tiny_base, replace(CONFIG, lexicon=name), "cpu") for name in ("tokens", "tfidf")}
    for name, run in alone.items():
        figures = _validation_figures(run)
        assert candidates[name]["accuracy"] == pytest.approx(figures["accuracy"])
        assert candidates[name]["loss"] == pytest.approx(figures["loss"], rel=1e-5)
    # The ensemble answers with the two heads' mean probabilities: scored as the mean of the two runs'
    # answers.
    mean = [(a + b) / 2 for a, b in zip(*(plain_probabilities(r.validation_logits) for r in alone.values()))]
    together = heldout_metrics(alone["tokens"].validation, mean)
    assert candidates["ensemble"]["accuracy"] == pytest.approx(together["accuracy"])
    assert candidates["ensemble"]["loss"] == pytest.approx(together["loss"], rel=1e-4)
    assert candidates["ensemble"]["train_seconds"] == 0.0
    best = min(candidates, key=lambda name: (candidates[name]["loss"], -candidates[name]["accuracy"]))
    assert chosen.run.choice["kept"] == best and chosen.run.choice["by"] == "validation loss, then accuracy"
    assert chosen.config.lexicon == ("both" if best == "ensemble" else best)
    # The model returned (and exported after) is the kept one.
    assert _validation_figures(chosen)["loss"] == pytest.approx(candidates[best]["loss"], rel=1e-4)
    assert isinstance(chosen.loaded.model.head, HeadEnsemble) == (best == "ensemble")
    assert chosen.run.train_seconds == pytest.approx(sum(c["train_seconds"] for c in candidates.values()))
    assert sum(line.startswith("backbone features of") for line in lines) == 1, (
        "the features are computed once"
    )
    assert f"kept {best}" in lines
    # MLflow gets both candidates' figures and which was kept.
    metrics = run_metrics(run_result(train=chosen.run))
    for name in candidates:
        assert metrics[f"candidate_{name}_validation_accuracy"] == candidates[name]["accuracy"]
    assert choice_tags(chosen.run) == {"candidate_kept": best}


def test_without_a_validation_split_it_trains_tokens_and_says_so(tiny_base, rows_file):
    data = TrainSource(rows_file, split_config=replace(SPLIT, validation_fraction=0.0)).validated()
    lines: list[str] = []
    trained = fit(data, tiny_base, CONFIG, "cpu", RunHooks(report=lines.append))
    assert trained.config.lexicon == "tokens" and trained.run.choice == {}
    assert len(trained.loaded.model.head.lexical.pairs) == 0
    assert any(line.startswith("no validation split to choose between tokens, tfidf") for line in lines)


def test_only_a_fresh_head_on_a_frozen_backbone_has_a_choice(tiny_base):
    family, loaded = load_joint_on(tiny_base, CONFIG)
    tokens, tfidf = family.candidates(loaded, CONFIG)
    assert (tokens.name, tfidf.name) == ("tokens", "tfidf") and tokens.loaded is loaded
    assert tfidf.loaded.model.lm is loaded.model.lm, "one backbone, two heads"
    assert len(tfidf.loaded.model.head.lexical.pairs) > 0 and len(loaded.model.head.lexical.pairs) == 0
    for config in (
        replace(CONFIG, method="lora"),
        replace(CONFIG, method="full"),
        replace(CONFIG, lexicon="tfidf"),
    ):
        (only,) = family.candidates(loaded, config)
        assert only.loaded is loaded and only.config.lexicon == (
            "tfidf" if config.lexicon == "tfidf" else "tokens"
        )
    loaded.config = {**loaded.config, "fine_tuned": True}  # a trained head keeps its own channel
    (only,) = family.candidates(loaded, CONFIG)
    assert only.config.lexicon == "tokens"


def test_each_candidate_checkpoints_apart_and_a_rerun_resumes_both(tiny_base, data, tmp_path):
    def run():
        lines: list[str] = []
        controls = RunControls(checkpoints=Checkpointer(tmp_path / "checkpoint.pt", CONFIG))
        return fit(data, tiny_base, CONFIG, "cpu", RunHooks(report=lines.append), controls), lines

    first, _ = run()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.tfidf.pt", "checkpoint.tokens.pt"]
    again, lines = run()
    assert sum(line.startswith("resumed from step") for line in lines) == 2
    assert again.run.choice["kept"] == first.run.choice["kept"]
    for name, figures in first.run.choice["candidates"].items():
        assert again.run.choice["candidates"][name]["loss"] == pytest.approx(figures["loss"], rel=1e-5)


def _two_heads(tiny_base):
    """The joint family and its two candidates on the tiny base, their heads made to answer apart."""
    family, loaded = load_joint_on(tiny_base, CONFIG)
    tokens, tfidf = family.candidates(loaded, CONFIG)
    for weight, scale in (
        (tokens.loaded.model.head.scorer[-1].weight, 40.0),
        (tfidf.loaded.model.head.scorer[-1].weight, -25.0),
    ):
        with torch.no_grad():
            weight.mul_(scale)
    return family, tokens, tfidf


def _served(loaded, states=(STATE, "awful, just awful", "fine I guess")) -> list[np.ndarray]:
    results = answer_joint_requests(
        loaded, [parse_request(s, {"tone": TONE, "intensity": INTENSITY}) for s in states]
    )
    return [probabilities(answer) for result in results for answer in result.answers.values()]


def test_the_heads_together_answer_with_the_mean_of_their_probabilities(tiny_base, tmp_path):
    family, tokens, tfidf = _two_heads(tiny_base)
    together = family.combined([tokens, tfidf])
    assert together.name == "ensemble" and together.config.lexicon == "both"
    assert together.loaded.model.lm is tokens.loaded.model.lm, "one backbone pass serves both heads"
    apart = [_served(c.loaded) for c in (tokens, tfidf)]
    assert not all(np.allclose(a, b, atol=1e-3) for a, b in zip(*apart)), (
        "the heads must differ to test the mean"
    )
    served = _served(together.loaded)
    for got, a, b in zip(served, *apart):
        np.testing.assert_allclose(got, (a + b) / 2, atol=TOL)  # each answer rounded to 4 places
    # The field vectors it caches per question text are both heads'; answering again reads them from the
    # cache.
    assert together.loaded.field_cache.vectors
    np.testing.assert_allclose(np.concatenate(_served(together.loaded)), np.concatenate(served), atol=1e-12)
    # Exported, it loads back as the same two heads on one backbone (stored in 16 bits: answers within
    # rounding).
    out = family.save_finetune(together.loaded, tmp_path / "export", {})
    back = family.load_trained(out)
    assert isinstance(back.model.head, HeadEnsemble) and len(back.model.head.members) == 2
    assert [len(m.lexical.pairs) > 0 for m in back.model.head.members] == [False, True]
    for got, want in zip(_served(back), served):
        np.testing.assert_allclose(got, want, atol=2e-2)
    # A run trained further from it keeps both heads: there is no channel left to choose.
    (only,) = family.candidates(back, CONFIG)
    assert only.loaded is back and family.combined([only]) is None


def test_an_ensemble_needs_heads_that_read_alike(tiny_base):
    _, tokens, tfidf = _two_heads(tiny_base)
    tfidf.loaded.model.head.read_layers = 1
    with pytest.raises(ValueError, match="same layers"):
        HeadEnsemble([tokens.loaded.model.head, tfidf.loaded.model.head])


def test_both_keeps_the_two_heads_together_with_or_without_a_validation_split(tiny_base, data, rows_file):
    both = replace(CONFIG, lexicon="both")
    lines: list[str] = []
    kept = fit(data, tiny_base, both, "cpu", RunHooks(report=lines.append))
    assert kept.run.choice["kept"] == "ensemble" and kept.run.choice["by"] == "trained together"
    assert isinstance(kept.loaded.model.head, HeadEnsemble) and kept.config.lexicon == "both"
    candidates = kept.run.choice["candidates"]
    assert set(candidates) == {"tokens", "tfidf", "ensemble"}, "each one's validation figures, for the record"
    assert _validation_figures(kept)["loss"] == pytest.approx(candidates["ensemble"]["loss"], rel=1e-4)
    assert any(line.startswith("training 2 heads on the same features, to answer together") for line in lines)
    bare = TrainSource(rows_file, split_config=replace(SPLIT, validation_fraction=0.0)).validated()
    alone = fit(bare, tiny_base, both, "cpu")
    assert isinstance(alone.loaded.model.head, HeadEnsemble) and alone.run.choice["kept"] == "ensemble"
    assert all("accuracy" not in figures for figures in alone.run.choice["candidates"].values())
    assert alone.run.steps == sum(
        alone.run.choice["candidates"][name]["steps"] for name in ("tokens", "tfidf")
    )
