"""The novelty gate: a state unlike the states a model trained on is never automated, however sure its answer.

A state is read as the model's own pooled state vector (`DecisionModel.state_vectors`), L2-normalised. Its
novelty is the mean cosine distance to its `k` nearest neighbours in a bank of training state vectors
(subsampled to at most `MAX_BANK` rows); a state farther than the `certify.novelty_quantile` quantile of the
validation split's distances (rows never in the bank) is novel. The calibrate stage fits it (`novelty.npz` in
the run folder), the export carries it, and the server applies it per request (`scoring.automation`).

Why k nearest neighbours and not a Mahalanobis distance: sentence vectors of real states lie in several topic
clusters, and one Gaussian around all of them covers the space between the clusters too, where nothing was
trained on; with a few thousand rows in hundreds of dimensions its covariance is also poorly pinned. The
nearest-neighbour distance on normalised vectors (Sun et al., 2022, "Out-of-distribution detection with deep
nearest neighbors") assumes no shape, and costs one [bank x width] product per request (4,096 x 384 on MiniLM:
well under a millisecond). The mean over k = 5 neighbours, rather than the k-th alone, keeps one near-duplicate
in the bank from hiding a state's distance to everything else.

    gate = fit_novelty(training_vectors, validation_vectors, quantile=0.99)
    gate.novel(vectors)                      # a bool per state
    read_novelty(novelty_bytes(gate))        # as the export carries it
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.data.contract import state_text

MAX_BANK = 4096
"""Training state vectors kept as the reference (a random subsample of more)."""
NEIGHBOURS = 5
"""How many nearest training states a state's distance averages over."""
LENGTH_FACTOR = 2
"""A state more than this many times as long (in characters) as the longest state the gate was fitted on is
novel, whatever its distance: a mean over many tokens drifts toward the centre of everything (measured on the
MiniLM joint model: 5,000 characters of other domains' sentences passed the distance that one sentence of them
failed)."""


def normalised(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32); a zero or non-finite row stays zero (and so reads as novel)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"state vectors must be a [states, width] array, got shape {vectors.shape}")
    finite = np.isfinite(vectors).all(axis=1, keepdims=True)
    vectors = np.where(finite, vectors, 0.0)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def embeddable(state: Any) -> bool:
    """Whether a state gives the model anything to read: a letter or a digit somewhere. Empty text, whitespace
    and punctuation alone ("." "?!", an empty JSON object or list) do not: measured on the MiniLM encoder, the
    pooled vector of "." lies as near tweets as tweets do, so the distance alone would pass it."""
    return any(character.isalnum() for character in state_text(state))


@dataclass(frozen=True)
class NoveltyGate:
    """A bank of training state vectors and the distance beyond which a state is novel."""

    bank: np.ndarray
    """[rows, width] L2-normalised training state vectors."""
    threshold: float
    """A state whose distance is above this is novel."""
    quantile: float
    """The quantile of the validation distances the threshold sits at (`certify.novelty_quantile`)."""
    k: int = NEIGHBOURS
    fit_states: int = 0
    """The validation states the threshold was fitted on."""
    max_chars: int | None = None
    """A state longer than this (`LENGTH_FACTOR` times the longest fitted on; None: no limit) is novel."""

    def too_long(self, state: Any) -> bool:
        """Whether the state is longer than any the gate allows (`max_chars`)."""
        return self.max_chars is not None and len(state_text(state)) > self.max_chars

    def distances(self, vectors: np.ndarray) -> np.ndarray:
        """Each state's mean cosine distance to its `k` nearest bank vectors (2 for a zero vector: nothing)."""
        unit = normalised(vectors)
        if len(unit) == 0:
            return np.zeros(0)
        similarity = unit @ self.bank.T
        k = min(self.k, self.bank.shape[0])
        nearest = -np.partition(-similarity, k - 1, axis=1)[:, :k]
        distance = 1.0 - nearest.mean(axis=1).astype(np.float64)
        return np.where(np.linalg.norm(unit, axis=1) > 0, distance, 2.0)

    def novel(self, vectors: np.ndarray) -> np.ndarray:
        """A bool per state: farther from the training states than the threshold."""
        return self.distances(vectors) > self.threshold

    def summary(self) -> dict[str, Any]:
        """What `/v1/models` and the run's records say of the gate."""
        return {
            "distance": f"mean cosine distance to the {self.k} nearest training states",
            "threshold": round(self.threshold, 6),
            "quantile": self.quantile,
            "bank": int(self.bank.shape[0]),
            "fit_states": self.fit_states,
            "max_chars": self.max_chars,
        }


def fit_novelty(
    training: np.ndarray,
    validation: np.ndarray,
    quantile: float,
    k: int = NEIGHBOURS,
    max_bank: int = MAX_BANK,
    seed: int = 0,
    longest: int | None = None,
) -> NoveltyGate:
    """The gate of `training` state vectors (at most `max_bank` of them, drawn at random with `seed`) with its
    threshold at `quantile` of the distances of `validation` (states never in the bank: a state's distance to
    itself would be 0); with `longest` (the most characters of any state fitted on), states over
    `LENGTH_FACTOR` times that are novel too."""
    bank = normalised(training)
    if len(bank) == 0 or len(validation) == 0:
        raise ValueError("the novelty gate needs training and validation state vectors")
    if len(bank) > max_bank:
        bank = bank[np.sort(np.random.default_rng(seed).choice(len(bank), max_bank, replace=False))]
    unfitted = NoveltyGate(bank, np.inf, quantile, k, len(validation))
    threshold = float(np.quantile(unfitted.distances(validation), quantile))
    max_chars = None if longest is None else LENGTH_FACTOR * longest
    return NoveltyGate(bank, threshold, quantile, k, len(validation), max_chars)


def novelty_bytes(gate: NoveltyGate) -> bytes:
    """The gate as the run folder and the export keep it (`novelty.npz`)."""
    buffer = io.BytesIO()
    np.savez(
        buffer,
        bank=gate.bank.astype(np.float32),
        threshold=np.float64(gate.threshold),
        quantile=np.float64(gate.quantile),
        k=np.int64(gate.k),
        fit_states=np.int64(gate.fit_states),
        max_chars=np.int64(-1 if gate.max_chars is None else gate.max_chars),
    )
    return buffer.getvalue()


def read_novelty(data: bytes | None) -> NoveltyGate | None:
    """The gate `novelty_bytes` wrote; None for None (an export made before the gate)."""
    if not data:
        return None
    with np.load(io.BytesIO(data), allow_pickle=False) as saved:
        return NoveltyGate(
            bank=saved["bank"].astype(np.float32),
            threshold=float(saved["threshold"]),
            quantile=float(saved["quantile"]),
            k=int(saved["k"]),
            fit_states=int(saved["fit_states"]),
            max_chars=int(saved["max_chars"]) if int(saved.get("max_chars", -1)) >= 0 else None,
        )
