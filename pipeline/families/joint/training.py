"""Fine-tune the decoder family: records as examples, LoRA / full / QLoRA, calibration, export.

The same chain as the encoder family (`pipeline.stages.finetune.finetune`: pins, validation, slice, split, the same
trainer, calibration, crash-safe export) with what differs here: one example per row (all its questions in one
sequence, `pipeline.families.joint.records`), adapters on the language layers' attention and MLP projections (the head trains
in fp32), QLoRA as 4-bit nf4 with double quantisation, and calibration that fits a global head temperature
(clamped to [0.05, 20]) then a relative temperature per question type ([0.5, 5]).

    decision finetune --data rows.jsonl --base models/qwen3-0.6b --out models/qwen3-tuned --method qlora
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.scoring.calibration import (
    MIN_DECISIONS,
    TYPE_NAMES,
    cross_fitted_metrics,
    fit_calibration,
    fit_temperature,
    softmax,
)
from pipeline.config import TrainConfig, ValidateConfig
from pipeline.families.laya.items import Item
from pipeline.scoring.metrics import detailed_metrics
from pipeline.families.joint.records import EncodedRecord, RecordTooLong, collate_records, encode_record

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GLOBAL_T = (0.05, 20.0)


@dataclass(frozen=True, slots=True)
class DecoderExample:
    """One row as the decoder sees it: its encoded record and one target distribution per question."""

    record: EncodedRecord
    targets: tuple[tuple[float, ...], ...]
    labels: tuple[int, ...]
    soft: tuple[bool, ...]
    row: int  # index of the record in the list given to `build_examples`

    def __len__(self) -> int:
        return len(self.record)


def build_examples(records, tokenizer, max_len: int) -> tuple[list[DecoderExample], dict[str, int]]:
    """Encode validated records; a row whose questions cannot fit is skipped as `too_long` (per decision)."""
    examples, skipped = [], Counter()
    for index, record in enumerate(records):
        try:
            encoded = encode_record(tokenizer, record.state, [d.question for d in record.decisions], max_len)
        except RecordTooLong:
            skipped["too_long"] += len(record.decisions)
            continue
        targets = tuple(_target(d) for d in record.decisions)
        examples.append(DecoderExample(encoded, targets, tuple(d.gold.label for d in record.decisions),
                                       tuple(d.gold.probabilities is not None for d in record.decisions), index))  # fmt: skip
    return examples, dict(skipped)


def _target(decision) -> tuple[float, ...]:
    gold = decision.gold
    if gold.probabilities is not None:
        return tuple(gold.probabilities)
    return tuple(float(i == gold.label) for i in range(len(decision.question.options)))


def collate_examples(examples: list[DecoderExample], pad_id: int) -> dict[str, torch.Tensor]:
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
    from pipeline.families.joint.head import decoder_loss
    from pipeline.families.laya.forward import autocast_context

    with autocast_context(batch["input_ids"].device, dtype):
        logits = model(batch)
    questions = batch["option_mask"].any(-1).sum()
    mean = decoder_loss(logits.float(), batch, batch["target"], config.label_smoothing, config.brier_weight,
                        config.ordinal_weight)  # fmt: skip
    return mean * questions


def prepare_decoder(model, config: TrainConfig) -> None:
    """LoRA (also on a 4-bit backbone) on the attention and MLP projections, or everything; the head trains."""
    if config.method in ("lora", "qlora"):
        from peft import LoraConfig, inject_adapter_in_model

        present = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.lm.named_modules()
                if n.rsplit(".", 1)[-1] in LORA_TARGETS
            }
        )
        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                          target_modules=present, bias="none")  # fmt: skip
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


def batch_task(pad_id: int, config: TrainConfig):
    from pipeline.training.loop import BatchTask

    return BatchTask(collate=lambda examples: collate_examples(examples, pad_id),
                     summed_loss=lambda model, batch, dtype: summed_loss(model, batch, dtype, config),
                     backbone="lm.", decisions=lambda example: len(example.targets))  # fmt: skip


@torch.inference_mode()
def score_examples(model, examples: list[DecoderExample], pad_id: int, device: torch.device,
                   batch_size: int = 8) -> tuple[list[Item], list[np.ndarray]]:  # fmt: skip
    """Raw logits per held-out decision, as model items (no token ids) for calibration and metrics."""
    was_training = model.training
    model.eval()
    items, logits = [], []
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    for start in range(0, len(order), batch_size):
        chosen = [examples[i] for i in order[start : start + batch_size]]
        batch = {k: v.to(device) for k, v in collate_examples(chosen, pad_id).items()}
        scores = model(batch).float().cpu().numpy().astype(np.float64)
        for b, example in enumerate(chosen):
            for q, target in enumerate(example.targets):
                k = len(target)
                items.append(Item((), tuple(range(k)), example.record.qtypes[q], target, example.labels[q],
                                  example.row, example.record.question_ids[q], example.soft[q]))  # fmt: skip
                logits.append(scores[b, q, :k])
    model.train(was_training)
    return items, logits


def fit_decoder_calibration(items: list[Item], logits: list[np.ndarray]) -> dict[str, Any]:
    """A global head temperature in [0.05, 20], then one relative temperature per type in [0.5, 5] on top."""
    targets = [np.eye(len(z))[it.label] for it, z in zip(items, logits)]
    global_t = fit_temperature(logits, targets, *GLOBAL_T) if len(items) >= MIN_DECISIONS else 1.0
    relative = fit_calibration(items, [z / global_t for z in logits])  # the encoder's per-type fit, on top
    return {"global": float(global_t), "by_type": list(relative.temperatures), "notes": relative.notes}


def effective_temperatures(temperatures: dict[str, Any]) -> list[float]:
    """The temperature each type's logits are divided by: global x relative."""
    return [temperatures["global"] * t for t in temperatures["by_type"]]


def cross_fitted(items: list[Item], logits: list[np.ndarray]) -> dict[str, float]:
    """Metrics after calibration, each half of the records scored with temperatures fitted on the other."""
    return cross_fitted_metrics(
        items, logits, fit=lambda its, zs: effective_temperatures(fit_decoder_calibration(its, zs))
    )


def load_for_training(base: str | Path, config: TrainConfig, device: torch.device):
    """The decoder (plain causal LM or decoder export); QLoRA loads the backbone in 4-bit nf4."""
    from pipeline.families.joint.layout import load_decoder

    if config.method != "qlora":
        return load_decoder(base)
    return load_decoder(base, quantization=qlora_config(device), device=str(device))


def qlora_config(device: torch.device):
    """nf4 with double quantisation, computing in bf16 (fp16 where the GPU lacks bf16)."""
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        compute = torch.float16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute)  # fmt: skip


def decoder_finetune(data, base, out, config: TrainConfig, split_config: ValidateConfig = ValidateConfig(),
                     row_slice=None, device: str = "auto", cancel=None, progress: bool = True,
                     eval_data=None) -> dict[str, Any]:  # fmt: skip
    """validate, slice, split, train, calibrate, export for a decoder base; the summary `finetune` prints."""
    from pipeline.families.joint.layout import export_decoder
    from pipeline.stages.finetune import _merge_counts, _summary, peak_memory_mb, pick_device, verify_inputs
    from pipeline.data.read import RowSlice
    from pipeline.data.split import Split, split_holdout
    from pipeline.training.loop import resolve_precision, train
    from pipeline.data.validate import validate_file

    pins = verify_inputs([data, base] + ([eval_data] if eval_data else []))
    validated = validate_file(data, row_slice or RowSlice())
    split = Split(validated.records, validate_file(eval_data).records) if eval_data else split_holdout(
        validated.records, split_config)  # fmt: skip
    dev = pick_device(device)
    loaded = load_for_training(base, config, dev)
    pad_id = loaded.tokenizer.pad_token_id
    train_examples, skipped_train = build_examples(split.train, loaded.tokenizer, loaded.max_len)
    heldout, skipped_heldout = build_examples(split.heldout, loaded.tokenizer, loaded.max_len)
    skipped = _merge_counts(validated.report.skipped, skipped_train, skipped_heldout)
    loaded.model.head.to(dev)
    if config.method != "qlora":  # a 4-bit backbone was loaded onto its device
        loaded.model.to(dev)
    items, base_logits = score_examples(loaded.model, heldout, pad_id, dev)
    prepare_decoder(loaded.model, config)
    result = train(loaded.model, train_examples, pad_id, config, dev, cancel, progress=progress,
                   task=batch_task(pad_id, config))  # fmt: skip
    items, tuned_logits = score_examples(loaded.model, heldout, pad_id, dev)
    temperatures = fit_decoder_calibration(items, tuned_logits)
    heldout_metrics = {"decisions": len(items), "base": _plain(items, base_logits),
                       "tuned": _plain(items, tuned_logits), "calibrated": cross_fitted(items, tuned_logits)}  # fmt: skip
    cancelled = result.cancelled or (cancel is not None and cancel.cancelled)
    export_dir = None
    if not cancelled:
        manifest = {"data": str(data), "base": str(base), "pins": pins, "family": "decoder", "steps": result.steps,
                    "params": {"train": asdict(config)},
                    "metrics": {k: v for k, v in heldout_metrics.items() if isinstance(v, dict)}}  # fmt: skip
        export_dir = export_decoder(loaded, out, temperatures, manifest).out
    return {
        "rows": validated.report.rows, "decisions": validated.report.decisions, "skipped": skipped,
        "heldout": {k: _summary(v) if isinstance(v, dict) else v for k, v in heldout_metrics.items()},
        "temperatures": {"global": temperatures["global"], **dict(zip(TYPE_NAMES, temperatures["by_type"]))},
        "temperature_notes": temperatures["notes"], "export_dir": export_dir, "cancelled": cancelled,
        "train_seconds": result.train_seconds, "s_per_step": result.s_per_step, "steps": result.steps,
        "decisions_per_second": result.decisions_per_second, "peak_memory_mb": peak_memory_mb(),
        "precision": str(resolve_precision(config.precision, dev) or "fp32").replace("torch.", ""),
        "compile": result.compile, "family": "decoder", "method": config.method, "losses": result.losses,
    }  # fmt: skip


def _plain(items: list[Item], logits: list[np.ndarray]) -> dict[str, float]:
    return detailed_metrics(items, [softmax(z) for z in logits]) if items else {"accuracy": math.nan}
