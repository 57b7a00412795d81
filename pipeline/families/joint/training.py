"""How the joint family trains: one example per row (every question in one sequence, or the questions in a
field sequence apart), LoRA / full / QLoRA on the backbone or the head alone on a frozen backbone (`head`: its
hidden states computed once, `cache_features`), the head in fp32, soft cross-entropy per question (optional
smoothing, Brier and ordinal terms).

    examples, skipped = build_examples(records, tokenizer, max_len, fields_apart=True)
    prepare_joint(model, config)
    train(model, examples, config, device, joint_batch_task(pad_id, config))
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from pipeline.config import TrainConfig
from pipeline.families.base import BatchTask, StateCut, cuts_by_row
from pipeline.families.forward_passes import autocast_context, length_batches
from pipeline.families.joint.backbone import lora_targets
from pipeline.families.joint.head import JointDecisionModel, joint_loss
from pipeline.families.joint.records import (
    EncodedRecord,
    FieldKey,
    RecordLayout,
    RecordTooLong,
    collate_records,
    distinct_field_keys,
    encode_row,
)
from pipeline.families.joint.token_cache import TokenCache
from pipeline.families.planned_layers import freeze_skipped
from pipeline.scoring.decisions import ScoredDecision


@dataclass(frozen=True, slots=True)
class JointExample:
    """One row as the joint model sees it: its encoded record and one target distribution per question."""

    record: EncodedRecord
    targets: tuple[tuple[float, ...], ...]
    labels: tuple[int, ...]
    soft: tuple[bool, ...]
    row: int  # index of the record in the list given to `build_examples`
    features: CachedFeatures | None = None  # a frozen backbone's hidden states (`cache_features`)

    def __len__(self) -> int:
        return len(self.record)

    def scored(self) -> list[ScoredDecision]:
        """The row's decisions as metrics and calibration see them, in question order."""
        return [
            ScoredDecision(
                self.record.qtypes[q],
                self.labels[q],
                self.row,
                self.record.question_ids[q],
                target,
                self.soft[q],
            )
            for q, target in enumerate(self.targets)
        ]


@dataclass(frozen=True, slots=True, eq=False)
class CachedFeatures:
    """One row's backbone hidden states, computed once: the sequence's [T, H], and the field sequence's [Tq,
    H] (fields apart; shared by every row with the same questions), or with questions isolated each of its
    field sequences' by key (each tensor shared by every row that asks the question)."""

    state: torch.Tensor
    fields: torch.Tensor | dict[FieldKey, torch.Tensor] | None


def build_examples(records, tokenizer, layout: RecordLayout) -> tuple[list[JointExample], dict[str, int]]:
    """Encode validated records (one example per row, or per question where `layout` reads each question in a
    sequence of its own); a row whose questions cannot fit is skipped as `too_long` (per decision)."""
    examples, skipped, cache = [], Counter(), TokenCache()
    for index, record in enumerate(records):
        questions = [d.question for d in record.decisions]
        try:
            encoded = encode_row(tokenizer, record.state, questions, layout, cache)
        except RecordTooLong:
            skipped["too_long"] += len(record.decisions)
            continue
        by_id = {d.question.id: d for d in record.decisions}
        # A question whose options were spread over several sequences is answered as one softmax, not trained
        # on.
        spread = {
            qid for qid, n in Counter(q for part in encoded for q in part.question_ids).items() if n > 1
        }
        skipped["too_long"] += len(spread)
        for part in encoded:
            if spread & set(part.question_ids):
                continue
            mine = [by_id[qid] for qid in part.question_ids]
            examples.append(
                JointExample(
                    part,
                    tuple(_target(d) for d in mine),
                    tuple(d.gold.label for d in mine),
                    tuple(d.gold.probabilities is not None for d in mine),
                    index,
                )
            )
    return examples, dict(skipped)


def state_cuts(examples: list[JointExample]) -> list[StateCut]:
    """Per row the examples read: its state's tokens, and what its records keep of them (a causal LM reads a
    row in one record per question, each leaving the state its own room: the fewest kept counts)."""
    return cuts_by_row(
        [
            (e.row, StateCut(e.record.state_length, e.record.state_tokens, e.record.state_room))
            for e in examples
        ]
    )


def _target(decision) -> tuple[float, ...]:
    gold = decision.gold
    if gold.probabilities is not None:
        return tuple(gold.probabilities)
    return tuple(float(i == gold.label) for i in range(len(decision.question.options)))


def collate_examples(examples: list[JointExample], pad_id: int) -> dict[str, torch.Tensor]:
    """`collate_records` plus the targets [B, Q, K], and the cached hidden states where the examples have
    them."""
    batch = collate_records([e.record for e in examples], pad_id)
    target = torch.zeros(batch["option_mask"].shape, dtype=torch.float32)
    for b, example in enumerate(examples):
        for q, values in enumerate(example.targets):
            target[b, q, : len(values)] = torch.tensor(values)
    if examples[0].features is not None:
        batch |= _cached_hidden(examples)
    return batch | {"target": target}


def _cached_hidden(examples: list[JointExample]) -> dict[str, torch.Tensor]:
    """Cached hidden states padded as `collate_records` pads the ids (fields: each distinct sequence once, in
    the order of its `field_index`)."""
    states = [e.features.state for e in examples]
    out = {"state_hidden": torch.nn.utils.rnn.pad_sequence(states, batch_first=True)}
    if examples[0].record.field_sequences is not None:
        by_key = {key: hidden for e in examples for key, hidden in e.features.fields.items()}
        hidden = [by_key[key] for key in distinct_field_keys([e.record for e in examples])]
        out["field_hidden"] = torch.nn.utils.rnn.pad_sequence(hidden, batch_first=True)
    elif examples[0].features.fields is not None:
        distinct = dict.fromkeys(e.record.field_ids for e in examples)
        by_ids = {e.record.field_ids: e.features.fields for e in examples}
        out["field_hidden"] = torch.nn.utils.rnn.pad_sequence(
            [by_ids[ids] for ids in distinct], batch_first=True
        )
    return out


@torch.inference_mode()
def cache_features(
    model: JointDecisionModel,
    examples: list[JointExample],
    pad_id: int,
    device: torch.device,
    batch_size: int = 64,
    report: Callable[[str], None] | None = None,
    dtype: torch.dtype = torch.float16,
) -> list[JointExample]:
    """The examples with their frozen backbone's hidden states (on the CPU, fp16 unless `dtype` says otherwise:
    training reads half; scoring reads full precision, as the model without a cache would), each sequence encoded
    once.

    A field sequence that many rows share is encoded once for all of them. `report` gets a line every 30 s.
    """
    was_training = model.training
    model.eval()
    fields: dict[tuple[int, ...], torch.Tensor] = {}
    cached: list[JointExample | None] = [None] * len(examples)
    started = last = time.perf_counter()
    done = 0
    for indices in length_batches([len(e) for e in examples], batch_size):
        batch = collate_records([examples[i].record for i in indices], pad_id)
        hidden = model.state_hidden_states(batch["input_ids"].to(device), batch["attention_mask"].to(device))
        _cache_new_fields(batch, [examples[i].record for i in indices], fields, model, device, dtype)
        for row, index in enumerate(indices):
            example = examples[index]
            state = hidden[row, : len(example)].to("cpu", dtype)
            cached[index] = replace(
                example, features=CachedFeatures(state, _own_fields(example.record, fields))
            )
        done += len(indices)
        if report and time.perf_counter() - last >= 30:
            last = time.perf_counter()
            report(f"backbone features: {done:,}/{len(examples):,} rows ({last - started:.0f} s)")
    model.train(was_training)
    if report:
        report(
            f"backbone features of {len(examples):,} rows computed once in "
            f"{time.perf_counter() - started:.0f} s"
        )
    return cached


def _own_fields(record: EncodedRecord, fields: dict):
    """The cached field hidden states a record reads: none, its field sequence's, or its isolated sequences'
    by key."""
    if record.field_sequences is not None:
        return {key: fields[key] for key in distinct_field_keys([record])}
    return fields.get(record.field_ids) if record.fields_apart else None


def _cache_new_fields(
    batch: dict, records: list[EncodedRecord], fields: dict, model, device, dtype: torch.dtype
) -> None:
    """Hidden states of the batch's field sequences (`collate_records` put each distinct one in its rows, in
    first-seen order), encoded only when one of them is not cached yet."""
    if "field_input_ids" not in batch:
        return
    isolated = records[0].field_sequences is not None
    distinct = distinct_field_keys(records) if isolated else list(dict.fromkeys(r.field_ids for r in records))
    if all(ids in fields for ids in distinct):
        return
    hidden = model.hidden_states(
        batch["field_input_ids"].to(device), batch["field_attention_mask"].to(device)
    )
    for row, key in enumerate(distinct):
        length = len(key[0]) if isolated else len(key)
        fields.setdefault(key, hidden[row, :length].to("cpu", dtype))


def summed_loss(
    model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None, config: TrainConfig = TrainConfig()
) -> torch.Tensor:
    """The batch's loss summed over its questions (the trainer divides by its window); the optional terms
    (label smoothing, Brier, ordinal) come from `config` and are off by default."""
    with autocast_context(batch["input_ids"].device, dtype):
        logits = model(batch)
    questions = batch["option_mask"].any(-1).sum()
    mean = joint_loss(
        logits.float(),
        batch,
        batch["target"],
        config.label_smoothing,
        config.brier_weight,
        config.ordinal_weight,
    )
    return mean * questions


def prepare_joint(model: JointDecisionModel, config: TrainConfig) -> None:
    """LoRA (also on a 4-bit backbone) on the backbone's projections, everything, or the head alone (`head`:
    the backbone frozen); the head trains in fp32."""
    if config.method == "head":
        model.lm.requires_grad_(False)
    elif config.method in ("lora", "qlora"):
        from peft import LoraConfig, inject_adapter_in_model

        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=lora_targets(model.lm),
            bias="none",
        )
        inject_adapter_in_model(lora, model.lm)
        for name, parameter in model.lm.named_parameters():
            parameter.requires_grad_("lora_" in name)
    else:
        for parameter in model.lm.parameters():
            parameter.requires_grad_(True)
    for parameter in model.head.parameters():
        parameter.requires_grad_(True)
    model.head.float()
    freeze_skipped(model.lm)
    if config.gradient_checkpointing:
        model.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def joint_batch_task(pad_id: int, config: TrainConfig) -> BatchTask:
    """Records collated with `pad_id`; the backbone (`lm.` parameters) gets the backbone learning rate."""
    return BatchTask(
        collate=lambda examples: collate_examples(examples, pad_id),
        summed_loss=lambda model, batch, dtype: summed_loss(model, batch, dtype, config),
        backbone="lm.",
        pad_id=pad_id,
        layers=lambda model: model.lm,
        decisions=lambda example: len(example.targets),
    )


@torch.inference_mode()
def score_examples(
    model, examples: list[JointExample], pad_id: int, device: torch.device, batch_size: int = 8
) -> tuple[list[ScoredDecision], list[np.ndarray]]:
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
