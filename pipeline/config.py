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


_SECTIONS = {"dataset": DatasetConfig, "validate": ValidateConfig}


def load_params(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    """Every section of `params.yaml` as its config dataclass; unknown keys are refused by name."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
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
