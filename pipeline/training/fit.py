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
from pipeline.training.loop import CancelToken, plan_budget, train


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


def fit_on_data(data: str | Path, base: str | Path, config: TrainConfig,
                split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                device: str = "auto", cancel: CancelToken | None = None, progress: bool = True,
                eval_data: str | Path | None = None, on_log=None,
                report: Callable[[str], None] | None = None,
                on_eval: Callable[[int, dict[str, float]], None] | None = None,
                checkpoints: Checkpointer | None = None) -> Trained:  # fmt: skip
    """Verify pins, validate, split, score the base, train, score again; nothing is written.

    The held-out decisions are split off `data` by content hash, or are all of `eval_data` when it is given.
    `report` gets a line at each long step (scoring, every 10 training steps or 30 s). `on_eval(step, metrics)`
    gets the held-out figures of the base (step 0), at a third and two thirds of the way, and of the fine-tune;
    they are only looked at: nothing in training reads them. `checkpoints` saves the training state as it goes
    and resumes a run from it (`training.checkpoint`).
    """
    say = report or (lambda line: None)
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
    say(f"{family.name} family on {dev}: {len(train_examples):,} training and {len(heldout_examples):,} held-out "
        f"examples; scoring the base")  # fmt: skip
    decisions, base_logits = _timed_score(
        family, loaded, heldout_examples, dev, config, progress, say, "base"
    )
    evaluated = on_eval or (lambda step, metrics: None)
    evaluated(0, _metrics(decisions, base_logits))
    family.prepare(loaded, config)
    task = family.batch_task(loaded, config)
    ready = family.training_examples(loaded, train_examples, config, dev, say)

    def evaluate(step: int) -> None:
        _, logits = _timed_score(family, loaded, heldout_examples, dev, config, False, say, f"step {step}")
        evaluated(step, _metrics(decisions, logits))

    result = train(loaded.model, ready, config, dev, task, cancel, on_log, progress=progress, report=report,
                   evaluate=evaluate if on_eval else None, checkpoints=checkpoints)  # fmt: skip
    del ready  # a frozen backbone's cached features: not needed once the head is trained
    _, tuned_logits = _timed_score(family, loaded, heldout_examples, dev, config, progress, say, "fine-tune")
    evaluated(result.steps, _metrics(decisions, tuned_logits))
    run = TrainRun(
        rows=validated.report.rows, decisions=validated.report.decisions,
        skipped=dict(Counter(validated.report.skipped) + Counter(skipped_train) + Counter(skipped_heldout)),
        train_decisions=sum(task.decisions(e) for e in train_examples),
        heldout={"decisions": len(decisions), "base": _metrics(decisions, base_logits),
                 "tuned": _metrics(decisions, tuned_logits)},
        steps=result.steps, planned_steps=result.planned_steps, cancelled=result.cancelled,
        train_seconds=result.train_seconds, s_per_step=result.s_per_step,
        decisions_per_second=result.decisions_per_second, saved_to=None, compile=result.compile,
        precision=result.precision, pins=pins, inputs=inputs, losses=result.losses, family=family.name,
        method=config.method,
        warnings=learning_warnings(decisions, base_logits, tuned_logits, majority_labels(split.train)),
        budget=plan_budget(len(train_examples), config).reason, logged_steps=result.logged_steps,
        resumed_from_step=result.resumed_from_step,
    )  # fmt: skip
    options = {d.question.id: d.question.options for r in split.heldout for d in r.decisions}
    return Trained(run, family, loaded, decisions, base_logits, tuned_logits, options)


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
