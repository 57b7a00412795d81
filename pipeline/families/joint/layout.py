"""Joint decision models on disk: load a base or an export, export one crash-safe.

The joint family's layout (the Laya family's is `pipeline.families.laya_layout`):

    decision_config.json  family "joint", backbone "causal_lm" | "encoder", fields "in_sequence" | "apart" (an
                          encoder reads the questions apart from the state), max_len, head {width, heads, layers,
                          chunk, read_layers (the backbone's last layers the head reads; 1 before), lexicon (the
                          vocabulary size of its bag of the state's words; 0 or absent: none), bigrams (the token
                          pairs the bag may hold; 0 or absent: none, and every token weighs 1), isolated (each
                          question read apart from the others, without its id; absent before), or members [a
                          head config each] for a `HeadEnsemble` (its read_layers and isolated beside)}, temperature
                          {global, by_type [choice, score, noul], folded_global}, fine_tuned, training
    backbone/             the backbone, LoRA merged, in 16 bits (bf16 from a bf16 or 4-bit source, else fp16), with
                          its tokenizer
    head.safetensors      the JointHead in fp32, written last: a folder without it is never listed or loaded
    manifest.json         lineage, as every export's

A base is a plain Hugging Face causal LM or encoder folder (BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...), or a
Laya-layout folder whose encoder carries the joint head instead of its own; each gets a fresh seeded head.
Exports written before the interface (family "decoder", a global temperature folded into the head) load as
they are.

    loaded = load_joint("models/qwen3-0.6b", max_len=2048)
    export_joint(loaded, "models/decision-qwen3", (1.3, 1.0, 0.9), manifest)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.config import ConfigError
from pipeline.families.base import ExportResult, ModelLayoutError
from pipeline.families.exporting import (
    MANIFEST,
    already_exported,
    calibrator_entry,
    check_finite,
    has_peft_modules,
    load_weights,
    read_calibrator,
    write_calibrator,
    write_files,
    write_marker_last,
    write_staged,
)
from pipeline.families.joint.backbone import (
    CAUSAL_LM,
    ENCODER,
    encoder_from_laya_layout,
    is_causal,
    is_causal_lm_folder,
    is_encoder_folder,
    is_laya_layout_folder,
    load_causal_lm,
    load_encoder,
    max_positions,
    read_hf_config,
    vocabulary_table,
)
from pipeline.families.joint.field_cache import FieldCache
from pipeline.families.joint.head import HeadEnsemble, JointDecisionModel, JointHead
from pipeline.families.joint.merge import JointExportError, is_quantised, merged_parts
from pipeline.families.joint.records import RecordLayout
from pipeline.families.joint.token_cache import TokenCache
from pipeline.families.planned_layers import configure_plan, current_plan, plan_manifest
from pipeline.layer_plans import KEY as PLAN_KEY
from pipeline.layer_plans import LayerPlanError
from pipeline.scoring.calibrators import Calibrator, as_calibrator

JOINT_CONFIG = "decision_config.json"
HEAD_FILE = "head.safetensors"
BACKBONE_DIR = "backbone"
HEAD_DEFAULTS = {"heads": 4, "layers": 2, "chunk": 2048}
IN_SEQUENCE, APART = "in_sequence", "apart"
ENCODER_READ_LAYERS = 4
# The token pairs a fresh encoder head's `tfidf` lexical channel may know (`LexicalChannel`): at most 65,536
# rows of 128 beside the vocabulary's (32 MiB in fp32; MiniLM's 30,522 tokens get all of them), and no more
# than four per token.
LEXICON_BIGRAMS = 65536
# A plain encoder's sequence length unless its tokenizer states less: what BERT-sized encoders were pretrained
# on (ModernBERT reaches 8192 positions, at a cost quadratic in the length).
ENCODER_MAX_LEN = 512


@dataclass
class LoadedJoint:
    """A joint decision model with its tokenizer and decision config."""

    model: JointDecisionModel
    tokenizer: Any
    config: dict[str, Any]
    calibrator: Calibrator | None = None  # an export's calibrator.json; None: the config's temperatures
    field_cache: FieldCache = field(default_factory=FieldCache)  # isolated questions' field vectors, served
    token_cache: TokenCache = field(default_factory=TokenCache)  # the question texts' ids, served

    @property
    def max_len(self) -> int:
        return int(self.config["max_len"])

    @property
    def fields_max_len(self) -> int:
        """Tokens the field sequence (the questions, fields apart) may take: what the backbone's positions
        reach."""
        return int(self.config.get("fields_max_len", self.max_len))

    @property
    def fields_apart(self) -> bool:
        """The questions are a field sequence of their own, not part of the state's (exports before: in
        it)."""
        return self.config.get("fields", IN_SEQUENCE) == APART

    @property
    def isolated(self) -> bool:
        """No question sees another's text or fields, nor its id (exports before: the row's questions read
        jointly)."""
        return bool((self.config.get("head") or {}).get("isolated", False))

    @property
    def state_windows(self) -> int:
        """Windows of `max_len` a long state is read in (fields apart; exports before: 1)."""
        return int(self.config.get("state_windows", 1)) if self.fields_apart else 1

    @property
    def layout(self) -> RecordLayout:
        return RecordLayout(
            self.max_len, self.fields_apart, self.fields_max_len, self.isolated, self.state_windows
        )


def is_joint_export(path: str | Path) -> bool:
    """A complete joint export: its head (written last) and its decision config are there."""
    path = Path(path)
    return (path / HEAD_FILE).is_file() and (path / JOINT_CONFIG).is_file()


def describe_base(path: str | Path) -> str:
    """What the joint family makes of a base folder, in words (a run's first lines say it)."""
    path = Path(path)
    if is_joint_export(path):
        return "a joint export: its trained head and backbone, trained further"
    if is_laya_layout_folder(path):
        return (
            "a Laya-layout folder: the joint head on its encoder (its own head left behind), each question "
            "apart"
        )
    config = read_hf_config(path) or {}
    name = ", ".join(config.get("architectures") or []) or config.get("model_type", "?")
    if is_causal_lm_folder(path):
        return (
            f"a causal LM folder ({name}): the joint head on its last hidden state, each question after the "
            "state"
        )
    return f"a plain encoder folder ({name}): the joint head on its last hidden states, each question apart"


def load_joint(
    path: str | Path,
    max_len: int = 1024,
    head_width: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    quantization: Any | None = None,
    device: str = "cpu",
    lexicon: str = "tokens",
) -> LoadedJoint:
    """A joint export, or a base (causal LM, encoder, Laya-layout encoder) with a fresh head seeded by `seed`.

    `max_len`, `head_width` and `lexicon` (an encoder head's lexical channel: `tokens` or `tfidf`,
    `TrainConfig.lexicon`) apply to a base only (an export carries its own; a Laya-layout base's own max_len,
    a plain encoder's `ENCODER_MAX_LEN` and an encoder's position embeddings cap `max_len`). The head is fp32
    always. `quantization` (a transformers quantization config, e.g. 4-bit `BitsAndBytesConfig` for QLoRA)
    loads a causal LM quantised. The folder is only read.
    """
    path = Path(path)
    if is_joint_export(path):
        return _load_export(path, dtype, quantization, device)
    if is_causal_lm_folder(path):
        lm = load_causal_lm(path, dtype, quantization, device)
        return _with_fresh_head(path, lm, _load_tokenizer(path), max_len, head_width, seed, lexicon)
    if is_laya_layout_folder(path):
        _refuse_quantised_encoder(path, quantization)
        # The base states the sequence length its encoder serves (MiniLM: 256, what it was trained on).
        encoder, tokenizer, stated = encoder_from_laya_layout(path)
        return _encoder_base(path, encoder.to(dtype), tokenizer, stated, max_len, head_width, seed, lexicon)
    if is_encoder_folder(path):
        _refuse_quantised_encoder(path, quantization)
        tokenizer = _load_tokenizer(path)
        stated = min(ENCODER_MAX_LEN, tokenizer.model_max_length)  # huge when the tokenizer states none
        encoder = load_encoder(path, dtype)
        return _encoder_base(path, encoder, tokenizer, stated, max_len, head_width, seed, lexicon)
    raise ModelLayoutError(
        f"{path}: not a joint decision model (no {HEAD_FILE} and {JOINT_CONFIG}; an unfinished export?), nor "
        "a causal LM or encoder folder (config.json with a ...ForCausalLM architecture, or a "
        "masked-language encoder's model_type), nor a Laya-layout folder"
    )


def _encoder_base(
    path: Path,
    encoder: nn.Module,
    tokenizer,
    stated: int,
    max_len: int,
    head_width: int,
    seed: int,
    lexicon: str,
) -> LoadedJoint:
    """An encoder with a fresh head: the state's sequence `stated` tokens at most, a field sequence what the
    encoder's positions reach (both within `max_len`)."""
    length = max_positions(encoder, min(max_len, stated))
    loaded = _with_fresh_head(path, encoder, tokenizer, length, head_width, seed, lexicon)
    loaded.config["fields_max_len"] = max_positions(encoder, max_len)
    return loaded


def _load_export(path: Path, dtype: torch.dtype, quantization: Any | None, device: str) -> LoadedJoint:
    from safetensors.torch import load_file

    config = json.loads((path / JOINT_CONFIG).read_text(encoding="utf-8"))
    folder = path / BACKBONE_DIR
    if config.get("backbone", CAUSAL_LM) == ENCODER:
        _refuse_quantised_encoder(path, quantization)
        backbone = load_encoder(folder, dtype)
    else:
        backbone = load_causal_lm(folder, dtype, quantization, device)
    head = _build_head(backbone, config["head"])
    head.load_state_dict(load_weights(path / HEAD_FILE, load_file), strict=True)
    loaded = _assemble(backbone, head, _load_tokenizer(folder), config)
    loaded.calibrator = read_calibrator(path)
    return loaded


def _refuse_quantised_encoder(path: Path, quantization: Any | None) -> None:
    if quantization is not None:
        raise ConfigError(
            f"train.method=qlora: {path} has an encoder backbone; QLoRA quantises causal LMs "
            "(use --method lora or --method full)"
        )


def _with_fresh_head(
    path: Path, backbone: nn.Module, tokenizer, max_len: int, head_width: int, seed: int, lexicon: str
) -> LoadedJoint:
    # An encoder's head reads its last 4 layers: on VADER, a logistic regression on the frozen MiniLM's mean
    # states scored 0.6955 from the last layer and 0.7205 from the last four side by side. A causal LM's
    # hidden states are wide already; its head reads the last layer.
    read_layers = 1 if is_causal(backbone) else min(ENCODER_READ_LAYERS, _layer_count(backbone))
    # An encoder's head also reads the state's words (`LexicalChannel`); a causal LM's sequence holds the
    # questions too, so a bag of it would not be the state's.
    vocabulary = 0 if is_causal(backbone) else vocabulary_table(backbone).shape[0]
    # Every fresh head isolates its questions: an answer depends on its question and the state alone (DESIGN
    # 5).
    head_config = {
        "width": head_width,
        **HEAD_DEFAULTS,
        "read_layers": read_layers,
        "lexicon": vocabulary,
        "bigrams": _lexicon_pairs(lexicon, vocabulary),
        "isolated": True,
    }
    head = _seeded_head(backbone, head_config, seed)
    causal = is_causal(backbone)
    config = {
        "family": "joint",
        "backbone": CAUSAL_LM if causal else ENCODER,
        # An encoder reads both ways, so the questions can be their own sequence, shared by every row that asks
        # them: a row then costs its state's tokens. A causal LM reads the questions after the state.
        "fields": IN_SEQUENCE if causal else APART,
        "max_len": max_len,
        "head": head_config,
        "temperature": {"global": 1.0, "by_type": [1.0, 1.0, 1.0]},
        "fine_tuned": False,
        "training": {"base": path.name, "head_seed": seed},
    }
    return _assemble(backbone, head, tokenizer, config)


def with_lexicon(loaded: LoadedJoint, lexicon: str) -> LoadedJoint:
    """A fresh head with `lexicon`'s channel (`tokens` or `tfidf`) on `loaded`'s backbone, which both then
    share, and on its device; drawn from the seed its first head was. `loaded` is a base's, with a fresh
    encoder head."""
    head_config = {
        **loaded.config["head"],
        "bigrams": _lexicon_pairs(lexicon, loaded.model.head.lexical.vocabulary),
    }
    head = _seeded_head(loaded.model.lm, head_config, int(loaded.config["training"].get("head_seed", 0)))
    device = next(loaded.model.head.parameters()).device
    return _assemble(
        loaded.model.lm, head.to(device), loaded.tokenizer, {**loaded.config, "head": head_config}
    )


def ensemble(members: list[LoadedJoint]) -> LoadedJoint:
    """One model answering with the mean probabilities of `members`' heads (`HeadEnsemble`), which share one
    backbone (`with_lexicon` made them so); the first member's config otherwise."""
    if any(m.model.lm is not members[0].model.lm for m in members):
        raise ValueError("an ensemble's heads must share one backbone")
    first = members[0]
    head = HeadEnsemble([m.model.head for m in members])
    config = {**first.config, "head": _head_config(head, first.config.get("head") or {})}
    return _assemble(first.model.lm, head, first.tokenizer, config)


def _lexicon_pairs(lexicon: str, vocabulary: int) -> int:
    """How many token pairs a fresh lexical channel may hold: `tfidf` adds the training rows' token pairs and
    weighs every entry by its idf (`LexicalChannel`); `tokens` holds none."""
    return min(LEXICON_BIGRAMS, 4 * vocabulary) if lexicon == "tfidf" else 0


def _seeded_head(backbone: nn.Module, head_config: dict[str, Any], seed: int) -> JointHead:
    with torch.random.fork_rng(devices=[]):  # seeded without moving the caller's random state
        torch.manual_seed(seed)
        return _build_head(backbone, head_config)


def _build_head(backbone: nn.Module, head: dict[str, Any]) -> JointHead | HeadEnsemble:
    if "members" in head:
        return HeadEnsemble([_build_head(backbone, member) for member in head["members"]])
    hidden = vocabulary_table(backbone).shape[1]
    return JointHead(
        hidden,
        head["width"],
        head["heads"],
        head["layers"],
        head["chunk"],
        read_layers=int(head.get("read_layers", 1)),
        lexicon=int(head.get("lexicon", 0)),
        isolated=bool(head.get("isolated", False)),
        bigrams=int(head.get("bigrams", 0)),
    )


def _layer_count(backbone: nn.Module) -> int:
    return int(getattr(backbone.config, "num_hidden_layers", 1) or 1)


def _assemble(
    backbone: nn.Module, head: JointHead | HeadEnsemble, tokenizer, config: dict[str, Any]
) -> LoadedJoint:
    loaded = LoadedJoint(
        JointDecisionModel(backbone, head.float()).eval(), _with_pad_token(tokenizer), config
    )
    set_layer_plan(loaded, config.get(PLAN_KEY))  # an export saved with a layer plan runs it
    set_state_windows(loaded, loaded.state_windows)
    return loaded


def set_state_windows(loaded: LoadedJoint, windows: int) -> None:
    """Read a long state in up to `windows` windows of `max_len` tokens (`records.windowed_state`) and record
    it in the config the export writes; a causal LM reads its state in its one sequence, so it keeps 1."""
    loaded.config["state_windows"] = int(windows) if loaded.fields_apart else 1
    loaded.model.state_window = loaded.max_len if loaded.state_windows > 1 else None


def set_layer_plan(loaded: LoadedJoint, spec) -> None:
    """Run the backbone as `spec` says (None: natively) and record it in the config the export writes; the
    head must still find the hidden states it reads (its last `read_layers`, embeddings included)."""
    plan = configure_plan(loaded.model.lm, None, spec)
    read = loaded.model.head.read_layers
    if plan is not None and len(plan) + 1 < read:
        raise LayerPlanError(
            f"train.layer_plan: the head reads the last {read} hidden states; a plan of "
            f"{len(plan)} visits gives {len(plan) + 1} (embeddings included)"
        )
    loaded.config = {**loaded.config, PLAN_KEY: plan}


def _load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _with_pad_token(tokenizer):
    """The tokenizer; one without a pad token pads with its eos token (padding is masked anyway)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLayoutError(
                f"{tokenizer.name_or_path}: the tokenizer has neither a pad token nor an eos token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def export_joint(
    loaded: LoadedJoint,
    out: str | Path,
    calibrator: Calibrator,
    manifest: dict[str, Any],
    files: dict[str, bytes] | None = None,
) -> ExportResult:
    """Merge, check and write `loaded` to `out` crash-safe, with `files` beside it (each named in `manifest`);
    a no-op when `out` already holds this export.

    The calibrator goes to `calibrator.json` (what this project's readers apply) and its type temperatures
    (choice, score, noul) into the config. The training model is left as it is (adapters included); the merge
    happens on a CPU copy.
    """
    out = Path(out)
    calibrator = as_calibrator(calibrator)
    config = _export_config(loaded, calibrator.temperatures)
    entry = calibrator_entry(calibrator, "every reader of this layout applies calibrator.json")
    manifest = {
        **manifest,
        "calibrator": entry,
        # The physical layers and the plan in decision_config.json: every reader of this layout applies it.
        "layer_plan": plan_manifest(current_plan(loaded.model.lm), "plan"),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if already_exported(out, config, manifest, JOINT_CONFIG, HEAD_FILE, calibrator):
        return ExportResult(str(out), False, json.loads((out / MANIFEST).read_text()))
    dtype = _export_dtype(loaded.model.lm)
    backbone, head = merged_parts(loaded.model)
    backbone.to(dtype)
    check_finite(backbone.state_dict(), dtype)
    check_finite(head.state_dict(), torch.float32)
    write_staged(
        out,
        lambda staging: _write_layout(
            backbone, head, loaded.tokenizer, config, manifest, calibrator, staging, files
        ),
    )
    return ExportResult(str(out), True, manifest)


def _export_config(loaded: LoadedJoint, temperatures) -> dict[str, Any]:
    by_type = _checked_temperatures(temperatures)
    # An old export folded a global temperature into its head; the record of it is kept.
    folded = float((loaded.config.get("temperature") or {}).get("folded_global", 1.0))
    return {
        **loaded.config,
        "family": "joint",
        "backbone": CAUSAL_LM if is_causal(loaded.model.lm) else ENCODER,
        "max_len": loaded.max_len,
        "head": _head_config(loaded.model.head, loaded.config.get("head") or {}),
        "temperature": {"global": 1.0, "by_type": by_type, "folded_global": folded},
        "fine_tuned": bool(loaded.config.get("fine_tuned")) or has_peft_modules(loaded.model.lm),
    }


def _checked_temperatures(temperatures) -> list[float]:
    """The three type temperatures, or JointExportError naming every bad entry."""
    if not isinstance(temperatures, (list, tuple)) or len(temperatures) != 3:
        raise JointExportError(
            f"temperatures must list 3 temperatures (choice, score, noul), got {temperatures!r}"
        )
    problems = [
        f"temperatures[{i}] must be positive and finite, got {t!r}"
        for i, t in enumerate(temperatures)
        if not _positive(t)
    ]
    if problems:
        raise JointExportError("; ".join(problems))
    return [float(t) for t in temperatures]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _head_config(head: JointHead | HeadEnsemble, known: dict[str, Any]) -> dict[str, Any]:
    """The head's shape read from the head itself (a head without blocks keeps the configured heads)."""
    if isinstance(head, HeadEnsemble):
        members = [_head_config(member, known) for member in head.members]
        return {"members": members, "read_layers": head.read_layers, "isolated": head.isolated}
    heads = head.blocks[0].self_attn.num_heads if len(head.blocks) else known.get("heads", 4)
    return {
        "width": head.memory_proj.out_features,
        "heads": heads,
        "layers": len(head.blocks),
        "chunk": head.chunk,
        "read_layers": head.read_layers,
        "lexicon": head.lexical.vocabulary if head.lexical is not None else 0,
        "bigrams": len(head.lexical.pairs) if head.lexical is not None else 0,
        "isolated": head.isolated,
    }


def _export_dtype(backbone: nn.Module) -> torch.dtype:
    """bf16 where the source is bf16 or quantised (fp16 could overflow what bf16 held), else fp16."""
    if any(is_quantised(p) for p in backbone.parameters()):
        return torch.bfloat16
    return torch.bfloat16 if vocabulary_table(backbone).dtype == torch.bfloat16 else torch.float16


def _write_layout(backbone, head, tokenizer, config, manifest, calibrator, folder: Path, files) -> None:
    from safetensors.torch import save_file

    write_calibrator(folder, calibrator)
    write_files(folder, files)
    backbone.save_pretrained(str(folder / BACKBONE_DIR))
    tokenizer.save_pretrained(str(folder / BACKBONE_DIR))
    (folder / JOINT_CONFIG).write_text(json.dumps(config, indent=2))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    # Weights in fp32; the lexical channel's pair keys stay int64 (fp32 would round them).
    state = {k: _saved(v) for k, v in head.state_dict().items()}
    write_marker_last(folder, HEAD_FILE, lambda partial: save_file(state, str(partial)))


def _saved(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.float() if tensor.is_floating_point() else tensor).detach().contiguous()


def temperature_of(config: dict[str, Any], qtype: int) -> float:
    """The temperature a question type's softmax uses: its own times the (unfolded) global one."""
    temperature = config.get("temperature") or {}
    by_type = temperature.get("by_type") or [1.0, 1.0, 1.0]
    return float(by_type[qtype]) * float(temperature.get("global", 1.0))
