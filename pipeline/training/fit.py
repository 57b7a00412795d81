"""The fit chain, family-free: pins, validation, split, examples, base scores, training, tuned scores.

trained = fit_on_data("data/processed/vader.jsonl", "data/snapshots/minilm", TrainConfig(max_steps=40))
trained.run.heldout["tuned"]["accuracy"]
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import ConfigError, TrainConfig, ValidateConfig
from pipeline.data.pins import pin_status, verify_inputs
from pipeline.data.read import RowSlice
from pipeline.data.split import Split, split_holdout
from pipeline.data.validate import validate_file
from pipeline.device import pick_device
from pipeline.families import pick_family
from pipeline.families.base import DecisionFamily
from pipeline.scoring.baselines import learning_warnings, majority_labels
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import heldout_metrics
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.loop import CancelToken, TrainResult, plan_budget, train
from pipeline.training.ranks import Ranks


@dataclass
class TrainRun:
    """The outcome of a fit: counts, metrics before and after, timings, where it was saved."""

    rows: int
    decisions: int
    skipped: dict[str, int]
    train_decisions: int
    heldout: dict[str, Any]
    steps: int
    planned_steps: int
    cancelled: bool
    train_seconds: float
    s_per_step: float
    decisions_per_second: float
    saved_to: str | None
    compile: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    pins: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each input (data, base, eval_data) with its path and whether DVC pins it (`data.pins.pin_status`)."""
    losses: list[tuple[int, float]] = field(default_factory=list)
    family: str = "laya"
    method: str = "lora"
    warnings: list[str] = field(default_factory=list)
    """Questions on which the fine-tune is no better than the base or the class prior (`scoring.baselines`)."""
    budget: str = ""
    """How many steps the run planned and why (`training.loop.plan_budget`)."""
    logged_steps: list[dict[str, float]] = field(default_factory=list)
    """Every logging step (step, loss, lr, s/step), a resumed run's from before the kill included."""
    resumed_from_step: int = 0
    """The training checkpoint's step this run resumed from (0: trained from the start)."""
    world_size: int = 1
    """Data-parallel ranks that trained it (`train.nproc`)."""
    allreduce_seconds: float = 0.0
    """Of `train_seconds`, rank 0's time in the gradient all-reduce (0 on one rank)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trained:
    """A trained model in memory with its family, held-out decisions and their raw logits before and after."""

    run: TrainRun
    family: DecisionFamily
    loaded: Any
    heldout: list[ScoredDecision]
    base_logits: list[np.ndarray]
    tuned_logits: list[np.ndarray]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option names per held-out question id


@dataclass
class Prepared:
    """What every rank builds before training: the checked inputs, the split and the family's examples."""

    family: DecisionFamily
    loaded: Any
    device: Any
    validated: Any
    split: Split
    train_examples: list[Any]
    heldout_examples: list[Any]
    skipped: Counter
    pins: dict[str, str]
    inputs: dict[str, dict[str, Any]]


def prepare_fit(data: str | Path, base: str | Path, config: TrainConfig, split_config: ValidateConfig,
                row_slice: RowSlice, device: str, eval_data: str | Path | None) -> Prepared:  # fmt: skip
    """Verify pins, pick the family, validate, split, load the base and build its examples."""
    named = {"data": data, "base": base} | ({"eval_data": eval_data} if eval_data else {})
    pins, inputs = verify_inputs(list(named.values())), pin_status(named)
    family = pick_family(base, config.family)
    if config.method not in family.methods:
        raise ConfigError(f"train.method={config.method}: the {family.name} family trains with "
                          f"{' or '.join(family.methods)}")  # fmt: skip
    validated = validate_file(data, row_slice)
    split = Split(validated.records, validate_file(eval_data).records) if eval_data else split_holdout(
        validated.records, split_config)  # fmt: skip
    dev = pick_device(device)
    loaded = family.load(base, config, dev)
    train_examples, skipped_train = family.build_examples(loaded, split.train)
    heldout_examples, skipped_heldout = family.build_examples(loaded, split.heldout)
    skipped = Counter(validated.report.skipped) + Counter(skipped_train) + Counter(skipped_heldout)
    return Prepared(
        family, loaded, dev, validated, split, train_examples, heldout_examples, skipped, pins, inputs
    )


def fit_on_data(data: str | Path, base: str | Path, config: TrainConfig,
                split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                device: str = "auto", cancel: CancelToken | None = None, progress: bool = True,
                eval_data: str | Path | None = None, on_log=None,
                report: Callable[[str], None] | None = None,
                on_eval: Callable[[int, dict[str, float]], None] | None = None,
                checkpoints: Checkpointer | None = None, ranks: Ranks | None = None) -> Trained:  # fmt: skip
    """Verify pins, validate, split, score the base, train, score again; nothing is written.

    The held-out decisions are split off `data` by content hash, or are all of `eval_data` when it is given.
    `report` gets a line at each long step (scoring, every 10 training steps or 30 s). `on_eval(step, metrics)`
    gets the held-out figures of the base (step 0), at a third and two thirds of the way, and of the fine-tune;
    they are only looked at: nothing in training reads them. `checkpoints` saves the training state as it goes
    and resumes a run from it (`training.checkpoint`). With `ranks` this is rank 0 of a data-parallel run: the
    other ranks train beside it (`follow_fit`) and only this one scores.
    """
    say = report or (lambda line: None)
    prepared = prepare_fit(data, base, config, split_config, row_slice, device, eval_data)
    family, loaded, dev = prepared.family, prepared.loaded, prepared.device
    say(f"{family.name} family on {dev}: {len(prepared.train_examples):,} training and "
        f"{len(prepared.heldout_examples):,} held-out examples; scoring the base")  # fmt: skip
    decisions, base_logits = _timed_score(
        family, loaded, prepared.heldout_examples, dev, config, progress, say, "base"
    )
    evaluated = on_eval or (lambda step, metrics: None)
    evaluated(0, _metrics(decisions, base_logits))

    def evaluate(step: int) -> None:
        _, logits = _timed_score(
            family, loaded, prepared.heldout_examples, dev, config, False, say, f"step {step}"
        )
        evaluated(step, _metrics(decisions, logits))

    result = _train_prepared(prepared, config, cancel, on_log, progress, report,
                             evaluate if on_eval else None, checkpoints, ranks)  # fmt: skip
    _, tuned_logits = _timed_score(
        family, loaded, prepared.heldout_examples, dev, config, progress, say, "fine-tune"
    )
    evaluated(result.steps, _metrics(decisions, tuned_logits))
    run = _train_run(prepared, config, result, decisions, base_logits, tuned_logits)
    options = {d.question.id: d.question.options for r in prepared.split.heldout for d in r.decisions}
    return Trained(run, family, loaded, decisions, base_logits, tuned_logits, options)


def follow_fit(data: str | Path, base: str | Path, config: TrainConfig, split_config: ValidateConfig,
               row_slice: RowSlice, device: str, eval_data: str | Path | None, ranks: Ranks,
               checkpoints: Checkpointer | None = None) -> TrainResult:  # fmt: skip
    """A rank other than 0 of a data-parallel run: the same preparation, then its share of every window (it
    resumes from rank 0's checkpoint as rank 0 does); no scoring, nothing written."""
    prepared = prepare_fit(data, base, config, split_config, row_slice, device, eval_data)
    return _train_prepared(prepared, config, None, None, False, None, None, checkpoints, ranks)


def _train_prepared(prepared: Prepared, config: TrainConfig, cancel, on_log, progress: bool, report, evaluate,
                    checkpoints: Checkpointer | None, ranks: Ranks | None) -> TrainResult:  # fmt: skip
    family, loaded = prepared.family, prepared.loaded
    # Fresh adapters draw their initial values: seeded, so the seed reproduces a run in any process, and a
    # data-parallel rank 0 starts where one process would (it broadcasts its values to the other ranks).
    torch.manual_seed(config.seed)
    family.prepare(loaded, config)
    task = family.batch_task(loaded, config)
    say = report or (lambda line: None)
    ready = family.training_examples(loaded, prepared.train_examples, config, prepared.device, say)
    # `ready` may hold a frozen backbone's cached features: dropped on return, once the head is trained.
    return train(loaded.model, ready, config, prepared.device, task, cancel, on_log, progress=progress,
                 report=report, evaluate=evaluate, checkpoints=checkpoints, ranks=ranks)  # fmt: skip


def _train_run(prepared: Prepared, config: TrainConfig, result: TrainResult, decisions, base_logits,
               tuned_logits) -> TrainRun:  # fmt: skip
    task = prepared.family.batch_task(prepared.loaded, config)
    train_examples = prepared.train_examples
    return TrainRun(
        rows=prepared.validated.report.rows, decisions=prepared.validated.report.decisions,
        skipped=dict(prepared.skipped),
        train_decisions=sum(task.decisions(e) for e in train_examples),
        heldout={"decisions": len(decisions), "base": _metrics(decisions, base_logits),
                 "tuned": _metrics(decisions, tuned_logits)},
        steps=result.steps, planned_steps=result.planned_steps, cancelled=result.cancelled,
        train_seconds=result.train_seconds, s_per_step=result.s_per_step,
        decisions_per_second=result.decisions_per_second, saved_to=None, compile=result.compile,
        precision=result.precision, pins=prepared.pins, inputs=prepared.inputs, losses=result.losses,
        family=prepared.family.name, method=config.method,
        warnings=learning_warnings(decisions, base_logits, tuned_logits, majority_labels(prepared.split.train)),
        budget=plan_budget(len(train_examples), config).reason, logged_steps=result.logged_steps,
        resumed_from_step=result.resumed_from_step, world_size=result.world_size,
        allreduce_seconds=result.allreduce_seconds,
    )  # fmt: skip


def _timed_score(family: DecisionFamily, loaded, examples, device, config: TrainConfig, progress: bool,
                 say: Callable[[str], None], what: str):  # fmt: skip
    started = time.perf_counter()
    decisions, logits = family.score(loaded, examples, device, config.eval_batch_size, progress)
    say(f"scored {len(decisions):,} held-out decisions ({what}) in {time.perf_counter() - started:.0f} s")
    return decisions, logits


def _metrics(decisions: list[ScoredDecision], logits: list[np.ndarray]) -> dict[str, float]:
    return heldout_metrics(decisions, plain_probabilities(logits))


def training_description(
    config: TrainConfig, base: str | Path, run: TrainRun, source_digest: str
) -> dict[str, Any]:
    """What a saved fine-tune records of its training (any family)."""
    return {"family": run.family, "method": config.method, "steps": run.steps, "config": asdict(config),
            "pins": run.pins, "base": str(base), "source_digest": source_digest}  # fmt: skip
