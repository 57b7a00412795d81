"""The joint family's backbones: a causal LM (Qwen3, Llama: read for its last hidden states, never its
vocabulary logits) or an encoder (the MiniLM of a Laya-layout base, or a plain Hugging Face encoder folder:
BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...).

    lm = load_causal_lm("models/qwen3-0.6b", dtype=torch.bfloat16)
    encoder, tokenizer, max_len = encoder_from_laya_layout("data/snapshots/minilm")
    encoder = load_encoder("models/deberta-v3-small")      # is_encoder_folder says it is one
    hidden = backbone_body(lm)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.device import has_native_bf16
from pipeline.families.base import BadBase
from pipeline.families.laya_layout import CONFIG_FILE, load_model

ENCODER, CAUSAL_LM = "encoder", "causal_lm"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HF_CONFIG = "config.json"
# What a tokenizer is saved as: the fast tokenizer's one file, or a slow one's vocabulary (WordPiece, BPE,
# SentencePiece). `tokenizer_config.json` alone names a class but holds no vocabulary.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spm.model",
    "tokenizer.model",
    "sentencepiece.bpe.model",
)


def read_hf_config(path: str | Path) -> dict[str, Any] | None:
    """A Hugging Face folder's config.json, or None where there is none (or it is not a JSON object)."""
    config = Path(path) / HF_CONFIG
    if not config.is_file():
        return None
    try:
        found = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeError):
        return None
    return found if isinstance(found, dict) else None


def has_tokenizer(path: str | Path) -> bool:
    """A tokenizer is saved in the folder (one of `TOKENIZER_FILES`)."""
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def is_causal_lm_folder(path: str | Path) -> bool:
    """A plain Hugging Face causal LM checkpoint (config.json naming a `...ForCausalLM` architecture)."""
    architectures = (read_hf_config(path) or {}).get("architectures") or []
    return any(str(name).endswith("ForCausalLM") for name in architectures)


def is_encoder_folder(path: str | Path) -> bool:
    """A plain Hugging Face text encoder checkpoint: config.json whose model type transformers runs as a
    masked-language encoder (BERT, RoBERTa, DeBERTa-v2, ModernBERT, ELECTRA, XLM-R, ...), not an
    encoder-decoder (BART) nor a causal LM, and with no custom code (never run here)."""
    found = read_hf_config(path)
    if found is None or "auto_map" in found or is_causal_lm_folder(path):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if found.get("model_type") not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return False
    # config.json leaves out what equals its class's default (BART's is_encoder_decoder): the full config
    # says.
    config = _auto_config(path)
    return config is not None and not config.is_encoder_decoder and not getattr(config, "is_decoder", False)


def _auto_config(path: str | Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, KeyError, OSError):
        return None


def is_laya_layout_folder(path: str | Path) -> bool:
    """A Laya-layout model, whose encoder can carry a joint head instead of its own."""
    return (Path(path) / CONFIG_FILE).is_file()


def load_causal_lm(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    quantization: Any | None = None,
    device: str = "cpu",
) -> nn.Module:
    """The causal LM in a local folder (nothing is fetched from a hub), in eval mode.

    `quantization` (e.g. a 4-bit `BitsAndBytesConfig` for QLoRA) loads the backbone quantised on `device`.
    """
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a Hugging Face model folder (no config.json)")
    if quantization is None:
        with _checked_load(folder) as checked:
            return checked(
                AutoModelForCausalLM.from_pretrained(
                    str(folder), dtype=dtype, local_files_only=True, output_loading_info=True
                )
            ).eval()
    compute = getattr(quantization, "bnb_4bit_compute_dtype", None) or dtype
    with _checked_load(folder) as checked:
        lm = checked(
            AutoModelForCausalLM.from_pretrained(
                str(folder),
                dtype=compute,
                quantization_config=quantization,
                local_files_only=True,
                device_map={"": device},
                output_loading_info=True,
            )
        )
    return lm.eval()  # bitsandbytes quantises as the weights land on their device


def load_encoder(folder: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A plain Hugging Face encoder folder, or the one a joint export saved (`backbone/`), in eval mode.

    transformers picks the attention: sdpa where the architecture has it (BERT, RoBERTa, ModernBERT), eager
    where it has not (DeBERTa-v2, which refuses an explicit sdpa).
    """
    from transformers import AutoModel

    with _checked_load(folder) as checked:
        return checked(
            AutoModel.from_pretrained(
                str(folder), dtype=dtype, local_files_only=True, output_loading_info=True
            )
        ).eval()


# Tensors a checkpoint may lack without harm: the pooler, which no family reads.
UNREAD_PREFIXES = ("pooler.",)


@contextmanager
def _checked_load(folder: str | Path) -> Iterator[Callable[[tuple[nn.Module, dict]], nn.Module]]:
    """A checker for `from_pretrained(..., output_loading_info=True)`'s result: the model, or BadBase where
    its checkpoint lacks tensors the model reads (transformers fills them at random and only warns).
    transformers' own load report is silenced meanwhile: a masked-LM save's head (unexpected) and pooler
    (missing) are no problem, and what is one is said here."""
    from transformers.utils import logging as hf_logging

    def checked(loaded: tuple[nn.Module, dict]) -> nn.Module:
        model, info = loaded
        missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(UNREAD_PREFIXES))
        if missing:
            raise BadBase(
                f"{folder}: its weights lack {len(missing)} of the model's tensors ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}), which would start at random; a partial or "
                "mismatched checkpoint? save the whole model again (model.save_pretrained)"
            )
        return model

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield checked
    finally:
        hf_logging.set_verbosity(verbosity)


def encoder_from_laya_layout(folder: str | Path) -> tuple[nn.Module, Any, int]:
    """The pretrained encoder, tokenizer and stated sequence length (`max_len`) of a Laya-layout folder (its
    own head is left behind)."""
    loaded = load_model(folder)
    return loaded.model.encoder.float().eval(), loaded.tokenizer, loaded.max_len


def is_causal(model: nn.Module) -> bool:
    """A causal LM has an output projection; an encoder's base model has none."""
    return model.get_output_embeddings() is not None


def backbone_body(model: nn.Module) -> nn.Module:
    """The module whose output is the last hidden states: a causal LM's base model (no LM head), or the
    encoder.

    `get_decoder()` comes first: on a peft-wrapped LM, `lm.model` resolves to the whole causal LM, whose
    forward would compute the vocabulary logits this family exists to avoid.
    """
    if not is_causal(model):
        return model
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def vocabulary_table(model: nn.Module) -> torch.Tensor:
    """The rows the head gathers per option token (a lexical prior): a causal LM's output projection (tied to
    the input embeddings on small Qwen and Llama models), an encoder's word embeddings. Used as a table, never
    a layer."""
    if is_causal(model):
        return model.get_output_embeddings().weight
    return model.get_input_embeddings().weight


def max_positions(model: nn.Module, wanted: int) -> int:
    """`wanted`, capped by what the backbone's position embeddings reach."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        return wanted
    # RoBERTa-like embeddings number positions from padding_idx + 1 (514 embeddings reach 512 tokens).
    offset = getattr(getattr(model, "embeddings", None), "padding_idx", None)
    return min(wanted, int(limit) - (offset + 1 if isinstance(offset, int) else 0))


def lora_targets(model: nn.Module) -> list[str]:
    """What LoRA wraps: a causal LM's attention and MLP projections, else every linear layer of the encoder's
    blocks (as the Laya family does); never the output projection or a pooler."""
    present = sorted(
        {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in LORA_TARGETS}
    )
    if present:
        return present
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and not name.startswith("pooler")
    ]


def qlora_config(device: torch.device):
    """nf4 with double quantisation, computing in bf16 (fp16 where the GPU only emulates bf16)."""
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16
    if device.type == "cuda" and not has_native_bf16(device):
        compute = torch.float16
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )
