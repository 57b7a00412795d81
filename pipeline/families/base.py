"""The model-family interface: everything a stage needs of a model family, and nothing a stage may ask beyond
it.

A family is how a backbone turns decision rows into per-option logits and how it is saved. Every stage (train,
calibrate, export, evaluate, smoke test, gate, Decision API, MLflow model) holds a `DecisionFamily` and the
model it loaded, and calls the interface; no stage asks which family it holds. `pipeline.families.pick_family`
is the only place that chooses one.

    family = pick_family("data/snapshots/minilm")           # laya: a Laya-layout folder
    loaded = family.load("data/snapshots/minilm", config, device)
    examples, skipped = family.build_examples(loaded, records)
    cuts = family.state_cuts(examples)                      # per row: state tokens, kept, room
    family.prepare(loaded, config)                          # LoRA, full, or QLoRA where the family has it
    family.learn_from_rows(loaded, examples)                # what the model counts in the training rows
    train(loaded.model, examples, config, device, family.batch_task(loaded, config))
    decisions, logits = family.score(loaded, heldout_examples, device)
    family.export(loaded, "models/tuned", calibrator, manifest)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pipeline.config import TrainConfig
from pipeline.scoring.automation import Automation
from pipeline.scoring.calibration import Temperatures
from pipeline.scoring.calibrators import Calibrator, type_temperatures
from pipeline.scoring.decisions import ScoredDecision

if TYPE_CHECKING:  # annotations only: the server need not import the validation schema to answer
    from pipeline.data.answers import ParsedRequest
    from pipeline.data.contract import Record


EncoderRun = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""An encoder pass: `(input_ids, attention_mask)` [batch, tokens] to hidden states [batch, tokens, width]."""


@dataclass(frozen=True)
class Candidate:
    """One of the models a run trains side by side and keeps the best of on its validation split
    (`DecisionFamily.candidates`): its name, its config and the loaded model it trains. `together`: trained to
    answer with the others (`DecisionFamily.combined`), not to be chosen among them."""

    name: str
    config: TrainConfig
    loaded: Any
    together: bool = False


class ModelLayoutError(ValueError):
    """A folder is not a complete model of the family that reads it (or of any family)."""


class BadBase(ModelLayoutError):
    """A folder no family starts from (or not the family asked for), in one line naming it and what to do: the
    CLI refuses it with exit code 2 before anything is trained or written."""


class NoSuchModel(ModelLayoutError):
    """A model named where there is none (no such folder, a file, a `models:/` URI of no form the registry
    reads): the user's input, refused with exit code 2 before any row is read."""


# What a tokenizer raises on text it cannot take (`tokenizers` raises TypeError for non-UTF-8 input): a family
# turns these, raised while encoding one request, into that request's BadQuestion.
UNENCODABLE = (TypeError, ValueError, UnicodeError)


class BadQuestion(ValueError):
    """A question that cannot be answered (its definition is invalid, or its options do not fit)."""

    def __init__(self, message: str, question_id: str | None = None) -> None:
        super().__init__(message)
        self.question_id = question_id


@dataclass(frozen=True)
class Answered:
    """A request's wire answers and the tokens its questions used."""

    answers: dict[str, dict[str, Any]]
    input_tokens: int
    state_vector: np.ndarray | None = field(default=None, compare=False, repr=False)
    """The state's vector (`DecisionFamily.state_vectors`) where the answer's own pass computed it (the joint
    family, fields apart): the novelty gate then needs no pass of its own."""
    logits: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    """Each question's raw option logits (model order) before calibration: what a calibrator is refitted on
    for another precision of the same model (`scoring.quantized`)."""


@dataclass(frozen=True)
class ExportResult:
    """Where an export went and whether anything had to be written."""

    out: str
    written: bool
    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StateCut:
    """What a model reads of one row's state: its tokens as serialised (`contract.state_text`), how many of
    them its sequences keep (the fewest, where a row is read in several sequences), and the room those
    sequences left the state (the least). A state longer than its room loses its end
    (`contract.STATE_TRUNCATION`)."""

    tokens: int
    kept: int
    room: int

    @property
    def dropped(self) -> int:
        return self.tokens - self.kept


def cut_state(ids: list[int], room: int) -> list[int]:
    """The state tokens a window of `room` tokens keeps: the first ones, the end cut
    (`contract.STATE_TRUNCATION`)."""
    return ids[: max(0, room)]


def cuts_by_row(sequences: list[tuple[int, StateCut]]) -> list[StateCut]:
    """One cut per row from `(row, cut)` per sequence: a row read in several sequences counts the one that
    kept the fewest of its state's tokens, and the least room any of them left it."""
    rows: dict[int, StateCut] = {}
    for row, cut in sequences:
        seen = rows.setdefault(row, cut)
        rows[row] = StateCut(cut.tokens, min(cut.kept, seen.kept), min(cut.room, seen.room))
    return list(rows.values())


@dataclass(frozen=True)
class BatchTask:
    """How a family's examples become batches and a summed loss, for the one training loop.

    `summed_loss(model, batch, dtype)` sums over the batch's decisions, so accumulation stays exact;
    `backbone` is the parameter-name prefix that gets the backbone learning rate; `decisions(example)` counts
    the decisions an example holds; `layers(model)` is the module whose repeated blocks are compiled on GPU;
    `pad_id` pads token ids (compile buckets pad with it too).
    """

    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    summed_loss: Callable[[torch.nn.Module, dict[str, torch.Tensor], torch.dtype | None], torch.Tensor]
    backbone: str
    pad_id: int
    layers: Callable[[torch.nn.Module], torch.nn.Module]
    decisions: Callable[[Any], int] = lambda example: 1


class DecisionFamily(ABC):
    """One model family: how it recognises, loads, trains, scores, exports and serves its models."""

    name: str
    """The family's name (`train.family`, `--family`, `manifest.json`)."""
    methods: tuple[str, ...]
    """The training methods it supports (`train.method`, `--method`), its default first."""
    bases: str
    """The base folders it starts from, in words (`decision families` prints them)."""

    @property
    def default_method(self) -> str:
        """What `train.method: null` trains with in this family."""
        return self.methods[0]

    def method_problem(self, base: Path, method: str) -> str | None:
        """Why this family cannot train `base` with `method` (one of its methods), seen from the folder alone
        before any data is read; None where it can or only loading tells."""
        return None

    @abstractmethod
    def describe_training(self, folder: Path) -> dict[str, Any]:
        """What a fine-tune folder or export of this family records of its training (method, steps, config,
        ...)."""

    @abstractmethod
    def owns(self, folder: Path) -> bool:
        """Whether `folder` is this family's by default: its base layout, fine-tune folder or export."""

    @abstractmethod
    def can_load(self, folder: Path) -> bool:
        """Whether this family can start from `folder` when asked for by name (a backbone that fits
        several)."""

    @abstractmethod
    def describe_base(self, folder: Path) -> str:
        """What this family makes of `folder` as a base, in words: `a plain encoder folder (BertModel): the
        joint head on its last hidden states, ...` (a run's first lines say it)."""

    @abstractmethod
    def is_export(self, folder: Path) -> bool:
        """A complete export of this family (its last-written file is there)."""

    @abstractmethod
    def written_last(self, folder: Path) -> Path:
        """The file an export writes last: its presence marks the folder complete (and dates the release)."""

    @abstractmethod
    def load(self, folder: str | Path, config: TrainConfig | None = None, device: torch.device | None = None):
        """A base or an export as a loaded model on `device` (the CPU by default); `config` picks e.g.
        QLoRA."""

    @abstractmethod
    def load_trained(self, folder: str | Path):
        """A model for inference from an export or from this family's fine-tune folder (adapters applied)."""

    @abstractmethod
    def build_examples(self, loaded, records: list[Record]) -> tuple[list[Any], dict[str, int]]:
        """Training examples of validated records, and the decisions skipped by reason."""

    @abstractmethod
    def state_cuts(self, examples: list[Any]) -> list[StateCut]:
        """One `StateCut` per row that `examples` (from one `build_examples` call) read: how many of its
        state's tokens the model keeps and how many it drops."""

    @abstractmethod
    def example_rows(self, examples: list[Any]) -> list[int]:
        """The row (its index in the records given to `build_examples`) each of `examples` comes from."""

    def refits_cheaply(self, config: TrainConfig) -> bool:
        """Whether `config` trains so little that a run may train it again on each of a few folds of its rows
        (out-of-fold answers to calibrate and certify on: `training.out_of_fold`); no by default."""
        return False

    @abstractmethod
    def prepare(self, loaded, config: TrainConfig) -> None:
        """Make the trainable parameters for `config.method` (one of `methods`)."""

    def training_precision(self, config: TrainConfig) -> tuple[str, str]:
        """The precision `config` (its method resolved) really trains in, and why when that is not
        `config.precision` (the run records and says what ran, not what was asked); `config.precision` by
        default."""
        return config.precision, ""

    def candidates(self, loaded, config: TrainConfig) -> list[Candidate]:
        """The models this run trains, one after the other on the same examples (a frozen backbone's features
        computed once), keeping the one with the lowest loss on the validation split; each config is resolved
        (nothing left to choose). One by default: `loaded` itself."""
        return [Candidate("", config, loaded)]

    def combined(self, trained: list[Candidate]) -> Candidate | None:
        """One model made of the trained candidates together: kept where they were trained `together`, else
        tried beside them on the validation split and kept where its loss is the lowest; None (the default):
        none."""
        return None

    def learn_from_rows(self, loaded, examples: list[Any]) -> None:
        """Set what the model counts in its training rows rather than learns by gradient (the joint head's
        word weights), before the first step; nothing by default."""
        return None

    def training_examples(
        self,
        loaded,
        examples: list[Any],
        config: TrainConfig,
        device: torch.device,
        report: Callable[[str], None] | None = None,
    ) -> list[Any]:
        """The examples as the training loop reads them, after `prepare` (a family may compute a frozen
        backbone's features once here); as they are by default."""
        return examples

    def scoring_examples(
        self, loaded, examples: list[Any], config: TrainConfig, device: torch.device
    ) -> list[Any]:
        """The examples a fit scores again and again (the held-out and validation rows: the base, each candidate,
        the fine-tune), ready for `score`: a family whose `config.method` keeps the backbone frozen may compute
        its features once, at full precision, so that each score runs the head alone; as they are by default."""
        return examples

    @abstractmethod
    def batch_task(self, loaded, config: TrainConfig) -> BatchTask:
        """Collate and summed loss for the training loop."""

    @abstractmethod
    def score(
        self, loaded, examples: list[Any], device: torch.device, batch_size: int = 32, progress: bool = False
    ) -> tuple[list[ScoredDecision], list[np.ndarray]]:
        """Raw option logits of every decision the examples hold (eval mode, no grad), in example order."""

    @abstractmethod
    def served_probabilities(
        self, loaded, decisions: list[ScoredDecision], logits: list[np.ndarray]
    ) -> list[np.ndarray]:
        """The probabilities the loaded model answers with for these decisions' logits (its calibration
        applied)."""

    @abstractmethod
    def temperatures(self, loaded) -> Temperatures:
        """The loaded model's own temperatures by question type (from its config)."""

    def calibrator(self, loaded) -> Calibrator:
        """The loaded model's calibrator (what a re-export keeps): its calibrator.json, else its type
        temperatures."""
        return loaded.calibrator or type_temperatures(self.temperatures(loaded))

    @abstractmethod
    def save_finetune(self, loaded, out: Path, training: dict[str, Any]) -> Path:
        """The trained model as this family keeps it before calibration (`load_trained` reads it)."""

    @abstractmethod
    def export(
        self,
        loaded,
        out: str | Path,
        calibrator: Calibrator,
        manifest: dict[str, Any],
        files: dict[str, bytes] | None = None,
    ) -> ExportResult:
        """Merge, check and write a servable, self-describing folder crash-safe; a no-op when already there.
        `files` go into the folder beside the model (`exporting.write_files`), each named in `manifest`."""

    @abstractmethod
    def answer(
        self,
        loaded,
        requests: list[ParsedRequest],
        dtype: torch.dtype | None = None,
        encoder: EncoderRun | None = None,
    ) -> list[Answered | BadQuestion]:
        """Answer parsed requests in shared forward passes (the backbone under autocast to `dtype` when
        given); a request that cannot be encoded fails alone. `encoder`, when given, runs the encoder pass of
        `served_encoder` in place of the torch modules (another runtime); the head stays in torch."""

    @abstractmethod
    def state_vectors(
        self, loaded, states: list[Any], dtype: torch.dtype | None = None, encoder: EncoderRun | None = None
    ) -> np.ndarray:
        """[states, width]: the model's own pooled vector of each state read alone, what the novelty gate
        compares with the training states' (`scoring.novelty`). A family whose answer pass reads the state
        alone hands the same vectors back with its answers (`Answered.state_vector`); one that reads it again
        for this reads its first `forward_passes.STATE_VECTOR_TOKENS` tokens. An empty state is a zero
        vector."""

    def served_encoder(self, loaded) -> torch.nn.Module | None:
        """The encoder pass that `answer` runs on padded batches, as a module `(input_ids, attention_mask) ->
        hidden states` another runtime can take over (`onnx_encoder.export_encoder`); None where the backbone
        cannot be handed over (the default)."""
        return None


@dataclass(eq=False)
class DecisionModel:
    """A loaded model with its family: what the server, the smoke test and the MLflow model hold."""

    family: DecisionFamily
    loaded: Any
    dtype: torch.dtype | None = None  # the serving precision's autocast dtype (None: fp32)
    encoder: EncoderRun | None = None  # another runtime's encoder pass (None: the model's own torch modules)
    automation: Automation = field(default_factory=Automation)
    """The export's certificates and novelty gate (`scoring.automation`): what marks each answer `x_automate`."""

    @property
    def backend(self) -> str:
        """Where the encoder runs: `torch`, or the runtime of `encoder` (`onnxruntime`)."""
        return getattr(self.encoder, "name", "torch") if self.encoder is not None else "torch"

    def answer(self, requests: list[ParsedRequest]) -> list[Answered | BadQuestion]:
        """The family's answers, each marked `x_automate` (and why not) by the model's `automation`; the states
        of requests that could be automated go through the novelty gate in one pass."""
        results = self.family.answer(self.loaded, requests, self.dtype, self.encoder)
        answered = [(r, a) for r, a in zip(requests, results) if isinstance(a, Answered)]
        given = [a.state_vector for _, a in answered]
        novel = iter(self.automation.novel_states([r for r, _ in answered], self.state_vectors, given))
        return [
            replace(a, answers=self.automation.marked(r, a.answers, next(novel)))
            if isinstance(a, Answered)
            else a
            for r, a in zip(requests, results)
        ]

    def state_vectors(self, states: list[Any]) -> np.ndarray:
        """The model's pooled vector of each state (`DecisionFamily.state_vectors`), at its serving precision."""
        return self.family.state_vectors(self.loaded, states, self.dtype, self.encoder)

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> DecisionModel:
        self.loaded.model.to(device)
        self.dtype = dtype
        return self
