"""Fine-tune a decision model: LoRA (peft) or full fine-tuning, soft cross-entropy, exact accumulation.

Each optimizer step sees a window of `micro_batch x grad_accum` items drawn in seeded random order; inside the
window items are sorted by length and cut into micro-batches (less padding), and each micro-batch's summed loss is
divided by the window's item count, so the accumulated gradient is exactly that of the window's mean loss. The
loss is read back from the device once per logging step. A cancel (flag or signal) stops at the next step.

    decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora
"""

from __future__ import annotations

import math
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pipeline.families.laya.adapters import apply_lora
from pipeline.training.compile import (
    CompileConfig,
    compiled_encoder,
    decide_compile,
    no_cudnn_sdpa,
    pad_to_bucket,
    pick_warmup_batches,
)
from pipeline.config import ConfigError, TrainConfig
from pipeline.families.laya.forward import decision_logits, soft_cross_entropy
from pipeline.families.laya.items import Item, collate


class CancelToken:
    """A flag the training loop checks at each step boundary; signals can set it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @contextmanager
    def on_signals(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[CancelToken]:
        """Within the block, the first SIGINT/SIGTERM cancels at the next step; the handlers are restored after."""
        previous = {s: signal.getsignal(s) for s in signals}
        for sig in signals:
            signal.signal(sig, lambda number, _frame: self.cancel(f"signal {signal.Signals(number).name}"))
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass
class TrainResult:
    """What a training run did."""

    steps: int
    planned_steps: int
    decisions: int
    cancelled: bool
    train_seconds: float
    step_seconds: list[float] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)
    compile: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"

    @property
    def s_per_step(self) -> float:
        """Median seconds per optimizer step, leaving out the first (warm-up) step when there are more."""
        steady = self.step_seconds[1:] or self.step_seconds
        return statistics.median(steady) if steady else float("nan")

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.train_seconds if self.train_seconds else float("nan")


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The encoder's autocast dtype (None for fp32)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if _cpu_has_native_bf16() else None


def _cpu_has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def prepare_model(model: torch.nn.Module, config: TrainConfig) -> None:
    """Set up the trainable parameters: LoRA adapters on the encoder, or the whole model."""
    if config.method == "qlora":
        raise ConfigError(
            "train.method=qlora: QLoRA quantises a decoder backbone; encoder models (the Laya layout) train "
            "with --method lora or --method full"
        )
    if config.method == "lora":
        apply_lora(model, config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
    else:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
    for name, parameter in model.named_parameters():
        if not name.startswith("encoder."):
            parameter.requires_grad_(not name.startswith("act_head."))  # no loss reaches the act head
    if config.gradient_checkpointing:
        model.encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_optimizer(
    model: torch.nn.Module, config: TrainConfig, total_steps: int, backbone: str = "encoder."
):
    """AdamW with the backbone (`backbone` prefix) and the head in their own groups, and a cosine schedule."""
    encoder = [p for n, p in model.named_parameters() if n.startswith(backbone) and p.requires_grad]
    head = [p for n, p in model.named_parameters() if not n.startswith(backbone) and p.requires_grad]
    groups = [{"params": encoder, "lr": config.encoder_lr}, {"params": head, "lr": config.head_lr}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=config.weight_decay)
    cosine = lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))  # noqa: E731
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)


def plan_windows(n_items: int, config: TrainConfig) -> list[list[int]]:
    """Item indices of every optimizer step: seeded shuffles per epoch, cut into windows, capped by max_steps."""
    window = config.micro_batch * config.grad_accum
    windows = []
    for epoch in range(config.epochs):
        order = list(range(n_items))
        random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
        windows.extend(order[i : i + window] for i in range(0, n_items, window))
    return windows if config.max_steps is None else windows[: config.max_steps]


def micro_batches(window: list[int], items: Sequence[Any], micro_batch: int) -> list[list[int]]:
    """A window's items sorted by length and cut into micro-batches: the same items, less padding."""
    ordered = sorted(window, key=lambda i: len(items[i]))
    return [ordered[i : i + micro_batch] for i in range(0, len(ordered), micro_batch)]


def accumulate_gradients(window: list[int], items: Sequence[Any], micro_batch: int,
                         summed_loss: Callable[[list[int]], torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """Backpropagate one window in length-grouped micro-batches; the gradient is that of the window's mean loss.

    Each micro-batch's summed loss is divided by the window's item count (not the micro-batch's), so splitting
    a window differently gives the same gradient up to float rounding. Returns the summed loss, on the device.
    """
    total = torch.zeros(())
    for indices in micro_batches(window, items, micro_batch):
        loss = summed_loss(indices)
        (loss / len(window)).backward()
        total = total.to(loss.device) + loss.detach()
    return total


@dataclass(frozen=True)
class BatchTask:
    """How another model family turns its examples into batches and a summed loss (default: the encoder's).

    `summed_loss(model, batch, dtype)` sums over the batch's examples, so accumulation stays exact;
    `backbone` is the parameter-name prefix that gets the backbone learning rate; `decisions(example)` counts
    the decisions an example holds (a decoder record holds all of its row's questions).
    """

    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    summed_loss: Callable[[torch.nn.Module, dict[str, torch.Tensor], torch.dtype | None], torch.Tensor]
    backbone: str = "lm."
    decisions: Callable[[Any], int] = lambda example: 1


def train(model: torch.nn.Module, items: Sequence[Any], pad_id: int, config: TrainConfig, device: torch.device,
          cancel: CancelToken | None = None, on_log: Callable[[dict[str, float]], None] | None = None,
          progress: bool = True, compile_config: CompileConfig | None = None,
          task: BatchTask | None = None) -> TrainResult:  # fmt: skip
    """Train `model` in place on `items` (model items, or another family's examples with `task`).

    The model must already be prepared (`prepare_model`, or the family's own preparation).
    """
    from tqdm.auto import tqdm

    if not items:
        raise ValueError("no training items: every decision was skipped (see the validation report)")
    windows = plan_windows(len(items), config)
    dtype = resolve_precision(config.precision, device)
    compile_config = compile_config or CompileConfig()
    enabled, reason = decide_compile(device, len(windows) * config.grad_accum, compile_config)
    if task is not None:
        enabled, reason = False, "per-layer compile is wired for the encoder family only"
    optimizer, scheduler = build_optimizer(model, config, len(windows), task.backbone if task else "encoder.")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.manual_seed(config.seed)
    model.to(device).train()

    def batch_of(indices: list[int], padded: bool) -> dict[str, torch.Tensor]:
        examples = [items[i] for i in indices]
        batch = task.collate(examples) if task else collate(examples, pad_id)
        batch = pad_to_bucket(batch, pad_id, compile_config) if padded else batch
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if task is not None:
            return task.summed_loss(model, batch, dtype)
        per_item = soft_cross_entropy(
            decision_logits(model, batch, dtype), batch["target"], batch["marker_mask"]
        )
        return per_item.sum()

    warmup = (
        pick_warmup_batches(_run_batches(windows, items, config, pad_id), compile_config) if enabled else []
    )
    result = TrainResult(0, len(windows), 0, False, 0.0, precision=str(dtype or "fp32").replace("torch.", ""))
    started = time.perf_counter()
    with no_cudnn_sdpa(), compiled_encoder(model, compile_config, enabled, reason, warmup,
                                            lambda _model, batch: loss_of(batch), pad_id) as report:  # fmt: skip
        running, seen_since_log = torch.zeros((), device=device), 0
        bar = tqdm(total=len(windows), unit="step", desc=f"train {config.method}", disable=not progress)
        for window in windows:
            if cancel is not None and cancel.cancelled:
                result.cancelled = True
                break
            step_started = time.perf_counter()
            running += accumulate_gradients(window, items, config.micro_batch,
                                            lambda indices: loss_of(batch_of(indices, report.enabled)))  # fmt: skip
            seen_since_log += len(window)
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps += 1
            result.decisions += sum(task.decisions(items[i]) for i in window) if task else len(window)
            result.step_seconds.append(time.perf_counter() - step_started)
            bar.update(1)
            if result.steps % config.log_every == 0 or result.steps == len(windows):
                mean_loss = running.item() / seen_since_log  # the one host sync of a logging step
                running.zero_()
                seen_since_log = 0
                result.losses.append((result.steps, mean_loss))
                bar.set_postfix(loss=f"{mean_loss:.4f}", s_step=f"{result.step_seconds[-1]:.2f}")
                if on_log is not None:
                    on_log({"step": result.steps, "loss": mean_loss, "lr": scheduler.get_last_lr()[0],
                            "s_per_step": result.step_seconds[-1]})  # fmt: skip
        bar.close()
    result.compile = asdict(report)
    result.train_seconds = time.perf_counter() - started
    model.eval()
    return result


def _run_batches(windows: list[list[int]], items: list[Item], config: TrainConfig, pad_id: int):
    """Every micro-batch of the run, collated on the CPU, in order (for choosing the warm-up batches)."""
    for window in windows:
        for indices in micro_batches(window, items, config.micro_batch):
            yield collate([items[i] for i in indices], pad_id)
