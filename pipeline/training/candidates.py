"""A fit's preparation and its candidates' training, family-free: the base loaded in its family, the split's
examples built once (a frozen backbone's features computed once where the family allows), and each candidate the
family proposes trained on them, the best (or their combination) kept. `training.fit` runs them once on the
training rows; `training.out_of_fold` once per fold.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import ConfigError, TrainConfig
from pipeline.cpu.budget import apply_threads, plan_threads
from pipeline.cpu.load import ThreadGovernor
from pipeline.data.split import SplitData
from pipeline.device import pick_device
from pipeline.families import MODEL_BUILDS, loading, pick_family
from pipeline.families.base import BadBase, Candidate, DecisionFamily
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import heldout_metrics
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.early_stop import EarlyStopping
from pipeline.training.loop import TrainResult, train
from pipeline.training.state_fit import StateFit, fit_of_states


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


def trained_candidates(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    evaluate: Callable[[int], None] | None,
    features: dict[str, list[Any]] | None = None,
) -> Iterator[tuple[Candidate, TrainResult]]:
    """The family's candidates for `config`, each trained in turn in `prepared.loaded` on the same examples (a
    frozen backbone's features computed once); a cancelled one ends the run. With several, each checkpoints to
    a file of its own (so a resumed run finds each where it stopped), and neither held-out checks (`evaluate`)
    nor a sweep's pruner see their steps, which would interleave. `features` may bring the training rows'
    features computed before (by the out-of-fold folds), and keeps them."""
    candidates = _candidates(prepared, config, hooks)
    features = {} if features is None else features
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


def train_best(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    evaluate: Callable[[int], None] | None,
    features: dict[str, list[Any]] | None = None,
) -> tuple[TrainResult, TrainConfig, dict[str, Any]]:
    """Train the family's candidates for `config` and keep in `prepared.loaded` their combination where they
    were trained together, else the one with the lowest loss on the validation split (then the higher
    accuracy), their combination among them: its result (seconds: all of them), its config and what was kept,
    with each one's validation figures."""
    trained = list(trained_candidates(prepared, config, hooks, controls, evaluate, features))
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
    metrics = uncalibrated_figures(decisions, logits)
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


def uncalibrated_figures(decisions: list[ScoredDecision], logits: list[np.ndarray]) -> dict[str, float]:
    """Accuracy, loss and the rest of `decisions` answered with `logits` at T = 1."""
    return heldout_metrics(decisions, plain_probabilities(logits))
