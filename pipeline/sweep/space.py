"""A sweep's search space, read from a small YAML file (docs/sweeps.md): which `train.*` settings vary, over
what, with what budget, and what the trials are ranked by.

    objective: validation_nll         # or validation_accuracy: the validation split's, calibrated by cross-fitting
    trials: 12                        # the budget: trials, wall minutes, or both (whichever ends first)
    minutes: 30
    parallel: 1                       # trials at once
    fixed: {train.early_stopping: null}
    space:
      train.method: [head, lora]                      # a list: one of these
      train.head_lr: {low: 0.0003, high: 0.003, log: true}
      train.epochs: {low: 2, high: 8}                 # int bounds: an int

Only `train.*` settings vary: every trial trains on the same validated split, so the data sections stay fixed.
Every value is checked by building the train section with it, so a typo or a bad value fails before any trial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from pipeline.config import ConfigError, Params, section_config
from pipeline.yaml_files import YamlFileError, load_yaml_file

OBJECTIVES = {"validation_nll": "minimize", "validation_accuracy": "maximize"}
SWEPT_SECTION = "train"
TOP_KEYS = {"objective", "trials", "minutes", "parallel", "seed", "pruner", "fixed", "space"}
PRUNERS = ("median", "none")


@dataclass(frozen=True)
class SearchSpace:
    """The parsed space file: Optuna distributions by `train.NAME`, fixed overrides, the budget and the
    objective."""

    distributions: dict[str, optuna.distributions.BaseDistribution]
    fixed: dict[str, Any] = field(default_factory=dict)
    objective: str = "validation_nll"
    trials: int | None = None
    minutes: float | None = None
    parallel: int = 1
    seed: int = 0
    pruner: str = "median"
    text: str = ""
    """The file as written: part of the sweep's key, so an edited space is a new sweep."""

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.objective]

    def overrides(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """A trial's settings by `train.NAME`: the fixed ones, then its sampled values (lists decoded)."""
        return self.fixed | {name: decode(value) for name, value in sampled.items()}

    def baseline(self, params: Params) -> dict[str, Any] | None:
        """params.yaml's own values of the swept settings, as Optuna stores them, when every one lies in the
        space: the sweep's first trial, so every other is compared with what `make run` trains. None when one
        lies out."""
        current = params.sections()[SWEPT_SECTION]
        values = {name: encode(_listed(current[name.split(".", 1)[1]])) for name in self.distributions}
        return values if all(_contains(self.distributions[n], v) for n, v in values.items()) else None

    def with_budget(
        self, trials: int | None = None, minutes: float | None = None, parallel: int | None = None
    ) -> SearchSpace:
        """The command line's budget over the file's (None keeps the file's)."""
        space = replace(
            self,
            trials=self.trials if trials is None else trials,
            minutes=self.minutes if minutes is None else minutes,
            parallel=self.parallel if parallel is None else parallel,
        )  # None keeps the file's; 0 is refused below, never taken for the file's
        _check_budget(space)
        return space


def load_space(path: str | Path, params: Params) -> SearchSpace:
    """Read and check a space file against `params` (every value must make a valid train section)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"search space {path}: a folder; give the space file (e.g. sweeps/vader.yaml)")
    if not path.is_file():
        raise ConfigError(f"search space {path}: no such file")
    try:  # not UTF-8, not YAML, a key given twice: one line naming the file
        raw = load_yaml_file(path) or {}
    except YamlFileError as error:
        raise ConfigError(f"search space {error}") from None
    text = path.read_text()
    if not isinstance(raw, dict):
        raise ConfigError(f"search space {path}: expected a mapping with a `space:` section")
    for key in ("space", "fixed"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ConfigError(
                f"search space {path}: `{key}:` must map train settings to values, as sweeps/vader.yaml does"
            )
    if not isinstance(raw.get("objective", "validation_nll"), str):
        raise ConfigError(f"search space {path}: `objective:` must be a metric's name, e.g. validation_nll")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"search space {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(TOP_KEYS))}"
        )
    if not raw.get("space"):
        raise ConfigError(f"search space {path}: `space:` is empty; name at least one train setting to vary")
    fixed = dict(raw.get("fixed") or {})
    distributions = {name: distribution(name, spec) for name, spec in raw["space"].items()}
    space = SearchSpace(
        distributions=distributions,
        fixed=fixed,
        objective=raw.get("objective", "validation_nll"),
        trials=raw.get("trials"),
        minutes=raw.get("minutes"),
        parallel=raw.get("parallel", 1),
        seed=raw.get("seed", 0),
        pruner=raw.get("pruner", "median"),
        text=text,
    )
    _check(space, params, path)
    return space


def distribution(name: str, spec: Any) -> optuna.distributions.BaseDistribution:
    """One setting's distribution: a list is a choice, `{low, high[, log][, step]}` a range (int when both
    bounds are ints)."""
    _check_name(name)
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"search space {name}: an empty list of choices")
        return optuna.distributions.CategoricalDistribution([encode(value) for value in spec])
    if (
        not isinstance(spec, dict)
        or not {"low", "high"} <= set(spec)
        or set(spec) - {"low", "high", "log", "step"}
    ):
        raise ConfigError(
            f"search space {name}: expected a list of choices or {{low, high[, log][, step]}}, got {spec!r}"
        )
    low, high, log, step = spec["low"], spec["high"], bool(spec.get("log", False)), spec.get("step")
    if step is not None and (not isinstance(step, int | float) or isinstance(step, bool) or step <= 0):
        raise ConfigError(f"search space {name}: step must be a positive number, got {step!r}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)) or low > high:
        raise ConfigError(
            f"search space {name}: low and high must be numbers with low <= high, got {low!r}, {high!r}"
        )
    try:
        if isinstance(low, int) and isinstance(high, int) and not isinstance(step, float):
            return optuna.distributions.IntDistribution(low, high, log=log, step=step or 1)
        return optuna.distributions.FloatDistribution(float(low), float(high), log=log, step=step)
    except ValueError as error:  # Optuna's own checks: log with a step, a log range through 0
        raise ConfigError(f"search space {name}: {error}") from None


def encode(value: Any) -> Any:
    """A choice as Optuna stores it: lists and mappings (a layer plan, target modules) as their JSON text."""
    return json.dumps(value) if isinstance(value, list | dict) else value


def decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def apply(params: Params, overrides: dict[str, Any]) -> Params:
    """`params` with a trial's `train.NAME` values in its train section (checked as params.yaml is)."""
    values = params.sections()[SWEPT_SECTION] | {
        name.split(".", 1)[1]: value for name, value in overrides.items()
    }
    return replace(params, train=section_config(SWEPT_SECTION, values))


def _check_name(name: str) -> None:
    section, _, key = str(name).partition(".")
    if section != SWEPT_SECTION or not key:
        raise ConfigError(
            f"search space {name}: only train.NAME settings vary in a sweep (every trial trains on "
            "the same validated split, so the data sections stay as params.yaml sets them)"
        )


def _check(space: SearchSpace, params: Params, path: Path) -> None:
    if space.objective not in OBJECTIVES:
        raise ConfigError(
            f"search space {path}: objective {space.objective!r}; known: {', '.join(OBJECTIVES)}"
        )
    if space.pruner not in PRUNERS:
        raise ConfigError(f"search space {path}: pruner {space.pruner!r}; known: {', '.join(PRUNERS)}")
    if not isinstance(space.seed, int) or isinstance(space.seed, bool):
        raise ConfigError(f"search space {path}: seed must be an int, got {space.seed!r}")
    _check_budget(space)
    for name in space.fixed:
        _check_name(name)
    try:
        apply(params, space.fixed)
        # Every choice, and each range's ends, must make a valid train section on their own.
        for name, dist in space.distributions.items():
            for value in _extremes(dist):
                apply(params, space.overrides({name: value}))
    except ConfigError as error:  # the setting is the space file's: name it, not params.yaml
        raise ConfigError(f"search space {path}: {error}") from None


def _check_budget(space: SearchSpace) -> None:
    if space.trials is None and space.minutes is None:
        raise ConfigError("search space: no budget; set `trials:` or `minutes:` (or --trials / --minutes)")
    if space.trials is not None and not _counts(space.trials, 1):
        raise ConfigError(f"search space: trials must be a positive int, got {space.trials!r}")
    if space.minutes is not None and not (_number(space.minutes) and space.minutes > 0):
        raise ConfigError(f"search space: minutes must be a positive number, got {space.minutes!r}")
    if not _counts(space.parallel, 1):
        raise ConfigError(f"search space: parallel must be a positive int, got {space.parallel!r}")


def _number(value: Any) -> bool:
    """A YAML number; `true` is not one, although Python counts a bool as an int."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _counts(value: Any, least: int) -> bool:
    return _number(value) and isinstance(value, int) and value >= least


def _listed(value: Any) -> Any:
    """A config tuple (a layer plan, target modules) as the space file writes it: a list."""
    return [_listed(v) for v in value] if isinstance(value, tuple) else value


def _contains(dist: optuna.distributions.BaseDistribution, value: Any) -> bool:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return value in dist.choices
    return _number(value) and dist.low <= value <= dist.high


def _extremes(dist: optuna.distributions.BaseDistribution) -> list[Any]:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]
