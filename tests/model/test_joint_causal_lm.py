"""The joint family on a causal LM (`pipeline.families.joint.head`) on a tiny random Qwen3, with hand-built
batches."""

from pathlib import Path

import pytest
import torch

from pipeline.families.joint.backbone import backbone_body, load_causal_lm
from pipeline.families.joint.head import JointDecisionModel, JointHead, joint_loss


def output_embeddings(lm):
    return lm.get_output_embeddings()


VOCAB = 300  # equal to no other dimension in these tests, so a vocabulary-sized output cannot hide
HIDDEN = 64
WIDTH = 32
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Per row: its length, then per question (qtype, question span, option spans, target over the options).
# Row 0 fills T; row 1 is right-padded and has one real question, so questions and options are uneven.
ROWS = [
    (
        40,
        [
            (0, (1, 6), [(7, 9), (10, 11), (12, 15)], [0.0, 0.0, 1.0]),
            (1, (16, 22), [(23, 24), (25, 26), (27, 28), (29, 31)], [0.1, 0.2, 0.6, 0.1]),
        ],
    ),
    (31, [(2, (2, 8), [(9, 11), (12, 14)], [0.0, 1.0])]),
]


def tiny_qwen3(folder: Path, seed: int = 0) -> Path:
    """A tiny random Qwen3 causal LM with tied embeddings, saved as a local checkpoint."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def make_batch(extra_questions: int = 0, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """A batch in the `collate_records` contract and its soft targets; `extra_questions` padded questions."""
    b, t = len(ROWS), max(length for length, _ in ROWS)
    q = max(len(questions) for _, questions in ROWS) + extra_questions
    k = max(len(spans) for _, questions in ROWS for *_, spans, _ in questions)
    gen = torch.Generator().manual_seed(seed)
    batch = {
        "input_ids": torch.zeros(b, t, dtype=torch.long),
        "attention_mask": torch.zeros(b, t, dtype=torch.long),
        "question_spans": torch.zeros(b, q, 2, dtype=torch.long),
        "question_mask": torch.zeros(b, q, dtype=torch.bool),
        "option_spans": torch.zeros(b, q, k, 2, dtype=torch.long),
        "option_mask": torch.zeros(b, q, k, dtype=torch.bool),
        "option_tokens": torch.zeros(b, q, k, 3, dtype=torch.long),
        "option_token_mask": torch.zeros(b, q, k, 3, dtype=torch.bool),
        "qtype": torch.zeros(b, q, dtype=torch.long),
    }
    target = torch.zeros(b, q, k)
    for row, (length, questions) in enumerate(ROWS):
        batch["input_ids"][row, :length] = torch.randint(5, VOCAB, (length,), generator=gen)
        batch["attention_mask"][row, :length] = 1
        for i, (qtype, q_span, spans, probs) in enumerate(questions):
            _fill_question(batch, row, i, qtype, q_span, spans)
            target[row, i, : len(probs)] = torch.tensor(probs)
    return batch, target


def _fill_question(batch, row, i, qtype, q_span, spans):
    batch["qtype"][row, i], batch["question_mask"][row, i] = qtype, True
    batch["question_spans"][row, i] = torch.tensor(q_span)
    for j, (start, end) in enumerate(spans):
        batch["option_spans"][row, i, j] = torch.tensor([start, end])
        batch["option_mask"][row, i, j] = True
        # The option's tokens are those of its span: the options are mentioned in the text.
        batch["option_tokens"][row, i, j, : end - start] = batch["input_ids"][row, start:end]
        batch["option_token_mask"][row, i, j, : end - start] = True


def _garble_padding(batch: dict) -> dict:
    """Padded entries with junk (as a careless collator might write) that must not matter."""
    batch = dict(batch)
    for key in ("question_spans", "option_spans", "option_tokens"):
        batch[key] = batch[key].clone()
    batch["question_spans"][~batch["question_mask"]] = torch.tensor([3, 30])
    batch["option_spans"][~batch["option_mask"]] = torch.tensor([5, 25])
    batch["option_tokens"][~batch["option_token_mask"]] = -100
    return batch


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "tiny")


def build_model(folder: Path, lora: bool = False, seed: int = 0) -> JointDecisionModel:
    lm = load_causal_lm(folder)
    if lora:
        from peft import LoraConfig, get_peft_model

        lm = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    torch.manual_seed(seed)
    return JointDecisionModel(lm, JointHead(HIDDEN, width=WIDTH))


def test_load_backbone_reads_a_local_folder_and_ties_the_projection(qwen_folder, tmp_path):
    lm = load_causal_lm(qwen_folder, dtype=torch.bfloat16)
    assert lm.dtype == torch.bfloat16 and not lm.training
    assert output_embeddings(lm).weight is lm.get_input_embeddings().weight
    assert backbone_body(lm) is lm.model
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_causal_lm(tmp_path)


@pytest.mark.parametrize("grad", [False, True])
def test_chunked_pooling_equals_unchunked(qwen_folder, grad):
    model = build_model(qwen_folder).eval()
    batch, _ = make_batch()
    hidden = backbone_body(model.lm)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    hidden, weight = hidden.last_hidden_state.detach(), output_embeddings(model.lm).weight.detach()
    results = []
    for chunk in (7, 4096):
        model.head.chunk = chunk
        model.head.zero_grad()
        with torch.set_grad_enabled(grad):
            logits = model.head(hidden, batch, weight)
            if grad:
                logits.sum().backward()
        results.append((logits.detach(), model.head.memory_proj.weight.grad))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    if grad:
        torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-5)


def test_head_runs_in_fp32_whatever_the_hidden_dtype(qwen_folder):
    model = build_model(qwen_folder).eval()
    batch, _ = make_batch()
    hidden = torch.randn(2, 40, HIDDEN)
    weight = output_embeddings(model.lm).weight.detach()
    with torch.no_grad():
        full = model.head(hidden, batch, weight)
        half = model.head(hidden.bfloat16(), batch, weight.bfloat16())
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    torch.testing.assert_close(half, full, atol=0.05, rtol=0.05)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)


@pytest.mark.parametrize("lora", [False, True])
def test_the_output_projection_never_sees_a_sequence(qwen_folder, lora):
    model = build_model(qwen_folder, lora=lora).train()
    projection_calls, vocab_sized = [], []
    output_embeddings(model.lm).register_forward_hook(lambda *args: projection_calls.append(1))
    for name, module in model.named_modules():
        module.register_forward_hook(
            lambda module, args, out, name=name: vocab_sized.extend(
                name for x in _tensors(out) if x.dim() >= 2 and x.shape[-1] == VOCAB
            )
        )
    batch, target = make_batch()
    joint_loss(model(batch), batch, target).backward()
    assert projection_calls == [] and vocab_sized == []
    assert output_embeddings(model.lm).weight.grad is not None or lora  # full fine-tune: the prior trains it


def _train(model: JointDecisionModel, steps: int = 30) -> list[float]:
    batch, target = make_batch()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = joint_loss(model(batch), batch, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_training_lowers_the_loss(qwen_folder, lora):
    model = build_model(qwen_folder, lora=lora).train()
    frozen = {n: p.detach().clone() for n, p in model.lm.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.lm.named_parameters() if "lora_B" in n}
    losses = _train(model)
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.equal(p, frozen[n]) for n, p in model.lm.named_parameters() if n in frozen)
    if lora:
        assert frozen and adapters  # the base is frozen, and the adapters (not just the head) learn
        assert any(not torch.equal(p, adapters[n]) for n, p in model.lm.named_parameters() if n in adapters)


def test_padding_gets_pad_logits_and_leaves_real_questions_alone(qwen_folder):
    model = build_model(qwen_folder).eval()
    batch, _ = make_batch()
    padded, _ = make_batch(extra_questions=1)
    with torch.no_grad():
        logits = model(batch)
        more = model(_garble_padding(padded))
    valid = batch["option_mask"] & batch["question_mask"][..., None]
    assert (logits[~valid] == -1e4).all() and (logits[valid] > -1e3).all()
    assert more.shape[1] == logits.shape[1] + 1 and (more[:, -1] == -1e4).all()
    torch.testing.assert_close(more[:, :-1], logits, atol=1e-5, rtol=1e-5)


def test_a_span_running_into_padding_pools_only_attended_tokens(qwen_folder):
    model = build_model(qwen_folder).eval()
    batch, _ = make_batch()
    length = ROWS[1][0]
    to_end, past_end = (dict(batch, option_spans=batch["option_spans"].clone()) for _ in range(2))
    to_end["option_spans"][1, 0, 1] = torch.tensor([12, length])
    past_end["option_spans"][1, 0, 1] = torch.tensor([12, batch["input_ids"].shape[1]])
    with torch.no_grad():
        torch.testing.assert_close(model(past_end), model(to_end), atol=1e-5, rtol=1e-5)


def _plain_soft_ce(logits, batch, target) -> torch.Tensor:
    losses = []
    for row, question in zip(*torch.nonzero(batch["question_mask"], as_tuple=True)):
        keep = batch["option_mask"][row, question]
        log_probs = torch.log_softmax(logits[row, question][keep], dim=-1)
        losses.append(-(target[row, question][keep] * log_probs).sum())
    return torch.stack(losses).mean()


def test_optional_loss_terms_are_off_by_default_and_each_changes_the_loss():
    batch, target = make_batch()
    logits = torch.randn(target.shape, generator=torch.Generator().manual_seed(1))
    logits = logits.masked_fill(~batch["option_mask"], -1e4)
    plain = joint_loss(logits, batch, target)
    torch.testing.assert_close(plain, _plain_soft_ce(logits, batch, target))
    for option in ({"label_smoothing": 0.1}, {"brier_weight": 1.0}, {"ordinal_weight": 1.0}):
        assert not torch.isclose(joint_loss(logits, batch, target, **option), plain), option
    batch_without_scores = dict(batch, qtype=torch.zeros_like(batch["qtype"]))
    ordinal_only = joint_loss(logits, batch_without_scores, target, ordinal_weight=1.0)
    torch.testing.assert_close(ordinal_only, plain)  # the ordinal term reads score questions only
