"""The pin check refuses bytes that differ from dvc.lock, naming the file and both hashes."""

import shutil

import pytest
import yaml

from pipeline.data.pins import PinMismatch, current_md5, verify_pins


@pytest.fixture
def pinned_copy(tmp_path):
    data = tmp_path / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text('{"state": "s"}\n')
    folder = tmp_path / "data" / "model"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    lock = {"schema": "2.0", "stages": {"s": {"outs": [
        {"path": "data/rows.jsonl", "md5": current_md5(data)},
        {"path": "data/model", "md5": current_md5(folder)},
    ]}}}  # fmt: skip
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    return tmp_path


def test_untouched_files_pass(pinned_copy):
    assert set(verify_pins(["data/rows.jsonl", "data/model"], root=pinned_copy)) == {
        "data/rows.jsonl",
        "data/model",
    }


def test_tampered_file_is_refused_with_both_hashes(pinned_copy):
    pinned = current_md5(pinned_copy / "data/rows.jsonl")
    (pinned_copy / "data/rows.jsonl").write_text('{"state": "tampered"}\n')
    with pytest.raises(PinMismatch) as error:
        verify_pins(["data/rows.jsonl"], root=pinned_copy)
    message = str(error.value)
    assert "data/rows.jsonl" in message and pinned in message
    assert current_md5(pinned_copy / "data/rows.jsonl") in message


def test_tampered_folder_missing_and_unpinned_files_are_all_reported(pinned_copy):
    (pinned_copy / "data/model/extra.bin").write_bytes(b"x")
    (pinned_copy / "data/rows.jsonl").unlink()
    with pytest.raises(PinMismatch) as error:
        verify_pins(["data/rows.jsonl", "data/model", "data/other.csv"], root=pinned_copy)
    message = str(error.value)
    assert "data/rows.jsonl: missing" in message
    assert "data/model: bytes differ" in message
    assert "data/other.csv: not pinned" in message


@pytest.mark.data
def test_project_dataset_matches_its_pin_and_a_tampered_copy_does_not(project_root, tmp_path):
    assert verify_pins(["data/processed/vader.jsonl"], root=project_root)
    (tmp_path / "data/processed").mkdir(parents=True)
    shutil.copy(project_root / "dvc.lock", tmp_path / "dvc.lock")
    copy = tmp_path / "data/processed/vader.jsonl"
    shutil.copy(project_root / "data/processed/vader.jsonl", copy)
    with copy.open("ab") as handle:
        handle.write(b"\n")
    with pytest.raises(PinMismatch, match=r"vader\.jsonl: bytes differ"):
        verify_pins(["data/processed/vader.jsonl"], root=tmp_path)


def test_training_refuses_a_tampered_pinned_input_before_it_starts(pinned_copy, monkeypatch):
    from pipeline.config import TrainConfig
    from pipeline.stages.train import train_on_data

    monkeypatch.chdir(pinned_copy)
    (pinned_copy / "data/rows.jsonl").write_text('{"state": "changed"}\n')
    with pytest.raises(PinMismatch, match=r"data/rows\.jsonl: bytes differ"):
        train_on_data("data/rows.jsonl", "data/model", None, TrainConfig(), progress=False)
