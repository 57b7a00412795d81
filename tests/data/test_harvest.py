"""Harvest: feedback joined to logged decisions becomes one new pinned shard of a data set (no row twice, no half
shard, one harvest at a time), and the review queue lists the least sure unlabelled answers."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import ValidateConfig
from pipeline.data.pins import data_revision
from pipeline.data.sources import open_source
from pipeline.data.split import TrainSource, read_ledger, split_holdout
from pipeline.flywheel.harvest import HarvestRefused, harvest_lock
from pipeline.flywheel.review import UnknownModel, review_queue, write_queue
from pipeline.flywheel.table import new_decision_id, open_store, utc_now
from pipeline.stages.harvest import harvest
from pipeline.stages.validate import validate_stage
from tests.api.conftest import QUESTIONS

TONES = ("negative", "neutral", "positive")


def answer(p_negative: float) -> dict:
    rest = (1 - p_negative) / 2
    probabilities = {"negative": p_negative, "neutral": rest, "positive": rest}
    return {
        "tone": {
            "type": "choice",
            "choice": max(probabilities, key=probabilities.get),
            "probabilities": probabilities,
            "confidence": 0.0,
            "x_top_probability": max(probabilities.values()),
        },
        "positive": {"type": "noul", "noul": 1 - p_negative, "x_confidence": max(p_negative, 1 - p_negative)},
    }


def log_decisions(store, n: int, model="tickets/1", owner="alice") -> list[str]:
    ids = [new_decision_id() for _ in range(n)]
    questions = {"tone": QUESTIONS["tone"], "positive": QUESTIONS["positive"]}
    store.append(
        "decisions",
        [
            {
                "decision_id": i,
                "time": utc_now(),
                "model": model,
                "model_version": model.split("/")[-1],
                "owner": owner,
                "state": json.dumps({"text": f"ticket {k} was late", "n": k}),
                "questions": json.dumps(questions),
                "answers": json.dumps(answer(0.34 + 0.6 * k / max(n, 1))),
                "latency_ms": 3.0,
            }
            for k, i in enumerate(ids)
        ],
    )
    return ids


def label(store, ids, gold=None) -> None:
    store.append(
        "feedback",
        [
            {
                "decision_id": i,
                "question_id": "tone",
                "gold": json.dumps(gold or TONES[k % 3]),
                "labelled_by": "alice",
                "time": utc_now(),
            }
            for k, i in enumerate(ids)
        ],
    )


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A git + DVC project with a data set of 60 rows in one Parquet shard, pinned."""
    monkeypatch.chdir(tmp_path)
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@t"],
        ["git", "config", "user.name", "t"],
        [sys.executable, "-m", "dvc", "init", "-q"],
    ):
        subprocess.run(command, check=True, capture_output=True)
    folder = tmp_path / "data" / "tickets"
    folder.mkdir(parents=True)
    rows = [
        {
            "state": json.dumps({"text": f"old ticket {k}"}),
            "questions": json.dumps({"tone": QUESTIONS["tone"]}),
            "gold": json.dumps({"tone": TONES[k % 3]}),
        }
        for k in range(60)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "part-0000.parquet")
    subprocess.run(
        [sys.executable, "-m", "dvc", "add", "-q", "data/tickets"], check=True, capture_output=True
    )
    return folder


def test_labelled_decisions_become_one_new_pinned_and_committed_shard(project, tmp_path):
    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 30)
    label(store, ids[:20])
    label(store, [ids[20]], gold="furious")  # not an option: counted by reason, never written
    before = data_revision(project)
    result = harvest(str(tmp_path / "inference"), project, ValidateConfig())
    assert result.rows == 20 and result.labels == 20
    assert result.skipped == {"gold_label_not_an_option": 1}
    assert result.previous_revision == before and result.revision == data_revision(project) != before
    assert result.models == ("tickets/1",) and result.first_decision <= result.last_decision
    shard = pq.read_table(result.shard)
    assert set(shard["decision_id"].to_pylist()) == set(ids[:20])
    assert open_source(project).fmt == "parquet"  # the provenance columns do not break the shards' one schema
    log = subprocess.run(
        ["git", "log", "--format=%s", "--", "data/tickets.dvc"], capture_output=True, text=True
    )
    assert log.stdout.startswith("harvest: 20 labelled decisions") and result.committed
    split = TrainSource(str(project), split_config=ValidateConfig()).validated().split
    assert sum(len(r.decisions) for r in split.every_record()) == 80  # 60 old rows + 20 harvested, each once
    harvested_heldout = [r for r in split.heldout if isinstance(r.state, dict) and "n" in r.state]
    assert result.heldout == len(harvested_heldout)


def test_rows_held_out_before_a_harvest_stay_held_out_and_the_harvested_ones_join_the_committed_ledger(
    project, tmp_path
):
    config = ValidateConfig(holdout_max_decisions=6, holdout_fraction=0.5)  # the cap binds
    # What the retrain flow's validate task runs: it records the rows it holds out.
    before = validate_stage(str(project), config)
    ledger = project.parent / "tickets.holdout-ledger.txt"  # beside the pinned folder, never inside it
    held_before = read_ledger(ledger)
    assert before.newly_held_out == before.split["heldout_rows"] == len(held_before) == 6
    revision = data_revision(project)
    assert validate_stage(str(project), config).newly_held_out == 0 and data_revision(project) == revision

    store = open_store(tmp_path / "inference")
    label(store, log_decisions(store, 40))
    result = harvest(str(tmp_path / "inference"), project, config)
    records = TrainSource(str(project), split_config=config).validated().split
    held_after = {r.content_hash() for r in records.heldout}
    assert held_before <= held_after  # the flow's next split keeps them out of training
    harvested = {r.content_hash() for r in records.heldout if "n" in r.state}
    assert len(harvested) == result.heldout and harvested <= read_ledger(ledger)
    assert result.ledger == str(ledger)
    # Without the ledger the new rows, hashing lower, would have pushed rows held out before into training.
    assert held_before - {r.content_hash() for r in split_holdout(records.every_record(), config).heldout}
    log = subprocess.run(
        ["git", "log", "--format=%s", "--", "data/tickets.holdout-ledger.txt"], capture_output=True, text=True
    )
    assert log.stdout.startswith("harvest: 40 labelled decisions")


def test_a_second_harvest_takes_only_what_is_new(project, tmp_path):
    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 10)
    label(store, ids[:4])
    first = harvest(str(tmp_path / "inference"), project, ValidateConfig())
    again = harvest(str(tmp_path / "inference"), project, ValidateConfig())
    assert first.rows == 4 and again.rows == 0 and again.already_harvested == 4
    assert again.revision is None and "nothing new" in again.line()
    label(store, ids[4:7])
    third = harvest(str(tmp_path / "inference"), project, ValidateConfig())
    assert third.rows == 3 and third.previous_revision == first.revision
    harvested = [
        i
        for s in open_source(project).shards
        if s.path.name.startswith("harvest-")
        for i in pq.read_table(s.path, columns=["decision_id"]).column(0).to_pylist()
    ]
    assert sorted(harvested) == sorted(ids[:7])  # no row twice


def test_only_the_runs_model_is_harvested_and_what_is_left_out_is_said(project, tmp_path):
    store = open_store(tmp_path / "inference")
    ours = log_decisions(store, 4, model="tickets/1")
    label(store, ours + log_decisions(store, 3, model="reviews/2"))  # another run's traffic in the shared log
    first = harvest(str(tmp_path / "inference"), project, ValidateConfig(), model="tickets")
    assert first.rows == 4 and first.models == ("tickets/1",) and first.other_models == {"reviews": 3}
    assert "left out: labelled decisions of other models: reviews (3)" in first.line()
    # A label sent after its decision was harvested (a correction, another question) is in no row: said so.
    label(store, ours[:1], gold="positive" if TONES[0] != "positive" else "negative")
    again = harvest(str(tmp_path / "inference"), project, ValidateConfig(), model="tickets")
    assert again.rows == 0 and again.late_labels == 1
    assert "left out: 1 label(s) given after their decision was harvested" in again.line()
    every_model = harvest(str(tmp_path / "inference"), project, ValidateConfig())  # model None: reviews' too
    assert every_model.rows == 3


def test_harvest_refuses_an_inference_log_that_is_not_there(project, tmp_path, capsys, monkeypatch):
    from pipeline.cli.main import main

    (project.parent.parent / "params.yaml").write_text("retrain:\n  data: data/tickets\n")
    monkeypatch.chdir(project.parent.parent)
    assert main(["harvest", "--inference", str(tmp_path / "no-such-log")]) == 2  # before any flow run
    [said] = capsys.readouterr().err.strip().splitlines()
    assert said.startswith(f"decision harvest: {tmp_path / 'no-such-log'}: no inference log there")


def test_a_jsonl_data_set_gets_a_jsonl_shard(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "a.jsonl").write_text(
        json.dumps({"state": "x", "questions": {"tone": QUESTIONS["tone"]}, "gold": {"tone": "negative"}})
        + "\n"
    )
    store = open_store(tmp_path / "inference")
    label(store, log_decisions(store, 3))
    result = harvest(str(tmp_path / "inference"), folder, ValidateConfig(), commit=False)
    lines = [json.loads(line) for line in Path(result.shard).read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["state"]["text"].startswith("ticket") and lines[0]["decision_id"]
    assert (
        result.pinned_by is None and result.revision
    )  # outside any DVC project: revision computed, not pinned


def test_a_data_set_that_is_one_file_is_refused_saying_what_to_do(tmp_path):
    single = tmp_path / "rows.jsonl"
    single.write_text("{}\n")
    with pytest.raises(HarvestRefused, match="move it into a folder"):
        harvest(str(tmp_path / "inference"), single, ValidateConfig())


def test_a_data_set_that_does_not_exist_is_refused_and_nothing_is_made(tmp_path):
    missing = tmp_path / "no" / "rows"
    with pytest.raises(HarvestRefused, match="no such folder"):
        harvest(str(tmp_path / "inference"), missing, ValidateConfig())
    assert list(tmp_path.iterdir()) == []  # not even the lock beside it


def test_two_harvests_of_one_data_set_never_interleave(tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    order = []

    def hold():
        with harvest_lock(folder):
            order.append("first in")
            time.sleep(0.5)
            order.append("first out")

    worker = threading.Thread(target=hold)
    worker.start()
    time.sleep(0.1)
    with pytest.raises(HarvestRefused, match="another harvest"), harvest_lock(folder, wait=False):
        pass
    with harvest_lock(folder):
        order.append("second in")
    worker.join()
    assert order == ["first in", "first out", "second in"]


def test_the_review_queue_lists_the_least_sure_unlabelled_answers_and_reads_back(tmp_path):
    from pipeline.flywheel.feedback import read_feedback_file

    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 20)  # decision k answers tone with P(negative) rising with k: least sure first
    label(store, ids[:2])
    queue = review_queue(store, "tickets", top=4)
    # decision k: P(negative) = p = 0.34 + 0.03 k; tone's margin p - (1 - p) / 2, the noul's |1 - 2p|
    margins = {(k, "tone"): abs(1.5 * (0.34 + 0.03 * k) - 0.5) for k in range(2, 20)}  # 0, 1: tone labelled
    margins |= {(k, "positive"): abs(1 - 2 * (0.34 + 0.03 * k)) for k in range(20)}
    expected = [(ids[k], q) for k, q in sorted(margins, key=margins.get)[:4]]
    assert [(it.decision_id, it.question) for it in queue] == expected
    assert expected[0] == (ids[5], "positive")  # p = 0.49: the nearest to a coin toss
    with pytest.raises(UnknownModel, match="the log holds tickets"):  # a typo is not "nothing to label"
        review_queue(store, "other-model", top=5)
    out = write_queue(queue, tmp_path / "review.csv")
    text = out.read_text().splitlines()
    assert text[0].split(",")[-1] == "label" and len(text) == 5
    assert read_feedback_file(out) == []  # nothing labelled yet
    labelled = out.read_text().replace("\r\n", "\n").splitlines()
    labelled[1] = labelled[1] + "negative" if queue[0].question == "tone" else labelled[1] + "true"
    out.write_text("\n".join(labelled) + "\n")
    (item,) = read_feedback_file(out)
    assert item["decision_id"] == queue[0].decision_id


def test_automated_answers_the_feedback_says_were_wrong_come_first(tmp_path, capsys):
    """Four sure tone answers the server automated (`x_automate`): two labelled with another option come first,
    with their feedback; one labelled right is not listed; the unlabelled one takes its place by margin. A
    wrong answer that was not automated is not listed (labelled: nothing to do)."""
    from pipeline.cli.main import main
    from pipeline.flywheel.feedback import read_feedback_file

    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 10)
    sure = [new_decision_id() for _ in range(5)]
    questions = json.dumps({"tone": QUESTIONS["tone"], "positive": QUESTIONS["positive"]})
    logged = []
    for k, decision_id in enumerate(sure):
        answers = answer(0.96)
        answers["tone"]["x_automate"] = k < 4  # the fifth: sure, but not automated
        logged.append(
            {
                "decision_id": decision_id,
                "time": utc_now(),
                "model": "tickets/1",
                "model_version": "1",
                "owner": "alice",
                "state": json.dumps({"text": f"sure {k}"}),
                "questions": questions,
                "answers": json.dumps(answers),
                "latency_ms": 3.0,
            }
        )
    store.append("decisions", logged)
    label(store, [sure[0], sure[1], sure[4]], gold="neutral")  # the model said negative: wrong
    label(store, [sure[2]], gold="negative")  # right
    queue = review_queue(store, "tickets", top=40)
    assert [(it.decision_id, it.question, it.automated) for it in queue[:2]] == [
        (sure[0], "tone", True),
        (sure[1], "tone", True),
    ]
    assert queue[0].feedback == '"neutral"' and queue[0].automated_wrong and not queue[2].automated_wrong
    listed = {(it.decision_id, it.question) for it in queue}
    assert (sure[2], "tone") not in listed and (sure[4], "tone") not in listed and (sure[3], "tone") in listed
    assert next(it for it in queue if it.decision_id == sure[3] and it.question == "tone").automated
    assert len(queue) == 2 + 2 * 10 + 5 + 1  # the wrong two, every unlabelled answer
    out = tmp_path / "review.csv"
    inference = ["--inference", str(tmp_path / "inference")]
    assert main(["review", "--model", "tickets", "--top", "5", "--out", str(out), *inference]) == 0
    assert "first 2 automated but wrong by their feedback" in capsys.readouterr().out
    assert read_feedback_file(out) == []  # their feedback is shown, not imported again unless relabelled
    assert main(["review", "--model", "tickets", "--out", str(out), "--overwrite", *inference, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["automated_wrong"] == 2
    assert ids  # the ten ordinary decisions, all unlabelled


def test_conformal_sets_appear_once_enough_answers_are_labelled(tmp_path):
    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 80)
    assert review_queue(store, "tickets", top=3)[0].set_size is None
    label(store, ids[:40], gold="negative")
    sized = review_queue(store, "tickets", top=80, order="set_size")
    assert sized[0].set_size is not None and sized[0].set_size >= sized[-1].set_size


def test_a_harvest_killed_mid_write_leaves_the_data_set_as_it_was(project, tmp_path, monkeypatch):
    import pipeline.flywheel.harvest as harvesting

    store = open_store(tmp_path / "inference")
    label(store, log_decisions(store, 5))
    before = data_revision(project)

    def killed(*args):
        raise KeyboardInterrupt  # what SIGINT does between writing the staged shard and renaming it in

    monkeypatch.setattr(harvesting.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        harvest(str(tmp_path / "inference"), project, ValidateConfig())
    assert data_revision(project) == before
    assert sorted(p.name for p in project.iterdir()) == ["part-0000.parquet"]
    assert not [p for p in project.parent.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert (
        harvest(str(tmp_path / "inference"), project, ValidateConfig()).rows == 5
    )  # the rerun takes them all


def test_the_review_and_import_commands_round_trip_a_labelled_file(tmp_path, capsys):
    from pipeline.cli.main import main

    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 6)
    out = tmp_path / "review.jsonl"
    inference = ["--inference", str(tmp_path / "inference")]
    assert main(["review", "--model", "tickets", "--top", "3", "--out", str(out), *inference]) == 0
    assert "decision feedback import" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["label"] == "" and r["decision_id"] in ids for r in rows)
    for row in rows:
        row["label"] = "true" if row["question"] == "positive" else "negative"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["feedback", "import", str(out), *inference, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stored"] == 3
    labelled = {(r["decision_id"], r["question_id"]) for r in store.feedback().to_pylist()}
    assert labelled == {(r["decision_id"], r["question"]) for r in rows}
    assert all(r["labelled_by"] == "import" for r in store.feedback().to_pylist())
    rows[0]["label"] = "furious"
    out.write_text(json.dumps(rows[0]) + "\n")
    assert main(["feedback", "import", str(out), *inference]) == 2  # nothing stored, the problem named
    assert "is not an option" in capsys.readouterr().err
    assert main(["feedback", "import", str(tmp_path / "missing.csv"), *inference]) == 2
    assert main(["review", "--model", "tickts", "--out", str(tmp_path / "typo.csv"), *inference]) == 2
    assert "tickts: no logged decision of this model; the log holds tickets" in capsys.readouterr().err
    # A second queue never replaces one that may hold labels, unless asked to.
    labelled = out.read_text()
    assert main(["review", "--model", "tickets", "--top", "3", "--out", str(out), *inference]) == 2
    assert "labels in it would be lost" in capsys.readouterr().err and out.read_text() == labelled
    assert main(["review", "--model", "tickets", "--out", str(out), "--overwrite", *inference, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said == {
        "model": "tickets",
        "answers": len(out.read_text().splitlines()),
        "out": str(out),
        "order": "margin",
        "conformal_sets": False,
        "alpha": 0.1,
        "automated_wrong": 0,
    }
    for where, said in (
        (tmp_path, "a .jsonl or .csv"),
        (tmp_path / "queue.txt", "a .jsonl or .csv"),
        (tmp_path / "sub.csv", "a folder"),
        (Path("/proc/queue.csv"), "no folder can be made"),
    ):
        (tmp_path / "sub.csv").mkdir(exist_ok=True)
        assert main(["review", "--model", "tickets", "--out", str(where), *inference]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


def test_an_inference_database_that_cannot_be_reached_is_one_line(tmp_path, capsys):
    from pipeline.cli.main import main

    labels = tmp_path / "labels.csv"
    labels.write_text("decision_id,question,label\nabc,tone,negative\n")
    database = ["--inference", "postgresql://someone:secret@127.0.0.1:1/nothing"]
    for command in (
        ["feedback", "import", str(labels)],
        ["review", "--model", "m", "--out", str(tmp_path / "q.csv")],
    ):
        assert main([*command, *database]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "127.0.0.1:1/nothing: the inference database cannot be used" in err[0], err
        assert "secret" not in err[0]


def test_a_labelled_csv_is_refused_at_its_lines_and_its_cells_read_as_a_tables(tmp_path, capsys):
    from pipeline.cli.main import main

    store = open_store(tmp_path / "inference")
    ids = log_decisions(store, 3)
    inference = ["--inference", str(tmp_path / "inference")]
    labelled = tmp_path / "labels.csv"
    rows = [
        (ids[0], "tone", "negative"),
        (ids[0], "positive", " true "),
        (ids[1], "tone", "furious"),
        (ids[2], "positive", "maybe"),
    ]
    write_labels(labelled, rows)
    assert main(["feedback", "import", str(labelled), *inference]) == 2
    said = capsys.readouterr().err
    # The file's lines, not the positions of its rows grouped by decision.
    assert "line 4, question 'tone': 'furious' is not an option of 'tone'" in said
    assert "line 5, question 'positive': 'maybe' is not an option" in said and "body." not in said
    # Item lines ({decision_id, gold}) are named by their lines too (they said body.0), beside flat rows.
    items = tmp_path / "items.jsonl"
    items.write_text(
        json.dumps({"decision_id": ids[1], "question": "tone", "label": "negative"})
        + "\n\n"
        + json.dumps({"decision_id": ids[2], "gold": {"tone": "furious"}})
        + "\n"
        + json.dumps({"decision_id": "nope", "gold": {"tone": "negative"}})
        + "\n"
    )
    assert main(["feedback", "import", str(items), *inference]) == 2
    said = capsys.readouterr().err
    assert "line 3, question 'tone': 'furious' is not an option of 'tone'" in said
    assert "line 4: no logged decision 'nope'" in said and "body." not in said and "(4" not in said
    write_labels(labelled, rows[:2])  # " true " is true, as a table reads it
    assert main(["feedback", "import", str(labelled), *inference]) == 0
    assert {r["question_id"]: json.loads(r["gold"]) for r in store.feedback().to_pylist()} == {
        "tone": "negative",
        "positive": "true",
    }


def write_labels(path, rows) -> None:
    path.write_text("decision_id,question,label\n" + "".join(f"{d},{q},{label}\n" for d, q, label in rows))


@pytest.mark.parametrize(
    ("content", "name", "said"),
    [
        (b'[1, 2]\n"x"\n', "labels.jsonl", "line 1 is JSON list, not an object"),
        (b"\xff\xfe\x00bad", "labels.csv", "not UTF-8 text (byte 0); save it as UTF-8"),
        (None, "labels", "a folder; give the labelled .jsonl or .csv file"),
        (None, "missing.csv", "no such file"),
    ],
)
def test_a_labelled_file_that_cannot_be_read_is_one_line_and_exit_2(content, name, said, tmp_path, capsys):
    # Lines of JSON that were no objects gave an AttributeError traceback.
    from pipeline.cli.main import main

    log_decisions(open_store(tmp_path / "inference"), 1)
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    elif name == "labels":
        path.mkdir()
    assert main(["feedback", "import", str(path), "--inference", str(tmp_path / "inference")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"decision feedback import: {path}: {said}" or said in line, line
