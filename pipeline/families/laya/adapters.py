"""LoRA adapters on the encoder (peft), and the fine-tune folder format for adapters plus head.

Adapters are injected in place (`peft.inject_adapter_in_model`), so the decision model keeps its structure and
the head its parameter names. A LoRA fine-tune is saved as:

    decision_adapter.json      method, base model path and hash, LoRA settings, decision config
    adapter_config.json        peft's adapter config
    adapter_model.safetensors  the LoRA weights of the encoder (peft's key names)
    head.safetensors           the decision head (head.*, type_emb.*, scorer.*, act_head.*), fp32

It deliberately holds no `rl_agent_config.json`: it is not a model until merged (`decision export`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.families.laya_layout import LoadedModel, load_model
from pipeline.families.planned_layers import configure_plan
from pipeline.layer_plans import KEY as PLAN_KEY

ADAPTER_FILE = "decision_adapter.json"
HEAD_PREFIXES = ("head.", "type_emb.", "scorer.", "act_head.", "temperature")


def linear_targets(encoder: nn.Module, targets: str | list[str]) -> list[str]:
    """Module names LoRA wraps: every linear layer of the encoder's blocks for "all-linear", else the list."""
    if targets != "all-linear":
        return list(targets)
    return [
        name
        for name, module in encoder.named_modules()
        if isinstance(module, nn.Linear) and not name.startswith("pooler")
    ]


def apply_lora(model: nn.Module, r: int, alpha: int, dropout: float, targets: str | list[str]) -> list[str]:
    """Inject LoRA adapters into `model.encoder` in place and freeze the encoder's base weights."""
    from peft import LoraConfig, inject_adapter_in_model

    names = linear_targets(model.encoder, targets)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none")
    inject_adapter_in_model(config, model.encoder)
    for name, parameter in model.encoder.named_parameters():
        parameter.requires_grad_("lora_" in name)
    return names


def has_lora(model: nn.Module) -> bool:
    return any("lora_" in name for name, _ in model.named_parameters())


def head_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The decision head's tensors (everything outside the encoder)."""
    return {
        k: v.detach().float().cpu().contiguous()
        for k, v in model.state_dict().items()
        if k.startswith(HEAD_PREFIXES)
    }


def save_adapter(model: nn.Module, out: str | Path, description: dict[str, Any]) -> Path:
    """Write LoRA weights, head and description (the description file last: it marks the folder complete)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lora = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model.encoder).items()}
    save_file(lora, out / "adapter_model.safetensors")
    save_file(head_state(model), out / "head.safetensors")
    peft_config = next(iter(model.encoder.peft_config.values()))
    (out / "adapter_config.json").write_text(json.dumps(peft_config.to_dict(), default=list, indent=2))
    partial = out / (ADAPTER_FILE + ".partial")
    partial.write_text(json.dumps(description, indent=2))
    partial.replace(out / ADAPTER_FILE)
    return out


def load_adapter(model: nn.Module, folder: str | Path) -> dict[str, Any]:
    """Inject and load a saved LoRA fine-tune into a freshly loaded base model; returns its description."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    description = json.loads((folder / ADAPTER_FILE).read_text())
    config = LoraConfig(**_peft_kwargs(json.loads((folder / "adapter_config.json").read_text())))
    inject_adapter_in_model(config, model.encoder)
    result = set_peft_model_state_dict(model.encoder, load_file(folder / "adapter_model.safetensors"))
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"{folder}: adapter keys the base model does not have: {result.unexpected_keys[:5]}")
    missing = model.load_state_dict(load_file(folder / "head.safetensors"), strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"{folder}: head keys the base model does not have: {missing.unexpected_keys[:5]}")
    return description


def _peft_kwargs(saved: dict[str, Any]) -> dict[str, Any]:
    keep = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias")
    return {k: saved[k] for k in keep if k in saved}


def load_for_inference(folder: str | Path) -> LoadedModel:
    """A Laya-layout model, or a LoRA fine-tune applied to the base model its description names; either runs
    the layer plan its config was saved with (a fine-tune; an export is materialised and has none)."""
    folder = Path(folder)
    if (folder / ADAPTER_FILE).is_file():
        description = json.loads((folder / ADAPTER_FILE).read_text())
        loaded = load_model(description["base"])
        load_adapter(loaded.model, folder)
        loaded.config = {**description.get("decision_config", loaded.config), **_temperatures(description)}
    else:
        loaded = load_model(folder)
    configure_plan(loaded.model.encoder, loaded.config.get(PLAN_KEY), None)
    return loaded


def _temperatures(description: dict[str, Any]) -> dict[str, Any]:
    return {"temperature": description["temperature"]} if "temperature" in description else {}
