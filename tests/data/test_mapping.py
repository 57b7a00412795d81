"""A mapping turns a plain table into decision rows: state columns, questions from label columns, options
given or found; and bad mappings are refused with one line naming the thing (exit 2 from the CLI)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli.main import main
from pipeline.config import ConfigError, ValidateConfig, load_params
from pipeline.data.mapping import (
    MappingError,
    flags_mapping,
    load_mapping,
    mapping_from_dict,
    read_mapped,
    write_rows,
)
from pipeline.data.read import RowSlice
from pipeline.data.split import TrainSource
from pipeline.data.validate import validate_file
from pipeline.lineage import keyed_sections

TICKETS = [
    {
        "id": "t1",
        "text": "parcel two weeks late",
        "channel": "email",
        "team": "shipping",
        "urgency": 3,
        "refund": "yes",
    },
    {
        "id": "t2",
        "text": "charged twice",
        "channel": "phone",
        "team": "billing",
        "urgency": 2,
        "refund": "no",
    },
    {
        "id": "t3",
        "text": "box crushed",
        "channel": "email",
        "team": "shipping",
        "urgency": None,
        "refund": "Yes",
    },
    {"id": "t4", "text": "how do I log in", "channel": "chat", "team": None, "urgency": 0, "refund": None},
    {"id": "t5", "text": "refund please", "channel": "email", "team": "billing", "urgency": 1, "refund": "1"},
]
MAPPING_YAML = """\
state: [text, channel]
id: id
questions:
  department:
    column: team
    instructions: Which team should handle this message?
    options: {shipping: delivery and damage, billing: charges and refunds, product: null}
  urgency:
    column: urgency
    type: score
    instructions: How urgent is a reply?
  wants_refund:
    column: refund
    type: noul
    instructions: The customer asks for their money back.
"""


@pytest.fixture(params=["csv", "parquet", "jsonl"])
def tickets(request, tmp_path):
    path = tmp_path / f"tickets.{request.param}"
    if request.param == "parquet":
        pq.write_table(pa.Table.from_pylist(TICKETS), path)
    elif request.param == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in TICKETS))
    else:
        header = list(TICKETS[0])
        lines = [",".join(header)] + [
            ",".join("" if r[k] is None else str(r[k]) for k in header) for r in TICKETS
        ]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def mapping_file(tmp_path):
    path = tmp_path / "tickets.mapping.yaml"
    path.write_text(MAPPING_YAML)
    return path


def test_a_yaml_mapping_gives_three_typed_questions_from_three_columns(tickets, mapping_file):
    data = validate_file(tickets, mapping=load_mapping(mapping_file))
    by_row = {r.row: {d.question.id: d for d in r.decisions} for r in data.records}
    department = by_row[0]["department"].question
    assert department.options == ("shipping", "billing", "product")  # given, in the mapping's order
    assert department.descriptions == ("delivery and damage", "charges and refunds", None)
    assert department.instructions == "Which team should handle this message?"
    assert by_row[0]["department"].gold.label == 0 and by_row[1]["department"].gold.label == 1
    urgency = by_row[0]["urgency"]
    assert (
        urgency.question.options == ("0", "1", "2", "3") and urgency.gold.label == 3
    )  # levels from the labels
    assert [by_row[i]["wants_refund"].gold.label for i in (0, 1, 2, 4)] == [1, 0, 1, 1]  # yes, no, Yes, 1
    # null cells: no gold for that question in that row, counted, never an error
    assert data.report.skipped == {"no_gold_for_question": 3}
    assert data.report.kept == 12 and data.report.decisions == 15
    assert data.report.labels["department"] == {"shipping": 2, "billing": 2, "product": 0}
    assert data.report.labels["wants_refund"] == {"false": 1, "true": 3}


def test_several_state_columns_make_a_json_object_state(tickets, mapping_file):
    data = validate_file(tickets, mapping=load_mapping(mapping_file))
    assert data.records[0].state == {"text": "parcel two weeks late", "channel": "email"}


def test_parquet_and_jsonl_states_keep_their_numbers(tmp_path):
    path = tmp_path / "records.parquet"
    pq.write_table(pa.table({"age": [31, None], "plan": ["pro", "free"], "churned": [True, False]}), path)
    mapping = load_mapping(flags_mapping(["age", "plan"], "churned", "will_churn", "noul"))
    data = validate_file(path, mapping=mapping)
    assert [r.state for r in data.records] == [{"age": 31, "plan": "pro"}, {"age": None, "plan": "free"}]
    assert [r.decisions[0].gold.label for r in data.records] == [1, 0]


def test_flags_stand_for_the_same_mapping_as_yaml(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("text,label\ngood,pos\nbad,neg\nfine,pos\n")
    from_flags = validate_file(path, mapping=load_mapping(flags_mapping(["text"], "label")))
    yaml_file = tmp_path / "m.yaml"
    yaml_file.write_text("state: text\nquestions:\n  label: {column: label}\n")
    from_yaml = validate_file(path, mapping=load_mapping(yaml_file))
    assert [r.content_hash() for r in from_flags.records] == [r.content_hash() for r in from_yaml.records]
    question = from_flags.records[0].decisions[0].question
    assert question.id == "label" and question.type == "choice" and question.options == ("neg", "pos")
    assert from_flags.records[0].state == "good"  # one state column: its cell, not an object


def test_options_inferred_with_counts_and_given_as_a_list(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("text,label\na,x\nb,y\nc,x\nd,x\n")
    mapped, total = read_mapped(path, load_mapping(flags_mapping(["text"], "label")))
    assert total == 4 and mapped.counts == {"label": {"x": 3, "y": 1}}
    assert mapped.mapping.questions["label"].options == ("x", "y")
    given = load_mapping(flags_mapping(["text"], "label", options=["y", "x", "z"]))
    mapped, _ = read_mapped(path, given)
    assert mapped.mapping.questions["label"].options == ("y", "x", "z")
    assert [g["label"] for g in mapped.columns.gold] == ["x", "y", "x", "x"]


def test_score_levels_fill_the_gaps_between_whole_numbers_or_follow_given_labels(tmp_path):
    path = tmp_path / "stars.csv"
    path.write_text("review,stars\ngreat,5\nawful,1\nok,3\n")
    mapped, _ = read_mapped(path, load_mapping(flags_mapping(["review"], "stars", type="score")))
    assert mapped.mapping.questions["stars"].options == ("1", "2", "3", "4", "5")
    assert [g["stars"] for g in mapped.columns.gold] == [4, 0, 2]
    named = mapping_from_dict(
        {
            "state": "review",
            "questions": {
                "stars": {"column": "stars", "type": "score", "options": {1: "poor", 3: "fine", 5: "great"}}
            },
        },
        "test",
    )
    data = validate_file(path, mapping=named)
    question = data.records[0].decisions[0].question
    assert question.descriptions == ("poor", "fine", "great") and data.records[0].decisions[0].gold.label == 2


def test_a_slice_is_taken_before_mapping_and_rows_keep_their_file_index(tickets, mapping_file):
    data = validate_file(tickets, RowSlice(2, 4), mapping=load_mapping(mapping_file))
    assert data.report.rows == 2 and data.report.file_rows == 5
    assert [r.row for r in data.records] == [2, 3]
    assert data.report.examples["no_gold_for_question"]["row"] in (2, 3)


def test_every_row_unusable_says_so_with_the_reason_counts(tmp_path, capsys):
    path = tmp_path / "empty_states.csv"
    path.write_text("text,label\n,pos\n,neg\n")
    assert main(["validate", str(path), "--state-column", "text", "--label-column", "label"]) == 2
    captured = capsys.readouterr()
    assert "missing_state" in captured.out and "no usable decision" in captured.err


def test_a_column_the_table_lacks_is_named_with_the_columns_it_has(tickets):
    mapping = load_mapping(flags_mapping(["text", "body"], "team"))
    with pytest.raises(MappingError, match=r"'body' that the table lacks \(its columns: id, text, channel"):
        validate_file(tickets, mapping=mapping)


def test_a_label_outside_the_given_options_is_refused_with_its_count(tickets):
    mapping = load_mapping(flags_mapping(["text"], "team", options=["shipping"]))
    with pytest.raises(MappingError, match=r"'billing' \(2 rows\); add them to its options"):
        validate_file(tickets, mapping=mapping)


def test_a_noul_label_that_is_not_yes_or_no_is_refused(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("text,flag\na,yes\nb,maybe\n")
    with pytest.raises(MappingError, match=r"'maybe' .* true/false, yes/no or 1/0"):
        read_mapped(path, load_mapping(flags_mapping(["text"], "flag", type="noul")))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"state": "text", "questions": {"q": {"column": "l"}}, "labels": "l"},
            r"mapping: unknown key\(s\) labels",
        ),
        (
            {"state": "text", "questions": {"q": {"column": "l", "typ": "score"}}},
            r"questions.q: unknown key\(s\) typ",
        ),
        (
            {"state": "text", "questions": {"q": {"column": "l", "type": "rank"}}},
            "questions.q.type: expected one of",
        ),
        ({"state": 3, "questions": {"q": {"column": "l"}}}, "state: expected a column name"),
        ({"state": "text", "questions": {}}, "questions: expected"),
        ({"state": "text", "questions": {"q": {"column": "l", "options": ["a", "a"]}}}, "'a' given twice"),
        ({"state": "text", "questions": {"q": {"column": "l", "type": "noul", "options": ["y"]}}}, "noul"),
        ({"state": "text", "questions": {"": {"column": "l"}}}, "a question id is empty"),
        ({"state": ["text", "text"], "questions": {"q": {"column": "l"}}}, "column 'text' named twice"),
        ({"state": "text", "questions": {"q": {"column": "text"}}}, "'text' is also the state"),
    ],
)
def test_a_bad_mapping_is_refused_naming_the_key(raw, message):
    with pytest.raises(MappingError, match=message):
        load_mapping(raw)


def test_an_unknown_yaml_key_is_refused_from_a_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("state: text\nquestion:\n  q: {column: label}\n")
    with pytest.raises(
        MappingError, match=r"m.yaml: unknown key\(s\) question \(known: state, questions, id, group\)"
    ):
        load_mapping(path)


def test_eval_data_is_mapped_with_the_options_fixed_on_the_training_data(tmp_path):
    train, held = tmp_path / "train.csv", tmp_path / "held.csv"
    train.write_text("text,label\na,x\nb,y\nc,x\n")
    held.write_text("text,label\nd,y\ne,z\n")
    config = ValidateConfig(mapping=flags_mapping(["text"], "label"))
    with pytest.raises(MappingError, match="'z'"):
        TrainSource(train, eval_data=held, split_config=config).validated()
    held.write_text("text,label\nd,y\n")
    split = TrainSource(train, eval_data=held, split_config=config).validated().split
    assert split.heldout[0].decisions[0].question.options == ("x", "y")


def test_params_take_a_mapping_file_or_inline_and_the_run_key_reads_the_file(tmp_path, mapping_file):
    with pytest.raises(ConfigError, match=r"validate\.mapping: questions\.q: unknown key"):
        ValidateConfig(mapping={"state": "text", "questions": {"q": {"column": "l", "kind": "x"}}})
    params_file = tmp_path / "params.yaml"
    params_file.write_text(f"validate:\n  mapping: {mapping_file}\n")
    before = keyed_sections(load_params(params_file))
    mapping_file.write_text(MAPPING_YAML.replace("How urgent", "How pressing"))
    assert keyed_sections(load_params(params_file)) != before


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_written_rows_validate_as_the_mapped_ones(tickets, mapping_file, tmp_path, suffix):
    mapping = load_mapping(mapping_file)
    mapped, _ = read_mapped(tickets, mapping)
    out = write_rows(mapped, tmp_path / f"rows.{suffix}")
    assert not list(tmp_path.glob(".*.partial"))
    direct, written = validate_file(tickets, mapping=mapping), validate_file(out)
    assert [r.content_hash() for r in written.records] == [r.content_hash() for r in direct.records]


@pytest.fixture
def plain_csv(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text('text,label\n"great, really",pos\nawful,neg\nmeh,neu\nlove it,pos\n')
    return path


def test_decision_map_previews_rows_as_they_will_be_trained(plain_csv, capsys):
    args = ["map", "--data", str(plain_csv), "--state-column", "text", "--label-column", "label"]
    assert main([*args, "--preview", "2", "--question", "tone", "--instructions", "The tone?"]) == 0
    out = capsys.readouterr().out
    assert "options from the labels, with their counts" in out and "pos  2" in out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and rows[0]["state"] == "great, really" and rows[0]["gold"] == {"tone": "pos"}
    assert rows[0]["questions"] == {
        "tone": {"type": "choice", "instructions": "The tone?", "criteria": ["neg", "neu", "pos"]}
    }
    assert main([*args, "--json", "--preview", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["questions"]["label"]["options"] == {"neg": 1, "neu": 1, "pos": 2}
    assert result["validation"]["kept"] == 4 and len(result["preview"]) == 1


def test_decision_map_writes_a_decision_file(plain_csv, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    args = ["map", "--data", str(plain_csv), "--state-column", "text", "--label-column", "label"]
    assert main([*args, "--write", str(out)]) == 0
    assert main(["validate", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["kept"] == 4


def test_decision_validate_with_a_mapping(plain_csv, tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("state: text\nquestions:\n  tone: {column: label, options: [neg, neu, pos]}\n")
    assert main(["validate", str(plain_csv), "--mapping", str(mapping), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == 4 and report["labels"] == {"tone": {"neg": 1, "neu": 1, "pos": 2}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state-column", "body", "--label-column", "label"], "'body' that the table lacks"),
        (["--state-column", "text", "--label-column", "label", "--options", "pos", "neg"], "'neu' (1 row)"),
        (["--label-column", "label"], "needs --state-column COL too"),
        (["--type", "score"], "--type need --state-column and --label-column"),
    ],
)
def test_bad_mapping_input_is_one_line_and_exit_two(plain_csv, capsys, args, message):
    assert main(["validate", str(plain_csv), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_train_refuses_a_bad_mapping_before_training(plain_csv, tmp_path, tiny_base, capsys):
    args = ["train", "--data", str(plain_csv), "--base", str(tiny_base), "--out", str(tmp_path / "o"), "-q"]
    assert main([*args, "--state-column", "text", "--label-column", "label", "--options", "pos"]) == 2
    assert "'neg' (1 row)" in capsys.readouterr().err and not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--mapping", str(tmp_path / "missing.yaml")])
    assert exit_info.value.code == 2 and "no such file" in capsys.readouterr().err


def test_finetune_trains_on_a_mapped_table_end_to_end_and_predict_reads_new_rows_through_it(
    tiny_base, tmp_path, capsys
):
    path = tmp_path / "plain.csv"
    words = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "broken", "rude"]}
    lines = [f"{words[label][i % 3]} item {i},{label}" for i in range(40) for label in ("pos", "neg")]
    path.write_text("text,label\n" + "\n".join(lines) + "\n")
    params = tmp_path / "params.yaml"
    params.write_text(
        "train:\n  micro_batch: 8\n  grad_accum: 1\n  precision: fp32\n"
        "validate:\n  holdout_max_decisions: 20\n  holdout_fraction: 0.3\n"
    )
    code = main(
        [
            "finetune",
            "--data",
            str(path),
            "--base",
            str(tiny_base),
            "--out",
            str(tmp_path / "export"),
            "--max-steps",
            "2",
            "--params",
            str(params),
            "--json",
            "-q",
            "--state-column",
            "text",
            "--label-column",
            "label",
            "--question",
            "tone",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["calibration"]["heldout"]["decisions"] == 20
        and (tmp_path / "export" / "manifest.json").is_file()
    )
    # evaluate reads the table through the same flags, as the decision rows `decision map --write` gives
    flags = ["--state-column", "text", "--label-column", "label", "--question", "tone"]
    assert main(["map", "--data", str(path), *flags, "--write", str(tmp_path / "rows.jsonl"), "--json"]) == 0
    capsys.readouterr()
    reports = []
    for data, extra in ((path, flags), (tmp_path / "rows.jsonl", [])):
        assert (
            main(["evaluate", "--model", str(tmp_path / "export"), "--data", str(data), "--json", *extra])
            == 0
        )
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["decisions"] == 80 and reports[0]["metrics"] == reports[1]["metrics"]
    # the export records the options it trained with, so unlabelled rows are asked the same question
    assert json.loads((tmp_path / "export" / "manifest.json").read_text())["mapping_options"] == {
        "tone": ["neg", "pos"]
    }
    new = tmp_path / "new.csv"
    new.write_text("text\ngreat item\nrude item\n")
    out = tmp_path / "scores.parquet"
    assert (
        main(
            [
                "predict",
                "--model",
                str(tmp_path / "export"),
                "--data",
                str(new),
                "--out",
                str(out),
                "-q",
                *flags,
            ]
        )
        == 0
    )
    scored = pq.read_table(out).to_pylist()
    assert [s["row_id"] for s in scored] == ["0", "1"]
    assert all(list(json.loads(s["answers"])["tone"]["probabilities"]) == ["neg", "pos"] for s in scored)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_group_column_groups_the_mapped_rows_and_the_written_file_keeps_it(
    tickets, mapping_file, tmp_path, suffix
):
    raw = {**yaml.safe_load(MAPPING_YAML), "group": "channel"}
    mapping = load_mapping(raw)
    direct = validate_file(tickets, mapping=mapping)
    assert [r.group for r in direct.records] == ['"email"', '"phone"', '"email"', '"chat"', '"email"']
    mapped, _ = read_mapped(tickets, mapping)
    written = validate_file(write_rows(mapped, tmp_path / f"rows.{suffix}"))
    assert [r.group for r in written.records] == [r.group for r in direct.records]
    # The split keeps each channel's rows on one side.
    split = (
        TrainSource(tickets, split_config=ValidateConfig(holdout_fraction=0.5, mapping=raw)).validated().split
    )
    sides = [{r.group for r in side} for side in (split.train, split.heldout)]
    assert all(sides) and not sides[0] & sides[1]


def test_a_group_that_is_not_a_column_name_is_refused():
    with pytest.raises(MappingError, match="group: expected a column name"):
        load_mapping({"state": "text", "questions": {"q": {"column": "l"}}, "group": 3})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"state: text\nquestions:\n  tone: {column: a}\n  tone: {column: b}\n",
            "key 'tone' given twice .*line 4",
        ),
        (b"state: text\nstate: body\nquestions:\n  q: {column: a}\n", "key 'state' given twice"),
        (b"\xff\xfestate: text\n", "not UTF-8 text"),
        (b"state: [text\n", "not YAML"),
    ],
)
def test_a_mapping_file_that_repeats_a_key_or_is_not_utf8_yaml_is_refused_naming_it(
    tmp_path, content, message
):
    path = tmp_path / "m.yaml"
    path.write_bytes(content)  # PyYAML alone would keep the last 'tone' and train on one question silently
    with pytest.raises(MappingError, match=f"m.yaml: {message}"):
        load_mapping(path)


def test_whole_numbers_written_with_a_decimal_point_in_a_csv_are_one_label(tmp_path):
    path = tmp_path / "stars.csv"
    path.write_text("review,stars\ngreat,5\nawful,1\nok,3.0\nfine,3\nmeh,2.0\n")
    mapped, _ = read_mapped(path, load_mapping(flags_mapping(["review"], "stars", type="score")))
    assert mapped.mapping.questions["stars"].options == ("1", "2", "3", "4", "5")
    assert mapped.counts == {"stars": {"5": 1, "1": 1, "3": 2, "2": 1}}
    assert [g["stars"] for g in mapped.columns.gold] == [4, 0, 2, 2, 1]


def test_map_never_writes_over_the_table_it_reads_and_says_when_it_replaces_a_file(
    plain_csv, tmp_path, capsys
):
    rows = tmp_path / "rows.jsonl"
    args = ["map", "--data", str(rows), "--state-column", "state", "--label-column", "gold", "--preview", "0"]
    assert (
        main(
            [
                "map",
                "--data",
                str(plain_csv),
                "--state-column",
                "text",
                "--label-column",
                "label",
                "--write",
                str(rows),
            ]
        )
        == 0
    )
    before = rows.read_bytes()
    capsys.readouterr()
    assert main([*args, "--write", str(rows)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"decision map: --write {rows}: the data being read; write the rows elsewhere"]
    assert rows.read_bytes() == before
    assert (
        main(
            [
                "map",
                "--data",
                str(plain_csv),
                "--state-column",
                "text",
                "--label-column",
                "label",
                "--write",
                str(rows),
            ]
        )
        == 0
    )
    assert "(replacing the file that was there)" in capsys.readouterr().out


def test_a_column_named_twice_is_one_line_and_exit_two(tmp_path, capsys):
    path = tmp_path / "twice.csv"
    path.write_text("id,text,label,label\n1,hello,neg,pos\n")
    assert main(["map", "--data", str(path), "--state-column", "text", "--label-column", "label"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'label' named more than once" in err[0]


def test_a_score_labelled_in_words_needs_its_levels_in_order(tmp_path):
    path = tmp_path / "urgency.csv"
    path.write_text("text,urgency\nno rush,low\ndown for all,high\nslow page,medium\n")
    with pytest.raises(
        MappingError,
        match=r"score .* not numbers \('high', 'low', 'medium'\): list its levels "
        "lowest first",
    ):
        read_mapped(path, load_mapping(flags_mapping(["text"], "urgency", type="score")))
    given = flags_mapping(["text"], "urgency", type="score", options=["low", "medium", "high"])
    mapped, _ = read_mapped(path, load_mapping(given))
    assert [g["urgency"] for g in mapped.columns.gold] == [0, 2, 1]


def test_true_and_1_in_one_column_stay_two_labels(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        "".join(json.dumps({"text": t, "y": y}) + "\n" for t, y in (("a", True), ("b", 1), ("c", 1)))
    )
    mapped, _ = read_mapped(path, load_mapping(flags_mapping(["text"], "y")))
    assert mapped.counts == {"y": {"true": 1, "1": 2}}
    assert [g["y"] for g in mapped.columns.gold] == ["true", "1", "1"]


def test_a_label_column_of_lists_or_objects_is_refused_naming_them(tmp_path, capsys):
    path = tmp_path / "tags.jsonl"
    path.write_text(
        '{"text": "a", "tags": ["late", "damaged"]}\n{"text": "b", "tags": {"k": 1}}\n'
        '{"text": "c", "tags": "late"}\n'
    )
    args = ["map", "--data", str(path), "--state-column", "text", "--label-column", "tags"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds lists or objects, not labels" in err and '["late","damaged"] (1 row)' in err
