"""Fine-tune a decision model: LoRA (peft) or full fine-tuning, soft cross-entropy, exact accumulation.

Each optimizer step sees a window of `micro_batch x grad_accum` items drawn in seeded random order; inside the
window items are sorted by length and cut into micro-batches (less padding), and each micro-batch's summed
loss is divided by the window's item count, so the accumulated gradient is exactly that of the window's mean
loss. The loss is read back from the device once per logging step (and once per checkpoint). A cancel (flag or
signal) stops at the next step. With a `Checkpointer` the loop saves its state every N steps or M minutes and
a rerun resumes from it (`pipeline.training.checkpoint`).

    decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pipeline.config import TrainConfig
from pipeline.device import precision_name, resolve_precision
from pipeline.families.base import BatchTask
from pipeline.training.checkpoint import (
    TrainState,
    fingerprint,
    load_parameters,
    restore_rng,
    rng_states,
    trainable_parameters,
)
from pipeline.training.compile import (
    CompileConfig,
    compiled_encoder,
    decide_compile,
    no_cudnn_sdpa,
    pad_to_bucket,
    pick_warmup_batches,
)
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.early_stop import EarlyStopping
from pipeline.training.progress import StepLog
from pipeline.training.ranks import Ranks


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
    logged_steps: list[dict[str, float]] = field(default_factory=list)
    """Every logging step's entry (step, loss, lr, s/step), as `on_log` got them."""
    resumed_from_step: int = 0
    """The step of the checkpoint this run resumed from (0: it started afresh)."""
    world_size: int = 1
    """Data-parallel ranks that shared each window (`training.ranks`)."""
    allreduce_seconds: float = 0.0
    """Of `train_seconds`, the time this rank spent in the gradient all-reduce (0 on one rank)."""
    early_stopping: dict[str, Any] = field(default_factory=dict)
    """With `train.early_stopping`: the validation checks, the best step, where training ended and whether the
    best step's weights were put back (`early_stop.EarlyStopping.summary`); empty without."""

    @property
    def s_per_step(self) -> float:
        """Median seconds per optimizer step, leaving out the first (warm-up) step when there are more."""
        steady = self.step_seconds[1:] or self.step_seconds
        return statistics.median(steady) if steady else float("nan")

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.train_seconds if self.train_seconds else float("nan")


def build_optimizer(model: torch.nn.Module, config: TrainConfig, total_steps: int, backbone: str):
    """AdamW with the backbone (`backbone` prefix) and the head in their own groups, and a cosine schedule
    with `train.warmup_steps` of linear warm-up (transformers' scheduler)."""
    from transformers import get_cosine_schedule_with_warmup

    encoder = [p for n, p in model.named_parameters() if n.startswith(backbone) and p.requires_grad]
    head = [p for n, p in model.named_parameters() if not n.startswith(backbone) and p.requires_grad]
    groups = [{"params": encoder, "lr": config.encoder_lr}, {"params": head, "lr": config.head_lr}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=config.weight_decay)
    warmup = min(config.warmup_steps, total_steps)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, warmup, max(1, total_steps))


BUCKET_WINDOWS = 50
"""Windows per length bucket: a shuffled epoch is cut into pools of this many windows, each pool sorted by
length before it is cut, so a window pads to a length near its own items' (the pools, and the windows, stay
random)."""


@dataclass(frozen=True)
class Budget:
    """How many optimizer steps a run takes, and why, in words a user can check."""

    windows_per_epoch: int
    epochs: int
    steps: int
    reason: str


def plan_budget(n_items: int, config: TrainConfig) -> Budget:
    """`train.epochs`, raised until the run has `train.min_steps` steps (a small set needs several epochs to
    learn), then capped by `train.max_steps`."""
    window = config.micro_batch * config.grad_accum
    per_epoch = max(1, -(-n_items // window))
    epochs = max(config.epochs, -(-config.min_steps // per_epoch))
    steps = per_epoch * epochs
    what = f"{n_items:,} examples in windows of {window} = {per_epoch:,} steps per epoch"
    if epochs > config.epochs:
        reason = (
            f"{what}; {config.epochs} epochs (train.epochs) would be {per_epoch * config.epochs:,} steps, "
            f"fewer than train.min_steps {config.min_steps}, so {epochs} epochs"
        )
    else:
        reason = f"{what}; {epochs} epochs (train.epochs)"
    if config.max_steps is not None and config.max_steps < steps:
        steps, reason = config.max_steps, f"{reason}, capped at train.max_steps {config.max_steps}"
    return Budget(per_epoch, epochs, steps, f"{reason}: {steps:,} steps")


def plan_windows(n_items: int, config: TrainConfig, lengths: Sequence[int] | None = None) -> list[list[int]]:
    """Item indices of every optimizer step (`plan_budget`): seeded shuffles per epoch, cut into windows; with
    `lengths`, each pool of `BUCKET_WINDOWS` windows is sorted by length first and its windows shuffled."""
    window = config.micro_batch * config.grad_accum
    budget = plan_budget(n_items, config)
    windows = []
    for epoch in range(budget.epochs):
        rng = random.Random(config.seed * 1_000_003 + epoch)
        order = list(range(n_items))
        rng.shuffle(order)
        pool = window * BUCKET_WINDOWS if lengths is not None else n_items
        for start in range(0, n_items, pool):
            chunk = order[start : start + pool]
            if lengths is not None:
                chunk.sort(key=lambda i: lengths[i])
            cut = [chunk[i : i + window] for i in range(0, len(chunk), window)]
            if lengths is not None:
                rng.shuffle(cut)
            windows.extend(cut)
    return windows[: budget.steps]


def micro_batches(window: list[int], items: Sequence[Any], micro_batch: int) -> list[list[int]]:
    """A window's items sorted by length and cut into micro-batches: the same items, less padding."""
    ordered = sorted(window, key=lambda i: len(items[i]))
    return [ordered[i : i + micro_batch] for i in range(0, len(ordered), micro_batch)]


def accumulate_gradients(
    window: list[int],
    items: Sequence[Any],
    micro_batch: int,
    summed_loss: Callable[[list[int]], torch.Tensor],
    window_size: int | None = None,
) -> torch.Tensor:
    """Backpropagate one window in length-grouped micro-batches; the gradient is that of the window's mean
    loss.

    Each micro-batch's summed loss is divided by the window's item count (not the micro-batch's), so splitting
    a window differently gives the same gradient up to float rounding. A rank's share of a window is divided
    by the whole window's `window_size`, so the ranks' summed gradients are the window's. Returns the summed
    loss, on the device.
    """
    total = torch.zeros(())
    for indices in micro_batches(window, items, micro_batch):
        loss = summed_loss(indices)
        (loss / (window_size or len(window))).backward()
        total = total.to(loss.device) + loss.detach()
    return total


def train(
    model: torch.nn.Module,
    examples: Sequence[Any],
    config: TrainConfig,
    device: torch.device,
    task: BatchTask,
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
    evaluate: Callable[[int], None] | None = None,
    stopper: EarlyStopping | None = None,
) -> TrainResult:
    """Train `model` in place on a family's `examples`, batched and scored by the family's `task`.

    The model must already be prepared (the family's `prepare`). `hooks.report` gets a progress line (step,
    loss, s/step, ETA) at least every 10 steps or 30 s, `hooks.on_log` every logging step. `evaluate(step)` is
    called after the steps of `eval_steps` (a third and two thirds of the way), e.g. to score held-out
    decisions; it must not train. With `controls.checkpoints`, the training state is saved as they say and a
    run whose checkpoint matches this one's config and data resumes from it ("resumed from step N"), on the
    same data order and schedule. With `controls.ranks` (data-parallel), this process trains on its share of
    every window and the gradients are all-reduced before each optimizer step; every rank resumes from the
    checkpoint, only rank 0 writes one. `controls.cancel` stops it at the next step. With a `stopper`, the
    validation loss is checked at its steps, training stops once it has not fallen for `train.early_stopping`
    checks, and the model ends with the best check's weights.
    """
    ranks, checkpoints = controls.ranks or Ranks(), controls.checkpoints
    if not examples:
        raise ValueError("no training examples: every decision was skipped (see the validation report)")
    windows = plan_windows(len(examples), config, [len(e) for e in examples])
    hooks.say(f"training budget: {plan_budget(len(examples), config).reason}")
    dtype = resolve_precision(config.precision, device)
    compile_config = controls.compile or CompileConfig()
    enabled, reason = decide_compile(device, len(windows) * config.grad_accum, compile_config)
    optimizer, scheduler = build_optimizer(model, config, len(windows), task.backbone)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    trainable = trainable_parameters(model)  # named before a compile wrapper can rename them
    torch.manual_seed(config.seed)
    model.to(device).train()
    ranks.broadcast(params)

    def on_device(items: list[Any], padded: bool) -> dict[str, torch.Tensor]:
        batch = task.collate(items)
        batch = pad_to_bucket(batch, task.pad_id, compile_config) if padded else batch
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def batch_of(indices: list[int], padded: bool) -> dict[str, torch.Tensor]:
        return on_device([examples[i] for i in indices], padded)

    def validation_batch(chunk: list[Any]) -> dict[str, torch.Tensor]:
        # Padded to the compile buckets as training is, so a compiled encoder meets no new shape.
        return on_device(chunk, compiled.enabled)

    def logged(entry: dict[str, float]) -> None:
        result.logged_steps.append(entry)
        hooks.logged(entry)

    warmup = (
        pick_warmup_batches(_run_batches(windows, examples, config, task), compile_config) if enabled else []
    )
    result = TrainResult(
        0, len(windows), 0, False, 0.0, precision=precision_name(dtype), world_size=ranks.world
    )
    log = StepLog(len(windows), config, logged, controls.progress, hooks.report)
    expected = fingerprint(config, len(examples), len(windows))
    saved = checkpoints.load(expected) if checkpoints is not None else None
    running, seen_since_log = torch.zeros((), device=device), 0
    if saved is not None:
        running, seen_since_log = resume(saved, trainable, optimizer, scheduler, result, device)
        if stopper is not None:
            stopper.load_state(saved.tallies.get("early_stopping"))
        log.resume(result.steps)
        hooks.say(f"resumed from step {result.steps} of {len(windows)} ({checkpoints.path})")
    earlier_seconds = result.train_seconds
    started = time.perf_counter()
    loss_fn = lambda _model, batch: task.summed_loss(model, batch, dtype)  # noqa: E731
    with (
        flushed_denormals(),
        no_cudnn_sdpa(),
        compiled_encoder(
            model, compile_config, enabled, reason, warmup, loss_fn, task.pad_id, backbone=task.layers(model)
        ) as compiled,
    ):
        for window in windows[result.steps :]:
            if controls.cancelled:
                result.cancelled = True
                break
            if controls.threads is not None:
                controls.threads.follow()
            step_started = time.perf_counter()
            window_loss = accumulate_gradients(
                ranks.shard(window),
                examples,
                config.micro_batch,
                lambda indices: loss_fn(model, batch_of(indices, compiled.enabled)),
                len(window),
            )
            running += ranks.reduce(params, window_loss.to(device))
            seen_since_log += len(window)
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps += 1
            result.decisions += sum(task.decisions(examples[i]) for i in window)
            result.step_seconds.append(time.perf_counter() - step_started)
            if evaluate is not None and result.steps in eval_steps(len(windows)):
                evaluate(result.steps)
                model.train()
            if stopper is not None and stopper.stops(
                result.steps, len(windows), model, trainable, validation_batch, dtype
            ):
                hooks.say(stopper.stopped(result.steps, len(windows)))
                break
            if log.due(result.steps):
                mean_loss = running.item() / seen_since_log  # the one host sync of a logging step
                running.zero_()
                seen_since_log = 0
                result.losses.append((result.steps, mean_loss))
                log.write(result, mean_loss, scheduler.get_last_lr()[0], time.perf_counter() - started)
            else:
                log.tick(result, time.perf_counter() - started)
            if checkpoints is not None and ranks.is_main and checkpoints.due(result.steps, len(windows)):
                result.train_seconds = earlier_seconds + time.perf_counter() - started
                checkpoints.save(
                    train_state(
                        expected, trainable, optimizer, scheduler, result, running, seen_since_log, stopper
                    )
                )
        log.close()
    if stopper is not None:
        restored = stopper.restore_best(trainable, result.steps)
        result.early_stopping = stopper.summary(result.steps) | {"restored_best": restored}
    result.compile = asdict(compiled)
    result.train_seconds = earlier_seconds + time.perf_counter() - started
    result.allreduce_seconds = ranks.reduce_seconds
    model.eval()
    return result


TALLIES = ("steps", "decisions", "losses", "step_seconds", "logged_steps", "train_seconds")
"""The parts of a `TrainResult` a checkpoint carries, so a resumed run reports the whole run."""


def train_state(
    expected: str,
    trainable: dict[str, torch.nn.Parameter],
    optimizer,
    scheduler,
    result: TrainResult,
    running: torch.Tensor,
    seen_since_log: int,
    stopper: EarlyStopping | None = None,
) -> TrainState:
    """The loop's state after `result.steps` steps (the loss summed since the last logging step and the early
    stopper's checks included), under the run's `expected` fingerprint (`checkpoint.fingerprint`)."""
    tallies = {name: getattr(result, name) for name in TALLIES}
    if stopper is not None:
        tallies["early_stopping"] = stopper.to_state()
    return TrainState(
        step=result.steps,
        fingerprint=expected,
        parameters={name: p.detach().to("cpu", copy=True) for name, p in trainable.items()},
        optimizer=optimizer.state_dict(),
        scheduler=scheduler.state_dict(),
        rng=rng_states(),
        tallies=tallies | {"running": running.item(), "seen_since_log": seen_since_log},
    )


def resume(
    state: TrainState,
    trainable: dict[str, torch.nn.Parameter],
    optimizer,
    scheduler,
    result: TrainResult,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """Put a saved state back into the model, optimizer, schedule, RNGs and `result`; the running loss sum and
    item count since the last logging step."""
    load_parameters(trainable, state.parameters)
    optimizer.load_state_dict(state.optimizer)  # moves the moments to the parameters' device
    scheduler.load_state_dict(state.scheduler)
    restore_rng(state.rng)
    for name in TALLIES:
        setattr(result, name, state.tallies[name])
    result.resumed_from_step = state.step
    return torch.tensor(state.tallies["running"], device=device), state.tallies["seen_since_log"]


@contextmanager
def flushed_denormals() -> Iterator[None]:
    """Subnormal floats flushed to zero while training, and not after.

    A confident model's gradients fall into subnormals, which x86 CPUs compute ~100x slower. The flag is the
    processor's, for the whole process, so it is cleared on the way out (torch cannot read it back; off is the
    process default and nothing else here sets it): left on, it broke float handling elsewhere in the process.
    """
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def eval_steps(total: int) -> set[int]:
    """The steps after which a run looks at its held-out figures: a third and two thirds of the way."""
    return {step for step in (round(total / 3), round(2 * total / 3)) if 0 < step < total}


def _run_batches(windows: list[list[int]], examples: Sequence[Any], config: TrainConfig, task: BatchTask):
    """Every micro-batch of the run, collated on the CPU, in order (for choosing the warm-up batches)."""
    for window in windows:
        for indices in micro_batches(window, examples, config.micro_batch):
            yield task.collate([examples[i] for i in indices])
