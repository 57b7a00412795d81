"""Rows that read the same state, or nearly the same: the split keeps them on one side
(`split.split_holdout`), and evaluation rows whose state a model trained on are counted and said
(`overlap_warning`).

Two rows share a state when their normalised states are equal: a text lower-cased, its punctuation dropped and
its whitespace collapsed ("Yay. Another good day!" and "YAY!! another good day" are one state); any other JSON
value by its canonical text (sorted keys). Two texts are near-duplicates when they hold the same set of words
once each run of digits is masked ("order 1234 arrived late, very late" and "late order 77 arrived very
late"): the sorted word set is a dictionary key, so both checks take one pass over the rows, with no threshold
to tune and no match beyond that rule. A SimHash with banding would also catch a changed word, but at the
price of a similarity threshold, several keys a row, and chance matches that join unrelated rows. A text of
fewer than `NEAR_MIN_WORDS` distinct words gets no near-duplicate key ("late 1" and "late 2" are two rows;
short texts share their words too often), and neither does a JSON state: its numbers are values, not noise.

    normalised_state("Yay. Another good day!") == normalised_state("YAY!! another  good day")   # True
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.data.contract import canonical_json

NEAR_MIN_WORDS = 5
FINGERPRINT = np.dtype("<u8")
"""A state's fingerprint: 64 bits of blake2b over its normalised text, little-endian (as an export's file
holds it)."""
_PUNCTUATION = re.compile(r"[^\w\s]+")
_ASCII_PUNCTUATION = str.maketrans({c: None for c in map(chr, range(128)) if _PUNCTUATION.match(c)})
_DIGITS = re.compile(r"\d+")


def normalised_state(state: Any) -> str:
    """A text lower-cased, punctuation dropped, whitespace collapsed; any other JSON value its canonical
    text."""
    if not isinstance(state, str):
        return canonical_json(state).decode()
    lower = state.lower()
    # The same characters dropped either way; a table is several times faster than the pattern on ASCII text.
    kept = lower.translate(_ASCII_PUNCTUATION) if lower.isascii() else _PUNCTUATION.sub("", lower)
    return " ".join(kept.split())


def near_key(normalised: str) -> frozenset[str] | None:
    """The near-duplicate key of a text's normalised state: the set of its words, each run of digits masked;
    None for a text of fewer than `NEAR_MIN_WORDS` distinct words."""
    words = frozenset(_DIGITS.sub("0", normalised).split())
    return words if len(words) >= NEAR_MIN_WORDS else None


@dataclass(frozen=True)
class StateKeys:
    """A row's normalised state and its near-duplicate key (None: it has none)."""

    state: str
    near: frozenset[str] | None


def state_keys(state: Any) -> StateKeys:
    """A row's normalised state, and for a text its near-duplicate key (a JSON state's numbers are values)."""
    normalised = normalised_state(state)
    return StateKeys(normalised, near_key(normalised) if isinstance(state, str) else None)


@dataclass(frozen=True)
class KeptTogether:
    """Rows the split kept on one side with another row: sharing its normalised state, or (of another state)
    its near-duplicate key."""

    shared_state_rows: int = 0
    near_duplicate_rows: int = 0

    @staticmethod
    def count(keys: list[StateKeys]) -> KeptTogether:
        states = Counter(k.state for k in keys)
        near_states: dict[frozenset[str], set[str]] = defaultdict(set)
        for k in keys:
            if k.near is not None:
                near_states[k.near].add(k.state)
        shared = sum(n for n in states.values() if n > 1)
        near = sum(states[state] for found in near_states.values() if len(found) > 1 for state in found)
        return KeptTogether(shared, near)

    def describe(self) -> str:
        """`; kept on one side: N rows sharing a state, M near-duplicates` ("" when there are none)."""
        if not (self.shared_state_rows or self.near_duplicate_rows):
            return ""
        shared, near = self.shared_state_rows, self.near_duplicate_rows
        return f"; kept on one side: {shared:,} rows sharing a state, {near:,} near-duplicates"


def state_fingerprints(states: Iterable[Any]) -> np.ndarray:
    """The sorted, distinct 64-bit fingerprints (blake2b) of these states' normalised text: what an export
    keeps of the states it trained on (`exporting.TRAINING_STATES`), never the states themselves."""
    return np.unique(state_fingerprints_of(states))


def overlapping(states: Iterable[Any], fingerprints: np.ndarray) -> int:
    """How many of `states` have a normalised state among `fingerprints` (`state_fingerprints`)."""
    return int(np.isin(state_fingerprints_of(states), fingerprints).sum())


def state_fingerprints_of(states: Iterable[Any]) -> np.ndarray:
    """Each state's fingerprint, in order (repeats kept)."""
    return np.array([_fingerprint(normalised_state(state)) for state in states], dtype=FINGERPRINT)


def overlap_warning(overlap: int | None, rows: int) -> str | None:
    """The one wording of the warning that evaluation rows repeat training states (None when none do, or
    nothing was checked)."""
    if not overlap:
        return None
    return (
        f"warning: {overlap:,} of {rows:,} evaluation rows have a state (case, punctuation and spacing "
        "aside) that the model trained on; their figures measure recall of training rows, not how it does "
        "on new states"
    )


def _fingerprint(normalised: str) -> int:
    return int.from_bytes(hashlib.blake2b(normalised.encode(), digest_size=8).digest(), "little")
