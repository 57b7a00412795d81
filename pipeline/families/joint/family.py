"""The `joint` family: a row's state read once, each of its questions isolated (its own field sequences on an
encoder, its own sequence after the state on a causal LM), and a head that pools question and option spans and
lets each question's fields attend to the state, so one pass answers every question of a row. Its backbone is
a causal LM (Clef-style; LoRA, full or QLoRA) or an encoder (a plain Hugging Face encoder folder, or the
MiniLM of a Laya-layout base; LoRA or full); `head` trains the head alone on either.

    family = JointFamily()
    loaded = family.load("models/qwen3-0.6b", TrainConfig(method="qlora"), torch.device("cuda"))
"""

from __future__ import annotations

import json
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
    Candidate,
    DecisionFamily,
    EncoderRun,
    ExportResult,
    StateCut,
)
from pipeline.families.joint.backbone import (
    has_tokenizer,
    is_causal,
    is_causal_lm_folder,
    is_encoder_folder,
    is_laya_layout_folder,
    qlora_config,
)
from pipeline.families.joint.layout import (
    HEAD_FILE,
    JOINT_CONFIG,
    LoadedJoint,
    describe_base,
    ensemble,
    export_joint,
    is_joint_export,
    load_joint,
    set_layer_plan,
    set_state_windows,
    temperature_of,
    with_lexicon,
)
from pipeline.families.joint.predict import answer_joint_requests, joint_state_vectors
from pipeline.families.joint.training import (
    JointExample,
    build_examples,
    cache_features,
    joint_batch_task,
    prepare_joint,
    score_examples,
    state_cuts,
)
from pipeline.families.runtimes.onnx_encoder import EncoderPass
from pipeline.scoring.calibration import Temperatures
from pipeline.scoring.calibrators import Calibrator
from pipeline.scoring.decisions import ScoredDecision


class JointFamily(DecisionFamily):
    """The state once per row, each question isolated: apart on an encoder, after the state on a causal LM."""

    name = "joint"
    methods = ("head", "lora", "full", "qlora")
    bases = (
        "a plain Hugging Face encoder folder (BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...) or causal LM "
        "folder (Qwen3, Llama, ...) with its tokenizer, a joint export; a Laya-layout folder when asked for "
        "by name"
    )

    def describe_training(self, folder: Path) -> dict[str, Any]:
        return json.loads((folder / JOINT_CONFIG).read_text()).get("training", {})

    def owns(self, folder: Path) -> bool:
        if is_joint_export(folder):
            return True
        return (is_causal_lm_folder(folder) or is_encoder_folder(folder)) and has_tokenizer(folder)

    def can_load(self, folder: Path) -> bool:
        return self.owns(folder) or is_laya_layout_folder(folder)

    def describe_base(self, folder: Path) -> str:
        return describe_base(folder)

    def method_problem(self, base: Path, method: str) -> str | None:
        if method == "qlora" and (is_encoder_folder(base) or is_laya_layout_folder(base)):
            return (
                f"train.method=qlora: {base} has an encoder backbone; QLoRA quantises causal LMs (use "
                "--method lora or --method full)"
            )
        return None

    def is_export(self, folder: Path) -> bool:
        return is_joint_export(folder)

    def written_last(self, folder: Path) -> Path:
        return folder / HEAD_FILE

    def load(
        self, folder, config: TrainConfig | None = None, device: torch.device | None = None
    ) -> LoadedJoint:
        """QLoRA loads a causal LM's backbone in 4-bit nf4 on `device`; an encoder refuses it."""
        device = device or torch.device("cpu")
        fresh = config or TrainConfig()
        width, lexicon = fresh.head_width, fresh.lexicon
        if config is None or config.method != "qlora":
            loaded = load_joint(folder, head_width=width, lexicon=lexicon)
            loaded.model.to(device)
        else:
            loaded = load_joint(
                folder,
                head_width=width,
                quantization=qlora_config(device),
                device=str(device),
                lexicon=lexicon,
            )
            loaded.model.head.to(device)
        if config is not None and config.layer_plan is not None:
            set_layer_plan(loaded, config.layer_plan)  # the run's plan, over the folder's own
        if config is not None:
            set_state_windows(loaded, config.state_windows)
        return loaded

    def load_trained(self, folder) -> LoadedJoint:
        return load_joint(folder)

    def build_examples(self, loaded: LoadedJoint, records) -> tuple[list[JointExample], dict[str, int]]:
        return build_examples(records, loaded.tokenizer, loaded.layout)

    def state_cuts(self, examples: list[JointExample]) -> list[StateCut]:
        return state_cuts(examples)

    def example_rows(self, examples: list[JointExample]) -> list[int]:
        return [example.row for example in examples]

    def refits_cheaply(self, config: TrainConfig) -> bool:
        """`head`: each fold trains the head alone, on the frozen backbone's features computed once."""
        return config.method == "head"

    def training_examples(
        self,
        loaded: LoadedJoint,
        examples: list[JointExample],
        config: TrainConfig,
        device: torch.device,
        report=None,
    ) -> list[JointExample]:
        """`head` trains on a frozen backbone: its hidden states are computed once, not once per epoch."""
        if config.method != "head":
            return examples
        return cache_features(
            loaded.model.to(device),
            examples,
            loaded.tokenizer.pad_token_id,
            device,
            config.eval_batch_size,
            report,
        )

    def scoring_examples(
        self, loaded: LoadedJoint, examples: list[JointExample], config: TrainConfig, device: torch.device
    ) -> list[JointExample]:
        """`head`: the frozen backbone's features of rows a fit scores again and again, computed once at full
        precision (as the model without a cache reads them), so that each score runs the head alone."""
        if config.method != "head" or not examples:
            return examples
        pad = loaded.tokenizer.pad_token_id
        model = loaded.model.to(device)
        return cache_features(model, examples, pad, device, config.eval_batch_size, dtype=torch.float32)

    def prepare(self, loaded: LoadedJoint, config: TrainConfig) -> None:
        prepare_joint(loaded.model, config)

    def training_precision(self, config: TrainConfig) -> tuple[str, str]:
        """`head` computes in fp32 whatever `train.precision` says: the frozen backbone's features are
        computed once, outside autocast, and the head turns autocast off inside (its many small products lose
        too much in bf16). A GPU run found `auto` (bf16 there) and fp32 equal (docs/results.md, "The GPU check
        on an H200")."""
        if config.method == "head":
            return "fp32", "the head computes in fp32, on features computed once without autocast"
        return config.precision, ""

    def candidates(self, loaded: LoadedJoint, config: TrainConfig) -> list[Candidate]:
        """`train.lexicon: auto` or `both` on a fresh encoder head trained alone: a `tokens` head and a
        `tfidf` head on the same frozen features, for the validation split to choose among them and the two
        together (`auto`) or to answer together (`both`). Anywhere else each is `tokens`: a LoRA or full run
        changes the backbone the second head would share, and a trained head keeps its own channel."""
        if config.lexicon not in ("auto", "both"):
            return [Candidate("", config, loaded)]
        tokens = replace(config, lexicon="tokens")
        fresh = not loaded.config.get("fine_tuned") and loaded.model.head.lexical is not None
        if not fresh or config.method != "head":
            return [Candidate("", tokens, loaded)]
        together = config.lexicon == "both"
        return [
            Candidate("tokens", tokens, loaded, together),
            Candidate("tfidf", replace(config, lexicon="tfidf"), with_lexicon(loaded, "tfidf"), together),
        ]

    def combined(self, trained: list[Candidate]) -> Candidate | None:
        """`train.lexicon: both`'s (or `auto`'s) two heads answering together (`HeadEnsemble`, the mean of
        their probabilities) on the backbone they share: no more training, and only the heads' cost again when
        serving."""
        if len(trained) < 2:
            return None
        config = replace(trained[0].config, lexicon="both")
        return Candidate("ensemble", config, ensemble([c.loaded for c in trained]), trained[0].together)

    def learn_from_rows(self, loaded: LoadedJoint, examples: list[JointExample]) -> None:
        """A fresh head's `tfidf` lexical channel: its pairs and word weights, from the training rows' states.
        A trained head keeps its own: its rows were learned for them. A `tokens` channel has nothing to
        count."""
        if loaded.config.get("fine_tuned"):
            return
        lexical = loaded.model.head.lexical
        if lexical is not None and len(lexical.pairs):
            lexical.fit([e.record.ids for e in examples])

    def batch_task(self, loaded: LoadedJoint, config: TrainConfig) -> BatchTask:
        return joint_batch_task(loaded.tokenizer.pad_token_id, config)

    def score(
        self,
        loaded: LoadedJoint,
        examples: list[JointExample],
        device: torch.device,
        batch_size: int = 32,
        progress: bool = False,
    ) -> tuple[list[ScoredDecision], list[np.ndarray]]:
        # A record holds every question of its row: a quarter of the Laya family's batch is about as many
        # tokens.
        return score_examples(
            loaded.model, examples, loaded.tokenizer.pad_token_id, device, max(1, batch_size // 4)
        )

    def served_probabilities(
        self, loaded: LoadedJoint, decisions: list[ScoredDecision], logits: list[np.ndarray]
    ) -> list[np.ndarray]:
        calibrator = self.calibrator(loaded)
        return [calibrator.probabilities(d.qtype, d.question_id, z) for d, z in zip(decisions, logits)]

    def temperatures(self, loaded: LoadedJoint) -> Temperatures:
        return (
            temperature_of(loaded.config, 0),
            temperature_of(loaded.config, 1),
            temperature_of(loaded.config, 2),
        )

    def save_finetune(self, loaded: LoadedJoint, out: Path, training: dict[str, Any]) -> Path:
        """An export at T = 1 (merged, self-describing): calibration then re-exports it with its
        temperatures."""
        # Trained, whatever the method: a head trained on a frozen backbone leaves no adapters to tell.
        loaded.config = {
            **loaded.config,
            "fine_tuned": True,
            "training": {**loaded.config.get("training", {}), **training},
        }
        manifest = {"family": self.name, "source_digest": training.get("source_digest")}
        return Path(export_joint(loaded, out, Calibrator(), manifest).out)

    def export(
        self,
        loaded: LoadedJoint,
        out,
        calibrator: Calibrator,
        manifest: dict[str, Any],
        files: dict[str, bytes] | None = None,
    ) -> ExportResult:
        return export_joint(loaded, out, calibrator, manifest, files)

    def answer(
        self,
        loaded: LoadedJoint,
        requests,
        dtype: torch.dtype | None = None,
        encoder: EncoderRun | None = None,
    ) -> list[Answered | BadQuestion]:
        return answer_joint_requests(loaded, requests, dtype=dtype, encoder=encoder)

    def state_vectors(
        self,
        loaded: LoadedJoint,
        states: list,
        dtype: torch.dtype | None = None,
        encoder: EncoderRun | None = None,
    ) -> np.ndarray:
        return joint_state_vectors(loaded, states, dtype, encoder)

    def served_encoder(self, loaded: LoadedJoint) -> torch.nn.Module | None:
        """An encoder backbone's pass (its last hidden states, or its last `read_layers` side by side); a
        causal LM's stays in torch."""
        model = loaded.model
        return None if is_causal(model.lm) else EncoderPass(model, model.hidden_states)
