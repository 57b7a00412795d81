"""Tiny random decision models in the Laya layout, for fast tests (no download, no pretrained weights)."""

from pathlib import Path

import torch

WORDS = (
    "the a is of and to in it this that was great good bad terrible fine okay love hate product order late "
    "question choice score noul true false yes no statement holds does not hold level tone negative neutral "
    "positive pick what how text sentiment intensity none mild strong extreme"
).split()


def tiny_tokenizer():
    """A lower-casing WordPiece tokenizer over a few dozen words and single characters."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789:.,!?'\"{}[]_-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters, *(f"##{c}" for c in letters)]
    backend = Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(dict.fromkeys(vocab))}, unk_token="[UNK]")
    )
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")  # fmt: skip


def tiny_model(seed: int = 0, hidden: int = 32, layers: int = 2, dropout: float = 0.0):
    from laya.common import DecisionModel
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=200, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=256,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)  # fmt: skip
    torch.manual_seed(seed)
    config._attn_implementation = "sdpa"
    encoder = BertModel(config)
    model = DecisionModel(encoder, head_layers=1, n_act=2, dropout=dropout).eval()
    with torch.no_grad():
        model.scorer[-1].weight.mul_(40.0)  # spread the untrained logits so probability checks can fail
    return model


def write_tiny_base(folder: Path, seed: int = 0, max_len: int = 96, head_max_len: int = 64) -> Path:
    """A tiny base written by laya's own `save_checkpoint` (the peer's writer)."""
    from laya.train import save_checkpoint

    tokenizer = tiny_tokenizer()
    cfg = {"encoder": "tiny-bert", "head_layers": 1, "act_costs": {"defer": 0.1}, "temperature": [1.0, 1.0, 1.0],
           "temperature_by_options": {}, "max_len": max_len, "head_max_len": head_max_len, "amp_dtype": "bf16",
           "fine_tuned": False, "training": {}}  # fmt: skip
    save_checkpoint(tiny_model(seed), tokenizer, cfg, str(folder))
    return folder
