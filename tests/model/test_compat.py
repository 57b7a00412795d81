"""Two-way Laya-layout compatibility, and our forward pass against laya's."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.data.validate import validate_rows
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import build_items, collate
from pipeline.families.laya.predict import predict
from pipeline.families.laya_layout import ModelLayoutError, load_model, save_model

QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "what tone",
        "criteria": {"negative": None, "neutral": "none", "positive": None},
    },
    "level": {"type": "score", "instructions": "how strong", "criteria": ["none", "mild", "strong"]},
    "good": {"type": "noul", "instructions": "it is good", "criteria": None},
}
STATES = ["this is great", {"turns": ["i hate the order", "it was late"]}, "okay product"]


def _agent_probabilities(folder, state):
    import laya

    agent = laya.Agent(str(folder), device="cpu")
    answers = agent.system_one(state, QUESTIONS)["answers"]
    return {
        "tone": [answers["tone"]["probabilities"][k] for k in ("negative", "neutral", "positive")],
        "level": [answers["level"]["probabilities"][str(i)] for i in range(3)],
        "good": [1 - answers["good"]["noul"], answers["good"]["noul"]],
    }


@pytest.mark.parametrize("state", STATES)
def test_a_laya_written_checkpoint_loads_here_and_answers_like_laya(tiny_base, state):
    ours = predict(load_model(tiny_base), state, QUESTIONS)
    theirs = _agent_probabilities(tiny_base, state)
    assert max(abs(ours["tone"]).max() for _ in [0]) > 0
    for qid, probabilities in theirs.items():
        np.testing.assert_allclose(ours[qid], probabilities, atol=2e-3)  # laya rounds answers to 4 decimals
    assert max(ours["tone"]) > 0.4, "the tiny model should not be uniform, or this test could not fail"


def test_a_checkpoint_we_write_loads_in_laya_agent(tiny_base, tmp_path):
    loaded = load_model(tiny_base)
    with torch.no_grad():
        loaded.model.scorer[1].bias.add_(0.3)  # make it differ from the base
    loaded.config = {**loaded.config, "temperature": [1.5, 0.8, 2.0]}
    save_model(loaded, tmp_path / "ours")
    reloaded = load_model(tmp_path / "ours")
    for state in STATES:
        ours = predict(reloaded, state, QUESTIONS)
        theirs = _agent_probabilities(tmp_path / "ours", state)
        for qid, probabilities in theirs.items():
            np.testing.assert_allclose(ours[qid], probabilities, atol=2e-3)


def test_our_forward_equals_laya_forward_in_fp32(tiny_base):
    loaded = load_model(tiny_base)
    rows = [
        {"state": s, "questions": QUESTIONS, "gold": {"tone": "neutral", "level": 1, "good": True}}
        for s in STATES
    ]
    items, skipped = build_items(validate_rows(rows).records, loaded)
    assert skipped == {} and len(items) == 9
    batch = collate(items, loaded.tokenizer.pad_token_id)
    with torch.no_grad():
        ours = decision_logits(loaded.model, batch)
        theirs, _act = loaded.model(
            batch["input_ids"],
            batch["attention_mask"],
            batch["marker_pos"],
            batch["marker_mask"],
            batch["qtype"],
        )
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-5)


def test_questions_the_model_cannot_read_are_skipped_with_a_reason(tiny_base):
    loaded = load_model(tiny_base)
    alike = "x " * 60  # both options cut to the same first tokens
    rows = [
        {
            "state": "fine",
            "questions": {
                "ok": QUESTIONS["good"],
                "alike": {"type": "choice", "criteria": [alike + "a", alike + "b"]},
            },
            "gold": {"ok": "true", "alike": alike + "a"},
        }
    ]
    items, skipped = build_items(validate_rows(rows).records, loaded)
    assert [it.question_id for it in items] == ["ok"] and skipped == {"options_collapsed": 1}

    # max_len shorter than the head_max_len a run of options may fill
    cramped = replace(loaded, config={**loaded.config, "max_len": 40})
    many = {"type": "choice", "instructions": "pick", "criteria": [f"o{i}" for i in range(60)]}
    rows[0]["questions"], rows[0]["gold"] = {"many": many}, {"many": many["criteria"][3]}
    items, skipped = build_items(validate_rows(rows).records, cramped)
    assert items == [] and skipped == {"options_beyond_max_len": 1}


def test_a_folder_without_the_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelLayoutError, match="not a decision model"):
        load_model(tmp_path)


def test_loading_never_modifies_the_folder(tmp_path):
    """laya's own loader rewrites tokenizer_config.json on first load; ours only reads (pinned hashes
    hold)."""
    from pipeline.data.pins import current_md5
    from tests.tiny import write_tiny_base

    folder = write_tiny_base(tmp_path / "base")
    before = current_md5(folder)
    load_model(folder)
    assert current_md5(folder) == before
