"""A sweep's Optuna study: TPE sampling, a median pruner on the validation curve, and storage that outlives
the process, so a killed sweep resumes where it stopped.

The study lives in SQLite in the sweep's folder (`runs/sweeps/<key>/optuna.db`) unless a storage URL is given
(PostgreSQL, say, for a sweep several machines share). One process drives a sweep at a time
(`RunFolder.driven("sweep")`); a
trial it left running when it was killed is marked failed and asked again with the same settings, so its run
folder (and training checkpoint) and its MLflow run are picked up where they stopped.

    with RunFolder(folder).driven("sweep"):
        study = open_study(space, key, storage_url(folder))
        requeue_interrupted(study)
        trial = study.ask(space.distributions)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from pipeline.config import ConfigError
from pipeline.masking import error_reason, mask_url
from pipeline.sweep.space import SearchSpace

STUDY_FILE = "optuna.db"
STARTUP_TRIALS = 3
"""Trials before the pruner prunes (and before TPE models the space): their curves are what it compares
with."""
WARMUP_CHECKS = 5
"""Validation checks (of `train.validation_checks`) a trial always gets before it may be pruned."""


def storage_url(folder: str | Path, url: str | None = None) -> str:
    """The study's storage: `url` when given, else SQLite in the sweep's folder."""
    return url or f"sqlite:///{Path(folder).resolve() / STUDY_FILE}"


def check_storage(url: str) -> None:
    """ConfigError, naming the URL (its password hidden), where Optuna cannot keep a study at `url`: no
    database URL, no driver for it, or a server that does not answer. Checked before a sweep opens its MLflow
    run, so a bad `--storage` leaves nothing behind."""
    try:
        optuna.storages.RDBStorage(url).engine.dispose()
    except (SQLAlchemyError, ImportError) as error:
        raise ConfigError(
            f"--storage {mask_url(url)}: Optuna cannot keep a study there ({error_reason(error, url)}); give "
            "a database URL it can reach, e.g. postgresql+psycopg://USER@HOST/DB or sqlite:///PATH"
        ) from error


def open_study(space: SearchSpace, name: str, storage: str) -> optuna.Study:
    """The sweep's study, created or (same name, same storage) loaded as it was left.

    The sampler's seed is the space's plus the trials the study already holds: a resumed sweep draws on from
    there, not the first process's draws again (which would ask settings already tried)."""
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS, n_warmup_steps=WARMUP_CHECKS + 1)
        if space.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the flow says what each trial did
    study = optuna.create_study(
        storage=storage, study_name=name, pruner=pruner, direction=space.direction, load_if_exists=True
    )
    seed = space.seed + len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    return study


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Trials a killed sweep left running: failed, and their settings asked again next (same run folder, same
    MLflow run, training resumed from its checkpoint). The caller holds the sweep's lock (`RunFolder.driven`),
    so none is live."""
    interrupted = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in interrupted:
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number})
    return [trial.number for trial in interrupted]


@dataclass(frozen=True)
class Budget:
    """Trials (counted across resumes) and wall minutes (of this process: a resumed sweep gets them
    afresh)."""

    trials: int | None
    minutes: float | None
    started: float

    def spent_trials(self, study: optuna.Study) -> int:
        """Trials that ended (finished, pruned or failed), less those a kill interrupted: each was asked
        again."""
        ended = study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        )
        requeued = sum(1 for t in study.get_trials(deepcopy=False) if "requeued_from" in t.user_attrs)
        return len(ended) - requeued

    def left(self, study: optuna.Study) -> int:
        """How many more trials may start now (0: the budget is spent)."""
        if self.minutes is not None and time.monotonic() - self.started >= self.minutes * 60:
            return 0
        return max(0, self.trials - self.spent_trials(study)) if self.trials is not None else 1 << 30


def pruning_callback(trial: optuna.Trial) -> Callable[[int, float], bool]:
    """What a training run asks at each validation check (`RunControls.prune`): the check's loss goes to the
    trial, numbered by check (not step, so runs with different budgets compare at the same share of theirs),
    and the answer is whether the pruner stops it."""
    checks = {"n": 0}

    def prune(_step: int, loss: float) -> bool:
        checks["n"] += 1
        trial.report(loss, checks["n"])
        return trial.should_prune()

    return prune


def objective_value(space: SearchSpace, metrics: dict[str, Any]) -> float:
    """The trial's value: its validation figure named by the space's objective (NaN-safe: a diverged run gets
    the worst value, so it is never best)."""
    value = float(metrics[space.objective])
    if math.isfinite(value):
        return value
    return math.inf if space.direction == "minimize" else -math.inf


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best finished trial, or None when none finished (every trial pruned or failed)."""
    return study.best_trial if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) else None
