"""The fit chain, family-free, on rows validated and split once: examples, base scores, training, tuned
scores.

data = TrainSource("data/processed/vader.jsonl").validated()
trained = fit(data, "data/snapshots/minilm", TrainConfig(max_steps=40))
trained.run.heldout["tuned"]["accuracy"]
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import TrainConfig
from pipeline.data.split import SplitData
from pipeline.families import explain_training, resolve_training
from pipeline.families.base import DecisionFamily
from pipeline.scoring.baselines import learning_warnings, majority_labels
from pipeline.scoring.decisions import ScoredDecision
from pipeline.training.candidates import (
    Prepared,
    prepare_fit,
    ready_to_score,
    train_best,
    trained_candidates,
    uncalibrated_figures,
)
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.loop import TrainResult, plan_budget
from pipeline.training.out_of_fold import OutOfFold, answer_out_of_fold, out_of_fold_plan
from pipeline.training.ranks import Ranks
from pipeline.training.state_fit import StateFit


@dataclass(frozen=True)
class TrainRun:
    """The outcome of a fit: counts, metrics before and after, timings, where it was saved (a new one, by
    `dataclasses.replace`, for each fact the train stage adds after the fit)."""

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
    """Each input (data, base, eval_data) with its path and whether DVC pins it (`data.pins.check_pins`)."""
    losses: list[tuple[int, float]] = field(default_factory=list)
    family: str = "laya"
    method: str = "lora"
    warnings: list[str] = field(default_factory=list)
    """Questions on which the fine-tune is no better than the base or the class prior
    (`scoring.baselines`)."""
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
    heldout_checkpoints: list[dict[str, float]] = field(default_factory=list)
    """The train stage's held-out figures by step (base at 0, a third and two thirds of the way, the end)."""
    peak_memory_mb: float | None = None
    """The train stage's peak device memory (`device.peak_memory_mb`)."""
    mlflow_run_id: str | None = None
    """The MLflow run the flow's train task opened for it."""
    threads: int | None = None
    """torch's CPU threads in each rank at the end (`cpu.budget.plan_threads`, fewer while other processes
    kept cores busy: `cpu.load`) ..."""
    threads_source: str = ""
    """... and where that number came from (`train.threads`, the affinity mask, a cgroup quota, others' load)."""
    states: StateFit | None = None
    """How the train and held-out rows' states fit the model's window: rows cut, tokens dropped."""
    validation_decisions: int = 0
    """Decisions of the validation split (carved from the training rows, not trained on; `data.split`)."""
    early_stopping: dict[str, Any] = field(default_factory=dict)
    """With `train.early_stopping`: the validation checks, the best step and where training ended
    (`TrainResult.early_stopping`)."""
    choice: dict[str, Any] = field(default_factory=dict)
    """Where the family trained several candidates (`DecisionFamily.candidates`, e.g. `train.lexicon: auto`):
    each one's validation accuracy and loss, steps and seconds, and the one kept."""
    score_ms_per_decision: float = 0.0
    """Milliseconds per held-out decision when the fine-tune scored them (batches of `train.eval_batch_size`,
    on the training device): what a sweep plots as latency."""
    out_of_fold: dict[str, Any] = field(default_factory=dict)
    """The training rows answered out of fold (`training.out_of_fold`): folds, decisions, seconds; or
    `skipped`, why not."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainRun:
        """A run as `to_dict` wrote it (train.json, a rank's result)."""
        return cls(**(values | {"states": StateFit.from_dict(values.get("states"))}))


@dataclass(frozen=True)
class Trained:
    """A trained model in memory with its family, held-out decisions and their raw logits before and after."""

    run: TrainRun
    family: DecisionFamily
    loaded: Any
    config: TrainConfig
    """The config it trained with, family and method resolved (`families.resolve_training`)."""
    heldout: list[ScoredDecision]
    base_logits: list[np.ndarray]
    tuned_logits: list[np.ndarray]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option names per held-out question id
    validation: list[ScoredDecision] = field(default_factory=list)
    """The validation split's decisions (carved from the training rows, never trained on) ..."""
    validation_logits: list[np.ndarray] = field(default_factory=list)
    """... and the fine-tune's raw logits on them: what the calibrator is fitted on."""
    out_of_fold: OutOfFold = field(default_factory=OutOfFold)
    """The training rows' decisions answered out of fold, where the validation split is small: fitted on
    with the validation split's."""


def fit(
    data: SplitData,
    base: str | Path,
    config: TrainConfig,
    device: str = "auto",
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
) -> Trained:
    """Score the base on the held-out rows, train on the others, score again; nothing is written.

    `hooks.on_eval(step, metrics)` gets the held-out figures of the base (step 0), at a third and two thirds
    of the way, and of the fine-tune; they are only looked at: nothing in training reads them. With
    `controls.ranks` this is rank 0 of a data-parallel run: the other ranks train beside it (`follow_fit`) and
    only this one scores. The run's `pins` and `inputs` are the caller's to record.
    """
    family, config = resolve_training(base, config)
    hooks.say(explain_training(base, family, config))  # said before the base loads, which can take minutes
    prepared = prepare_fit(data, base, config, device, (controls.ranks or Ranks()).world)
    try:
        return _fit_prepared(prepared, config, hooks, controls)
    finally:
        prepared.threads.stop()


def _fit_prepared(prepared: Prepared, config: TrainConfig, hooks: RunHooks, controls: RunControls) -> Trained:
    family, dev, data = prepared.family, prepared.device, prepared.data
    hooks.say(prepared.states.describe())
    hooks.say(
        f"{family.name} family ({config.method}) on {dev}, torch threads "
        f"{prepared.threads.threads} ({prepared.threads.describe()}): "
        f"{len(prepared.train_examples):,} training, {len(prepared.validation_examples):,} validation and "
        f"{len(prepared.heldout_examples):,} held-out examples; scoring the base"
    )
    ready_to_score(prepared, config, hooks)

    def scored(
        what: str, progress: bool, examples: list[Any] = prepared.heldout_scoring, split: str = "held-out"
    ) -> tuple[list[ScoredDecision], list[np.ndarray]]:
        prepared.threads.follow()
        started = time.perf_counter()
        result = family.score(prepared.loaded, examples, dev, config.eval_batch_size, progress)
        hooks.say(
            f"scored {len(result[0]):,} {split} decisions ({what}) in {time.perf_counter() - started:.0f} s"
        )
        return result

    decisions, base_logits = scored("base", controls.progress)
    hooks.evaluated(0, uncalibrated_figures(decisions, base_logits))

    def evaluate(step: int) -> None:
        hooks.evaluated(step, uncalibrated_figures(decisions, scored(f"step {step}", False)[1]))

    features: dict[str, list[Any]] = {}  # the training rows' frozen features: the folds' and the run's
    out_of_fold = _out_of_fold(prepared, config, hooks, controls, features)
    result, config, choice = train_best(
        prepared, config, hooks, controls, evaluate if hooks.on_eval else None, features
    )
    started = time.perf_counter()
    # The trained model itself, backbone and all: its time per decision is the latency a sweep plots.
    _, tuned_logits = scored("fine-tune", controls.progress, prepared.heldout_examples)
    score_ms = 1000 * (time.perf_counter() - started) / max(1, len(decisions))
    hooks.evaluated(result.steps, uncalibrated_figures(decisions, tuned_logits))
    validation = ([], [])
    if prepared.validation_examples and not result.cancelled:
        validation = scored("fine-tune", controls.progress, prepared.validation_scoring, "validation")
    run = replace(
        _train_run(prepared, config, result, decisions, base_logits, tuned_logits, score_ms),
        choice=choice,
        out_of_fold=out_of_fold.summary,
    )
    options = {d.question.id: d.question.options for r in data.split.heldout for d in r.decisions}
    return Trained(
        run=run,
        family=family,
        loaded=prepared.loaded,
        config=config,
        heldout=decisions,
        base_logits=base_logits,
        tuned_logits=tuned_logits,
        options=options,
        validation=validation[0],
        validation_logits=validation[1],
        out_of_fold=out_of_fold,
    )


def _out_of_fold(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    features: dict[str, list[Any]],
) -> OutOfFold:
    """The training rows answered out of fold where the validation split is small and the family refits
    cheaply; else none, and a line says why where a user would want to know."""
    task = prepared.family.batch_task(prepared.loaded, config)
    validation = sum(task.decisions(e) for e in prepared.validation_examples)
    why_not = out_of_fold_plan(prepared, config, validation, (controls.ranks or Ranks()).world)
    if why_not is None:
        hooks.say(
            f"the validation split has {validation:,} decisions (below train.out_of_fold_below): answering "
            f"the training rows out of {config.out_of_fold_folds} folds, to calibrate and certify on"
        )
        return answer_out_of_fold(prepared, config, hooks, controls, features)
    if not why_not.startswith("-"):
        hooks.say(why_not)
    return OutOfFold(summary={"skipped": why_not.removeprefix("- ")})


def follow_fit(
    data: SplitData, base: str | Path, config: TrainConfig, device: str, controls: RunControls
) -> TrainResult:
    """A rank other than 0 of a data-parallel run: the same preparation, then its share of every window (it
    resumes from rank 0's checkpoint as rank 0 does); no scoring, nothing written."""
    _, config = resolve_training(base, config)
    prepared = prepare_fit(data, base, config, device, (controls.ranks or Ranks()).world)
    try:  # every candidate, as rank 0 trains them: only rank 0 scores them and keeps the best
        *_, (_, result) = trained_candidates(prepared, config, RunHooks(), controls, None)
        return result
    finally:
        prepared.threads.stop()


def _train_run(
    prepared: Prepared,
    config: TrainConfig,
    result: TrainResult,
    decisions,
    base_logits,
    tuned_logits,
    score_ms: float,
) -> TrainRun:
    task = prepared.family.batch_task(prepared.loaded, config)
    train_examples = prepared.train_examples
    return TrainRun(
        rows=prepared.data.report.rows,
        decisions=prepared.data.report.decisions,
        skipped=dict(prepared.skipped),
        train_decisions=sum(task.decisions(e) for e in train_examples),
        validation_decisions=sum(task.decisions(e) for e in prepared.validation_examples),
        heldout={
            "decisions": len(decisions),
            "base": uncalibrated_figures(decisions, base_logits),
            "tuned": uncalibrated_figures(decisions, tuned_logits),
        },
        steps=result.steps,
        planned_steps=result.planned_steps,
        cancelled=result.cancelled,
        train_seconds=result.train_seconds,
        s_per_step=result.s_per_step,
        decisions_per_second=result.decisions_per_second,
        saved_to=None,
        compile=result.compile,
        precision=result.precision,
        losses=result.losses,
        family=prepared.family.name,
        method=config.method,
        warnings=learning_warnings(
            decisions, base_logits, tuned_logits, majority_labels(prepared.data.split.train)
        ),
        budget=plan_budget(len(train_examples), config).reason,
        logged_steps=result.logged_steps,
        resumed_from_step=result.resumed_from_step,
        world_size=result.world_size,
        allreduce_seconds=result.allreduce_seconds,
        threads=prepared.threads.threads,
        early_stopping=result.early_stopping,
        score_ms_per_decision=score_ms,
        threads_source=prepared.threads.describe(),
        states=prepared.states,
    )


def training_description(
    config: TrainConfig, base: str | Path, run: TrainRun, source_digest: str
) -> dict[str, Any]:
    """What a saved fine-tune records of its training (any family)."""
    return {
        "family": run.family,
        "method": config.method,
        "steps": run.steps,
        "config": asdict(config),
        "pins": run.pins,
        "base": str(base),
        "source_digest": source_digest,
    }
