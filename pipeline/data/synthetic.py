"""A small synthetic decision-row generator for tests and benchmarks.

Clean rows carry all three question types with hard and soft gold; `broken_rows()` gives one row per reason
code, each with the exact skip it must produce. Rows are plain dicts; `write_rows` writes JSONL, Parquet
(JSON text cells, row groups) or CSV.

    python -m pipeline.data.synthetic out.jsonl --rows 1000 --broken-every 10
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

_WORDS = [
    "the",
    "order",
    "arrived",
    "late",
    "and",
    "the",
    "box",
    "was",
    "damaged",
    "but",
    "support",
    "replied",
    "quickly",
    "with",
    "a",
    "refund",
    "offer",
    "great",
    "product",
    "works",
    "as",
    "described",
    "would",
    "buy",
    "again",
    "terrible",
    "battery",
    "life",
    "screen",
    "flickers",
    "at",
    "night",
    "delivery",
    "was",
    "fine",
    "neutral",
    "experience",
    "overall",
    "price",
    "is",
    "fair",
    "quality",
    "could",
    "be",
    "better",
]
TONES = ("negative", "neutral", "positive")
INTENSITY_LEGEND = ("none", "mild", "moderate", "strong", "extreme")


def clean_row(rng: random.Random, state_chars: int = 120) -> dict[str, Any]:
    """A valid row: a text state and one question of each type, with hard and soft gold mixed."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < state_chars:
        words.append(rng.choice(_WORDS))
    tone = rng.randrange(3)
    level = rng.randrange(len(INTENSITY_LEGEND))
    soft = [rng.random() for _ in TONES]
    total = sum(soft)
    questions = {
        "tone": {"type": "choice", "instructions": "What is the tone?", "criteria": {t: None for t in TONES}},
        "intensity": {"type": "score", "instructions": "How intense?", "criteria": list(INTENSITY_LEGEND)},
        "is_negative": {"type": "noul", "instructions": "The text is negative.", "criteria": None},
    }
    gold = {
        "tone": {"label": TONES[tone], "probabilities": {t: p / total for t, p in zip(TONES, soft)}}
        if rng.random() < 0.5
        else TONES[tone],
        "intensity": level,
        "is_negative": {"noul": round(rng.random(), 3)} if rng.random() < 0.5 else tone == 0,
    }
    return {"state": " ".join(words)[:state_chars], "questions": questions, "gold": gold}


def broken_rows() -> list[tuple[dict[str, Any], str, int]]:
    """(row, reason, decisions it accounts for): one deliberately broken row per reason code."""
    q = {"type": "choice", "instructions": "Pick", "criteria": ["a", "b"]}
    long_text = "x" * 200_001
    return [
        ({"state": "s", "questions": "{not json", "gold": {}}, "invalid_json", 1),
        ({"state": None, "questions": {"q": q}, "gold": {"q": "a"}}, "missing_state", 1),
        ({"state": "s", "questions": {}, "gold": {"q": "a"}}, "missing_questions", 1),
        ({"state": "s", "questions": {"q": q, "r": q}}, "missing_gold", 2),
        ({"state": "s", "questions": {f"q{i}": q for i in range(65)}, "gold": {}}, "too_many_questions", 65),
        ({"state": "s", "questions": {"q": "just a string"}, "gold": {"q": "a"}}, "bad_question", 1),
        (
            {"state": "s", "questions": {"q": {**q, "type": "rank"}}, "gold": {"q": "a"}},
            "unknown_question_type",
            1,
        ),
        ({"state": "s", "questions": {"q": {**q, "criteria": 7}}, "gold": {"q": "a"}}, "bad_criteria", 1),
        (
            {
                "state": "s",
                "questions": {"q": {**q, "criteria": [str(i) for i in range(256)]}},
                "gold": {"q": "1"},
            },
            "too_many_options",
            1,
        ),
        (
            {"state": "s", "questions": {"q": {**q, "criteria": ["a", "a"]}}, "gold": {"q": "a"}},
            "repeated_options",
            1,
        ),
        ({"state": long_text, "questions": {"q": q}, "gold": {"q": "a"}}, "too_long", 1),
        ({"state": "s", "questions": {"q": q, "r": q}, "gold": {"q": "a"}}, "no_gold_for_question", 1),
        ({"state": "s", "questions": {"q": q}, "gold": {"q": "c"}}, "gold_label_not_an_option", 1),
        (
            {
                "state": "s",
                "questions": {"q": q},
                "gold": {"q": {"label": "a", "probabilities": {"a": 0.9, "b": 0.9}}},
            },
            "gold_probabilities_invalid",
            1,
        ),
    ]


def generate_rows(
    n: int, seed: int = 0, broken_every: int = 0, state_chars: int = 120
) -> list[dict[str, Any]]:
    """`n` rows; with `broken_every=k`, every k-th row is a broken one (cycling through the reason codes)."""
    rng = random.Random(seed)
    broken = [row for row, _, _ in broken_rows()]
    return [
        broken[(i // broken_every) % len(broken)]
        if broken_every and i % broken_every == broken_every - 1
        else clean_row(rng, state_chars)
        for i in range(n)
    ]


def _as_text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.startswith("{not")):
        return value
    return orjson.dumps(value).decode()


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as an Arrow table of JSON text cells (state stays plain text when it is a string)."""
    return pa.table(
        {
            "state": [
                r.get("state") if isinstance(r.get("state"), str | None) else _as_text(r["state"])
                for r in rows
            ],
            "questions": [
                r.get("questions") if isinstance(r.get("questions"), str) else _as_text(r.get("questions"))
                for r in rows
            ],
            "gold": [_as_text(r.get("gold")) for r in rows],
        }
    )


def write_rows(rows: list[dict[str, Any]], path: str | Path, row_group_size: int = 10_000) -> Path:
    """Write rows as JSONL, Parquet or CSV, chosen by the suffix of `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("wb") as handle:
            for row in rows:
                handle.write(orjson.dumps(row) + b"\n")
    elif path.suffix == ".parquet":
        pq.write_table(rows_to_table(rows), path, row_group_size=row_group_size)
    elif path.suffix == ".csv":
        pa_csv.write_csv(rows_to_table(rows), path)
    else:
        raise ValueError(f"{path}: choose .jsonl, .parquet or .csv")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="output file (.jsonl, .parquet or .csv)")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--broken-every", type=int, default=0, help="make every k-th row a broken one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_rows(generate_rows(args.rows, args.seed, args.broken_every), args.out)


if __name__ == "__main__":
    main()
