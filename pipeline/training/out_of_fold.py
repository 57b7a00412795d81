"""Out-of-fold answers of the training rows: what the calibrator and the certificates are fitted on where the
validation split is small.

A validation split of a few hundred decisions (every data set of a few thousand rows) fits a calibrator loosely and
certifies almost nothing. Where the family trains cheaply (a head on a frozen backbone's features, computed once),
the run trains its candidates again on each of `train.out_of_fold_folds` folds of the training rows and answers the
fold it left out: every training decision answered by a model that never saw it, several times the validation
split's decisions. The held-out rows play no part. Rows that would go to one side of a split together share a fold
(`data.split.folds_of_rows`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.config import TrainConfig
from pipeline.data.split import folds_of_rows
from pipeline.scoring.decisions import ScoredDecision
from pipeline.training.candidates import Prepared, train_best
from pipeline.training.controls import RunControls, RunHooks


@dataclass(frozen=True)
class OutOfFold:
    """The training rows' decisions, each answered by the fold model that did not train on it."""

    decisions: list[ScoredDecision] = field(default_factory=list)
    """Their records are the training split's row indices."""
    logits: list[np.ndarray] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    """Folds, decisions, seconds; or `skipped`: why the run has none."""


def out_of_fold_plan(
    prepared: Prepared, config: TrainConfig, validation_decisions: int, world: int
) -> str | None:
    """Why this run answers no training row out of fold (None: it does). Silent reasons (off, a validation split
    big enough) start with `-`; the others are worth a line in the run's log."""
    if config.out_of_fold_below == 0:
        return "- off (train.out_of_fold_below: 0)"
    if validation_decisions >= config.out_of_fold_below:
        return f"- the validation split's {validation_decisions:,} decisions are enough (train.out_of_fold_below)"
    small = f"the validation split has {validation_decisions:,} decisions (below train.out_of_fold_below)"
    if not prepared.family.refits_cheaply(config):
        return (
            f"{small}, but out-of-fold answers retrain the model once per fold, which only train.method head does "
            f"cheaply; the calibrator and the certificates are fitted on the validation split alone"
        )
    if world > 1:
        return f"{small}, but a data-parallel run (train.nproc > 1) answers no training row out of fold"
    rows = len(prepared.data.split.train)
    if rows < 2 * config.out_of_fold_folds:
        return f"{small}, but {rows} training rows are too few for {config.out_of_fold_folds} folds"
    return None


def answer_out_of_fold(
    prepared: Prepared,
    config: TrainConfig,
    hooks: RunHooks,
    controls: RunControls,
    features: dict[str, list[Any]],
) -> OutOfFold:
    """Train the family's candidates on all folds of the training rows but one and answer that one, for each
    fold; `prepared.loaded` is left as it was (its weights restored), and `features` keeps the training rows'
    features (a frozen backbone's) for the run's own training. A cancelled run stops here with no answers."""
    family, k = prepared.family, config.out_of_fold_folds
    started = time.perf_counter()
    with_features = family.training_examples(
        prepared.loaded, prepared.train_examples, config, prepared.device, hooks.report
    )
    features.setdefault("train", with_features)
    fold_of_row = folds_of_rows(prepared.data.split.train, k)
    folds = [fold_of_row[row] for row in family.example_rows(prepared.train_examples)]
    kept = {name: value.detach().clone() for name, value in prepared.loaded.model.state_dict().items()}
    quiet = replace(controls, checkpoints=None, prune=None, progress=False)
    decisions: list[ScoredDecision] = []
    logits: list[np.ndarray] = []
    try:
        for fold in range(k):
            # Every fold from the weights the run started with: a head trained on the folds before would have
            # seen this fold's rows (`DecisionFamily.prepare` makes the trainable parameters, it need not reset
            # them).
            prepared.loaded.model.load_state_dict(kept)
            inside = [i for i, f in enumerate(folds) if f != fold]
            # From the features the head trains on (half precision, where the served model reads full): a second,
            # full-precision copy of every training row's features would double the run's memory.
            left_out = [with_features[i] for i, f in enumerate(folds) if f == fold]
            # The fold's training lines (a line every 10 steps or 30 s), named by fold: minutes go by per fold.
            heard = RunHooks(report=lambda line, fold=fold: hooks.say(f"fold {fold + 1}/{k}: {line}"))
            answered = _fold_answers(prepared, config, quiet, heard, inside, with_features, left_out)
            if answered is None:
                return OutOfFold(summary={"skipped": "the run was cancelled"})
            decisions += answered[0]
            logits += answered[1]
            hooks.say(
                f"out of fold {fold + 1}/{k}: trained on {len(inside):,} training examples, answered "
                f"{len(answered[0]):,} decisions of the other {len(left_out):,} "
                f"({time.perf_counter() - started:.0f} s so far)"
            )
    finally:
        prepared.loaded.model.load_state_dict(kept)
    seconds = round(time.perf_counter() - started, 1)
    return OutOfFold(decisions, logits, {"folds": k, "decisions": len(decisions), "seconds": seconds})


def _fold_answers(
    prepared: Prepared,
    config: TrainConfig,
    controls: RunControls,
    hooks: RunHooks,
    inside: list[int],
    with_features: list[Any],
    left_out: list[Any],
) -> tuple[list[ScoredDecision], list[np.ndarray]] | None:
    """One fold: the candidates trained on the examples at `inside`, their answers to `left_out`; None when
    cancelled."""
    fold = replace(prepared, train_examples=[prepared.train_examples[i] for i in inside])
    result, config, _ = train_best(
        fold, config, hooks, controls, None, {"train": [with_features[i] for i in inside]}
    )
    if result.cancelled:
        return None
    return fold.family.score(fold.loaded, left_out, fold.device, config.eval_batch_size)
