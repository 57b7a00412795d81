"""The novelty gate (`scoring.novelty`) on synthetic vectors: states near the training states pass, states far
from them (or between their clusters) are flagged, the threshold sits at its quantile, and the gate survives its
file."""

import numpy as np
import pytest

from pipeline.config import CertifyConfig, ConfigError
from pipeline.scoring.novelty import (
    MAX_BANK,
    embeddable,
    fit_novelty,
    normalised,
    novelty_bytes,
    read_novelty,
)

WIDTH = 48


def clustered(rng: np.random.Generator, centres: np.ndarray, n: int, spread: float = 0.15) -> np.ndarray:
    """`n` vectors around randomly chosen `centres` (topic clusters, as sentence vectors fall)."""
    picked = centres[rng.integers(len(centres), size=n)]
    return picked + spread * rng.standard_normal((n, centres.shape[1])) / np.sqrt(centres.shape[1])


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(0)
    centres = normalised(rng.standard_normal((4, WIDTH)))
    gate = fit_novelty(clustered(rng, centres, 3000), clustered(rng, centres, 1000), quantile=0.99)
    return rng, centres, gate


def test_in_scope_states_mostly_pass_and_the_share_flagged_is_about_one_minus_the_quantile(world):
    rng, centres, gate = world
    flagged = gate.novel(clustered(rng, centres, 4000)).mean()
    assert 0.0 < flagged < 0.03, flagged  # 1% expected at quantile 0.99


def test_states_far_from_every_cluster_and_between_clusters_are_flagged(world):
    rng, centres, gate = world
    elsewhere = gate.novel(rng.standard_normal((500, WIDTH)))
    assert elsewhere.mean() > 0.99
    # Midway between two topics: inside one Gaussian around all of them, but near no training state.
    between = normalised((centres[0] + centres[1])[None, :]) + 0.02 * rng.standard_normal((200, WIDTH))
    assert gate.novel(between).mean() > 0.95


def test_a_zero_or_non_finite_vector_is_novel(world):
    _, centres, gate = world
    vectors = np.stack([np.zeros(WIDTH), np.full(WIDTH, np.nan), centres[0]])
    assert gate.novel(vectors).tolist() == [True, True, False]


def test_the_bank_is_subsampled_and_the_threshold_comes_from_the_validation_states_only():
    rng = np.random.default_rng(1)
    training = rng.standard_normal((MAX_BANK + 500, 8))
    gate = fit_novelty(training, rng.standard_normal((300, 8)), quantile=0.9)
    assert gate.bank.shape == (MAX_BANK, 8) and gate.fit_states == 300
    assert np.allclose(np.linalg.norm(gate.bank, axis=1), 1.0, atol=1e-5)
    stricter = fit_novelty(training, rng.standard_normal((300, 8)), quantile=0.5)
    assert stricter.threshold < gate.threshold
    with pytest.raises(ValueError, match="training and validation"):
        fit_novelty(training, np.zeros((0, 8)), quantile=0.9)


def test_the_gate_survives_its_file(world):
    rng, centres, gate = world
    again = read_novelty(novelty_bytes(gate))
    probe = clustered(rng, centres, 50)
    assert np.array_equal(again.distances(probe), gate.distances(probe))
    assert (again.threshold, again.quantile, again.k, again.fit_states) == (
        gate.threshold,
        gate.quantile,
        gate.k,
        gate.fit_states,
    )
    assert read_novelty(None) is None
    assert gate.summary()["bank"] == len(gate.bank) and gate.summary()["quantile"] == 0.99


def test_a_state_far_longer_than_any_fitted_on_is_too_long(world):
    rng, centres, gate = world
    assert gate.max_chars is None and not gate.too_long("x" * 100_000)
    limited = fit_novelty(clustered(rng, centres, 200), clustered(rng, centres, 100), 0.99, longest=300)
    assert limited.max_chars == 600 and limited.too_long("x" * 601) and not limited.too_long("x" * 600)
    assert read_novelty(novelty_bytes(limited)).max_chars == 600


def test_states_without_a_letter_or_digit_are_not_embeddable():
    assert not any(embeddable(state) for state in ("", "  \n\t", ".", "?!", "-", {}, []))
    assert all(embeddable(state) for state in ("late", "5", "été", {"a": 1}, [0]))


@pytest.mark.parametrize("bad", [0.2, 1.0, 1.5])
def test_a_novelty_quantile_outside_its_range_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"certify\.novelty_quantile"):
        CertifyConfig(novelty_quantile=bad)
