"""The packed serving pass (no padding) gives the padded pass's option logits, for every sequence, in the caller's
order: across attention chunks, with markers near the end of long sequences, under a layer plan, and alone or
among batch-mates. predict_items takes it for BERT encoders and keeps the padded pass for the rest."""

import numpy as np
import pytest
import torch

from pipeline.families.laya import packed as packed_module
from pipeline.families.laya import predict as predict_module
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import Item, collate_parts
from pipeline.families.laya.packed import packed_logits, packs
from pipeline.families.laya.sequences import Part
from pipeline.families.laya_layout import load_model
from pipeline.families.planned_layers import apply_layer_plan
from pipeline.layer_plans import resolve_plan


def random_items(n: int, vocab: int, seed: int = 0) -> list[Part]:
    """Sequences of lengths 6..60 with 2-5 option markers anywhere after [CLS]."""
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(n):
        length = int(rng.integers(6, 61))
        markers = sorted(
            rng.choice(np.arange(1, length), size=int(rng.integers(2, 6)), replace=False).tolist()
        )
        ids = rng.integers(5, vocab, size=length).tolist()
        items.append(Part(tuple(ids), tuple(markers), int(rng.integers(0, 3))))
    return items


def padded(model, items: list[Part], pad_id: int) -> list[torch.Tensor]:
    """Each sequence alone through the padded pass: no batch-mates, no padding at all."""
    with torch.inference_mode():
        return [decision_logits(model, collate_parts([it], pad_id))[0, : len(it.markers)] for it in items]


@pytest.fixture(scope="module")
def loaded(tiny_base):
    loaded = load_model(tiny_base)
    loaded.model.eval()
    return loaded


def test_the_tiny_laya_model_takes_the_packed_pass(loaded):
    assert packs(loaded.model)


def test_packed_logits_equal_the_padded_pass_item_by_item_across_chunks(loaded):
    vocab = loaded.model.encoder.config.vocab_size
    items = random_items(3 * packed_module.ATTENTION_CHUNK + 5, vocab)  # four chunks, the last one short
    expected = padded(loaded.model, items, loaded.tokenizer.pad_token_id)
    got = packed_logits(loaded.model, items)
    assert len(got) == len(items)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)


def test_an_items_logits_do_not_depend_on_its_batch_mates(loaded):
    vocab = loaded.model.encoder.config.vocab_size
    items = random_items(20, vocab, seed=1)
    alone = packed_logits(loaded.model, [items[7]])[0]
    for mates in (items[:8], items[7:], items[::-1]):
        position = mates.index(items[7])
        torch.testing.assert_close(packed_logits(loaded.model, mates)[position], alone, atol=1e-5, rtol=1e-5)


def test_packed_pass_follows_a_layer_plan(tiny_base):
    loaded = load_model(tiny_base)
    model = loaded.model.eval()
    apply_layer_plan(model.encoder, resolve_plan([0, 0, 1], len(model.encoder.encoder.layer)))
    items = random_items(10, model.encoder.config.vocab_size, seed=2)
    native = packed_logits(load_model(tiny_base).model.eval(), items)
    planned = packed_logits(model, items)
    for want, have in zip(padded(model, items, loaded.tokenizer.pad_token_id), planned):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)
    assert any(not torch.allclose(p, n, atol=1e-4) for p, n in zip(planned, native)), (
        "the plan changed nothing"
    )


def test_predict_items_keeps_the_padded_pass_for_encoders_it_does_not_cover(loaded, monkeypatch):
    vocab = loaded.model.encoder.config.vocab_size
    items = [
        Item((part,), part.qtype, (), -1, 0, f"q{i}")
        for i, part in enumerate(random_items(12, vocab, seed=3))
    ]
    via_packed = predict_module.predict_items(loaded, [items[:5], items[5:]])
    monkeypatch.setattr(predict_module, "packs", lambda model: False)
    calls = []
    original = predict_module.decision_logits
    monkeypatch.setattr(predict_module, "decision_logits", lambda *a: calls.append(1) or original(*a))
    via_padded = predict_module.predict_items(loaded, [items[:5], items[5:]])
    assert calls, "the padded pass did not run"
    for request_packed, request_padded in zip(via_packed, via_padded):
        for a, b in zip(request_packed, request_padded):
            np.testing.assert_allclose(a, b, atol=1e-6)
