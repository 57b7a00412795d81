"""The fit chain, family-free, on rows validated and split once: examples, base scores, training, tuned
scores.

data = TrainSource("data/processed/vader.jsonl").validated()
trained = fit(data, "data/snapshots/minilm", TrainConfig(max_steps=40))
trained.run.heldout["tuned"]["accuracy"]
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import ConfigError, TrainConfig
from pipeline.cpu.budget import apply_threads, plan_threads
from pipeline.cpu.load import ThreadGovernor
from pipeline.data.split import SplitData
from pipeline.device import pick_device
from pipeline.families import MODEL_BUILDS, explain_training, loading, pick_family, resolve_training
from pipeline.families.base import BadBase, Candidate, DecisionFamily
from pipeline.scoring.baselines import learning_warnings, majority_labels
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import heldout_metrics
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.early_stop import EarlyStopping
from pipeline.training.loop import TrainResult, plan_budget, train
from pipeline.training.ranks import Ranks
from pipeline.training.state_fit import StateFit, fit_of_states


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


@dataclass
class Prepared:
    """What every rank builds before training: the family, its loaded base and examples of the split."""

    family: DecisionFamily
    loaded: Any
    device: Any
    data: SplitData
    train_examples: list[Any]
    heldout_examples: list[Any]
    validation_examples: list[Any]
    skipped: Counter
    threads: ThreadGovernor
    """Started here; whoever prepared it stops it."""
    states: StateFit
    """How the examples' states fit the model's window."""
    heldout_scoring: list[Any] | None = None
    """The held-out examples as a fit scores them again and again (`DecisionFamily.scoring_examples`: a frozen
    backbone's features computed once); None until `ready_to_score`."""
    validation_scoring: list[Any] | None = None
    """The validation examples likewise."""


def ready_to_score(prepared: Prepared, config: TrainConfig, hooks: RunHooks) -> None:
    """Set `prepared`'s scoring examples: the held-out and validation rows are scored for the base, every
    candidate and the fine-tune, and a family may make that the head's work alone (`scoring_examples`)."""
    started = time.perf_counter()
    family, loaded, device = prepared.family, prepared.loaded, prepared.device
    prepared.heldout_scoring = family.scoring_examples(loaded, prepared.heldout_examples, config, device)
    prepared.validation_scoring = family.scoring_examples(
        loaded, prepared.validation_examples, config, device
    )
    if (seconds := time.perf_counter() - started) >= 1:
        hooks.say(f"the held-out and validation rows' backbone features computed once in {seconds:.0f} s")


def prepare_fit(
    data: SplitData, base: str | Path, config: TrainConfig, device: str, world: int = 1
) -> Prepared:
    """Size torch's threads (this process's share of `train.threads` among `world` ranks), load the base in
    its family (`config` resolved: family and method filled in) and build its examples."""
    budget = plan_threads(config.threads, "train.threads", share=world, sharing="ranks")
    apply_threads(budget)  # before anything runs: the base's scoring uses them too
    threads = ThreadGovernor(budget).start()
    family = pick_family(base, config.family)
    dev = pick_device(device)
    with MODEL_BUILDS, loading(base, BadBase, "a base"):
        loaded = family.load(base, config, dev)
    train_examples, skipped_train = family.build_examples(loaded, data.split.train)
    heldout_examples, skipped_heldout = family.build_examples(loaded, data.split.heldout)
    validation_examples, skipped_validation = family.build_examples(loaded, data.split.validation)
    skipped = sum(
        (Counter(c) for c in (skipped_train, skipped_heldout, skipped_validation)),
        Counter(data.report.skipped),
    )
    # Each split's cuts apart: a family may key them by record index, which restarts in every split.
    cuts = [
        cut
        for part in (train_examples, heldout_examples, validation_examples)
        for cut in family.state_cuts(part)
    ]
    states = fit_of_states(cuts)
    if config.early_stopping is not None and not validation_examples:
        raise ConfigError(
            "train.early_stopping needs a validation split, and this run has none: its training rows "
            "gave fewer than validate.validation_min_decisions, or validate.validation_fraction is 0"
        )
    return Prepared(
        family=family,
        loaded=loaded,
        device=dev,
        data=data,
        train_examples=train_examples,
        heldout_examples=heldout_examples,
        validation_examples=validation_examples,
        skipped=skipped,
        threads=threads,
        states=states,
    )


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
    hooks.evaluated(0, _metrics(decisions, base_logits))

    def evaluate(step: int) -> None:
        hooks.evaluated(step, _metrics(decisions, scored(f"step {step}", False)[1]))

    result, config, choice = _train_best(
        prepared, config, hooks, controls, evaluate if hooks.on_eval else None
    )
    started = time.perf_counter()
    # The trained model itself, backbone and all: its time per decision is the latency a sweep plots.
    _, tuned_logits = scored("fine-tune", controls.progress, prepared.heldout_examples)
    score_ms = 1000 * (time.perf_counter() - started) / max(1, len(decisions))
    hooks.evaluated(result.steps, _metrics(decisions, tuned_logits))
    validation = ([], [])
    if prepared.validation_examples and not result.cancelled:
        validation = scored("fine-tune", controls.progress, prepared.validation_scoring, "validation")
    run = replace(
        _train_run(prepared, config, result, decisions, base_logits, tuned_logits, score_ms), choice=choice
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
    )


def follow_fit(
    data: SplitData, base: str | Path, config: TrainConfig, device: str, controls: RunControls
) -> TrainResult:
    """A rank other than 0 of a data-parallel run: the same preparation, then its share of every window (it
    resumes from rank 0's checkpoint as rank 0 does); no scoring, nothing written."""
    _, config = resolve_training(base, config)
    prepared = prepare_fit(data, base, config, device, (controls.ranks or Ranks()).world)
    try:  # every candidate, as rank 0 trains them: only rank 0 scores them and keeps the best
        *_, (_, result) = _trained_candidates(prepared, config, RunHooks(), controls, None)
        return result
    finally:
        prepared.threads.stop()


def _candidates(prepared: Prepared, config: TrainConfig, hooks: RunHooks) -> list[Candidate]:
    """What the family trains for `config`; only the first when there is no validation split to choose on
    (unless they are trained to answer together)."""
    candidates = prepared.family.candidates(prepared.loaded, config)
    names = ", ".join(c.name for c in candidates)
    if len(candidates) > 1 and not prepared.validation_examples and not candidates[0].together:
        hooks.say(
            f"no validation split to choose between {names}: training {candidates[0].name} "
            "(validate.validation_fraction)"
        )
        return candidates[:1]
    if len(candidates) > 1 and candidates[0].together:
        hooks.say(f"training {len(candidates)} heads on the same features, to answer together: {names}")
    elif len(candidates) > 1:
        hooks.say(
            f"training {len(candidates)} candidates on the same features, keeping the one with the lowest "
            f"loss on the validation split: {names}"
        )
    return candidates


def _trained_candidates(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    evaluate: Callable[[int], None] | None,
) -> Iterator[tuple[Candidate, TrainResult]]:
    """The family's candidates for `config`, each trained in turn in `prepared.loaded` on the same examples (a
    frozen backbone's features computed once); a cancelled one ends the run. With several, each checkpoints to
    a file of its own (so a resumed run finds each where it stopped), and neither held-out checks (`evaluate`)
    nor a sweep's pruner see their steps, which would interleave."""
    candidates = _candidates(prepared, config, hooks)
    features: dict[str, list[Any]] = {}
    for candidate in candidates:
        prepared.loaded = candidate.loaded
        if len(candidates) == 1:
            result = _train_prepared(prepared, candidate.config, hooks, controls, evaluate, features)
        else:
            checkpoints = controls.checkpoints.beside(candidate.name) if controls.checkpoints else None
            own = replace(controls, checkpoints=checkpoints, prune=None)
            result = _train_prepared(prepared, candidate.config, hooks, own, None, features)
        yield candidate, result
        if result.cancelled:
            return


def _train_best(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    evaluate: Callable[[int], None] | None,
) -> tuple[TrainResult, TrainConfig, dict[str, Any]]:
    """Train the family's candidates for `config` and keep in `prepared.loaded` their combination where they
    were trained together, else the one with the lowest loss on the validation split (then the higher
    accuracy), their combination among them: its result (seconds: all of them), its config and what was kept,
    with each one's validation figures."""
    trained = list(_trained_candidates(prepared, config, hooks, controls, evaluate))
    last, result = trained[-1]
    if len(trained) == 1 or result.cancelled:
        return result, last.config, {}
    combined = prepared.family.combined([candidate for candidate, _ in trained])
    if combined is not None:  # trained as its members were: their steps, no seconds of its own
        steps = sum(r.steps for _, r in trained)
        trained.append((combined, replace(result, steps=steps, train_seconds=0.0)))
        hooks.say(f"candidate {combined.name}: the {len(trained) - 1} trained together, no more training")
    trials = [(c, r, _validation_figures(prepared, c, r, config, hooks)) for c, r in trained]
    if combined is not None and combined.together:
        (kept, result, _), by = trials[-1], "trained together"
    else:
        # The loss, as sweeps rank trials (`validation_nll`): on 200-1,000 decisions accuracy moves with a few
        # answers; on sotu, long-sotu, VADER and records-chile the lowest loss was the best held out
        # (docs/results.md).
        kept, result, _ = min(trials, key=lambda t: (t[2]["loss"], -t[2]["accuracy"]))
        by = "validation loss, then accuracy"
    prepared.loaded = kept.loaded
    hooks.say(f"kept {kept.name}")
    choice = {
        "kept": kept.name,
        "by": by,
        "candidates": {
            c.name: {**m, "steps": r.steps, "train_seconds": r.train_seconds} for c, r, m in trials
        },
    }
    return replace(result, train_seconds=sum(r.train_seconds for _, r, _ in trials)), kept.config, choice


def _validation_figures(
    prepared: Prepared, candidate: Candidate, result: TrainResult, config: TrainConfig, hooks: RunHooks
) -> dict[str, float]:
    """A trained candidate's uncalibrated accuracy and loss on the validation split ({} without one), said."""
    if not prepared.validation_examples:
        return {}
    decisions, logits = prepared.family.score(
        candidate.loaded, prepared.validation_scoring, prepared.device, config.eval_batch_size
    )
    metrics = _metrics(decisions, logits)
    hooks.say(
        f"candidate {candidate.name}: validation accuracy {metrics['accuracy']:.4f}, loss "
        f"{metrics['loss']:.4f} ({result.steps} steps in {result.train_seconds:.0f} s)"
    )
    return {"accuracy": metrics["accuracy"], "loss": metrics["loss"]}


def _train_prepared(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    evaluate: Callable[[int], None] | None,
    features: dict[str, list[Any]] | None = None,
) -> TrainResult:
    """Train `prepared.loaded` from its fresh state. `features` keeps the examples as the loop reads them (a
    frozen backbone's features) for the next candidate on the same backbone."""
    family, loaded = prepared.family, prepared.loaded
    # Fresh adapters draw their initial values: seeded, so the seed reproduces a run in any process, and a
    # data-parallel rank 0 starts where one process would (it broadcasts its values to the other ranks).
    with MODEL_BUILDS:  # seeded and built together: another thread's model build draws neither
        torch.manual_seed(config.seed)
        family.prepare(loaded, config)
    family.learn_from_rows(loaded, prepared.train_examples)
    task = family.batch_task(loaded, config)
    features = {} if features is None else features

    def ready_examples(split: str, examples: list[Any]) -> list[Any]:
        if split not in features:
            features[split] = family.training_examples(
                loaded, examples, config, prepared.device, hooks.report
            )
        return features[split]

    # `ready` may hold a frozen backbone's cached features: dropped once the head (the last candidate) is
    # trained.
    ready = ready_examples("train", prepared.train_examples)
    controls = replace(controls, threads=prepared.threads)
    stopper = None
    if config.early_stopping is not None or controls.prune is not None:
        checked = ready_examples("validation", prepared.validation_examples)
        stopper = EarlyStopping(checked, config, task, hooks.report, controls.prune)
    return train(loaded.model, ready, config, prepared.device, task, hooks, controls, evaluate, stopper)


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
            "base": _metrics(decisions, base_logits),
            "tuned": _metrics(decisions, tuned_logits),
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


def _metrics(decisions: list[ScoredDecision], logits: list[np.ndarray]) -> dict[str, float]:
    return heldout_metrics(decisions, plain_probabilities(logits))


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
