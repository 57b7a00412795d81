"""Tiny random decision models in the Laya layout, for fast tests (no download, no pretrained weights), and
the small project files around them (learnable rows, a dvc.lock pinning inputs).

The models need torch, transformers, tokenizers and laya only: `scripts/gpu_check.py` builds them on a GPU
machine that has no DVC (so `pin_inputs` imports it when called).
"""

import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from pipeline.config import TrainConfig
from pipeline.data import contract, synthetic
from pipeline.data.contract import Decision, Record

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
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def tiny_model(
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    dropout: float = 0.0,
    heads: int = 2,
    intermediate: int | None = None,
):
    """A random BERT encoder (feed-forward `intermediate` wide, 2 x hidden by default) under a Laya head."""
    from laya.common import DecisionModel
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=200,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or 2 * hidden,
        max_position_embeddings=256,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    config._attn_implementation = "sdpa"
    encoder = BertModel(config)
    model = DecisionModel(encoder, head_layers=1, n_act=2, dropout=dropout).eval()
    with torch.no_grad():
        model.scorer[-1].weight.mul_(40.0)  # spread the untrained logits so probability checks can fail
    return model


def write_tiny_base(
    folder: Path, seed: int = 0, max_len: int = 96, head_max_len: int = 64, layers: int = 2, **sizes
) -> Path:
    """A tiny base written by laya's own `save_checkpoint` (the peer's writer), its encoder `layers` deep;
    `sizes` go to `tiny_model` (hidden, heads, intermediate)."""
    from laya.train import save_checkpoint

    tokenizer = tiny_tokenizer()
    cfg = {
        "encoder": "tiny-bert",
        "head_layers": 1,
        "act_costs": {"defer": 0.1},
        "temperature": [1.0, 1.0, 1.0],
        "temperature_by_options": {},
        "max_len": max_len,
        "head_max_len": head_max_len,
        "amp_dtype": "bf16",
        "fine_tuned": False,
        "training": {},
    }
    save_checkpoint(tiny_model(seed, layers=layers, **sizes), tokenizer, cfg, str(folder))
    return folder


SENTENCES = [
    " ".join(WORDS),
    "What is the tone? The order was late and the box was broken.",
    '{"negative": null, "neutral": null, "positive": null} ["false", "true"] options: - tone (choice):',
]
"""What the tiny BPE and Unigram tokenizers are trained on, in memory."""


def _trained_bpe(specials: list[str], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(
        SENTENCES * 20, vocab_size=vocab_size, min_frequency=1, special_tokens=specials
    )
    return trainer._tokenizer


def tiny_bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer trained in memory on a few sentences (Qwen/Llama-like; nothing
    downloaded)."""
    from transformers import PreTrainedTokenizerFast

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    return PreTrainedTokenizerFast(
        tokenizer_object=_trained_bpe(specials, vocab_size),
        bos_token=specials[0],
        eos_token=specials[1],
        pad_token=specials[2],
    )


ENCODER_ARCHITECTURES = ("bert", "roberta", "deberta-v2", "modernbert")
"""The plain Hugging Face encoders `write_tiny_encoder` builds (model_type names)."""
BERT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def tiny_encoder_tokenizer(arch: str):
    """A tokenizer built the way `arch`'s own is: WordPiece with [CLS]/[SEP] (BERT), byte-level BPE whose cls
    and sep are <s> and </s> (RoBERTa), a SentencePiece-style Unigram with [CLS]/[SEP] (DeBERTa-v2),
    byte-level BPE with [CLS]/[SEP] (ModernBERT)."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import PreTrainedTokenizerFast

    if arch == "bert":
        return tiny_tokenizer()
    if arch == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: <s> 0, <pad> 1, </s> 2
        return PreTrainedTokenizerFast(
            tokenizer_object=_trained_bpe(specials, 320),
            bos_token="<s>",
            eos_token="</s>",
            cls_token="<s>",
            sep_token="</s>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
        )
    specials = list(BERT_SPECIALS.values())
    if arch == "deberta-v2":
        trainer = SentencePieceUnigramTokenizer()
        trainer.train_from_iterator(
            SENTENCES * 20, vocab_size=200, special_tokens=specials, unk_token="[UNK]"
        )
        return PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer, **BERT_SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=_trained_bpe(specials, 320), **BERT_SPECIALS)


def write_tiny_encoder(
    folder: Path, arch: str = "bert", seed: int = 0, hidden: int = 32, layers: int = 2, positions: int = 128
) -> Path:
    """A tiny random plain Hugging Face encoder of `arch` (one of `ENCODER_ARCHITECTURES`) with its tokenizer,
    as `save_pretrained` writes a checkpoint; it reaches `positions` tokens."""
    from transformers import AutoModel

    tokenizer = tiny_encoder_tokenizer(arch)
    config = _tiny_encoder_config(arch, tokenizer, hidden, layers, positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        AutoModel.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tiny_encoder_config(arch: str, tokenizer, hidden: int, layers: int, positions: int):
    from transformers import BertConfig, DebertaV2Config, ModernBertConfig, RobertaConfig

    sizes = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "intermediate_size": 2 * hidden,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "bert":
        return BertConfig(max_position_embeddings=positions, **sizes)
    if arch == "roberta":  # positions are numbered from pad_token_id + 1, as RoBERTa's 514 reach 512 tokens
        return RobertaConfig(
            max_position_embeddings=positions + tokenizer.pad_token_id + 1,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            **sizes,
        )
    if arch == "deberta-v2":  # DeBERTa-v3's settings: relative attention only, no absolute positions
        return DebertaV2Config(
            max_position_embeddings=positions,
            relative_attention=True,
            position_buckets=64,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            **sizes,
        )
    ids = {
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
    }
    return ModernBertConfig(max_position_embeddings=positions, local_attention=64, **ids, **sizes)


def write_tiny_causal_lm(
    folder: Path, seed: int = 0, hidden: int = 64, layers: int = 2, arch: str = "qwen3", **extra
) -> Path:
    """A tiny random Qwen3 (or `arch="llama"`: Llama) causal LM (tied embeddings) with the tiny BPE tokenizer,
    as a local checkpoint; `extra` goes to the config over the tiny sizes (e.g. sliding-window settings, head
    counts)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tokenizer = tiny_bpe_tokenizer()
    config_class, model_class = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[arch]
    sizes = {
        "vocab_size": 512,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 1024,
    } | extra
    config = config_class(
        hidden_size=hidden,
        num_hidden_layers=layers,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )
    torch.manual_seed(seed)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def synthetic_records(n: int, seed: int = 0, state_chars: int = 120) -> list[Record]:
    """`n` clean synthetic rows as the records validation would keep of them (every decision of each), read
    with the contract's own parsers and without the validation schema (pandera), which the lent GPU machine
    lacks."""
    return [_record(index, row) for index, row in enumerate(synthetic.generate_rows(n, seed, 0, state_chars))]


def _record(index: int, row: dict[str, Any]) -> Record:
    parsed = contract.parse_questions(row["questions"])
    decisions = []
    for spec in parsed.specs:
        _label_ok, _probabilities_ok, gold = contract.judge_gold(spec, row["gold"][spec.id])
        if parsed.error or spec.question is None or gold is None:
            raise ValueError(f"synthetic row {index}, question {spec.id}: not a clean decision")
        decisions.append(Decision(index, spec.question, gold))
    return Record(index, contract.parse_state(row["state"]), tuple(decisions), row["gold"], parsed.canonical)


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout of the model off, in training mode too (modules and the float rates some modules
    keep)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):
            module.dropout = 0.0


def write_learnable_rows(path: Path, n: int, seed: int = 0) -> Path:
    """Rows whose tone is written in the text (one telling word among filler), so training can learn it."""
    import random

    rng = random.Random(seed)
    cues = {
        "negative": ("bad", "terrible", "hate"),
        "neutral": ("fine", "okay"),
        "positive": ("great", "good", "love"),
    }
    rows = []
    for _ in range(n):
        tone = rng.choice(list(cues))
        words = [rng.choice(["the", "order", "product", "was", "it", "this"]) for _ in range(5)]
        words.insert(rng.randrange(6), rng.choice(cues[tone]))
        question = {
            "type": "choice",
            "instructions": "What is the tone?",
            "criteria": {t: None for t in cues},
        }
        rows.append({"state": " ".join(words), "questions": {"tone": question}, "gold": {"tone": tone}})
    return synthetic.write_rows(rows, path)


# The joint family's `head` method on a tiny base: a high learning rate and many epochs, so a few dozen
# learnable rows are learned in seconds.
JOINT_HEAD = TrainConfig(
    family="joint",
    method="head",
    micro_batch=8,
    grad_accum=1,
    head_lr=3e-3,
    head_width=32,
    epochs=30,
    log_every=5,
    precision="fp32",
    out_of_fold_below=0,  # a test of out-of-fold answers turns them on (tests/model/test_out_of_fold.py)
)


def load_joint_on(base: Path, config: TrainConfig = JOINT_HEAD):
    """(the joint family, the tiny base loaded by it on the CPU with a fresh head)."""
    from pipeline.families import pick_family

    family = pick_family(base, "joint")
    return family, family.load(base, config, torch.device("cpu"))


def pin_inputs(folder: Path, *paths: Path) -> list[Path]:
    """The paths as a DVC repository at `folder` holds them: copied in when outside it, and pinned in
    `folder/dvc.lock` by DVC's hash (what `dvc repro` would write for stage outputs)."""
    from pipeline.data.pins import current_md5

    inside = []
    for path in map(Path, paths):
        if not path.resolve().is_relative_to(folder.resolve()):
            copy = folder / "pinned" / path.name
            copy.parent.mkdir(exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, copy, dirs_exist_ok=True)
            else:
                shutil.copy(path, copy)
            path = copy
        inside.append(path)
    outs = [
        {"path": p.resolve().relative_to(folder.resolve()).as_posix(), "md5": current_md5(p)} for p in inside
    ]
    lock = {"schema": "2.0", "stages": {"inputs": {"cmd": "true", "outs": outs}}}
    (folder / "dvc.lock").write_text(yaml.safe_dump(lock))
    return inside


def contrary_row(row: dict[str, Any]) -> dict[str, Any]:
    """A synthetic row (`synthetic.generate_rows`) with every gold label moved to another option: what the row
    taught, this contradicts."""
    gold = row["gold"]
    tone = gold["tone"]["label"] if isinstance(gold["tone"], dict) else gold["tone"]
    return row | {
        "gold": {
            "tone": "negative" if tone != "negative" else "positive",
            "intensity": (gold["intensity"] + 2) % 5,
            "is_negative": not gold["is_negative"],
        }
    }


TONE_OPTIONS = ("negative", "neutral", "positive")


def tone_certificate(threshold: float | None = 0.0, options: tuple[str, ...] = TONE_OPTIONS):
    """A certificate for the synthetic rows' tone question (ε 0.05, δ 0.1); threshold 0 automates every
    answer, None none."""
    from pipeline.scoring.certify import Certificate

    return Certificate(
        question_id="tone",
        qtype="choice",
        target_error=0.05,
        delta=0.1,
        threshold=threshold,
        fit_decisions=400,
        options=options,
    )


def certified_copy(source: Path, out: Path, certificates: dict | None) -> Path:
    """A copy of the model folder `source` at `out` whose manifest carries `certificates` ({question:
    Certificate}; None: carries none), as the export stage writes them."""
    import json
    import shutil

    from pipeline.families.exporting import (
        CERTIFICATES,
        CERTIFICATES_FILE,
        MANIFEST,
        read_manifest,
        with_carried,
        write_files,
    )
    from pipeline.scoring.certify import certificates_json

    shutil.copytree(source, out)
    data = None if certificates is None else certificates_json(certificates).encode()
    manifest, files = with_carried(read_manifest(out), {}, CERTIFICATES, data)
    (out / CERTIFICATES_FILE).unlink(missing_ok=True)
    write_files(out, files)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out
