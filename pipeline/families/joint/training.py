"""How the joint family trains: one example per row (every question in one sequence), LoRA / full / QLoRA on the
backbone, the head in fp32, soft cross-entropy per question (optional smoothing, Brier and ordinal terms).

    examples, skipped = build_examples(records, tokenizer, max_len)
    prepare_joint(model, config)
    train(model, examples, config, device, joint_batch_task(pad_id, config))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import TrainConfig
from pipeline.families.base import BatchTask
from pipeline.families.forward_passes import autocast_context, length_batches
from pipeline.families.joint.backbone import lora_targets
from pipeline.families.joint.head import JointDecisionModel, joint_loss
from pipeline.families.joint.records import EncodedRecord, RecordTooLong, collate_records, encode_record
from pipeline.scoring.decisions import ScoredDecision


@dataclass(frozen=True, slots=True)
class JointExample:
    """One row as the joint model sees it: its encoded record and one target distribution per question."""

    record: EncodedRecord
    targets: tuple[tuple[float, ...], ...]
    labels: tuple[int, ...]
    soft: tuple[bool, ...]
    row: int  # index of the record in the list given to `build_examples`

    def __len__(self) -> int:
        return len(self.record)

    def scored(self) -> list[ScoredDecision]:
        """The row's decisions as metrics and calibration see them, in question order."""
        return [ScoredDecision(self.record.qtypes[q], self.labels[q], self.row, self.record.question_ids[q],
                               target, self.soft[q]) for q, target in enumerate(self.targets)]  # fmt: skip


def build_examples(records, tokenizer, max_len: int) -> tuple[list[JointExample], dict[str, int]]:
    """Encode validated records; a row whose questions cannot fit is skipped as `too_long` (per decision)."""
    examples, skipped = [], Counter()
    for index, record in enumerate(records):
        try:
            encoded = encode_record(tokenizer, record.state, [d.question for d in record.decisions], max_len)
        except RecordTooLong:
            skipped["too_long"] += len(record.decisions)
            continue
        targets = tuple(_target(d) for d in record.decisions)
        examples.append(JointExample(encoded, targets, tuple(d.gold.label for d in record.decisions),
                                     tuple(d.gold.probabilities is not None for d in record.decisions), index))  # fmt: skip
    return examples, dict(skipped)


def _target(decision) -> tuple[float, ...]:
    gold = decision.gold
    if gold.probabilities is not None:
        return tuple(gold.probabilities)
    return tuple(float(i == gold.label) for i in range(len(decision.question.options)))


def collate_examples(examples: list[JointExample], pad_id: int) -> dict[str, torch.Tensor]:
    """`collate_records` plus the targets [B, Q, K]."""
    batch = collate_records([e.record for e in examples], pad_id)
    target = torch.zeros(batch["option_mask"].shape, dtype=torch.float32)
    for b, example in enumerate(examples):
        for q, values in enumerate(example.targets):
            target[b, q, : len(values)] = torch.tensor(values)
    return batch | {"target": target}


def summed_loss(model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None,
                config: TrainConfig = TrainConfig()) -> torch.Tensor:  # fmt: skip
    """The batch's loss summed over its questions (the trainer divides by its window); the optional terms
    (label smoothing, Brier, ordinal) come from `config` and are off by default."""
    with autocast_context(batch["input_ids"].device, dtype):
        logits = model(batch)
    questions = batch["option_mask"].any(-1).sum()
    mean = joint_loss(logits.float(), batch, batch["target"], config.label_smoothing, config.brier_weight,
                      config.ordinal_weight)  # fmt: skip
    return mean * questions


def prepare_joint(model: JointDecisionModel, config: TrainConfig) -> None:
    """LoRA (also on a 4-bit backbone) on the backbone's projections, or everything; the head trains in fp32."""
    if config.method in ("lora", "qlora"):
        from peft import LoraConfig, inject_adapter_in_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                          target_modules=lora_targets(model.lm), bias="none")  # fmt: skip
        inject_adapter_in_model(lora, model.lm)
        for name, parameter in model.lm.named_parameters():
            parameter.requires_grad_("lora_" in name)
    else:
        for parameter in model.lm.parameters():
            parameter.requires_grad_(True)
    for parameter in model.head.parameters():
        parameter.requires_grad_(True)
    model.head.float()
    if config.gradient_checkpointing:
        model.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def joint_batch_task(pad_id: int, config: TrainConfig) -> BatchTask:
    """Records collated with `pad_id`; the backbone (`lm.` parameters) gets the backbone learning rate."""
    return BatchTask(collate=lambda examples: collate_examples(examples, pad_id),
                     summed_loss=lambda model, batch, dtype: summed_loss(model, batch, dtype, config),
                     backbone="lm.", pad_id=pad_id, layers=lambda model: model.lm,
                     decisions=lambda example: len(example.targets))  # fmt: skip


@torch.inference_mode()
def score_examples(model, examples: list[JointExample], pad_id: int, device: torch.device,
                   batch_size: int = 8) -> tuple[list[ScoredDecision], list[np.ndarray]]:  # fmt: skip
    """Raw logits per held-out decision, in example order and question order within each example."""
    was_training = model.training
    model.eval()
    logits: list[list[np.ndarray]] = [[] for _ in examples]
    for indices in length_batches([len(e) for e in examples], batch_size):
        batch = {k: v.to(device) for k, v in collate_examples([examples[i] for i in indices], pad_id).items()}
        scores = model(batch).float().cpu().numpy().astype(np.float64)
        for b, index in enumerate(indices):
            logits[index] = [scores[b, q, : len(t)] for q, t in enumerate(examples[index].targets)]
    model.train(was_training)
    return [d for e in examples for d in e.scored()], [z for row in logits for z in row]
