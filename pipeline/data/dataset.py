"""Build the embedded VADER dataset: decision rows from the VADER sentiment ground truth.

Source: Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for Sentiment Analysis of
Social Media Text. ICWSM-14. MIT licence. 23,703 sentences from tweets, movie reviews, NYT editorials and
product reviews, each rated -4..+4 by 15-29 people; the raw ratings give soft consensus labels.

Each row asks four questions of one sentence: `tone` (choice), `is_negative` and `is_positive` (noul) and
`intensity` (score 0..4), with gold soft probabilities from the raters and the majority label.

    dvc repro dataset        # or: python -m pipeline.stages.dvc dataset
"""

from __future__ import annotations

import hashlib
import html
import io
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.config import DatasetConfig

SOURCES = ("tweets", "movieReviewSnippets", "nytEditorialSnippets", "amazonReviewSnippets")
INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
TONES = ("negative", "neutral", "positive")
INTENSITY_LEGEND = (
    "no sentiment",
    "slight sentiment",
    "moderate sentiment",
    "strong sentiment",
    "extreme sentiment",
)
QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "What is the overall sentiment of the text?",
        "criteria": {
            "negative": "the text expresses a negative feeling or judgement",
            "neutral": "the text expresses no clear feeling either way",
            "positive": "the text expresses a positive feeling or judgement",
        },
    },
    "is_negative": {
        "type": "noul",
        "instructions": "The text expresses a negative sentiment.",
        "criteria": None,
    },
    "is_positive": {
        "type": "noul",
        "instructions": "The text expresses a positive sentiment.",
        "criteria": None,
    },
    "intensity": {
        "type": "score",
        "instructions": "How strong is the sentiment expressed, whatever its direction?",
        "criteria": list(INTENSITY_LEGEND),
    },
}
CITATION = (
    "Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for Sentiment Analysis of "
    "Social Media Text. Eighth International Conference on Weblogs and Social Media (ICWSM-14)."
)


class ArchiveMismatch(ValueError):
    """The source archive's bytes are not the pinned ones."""


@dataclass(frozen=True)
class DatasetResult:
    """What the dataset stage built."""

    out: str
    rows: int
    duplicates_removed: int
    by_source: dict[str, int]
    sha256: str


def verify_archive(path: Path, sha256: str) -> bytes:
    """The archive's bytes, after checking their sha256 against the pin."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the VADER source archive is missing; fetch it with "
            f"`pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d {path.parent}`"
        )
    data = path.read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise ArchiveMismatch(f"{path}: sha256 {found} differs from the pinned {sha256}; refusing to use it")
    return data


def read_ground_truth(archive_bytes: bytes) -> dict[str, list[tuple[str, str, list[int]]]]:
    """Per source: (id, text, raw ratings) in file order, from the nested ground-truth archive."""
    with tarfile.open(fileobj=io.BytesIO(archive_bytes)) as sdist:
        inner = sdist.extractfile(INNER_ARCHIVE).read()
    with tarfile.open(fileobj=io.BytesIO(inner)) as truth:
        members = {Path(m.name).name: m for m in truth.getmembers() if m.isfile()}
        read = lambda name: truth.extractfile(members[name]).read().decode("utf-8-sig")  # noqa: E731
        return {
            source: _join(read(f"{source}_GroundTruth.txt"), read(f"{source}_anonDataRatings.txt"))
            for source in SOURCES
        }


def _join(ground_truth: str, ratings: str) -> list[tuple[str, str, list[int]]]:
    raw = {}
    for line in ratings.splitlines():
        parts = line.strip("\ufeff").split("\t")
        if len(parts) >= 4:
            raw[parts[0].strip()] = orjson.loads(parts[3])
    joined = []
    for line in ground_truth.splitlines():
        parts = line.strip("\ufeff").split("\t")
        if len(parts) >= 3 and parts[0].strip() in raw:
            joined.append((parts[0].strip(), "\t".join(parts[2:]), raw[parts[0].strip()]))
    return joined


def decision_row(source: str, sentence_id: str, text: str, ratings: list[int]) -> dict[str, Any]:
    """One decision row: four questions, gold from the raters' -4..+4 ratings."""
    n = len(ratings)
    tone_counts = Counter(TONES[(r > 0) - (r < 0) + 1] for r in ratings)
    tone = {t: tone_counts[t] / n for t in TONES}
    intensity = [sum(abs(r) == level for r in ratings) / n for level in range(len(INTENSITY_LEGEND))]
    mean = sum(ratings) / n
    p_negative, p_positive = tone["negative"], tone["positive"]
    return {
        "id": f"{source}/{sentence_id}",
        "source": source,
        "state": text,
        "questions": QUESTIONS,
        "gold": {
            "tone": {"label": _majority(tone, mean), "probabilities": tone},
            "is_negative": _noul_gold(p_negative),
            "is_positive": _noul_gold(p_positive),
            # Keyed by level, as other Laya-layout tools read soft score targets.
            "intensity": {
                "label": max(range(len(intensity)), key=intensity.__getitem__),
                "probabilities": {str(level): p for level, p in enumerate(intensity)},
            },
        },
        "mean_rating": round(mean, 4),
    }


def _noul_gold(p_true: float) -> dict[str, Any]:
    # `noul` is P(true) (docs/data-format.md); `probabilities` repeats it in the form other Laya-layout tools
    # read.
    return {
        "label": "true" if p_true > 0.5 else "false",
        "noul": p_true,
        "probabilities": {"false": 1.0 - p_true, "true": p_true},
    }


def _majority(tone: dict[str, float], mean: float) -> str:
    best = max(tone.values())
    tied = [t for t in TONES if tone[t] == best]
    if len(tied) == 1:
        return tied[0]
    by_mean = TONES[(mean > 0) - (mean < 0) + 1]  # a tie between raters goes to the side of the mean rating
    return by_mean if by_mean in tied else "neutral"


def _unescape(text: str) -> str:
    # A few NYT snippets were escaped twice at the source ("&amp;amp;"): unescape until nothing changes.
    for _ in range(3):
        unescaped = html.unescape(text)
        if unescaped == text:
            break
        text = unescaped
    return text


def build_rows(archive_bytes: bytes) -> tuple[list[dict[str, Any]], int]:
    """All rows in source and file order, HTML entities unescaped, later duplicates of a text dropped."""
    rows, seen, duplicates = [], set(), 0
    for source, items in read_ground_truth(archive_bytes).items():
        for sentence_id, raw_text, ratings in items:
            text = " ".join(_unescape(raw_text).split())
            if not text or not ratings:
                continue
            if text.casefold() in seen:
                duplicates += 1
                continue
            seen.add(text.casefold())
            rows.append(decision_row(source, sentence_id, text, ratings))
    return rows, duplicates


def build_dataset(config: DatasetConfig, root: Path = Path(".")) -> DatasetResult:
    """The `dataset` stage: verify the archive, build the rows, write them as JSONL (byte-for-byte
    reproducible)."""
    rows, duplicates = build_rows(verify_archive(root / config.archive, config.archive_sha256))
    payload = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    out = root / config.out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(out.name + ".partial")
    staging.write_bytes(payload)
    staging.replace(out)  # never leave a half-written dataset where DVC would pin it
    by_source = dict(Counter(row["source"] for row in rows))
    return DatasetResult(
        str(config.out), len(rows), duplicates, by_source, hashlib.sha256(payload).hexdigest()
    )
