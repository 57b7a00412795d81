"""The register and promotion-gate stages: a new version gets `challenger`; `champion` moves through the gate.

The gate scores the current champion now, on the same held-out split as the candidate (any family), and
compares (`pipeline.mlops.promotion.gate`); the verdict and its reasons are tagged on the version.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pipeline.config import PromoteConfig, ValidateConfig
from pipeline.mlops.promotion import (
    CHALLENGER,
    CHAMPION,
    GATE_REASONS_TAG,
    GATE_TAG,
    current,
    gate,
    set_alias,
)
from pipeline.mlops.registry import client, download_version, register_export
from pipeline.stages.evaluate import score_heldout


def register_stage(export_dir: str | Path, name: str, run_id: str, tags: dict[str, str]) -> str:
    """Register the export as a new version (or find the one with the same idempotency key); it gets `challenger`."""
    version = register_export(export_dir, name, run_id, tags)
    set_alias(name, CHALLENGER, version, "new version")
    return version


def promotion_stage(name: str, version: str, calibrated: dict[str, float], smoke_passed: bool, data: str | Path,
                    split_config: ValidateConfig, config: PromoteConfig,
                    learning_warnings: list[str] | None = None,
                    unpinned: bool = False) -> dict[str, Any]:  # fmt: skip
    """Gate `version` against the champion scored now on the same split; move `champion` when it passes.

    `unpinned`: the version was trained with --allow-unpinned, and the gate holds it."""
    champion_version = current(name, CHAMPION)
    if champion_version == version:
        return {"promote": False, "reasons": ["already the champion"], "champion": version}
    champion = None
    if champion_version is not None:
        with tempfile.TemporaryDirectory() as tmp:
            champion = score_heldout(download_version(name, champion_version, tmp), data, split_config)
    verdict = gate(calibrated, champion, smoke_passed, config, learning_warnings, unpinned=unpinned)
    client().set_model_version_tag(name, version, GATE_TAG, "promote" if verdict.promote else "hold")
    client().set_model_version_tag(name, version, GATE_REASONS_TAG, "; ".join(verdict.reasons))
    if verdict.promote:
        set_alias(name, CHAMPION, version, "promotion gate: " + "; ".join(verdict.reasons))
    return verdict.to_dict() | {"champion": current(name, CHAMPION), "previous_champion": champion_version,
                                "champion_metrics": champion}  # fmt: skip
