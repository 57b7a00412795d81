"""The joint head's lexical channel on an encoder: a bag of the state's words scored against each option, which a
fresh head starts without (it adds nothing until trained) and which learns what the backbone's features lack."""

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
    ready = family.training_examples(loaded, examples, HEAD, CPU)
    blank = [replace(e, features=CachedFeatures(torch.zeros_like(e.features.state),
                                                {k: torch.zeros_like(v) for k, v in e.features.fields.items()}))
             for e in ready]  # fmt: skip
    result = train(loaded.model, blank, HEAD, CPU, family.batch_task(loaded, HEAD))
    return result.losses[0][1], result.losses[-1][1]


def test_the_channel_learns_the_telling_word_when_the_backbone_features_carry_nothing(tiny_base, rows):
    family, loaded = load_joint_on(tiny_base)
    first, last = _trained_loss(family, loaded, rows)
    assert last < 0.5 * first, (first, last)
    family, without = load_joint_on(tiny_base)
    without.model.head.lexical = None
    _, prior_only = _trained_loss(family, without, rows)
    assert prior_only > 0.8, prior_only  # three tones: only the class prior is learnable, ln 3 = 1.10
    assert last < 0.5 * prior_only


def test_an_export_keeps_the_channel_and_an_old_head_config_loads_without_it(tiny_base, tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from pipeline.families.joint.layout import HEAD_FILE, JOINT_CONFIG, load_joint

    _, loaded = load_joint_on(tiny_base)
    folder = tmp_path / "export"
    export_joint(loaded, folder, [1.0, 1.0, 1.0], {})
    reloaded = load_joint(folder)
    assert reloaded.config["head"]["lexicon"] == _vocabulary(loaded)
    torch.testing.assert_close(
        reloaded.model.head.lexical.table.weight, loaded.model.head.lexical.table.weight
    )
    # An export written before the channel: no `lexicon` in its head config, no channel weights in its head.
    config = json.loads((folder / JOINT_CONFIG).read_text())
    del config["head"]["lexicon"]
    (folder / JOINT_CONFIG).write_text(json.dumps(config))
    weights = {k: v for k, v in load_file(str(folder / HEAD_FILE)).items() if not k.startswith("lexical.")}
    save_file(weights, str(folder / HEAD_FILE))
    assert load_joint(folder).model.head.lexical is None
