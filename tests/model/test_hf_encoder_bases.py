"""Any Hugging Face encoder folder is a base. A tiny random BERT, RoBERTa, DeBERTa-v2 and ModernBERT, each
with a tokenizer built the way its own is (`tests/tiny.py`; nothing downloaded), load as the joint family's
base with a fresh isolated head; `decision finetune` picks the family and method from the folder and says why,
trains the head, exports, and the export answers as the trained model did; LoRA wraps every linear layer of
each encoder's blocks and is merged on export. A folder that is no base is refused in one line, exit code 2,
before anything is written."""

import json
from dataclasses import replace

import pytest
import yaml
from torch import nn

from pipeline.cli.main import main
from pipeline.config import TrainConfig
from pipeline.data.answers import parse_request
from pipeline.data.pins import current_md5
from pipeline.data.split import SplitData
from pipeline.families import explain_training, load_decision_model, pick_family, resolve_training
from pipeline.families.joint.backbone import TOKENIZER_FILES
from pipeline.families.joint.predict import answer_joint_requests
from pipeline.families.joint.records import encode_row
from pipeline.families.joint.training import prepare_joint
from pipeline.rundir import RunFolder
from pipeline.scoring.heldout import load_expected
from pipeline.stages.smoke import compare_with_trained, heldout_requests
from tests.tiny import JOINT_HEAD, load_joint_on, write_learnable_rows, write_tiny_encoder

ARCHITECTURES = ("bert", "roberta", "deberta-v2", "modernbert")
POSITIONS = 128
TONE = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"negative": None, "neutral": "neither", "positive": None},
}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def encoder(request, tmp_path_factory):
    return write_tiny_encoder(
        tmp_path_factory.mktemp("encoders") / request.param, request.param, positions=POSITIONS
    )


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    return write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 24)


def write_params(folder, steps: int = 10, **train):
    # A few steps at a high learning rate: enough for the loss to fall, and the export to differ from the
    # base.
    params = {
        "validate": {"holdout_max_decisions": 6, "holdout_fraction": 0.25},
        "train": {
            "max_steps": steps,
            "micro_batch": 8,
            "grad_accum": 1,
            "head_lr": 0.01,
            "head_width": 32,
            "lora_r": 4,
            "lora_alpha": 8,
            "lora_lr": 0.005,
            "log_every": 2,
            "precision": "fp32",
            "epochs": 100,
            # No out-of-fold head trainings: what is checked here is the base, the training and the export
            # (tests/model/test_out_of_fold.py checks the folds).
            "out_of_fold_below": 0,
            **train,
        },
    }
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def finetune(base, data, out, params, capsys, *flags) -> tuple[int, str, str]:
    capsys.readouterr()  # what came before (transformers' progress bars while the base was written)
    code = main(
        [
            "finetune",
            "--data",
            str(data),
            "--base",
            str(base),
            "--out",
            str(out),
            "--params",
            str(params),
            "--device",
            "cpu",
            "--json",
            *flags,
        ]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def architecture(folder) -> str:
    return json.loads((folder / "config.json").read_text())["architectures"][0]


def test_the_family_and_method_follow_from_the_folder_by_the_stated_rule(encoder):
    family, config = resolve_training(encoder, TrainConfig())
    assert (family.name, config.method) == ("joint", "head")
    said = explain_training(encoder, family, config)
    assert said.startswith("joint family (what the base is)")
    assert (
        f"a plain encoder folder ({architecture(encoder)})" in said and "the joint family's default" in said
    )


def test_decision_families_states_the_bases_and_the_rule(capsys):
    assert main(["families", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert "ModernBERT" in described["joint"]["bases"] and "Laya-layout" in described["laya"]["bases"]
    # each family's whole first paragraph, ending its sentence: not a first line cut mid-sentence
    assert all(entry["doc"].endswith(".") for entry in described.values()), described
    assert "read in several" in described["laya"]["doc"]
    assert main(["families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("rule: with no --family") and "default" in lines[-1]
    assert sum(line.startswith("  starts from: ") for line in lines) == len(described)


def test_a_plain_encoder_loads_with_a_fresh_isolated_head_and_is_only_read(encoder):
    before = current_md5(encoder)
    _, loaded = load_joint_on(encoder)
    tokenizer, head = loaded.tokenizer, loaded.config["head"]
    assert loaded.config["backbone"] == "encoder" and loaded.fields_apart and loaded.isolated
    assert head["read_layers"] == 2  # min(4, its 2 layers)
    assert head["lexicon"] == loaded.model.lm.get_input_embeddings().num_embeddings == len(tokenizer)
    assert loaded.max_len == POSITIONS  # what its positions reach (RoBERTa's are numbered from pad id + 1)
    [record] = encode_row(
        tokenizer,
        "the order was late",
        list(parse_request("s", {"tone": TONE}).questions.values()),
        loaded.layout,
    )
    assert (record.ids[0], record.ids[-1]) == (tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert all(
        seq[0] == tokenizer.cls_token_id and seq[-1] == tokenizer.sep_token_id
        for seq in record.field_sequences[0]
    )
    # A state longer than the positions is cut to fit, not an error.
    [long] = answer_joint_requests(loaded, [parse_request("the order was late " * 200, {"tone": TONE})])
    assert sum(long.answers["tone"]["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)
    assert current_md5(encoder) == before


def test_lora_wraps_every_linear_layer_of_the_encoder_blocks(encoder):
    from peft.tuners.lora import LoraLayer

    _, loaded = load_joint_on(encoder)
    lm = loaded.model.lm
    linears = {
        name for name, m in lm.named_modules() if isinstance(m, nn.Linear) and not name.startswith("pooler")
    }
    prepare_joint(loaded.model, replace(JOINT_HEAD, method="lora", lora_r=4, lora_alpha=8))
    wrapped = {name for name, m in lm.named_modules() if isinstance(m, LoraLayer)}
    assert wrapped == linears and len(wrapped) >= 8  # attention and feed-forward, in both layers
    trainable = {n for n, p in lm.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def assert_export_answers_as_trained(summary: dict) -> None:
    """The export, reloaded, answers the held-out rows as the trained model did before export (the run
    folder's expected answers)."""
    run = RunFolder(summary["run_dir"])
    model = load_decision_model(summary["export_dir"])
    bodies = heldout_requests(SplitData.load(run.split).split.heldout, 100)
    answered = model.answer([parse_request(b["state"], b["questions"]) for b in bodies])
    failures: list[str] = []
    figures = compare_with_trained(
        [{"answers": a.answers} for a in answered], load_expected(run.expected_answers), failures
    )
    # The smoke test's bounds (fp16 weights); measured about 5e-5 here, the answers' 4-decimal rounding.
    assert failures == [] and figures["trained_agreement"] == 1.0, figures


def test_finetune_picks_joint_head_says_why_trains_and_the_export_answers_as_trained(
    encoder, learnable, tmp_path, capsys
):
    code, out, err = finetune(encoder, learnable, tmp_path / "export", write_params(tmp_path), capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["train"]["family"], summary["train"]["method"], summary["train"]["steps"]) == (
        "joint",
        "head",
        10,
    )
    losses = [loss for _, loss in summary["train"]["losses"]]
    assert losses[-1] < losses[0], losses
    first = err.splitlines()[:3]
    assert any(f"is a plain encoder folder ({architecture(encoder)})" in line for line in first), first
    config = json.loads((tmp_path / "export" / "decision_config.json").read_text())
    assert (config["backbone"], config["fields"], config["head"]["isolated"]) == ("encoder", "apart", True)
    assert architecture(tmp_path / "export" / "backbone") == architecture(encoder)
    assert_export_answers_as_trained(summary)


@pytest.mark.slow
def test_lora_on_a_plain_bert_trains_and_the_merged_export_answers_as_trained(learnable, tmp_path, capsys):
    bert = write_tiny_encoder(tmp_path / "bert", "bert", positions=POSITIONS)
    params = write_params(tmp_path, method="lora")
    code, out, err = finetune(bert, learnable, tmp_path / "export", params, capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["train"]["family"], summary["train"]["method"]) == ("joint", "lora")
    assert "method lora (set by train.method or --method)" in err
    config = json.loads((tmp_path / "export" / "decision_config.json").read_text())
    assert config["fine_tuned"] is True
    assert not any("lora" in line for line in (tmp_path / "export" / "backbone" / "config.json").read_text())
    assert_export_answers_as_trained(summary)


def no_tokenizer(folder):
    for name in (*TOKENIZER_FILES, "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    return "no tokenizer beside config.json"


def unknown_architecture(folder):
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"})
    )
    return "neither a causal LM"


def unknown_model_type(folder):
    # Named by its architecture alone, it said "names BertModel" of a model_type nothing runs.
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["BertModel"], "model_type": "no-such-model"})
    )
    return "names BertModel, model_type 'no-such-model': neither a causal LM"


def no_config(folder):
    (folder / "config.json").unlink()
    return "not a model folder: no config.json"


def truncated_weights(folder):
    # A half-copied base: it loaded only after the whole data set was validated, and left the run folder
    # behind.
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors: unreadable weights (SafetensorError"


def garbage_weights(folder):
    (folder / "model.safetensors").write_bytes(b"not a tensor file")
    return "model.safetensors: unreadable weights"


@pytest.mark.parametrize(
    "damage",
    [no_config, unknown_architecture, unknown_model_type, no_tokenizer, truncated_weights, garbage_weights],
)
def test_a_folder_that_is_no_base_is_refused_in_one_line_before_anything_is_written(
    damage, learnable, tmp_path, capsys
):
    folder = write_tiny_encoder(tmp_path / "base", "bert", positions=POSITIONS)
    said = damage(folder)
    code, _, err = finetune(folder, learnable, tmp_path / "export", write_params(tmp_path), capsys)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"decision finetune: {folder}") and said in line, line
    assert not (tmp_path / "export").exists() and not (tmp_path / "export.run").exists()


def test_train_refuses_a_folder_that_is_no_base_too(learnable, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    code = main(
        [
            "train",
            "--data",
            str(learnable),
            "--base",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "tune"),
            "--params",
            str(write_params(tmp_path)),
            "--device",
            "cpu",
            "--json",
        ]
    )
    assert code == 2 and "empty: not a model folder: no config.json" in capsys.readouterr().err
    assert not (tmp_path / "tune").exists()


def test_a_hub_id_is_refused_while_offline_with_what_to_do(learnable, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = finetune(
        "google-bert/bert-base-uncased", learnable, tmp_path / "export", write_params(tmp_path), capsys
    )
    assert code == 2
    [line] = err.strip().splitlines()
    assert "google-bert/bert-base-uncased: no such folder" in line
    assert "decision snapshot --from google-bert/bert-base-uncased" in line
    assert not (tmp_path / "export").exists()


def test_a_family_that_cannot_start_from_the_folder_names_the_one_that_can(tmp_path):
    from pipeline.families.base import BadBase

    folder = write_tiny_encoder(tmp_path / "base", "bert", positions=POSITIONS)
    assert pick_family(folder).name == "joint"
    with pytest.raises(
        BadBase,
        match=r"the laya family cannot start from it: it is a plain encoder folder "
        r"\(BertModel\).* \(--family joint",
    ):
        pick_family(folder, "laya")
