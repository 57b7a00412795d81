"""How the Laya family trains: LoRA on every linear layer of the encoder (or full fine-tuning) and soft
cross-entropy over each question's own options, one softmax per decision even when its options fill several
sequences."""

from __future__ import annotations

import torch

from pipeline.config import TrainConfig
from pipeline.families.base import BatchTask
from pipeline.families.laya.adapters import apply_lora
from pipeline.families.laya.forward import decision_logits, item_logits, soft_cross_entropy
from pipeline.families.laya.items import collate
from pipeline.families.planned_layers import freeze_skipped


def prepare_model(model: torch.nn.Module, config: TrainConfig) -> None:
    """Set up the trainable parameters: LoRA adapters on the encoder, or the whole model (no QLoRA here)."""
    if config.method == "lora":
        apply_lora(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
    else:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
    for name, parameter in model.named_parameters():
        if not name.startswith("encoder."):
            parameter.requires_grad_(not name.startswith("act_head."))  # no loss reaches the act head
    freeze_skipped(model.encoder)
    if config.gradient_checkpointing:
        model.encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def summed_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype | None
) -> torch.Tensor:
    """Soft cross-entropy of each item against its target over all its options, summed over the batch."""
    logits = item_logits(decision_logits(model, batch, dtype), batch)
    return soft_cross_entropy(logits, batch["target"], batch["option_mask"]).sum()


def laya_batch_task(pad_id: int) -> BatchTask:
    """Items collated with `pad_id`; the encoder (`encoder.` parameters) gets the backbone learning rate."""
    return BatchTask(
        collate=lambda items: collate(items, pad_id),
        summed_loss=summed_loss,
        backbone="encoder.",
        pad_id=pad_id,
        layers=lambda model: model.encoder,
    )
