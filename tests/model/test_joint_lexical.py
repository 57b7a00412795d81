"""The joint head's lexical channel on an encoder: a bag of the state's words scored against each option,
which a fresh head starts without (it adds nothing until trained) and which learns what the backbone's
features lack."""

from dataclasses import replace

import pytest
import torch

from pipeline.data.validate import validate_file
from pipeline.families.joint.layout import export_joint
from pipeline.families.joint.training import CachedFeatures, collate_examples
from pipeline.training.loop import train
from tests.tiny import JOINT_HEAD as HEAD
from tests.tiny import load_joint_on, write_learnable_rows

CPU = torch.device("cpu")
TFIDF = replace(HEAD, lexicon="tfidf")


@pytest.fixture(scope="module")
def rows(tiny_base, tmp_path_factory):
    path = write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 48)
    return validate_file(path).records


def _vocabulary(loaded) -> int:
    return loaded.model.lm.get_input_embeddings().num_embeddings


def test_an_encoders_fresh_head_has_the_channel_and_it_adds_nothing_until_trained(tiny_base, rows):
    family, loaded = load_joint_on(tiny_base)
    head = loaded.model.head
    assert head.lexical is not None and loaded.config["head"]["lexicon"] == _vocabulary(loaded)
    examples, _ = family.build_examples(loaded, rows[:6])
    batch = collate_examples(examples, loaded.tokenizer.pad_token_id)
    with torch.no_grad():
        with_channel = loaded.model(batch)
        channel, head.lexical = head.lexical, None
        without = loaded.model(batch)
    head.lexical = channel
    torch.testing.assert_close(with_channel, without)


def _trained_loss(family, loaded, rows) -> tuple[float, float]:
    """First and last logged training loss of the head on features that carry nothing (all zeros)."""
    examples, _ = family.build_examples(loaded, rows)
    family.prepare(loaded, HEAD)
    family.learn_from_rows(loaded, examples)
    ready = family.training_examples(loaded, examples, HEAD, CPU)
    blank = [
        replace(
            e,
            features=CachedFeatures(
                torch.zeros_like(e.features.state),
                {k: torch.zeros_like(v) for k, v in e.features.fields.items()},
            ),
        )
        for e in ready
    ]
    result = train(loaded.model, blank, HEAD, CPU, family.batch_task(loaded, HEAD))
    return result.losses[0][1], result.losses[-1][1]


@pytest.fixture(scope="module")
def prior_only(tiny_base, rows) -> float:
    """The last loss of a head without the channel on the same blank features: only the class prior is
    learnable. Trained once for the module: no lexicon changes it."""
    family, without = load_joint_on(tiny_base)
    without.model.head.lexical = None
    return _trained_loss(family, without, rows)[1]


@pytest.mark.parametrize("lexicon", ["tokens", "tfidf"])
def test_the_channel_learns_the_telling_word_when_the_features_carry_nothing(
    tiny_base, rows, lexicon, prior_only
):
    family, loaded = load_joint_on(tiny_base, replace(HEAD, lexicon=lexicon))
    first, last = _trained_loss(family, loaded, rows)
    assert last < 0.5 * first, (first, last)
    lexical = loaded.model.head.lexical
    if lexicon == "tokens":  # the default: single tokens weighing 1, nothing counted from the rows
        assert len(lexical.pairs) == 0 and (lexical.idf == 1).all()
    else:
        assert (lexical.pairs != lexical.NO_PAIR).any() and (lexical.idf != 1).any()
    assert prior_only > 0.8, prior_only  # three tones: only the class prior is learnable, ln 3 = 1.10
    assert last < 0.5 * prior_only


def test_an_export_keeps_the_channel_and_an_old_head_config_loads_without_it(tiny_base, rows, tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from pipeline.families.joint.layout import HEAD_FILE, JOINT_CONFIG, load_joint

    family, loaded = load_joint_on(tiny_base, TFIDF)
    family.learn_from_rows(loaded, family.build_examples(loaded, rows)[0])
    lexical = loaded.model.head.lexical
    assert (lexical.pairs != lexical.NO_PAIR).any() and (lexical.idf != 1).any()  # learned from the rows
    folder = tmp_path / "export"
    export_joint(loaded, folder, [1.0, 1.0, 1.0], {})
    reloaded = load_joint(folder)
    assert reloaded.config["head"]["lexicon"] == _vocabulary(loaded)
    assert reloaded.config["head"]["bigrams"] == len(lexical.pairs) > 0
    saved = reloaded.model.head.lexical.state_dict()
    assert set(saved) == {"table.weight", "option.weight", "option.bias", "idf", "pairs"}
    for name, value in lexical.state_dict().items():
        torch.testing.assert_close(saved[name], value)
    # An export written before pairs and weights: no `bigrams`, no `idf` or `pairs`, a table of the vocabulary
    # only.
    config = json.loads((folder / JOINT_CONFIG).read_text())
    del config["head"]["bigrams"]
    (folder / JOINT_CONFIG).write_text(json.dumps(config))
    weights = load_file(str(folder / HEAD_FILE))
    del weights["lexical.idf"], weights["lexical.pairs"]
    weights["lexical.table.weight"] = weights["lexical.table.weight"][: _vocabulary(loaded)].contiguous()
    save_file(weights, str(folder / HEAD_FILE))
    before = load_joint(folder).model.head.lexical
    assert len(before.pairs) == 0 and (before.idf == 1).all()
    torch.testing.assert_close(before.table.weight, lexical.table.weight[: _vocabulary(loaded)])
    # An export written before the channel: no `lexicon` in its head config, no channel weights in its head.
    config = json.loads((folder / JOINT_CONFIG).read_text())
    del config["head"]["lexicon"]
    (folder / JOINT_CONFIG).write_text(json.dumps(config))
    weights = {k: v for k, v in load_file(str(folder / HEAD_FILE)).items() if not k.startswith("lexical.")}
    save_file(weights, str(folder / HEAD_FILE))
    assert load_joint(folder).model.head.lexical is None


def test_a_trained_head_keeps_its_pairs_and_weights_when_it_trains_further(tiny_base, rows, tmp_path):
    from pipeline.families.joint.layout import load_joint

    family, loaded = load_joint_on(tiny_base, TFIDF)
    family.learn_from_rows(loaded, family.build_examples(loaded, rows[:24])[0])
    loaded.config = {**loaded.config, "fine_tuned": True}
    export_joint(loaded, tmp_path / "export", [1.0, 1.0, 1.0], {})
    trained = load_joint(tmp_path / "export")
    learned = {k: v.clone() for k, v in trained.model.head.lexical.state_dict().items()}
    family.learn_from_rows(trained, family.build_examples(trained, rows[24:])[0])
    for name, value in trained.model.head.lexical.state_dict().items():
        assert torch.equal(value, learned[name]), name
    fresh = load_joint_on(tiny_base, TFIDF)[1]
    family.learn_from_rows(fresh, family.build_examples(fresh, rows[24:])[0])
    assert not torch.equal(fresh.model.head.lexical.idf, learned["idf"])  # other rows: other weights
