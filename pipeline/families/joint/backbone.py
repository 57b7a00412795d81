"""The joint family's backbones: a causal LM (Qwen3, Llama: read for its last hidden states, never its vocabulary
logits) or an encoder (the MiniLM of a Laya-layout base, or any Hugging Face encoder folder).

    lm = load_causal_lm("models/qwen3-0.6b", dtype=torch.bfloat16)
    encoder, tokenizer, max_len = encoder_from_laya_layout("data/snapshots/minilm")
    hidden = backbone_body(lm)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.device import has_native_bf16
from pipeline.families.laya_layout import CONFIG_FILE, load_model

ENCODER, CAUSAL_LM = "encoder", "causal_lm"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_causal_lm_folder(path: str | Path) -> bool:
    """A plain Hugging Face causal LM checkpoint (config.json naming a `...ForCausalLM` architecture)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return any(str(name).endswith("ForCausalLM") for name in architectures)


def is_laya_layout_folder(path: str | Path) -> bool:
    """A Laya-layout model, whose encoder can carry a joint head instead of its own."""
    return (Path(path) / CONFIG_FILE).is_file()


def load_causal_lm(folder: str | Path, dtype: torch.dtype = torch.float32, quantization: Any | None = None,
                   device: str = "cpu") -> nn.Module:  # fmt: skip
    """The causal LM in a local folder (nothing is fetched from a hub), in eval mode.

    `quantization` (e.g. a 4-bit `BitsAndBytesConfig` for QLoRA) loads the backbone quantised on `device`.
    """
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a Hugging Face model folder (no config.json)")
    if quantization is None:
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True).eval()
    compute = getattr(quantization, "bnb_4bit_compute_dtype", None) or dtype
    lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=compute, quantization_config=quantization,
                                              local_files_only=True, device_map={"": device})  # fmt: skip
    return lm.eval()  # bitsandbytes quantises as the weights land on their device


def load_encoder(folder: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A Hugging Face encoder saved by a joint export (`backbone/`)."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), dtype=dtype, local_files_only=True,
                                     attn_implementation="sdpa").eval()  # fmt: skip


def encoder_from_laya_layout(folder: str | Path) -> tuple[nn.Module, Any, int]:
    """The pretrained encoder, tokenizer and stated sequence length (`max_len`) of a Laya-layout folder (its own
    head is left behind)."""
    loaded = load_model(folder)
    return loaded.model.encoder.float().eval(), loaded.tokenizer, loaded.max_len


def is_causal(model: nn.Module) -> bool:
    """A causal LM has an output projection; an encoder's base model has none."""
    return model.get_output_embeddings() is not None


def backbone_body(model: nn.Module) -> nn.Module:
    """The module whose output is the last hidden states: a causal LM's base model (no LM head), or the encoder.

    `get_decoder()` comes first: on a peft-wrapped LM, `lm.model` resolves to the whole causal LM, whose
    forward would compute the vocabulary logits this family exists to avoid.
    """
    if not is_causal(model):
        return model
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def vocabulary_table(model: nn.Module) -> torch.Tensor:
    """The rows the head gathers per option token (a lexical prior): a causal LM's output projection (tied to the
    input embeddings on small Qwen and Llama models), an encoder's word embeddings. Used as a table, never a layer."""
    if is_causal(model):
        return model.get_output_embeddings().weight
    return model.get_input_embeddings().weight


def max_positions(model: nn.Module, wanted: int) -> int:
    """`wanted`, capped by what the backbone's position embeddings reach."""
    limit = getattr(model.config, "max_position_embeddings", None)
    return min(wanted, int(limit)) if limit else wanted


def lora_targets(model: nn.Module) -> list[str]:
    """What LoRA wraps: a causal LM's attention and MLP projections, else every linear layer of the encoder's
    blocks (as the Laya family does); never the output projection or a pooler."""
    present = sorted(
        {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in LORA_TARGETS}
    )
    if present:
        return present
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not name.startswith("pooler")]  # fmt: skip


def qlora_config(device: torch.device):
    """nf4 with double quantisation, computing in bf16 (fp16 where the GPU only emulates bf16)."""
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16
    if device.type == "cuda" and not has_native_bf16(device):
        compute = torch.float16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute)  # fmt: skip
