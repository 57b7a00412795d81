"""`train.lexicon: auto`: a `tokens` head and a `tfidf` head trained one after the other on the same frozen features,
each as its own run would train it, and the one more accurate on the validation split kept; where there is nothing
to choose (no validation split, a LoRA run, a trained head) it is `tokens`."""

from dataclasses import replace

import pytest

from pipeline.config import ValidateConfig
from pipeline.data.split import TrainSource
from pipeline.mlops.tracking import TrainingRecord, choice_tags, run_metrics
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.metrics import heldout_metrics
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.fit import fit
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


def test_each_candidate_trains_as_its_own_run_would_and_the_more_accurate_is_kept(tiny_base, data):
    lines: list[str] = []
    chosen = fit(data, tiny_base, CONFIG, "cpu", RunHooks(report=lines.append))
    candidates = chosen.run.choice["candidates"]
    assert set(candidates) == {"tokens", "tfidf"}
    for name in candidates:
        alone = _validation_figures(fit(data, tiny_base, replace(CONFIG, lexicon=name), "cpu"))
        assert candidates[name]["accuracy"] == pytest.approx(alone["accuracy"])
        assert candidates[name]["loss"] == pytest.approx(alone["loss"], rel=1e-5)
    best = max(candidates, key=lambda name: (candidates[name]["accuracy"], -candidates[name]["loss"]))
    assert chosen.run.choice["kept"] == best == chosen.config.lexicon
    # The model returned (and exported after) is the kept one, with the channel its lexicon makes.
    assert _validation_figures(chosen)["loss"] == pytest.approx(candidates[best]["loss"], rel=1e-5)
    assert (len(chosen.loaded.model.head.lexical.pairs) > 0) == (best == "tfidf")
    assert chosen.run.train_seconds == pytest.approx(sum(c["train_seconds"] for c in candidates.values()))
    assert sum(line.startswith("backbone features of") for line in lines) == 1, (
        "the features are computed once"
    )
    assert f"kept {best}" in lines
    # MLflow gets both candidates' figures and which was kept.
    described = chosen.run.to_dict() | {"peak_memory_mb": 0.0}
    figures = described["heldout"]["tuned"]
    heldout = {"decisions": 1, "base": figures, "tuned": figures, "calibrated": figures}
    record = TrainingRecord("key", {}, described, {"heldout": heldout, "temperatures": {}}, {}, "rows.jsonl", "md5",
                            "export", "run")  # fmt: skip
    metrics = run_metrics(record)
    for name in candidates:
        assert metrics[f"candidate_{name}_validation_accuracy"] == candidates[name]["accuracy"]
    assert choice_tags(described) == {"candidate_kept": best}


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
