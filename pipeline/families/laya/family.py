"""The `laya` family: a Laya-layout encoder, one token sequence per decision (several, under one softmax, for
a question whose options do not fit one), exports that `laya.Agent` loads.

family = LayaFamily()
loaded = family.load("data/snapshots/minilm")
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import TrainConfig
from pipeline.families.base import (
    Answered,
    BadQuestion,
    BatchTask,
    DecisionFamily,
    EncoderRun,
    ExportResult,
    StateCut,
)
from pipeline.families.laya.adapters import ADAPTER_FILE, load_for_inference, save_adapter
from pipeline.families.laya.export import export_model
from pipeline.families.laya.forward import encoder_pass, score_items
from pipeline.families.laya.items import Item, build_items, state_cuts
from pipeline.families.laya.predict import answer_requests, calibrated_probabilities, laya_state_vectors
from pipeline.families.laya.training import laya_batch_task, prepare_model
from pipeline.families.laya_layout import CONFIG_FILE, LoadedModel, load_model, save_model
from pipeline.families.planned_layers import configure_plan
from pipeline.layer_plans import KEY as PLAN_KEY
from pipeline.scoring.calibration import Temperatures
from pipeline.scoring.calibrators import Calibrator
from pipeline.scoring.decisions import ScoredDecision


class LayaFamily(DecisionFamily):
    """One sequence per question: `[CLS] question [SEP] [MASK] option ... [SEP] state [SEP]`; a question whose
    options do not fit one is read in several (docs/training.md, "Model families";
    `sequences.question_parts`)."""

    name = "laya"
    methods = ("lora", "full")
    bases = "a Laya-layout folder (rl_agent_config.json): the stock MiniLM snapshot, a laya checkpoint"

    def describe_training(self, folder: Path) -> dict[str, Any]:
        """A LoRA fine-tune's adapter description, else the Laya config's `training`."""
        if (folder / ADAPTER_FILE).is_file():
            return json.loads((folder / ADAPTER_FILE).read_text())
        return json.loads((folder / CONFIG_FILE).read_text()).get("training", {})

    def owns(self, folder: Path) -> bool:
        return (folder / CONFIG_FILE).is_file() or (folder / ADAPTER_FILE).is_file()

    def can_load(self, folder: Path) -> bool:
        return (folder / CONFIG_FILE).is_file()

    def describe_base(self, folder: Path) -> str:
        return "a Laya-layout folder: its encoder and its own decision head, one sequence per question"

    def is_export(self, folder: Path) -> bool:
        return (folder / CONFIG_FILE).is_file()

    def written_last(self, folder: Path) -> Path:
        return folder / CONFIG_FILE

    def load(
        self, folder, config: TrainConfig | None = None, device: torch.device | None = None
    ) -> LoadedModel:
        loaded = load_model(folder)
        # The run's plan, else the one a fine-tune folder was saved with (a base has none).
        wanted = config.layer_plan if config is not None else None
        plan = configure_plan(loaded.model.encoder, loaded.config.get(PLAN_KEY), wanted)
        if plan is not None:
            loaded.config = {**loaded.config, PLAN_KEY: plan}
        loaded.model.to(device or "cpu")
        return loaded

    def load_trained(self, folder) -> LoadedModel:
        return load_for_inference(folder)

    def build_examples(self, loaded: LoadedModel, records) -> tuple[list[Item], dict[str, int]]:
        return build_items(records, loaded)

    def state_cuts(self, examples: list[Item]) -> list[StateCut]:
        return state_cuts(examples)

    def example_rows(self, examples: list[Item]) -> list[int]:
        return [item.record for item in examples]

    def prepare(self, loaded: LoadedModel, config: TrainConfig) -> None:
        prepare_model(loaded.model, config)

    def batch_task(self, loaded: LoadedModel, config: TrainConfig) -> BatchTask:
        return laya_batch_task(loaded.tokenizer.pad_token_id)

    def score(
        self,
        loaded: LoadedModel,
        examples: list[Item],
        device: torch.device,
        batch_size: int = 32,
        progress: bool = False,
    ) -> tuple[list[ScoredDecision], list[np.ndarray]]:
        logits = score_items(
            loaded.model,
            examples,
            loaded.tokenizer.pad_token_id,
            device,
            batch_size,
            progress=progress,
            logits=True,
        )
        return [item.scored() for item in examples], logits

    def served_probabilities(
        self, loaded: LoadedModel, decisions: list[ScoredDecision], logits: list[np.ndarray]
    ) -> list[np.ndarray]:
        return calibrated_probabilities(loaded, decisions, logits)

    def temperatures(self, loaded: LoadedModel) -> Temperatures:
        t = loaded.config.get("temperature") or [1.0, 1.0, 1.0]
        return (float(t[0]), float(t[1]), float(t[2]))

    def save_finetune(self, loaded: LoadedModel, out: Path, training: dict[str, Any]) -> Path:
        """LoRA: adapters plus head (`pipeline.families.laya.adapters`); full: a complete Laya-layout model."""
        training = {**training, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        loaded.model.to("cpu")
        if training["method"] == "lora":
            return save_adapter(loaded.model, out, {"decision_config": loaded.config, **training})
        return save_model(
            replace(loaded, config={**loaded.config, "fine_tuned": True, "training": training}), out
        )

    def export(
        self,
        loaded: LoadedModel,
        out,
        calibrator: Calibrator,
        manifest: dict[str, Any],
        files: dict[str, bytes] | None = None,
    ) -> ExportResult:
        return export_model(loaded, out, calibrator, manifest, files)

    def answer(
        self,
        loaded: LoadedModel,
        requests,
        dtype: torch.dtype | None = None,
        encoder: EncoderRun | None = None,
    ) -> list[Answered | BadQuestion]:
        return answer_requests(loaded, requests, dtype, encoder)

    def state_vectors(
        self,
        loaded: LoadedModel,
        states: list,
        dtype: torch.dtype | None = None,
        encoder: EncoderRun | None = None,
    ) -> np.ndarray:
        return laya_state_vectors(loaded, states, dtype, encoder)

    def served_encoder(self, loaded: LoadedModel) -> torch.nn.Module:
        return encoder_pass(loaded.model)
