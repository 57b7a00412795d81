"""Pinning covers every source: a folder of shards is pinned by real `dvc add`, a changed shard is a new data
revision and a refused pin, a glob is pinned by its folder, a Hub id is named unpinnable; a retrain's data
revision is compared with the one its model's previous version was trained on (in a real MLflow registry)."""

import subprocess
import sys

import pytest
import yaml

from pipeline.data import synthetic
from pipeline.data.pins import PinMismatch, Unpinned, check_pins, current_md5, data_revision
from pipeline.data.sources import pin_path
from pipeline.lineage import DataRevision, settings_changed
from pipeline.mlops.registry import RegistryLineage


@pytest.fixture
def repo(tmp_path):
    """A DVC repository with a folder of three Parquet shards pinned by `dvc add shards`."""
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    rows = synthetic.generate_rows(30, seed=2)
    for i in range(3):
        synthetic.write_rows(rows[i * 10 : (i + 1) * 10], tmp_path / "shards" / f"part-{i}.parquet")
    subprocess.run(
        [sys.executable, "-m", "dvc", "add", "-q", "shards"], cwd=tmp_path, check=True, timeout=120
    )
    return tmp_path


def _change_one_shard(folder):
    synthetic.write_rows(synthetic.generate_rows(10, seed=9), folder / "part-1.parquet")


def test_a_folder_revision_is_its_dvc_pin_and_a_changed_shard_makes_a_new_one(repo):
    pinned = yaml.safe_load((repo / "shards.dvc").read_text())["outs"][0]["md5"]
    before = data_revision(repo / "shards")
    assert before == pinned == current_md5(repo / "shards")  # what `dvc add` recorded
    assert check_pins({"data": repo / "shards"}, repo / "dvc.lock").pins == {"shards": pinned}
    _change_one_shard(repo / "shards")
    assert data_revision(repo / "shards") != before
    with pytest.raises(PinMismatch, match=r"shards: bytes differ from shards\.dvc"):
        check_pins({"data": repo / "shards"}, repo / "dvc.lock")


def test_a_glob_is_pinned_by_its_folder_and_its_revision_follows_only_the_shards_it_matches(repo):
    pattern = f"{repo}/shards/part-[01].parquet"
    assert pin_path(pattern) == repo / "shards"
    assert check_pins({"data": pattern}, repo / "dvc.lock", require=True).pins == {
        "shards": current_md5(repo / "shards")
    }
    before = data_revision(pattern)
    assert before != data_revision(repo / "shards")  # two shards of three: not the folder's hash
    synthetic.write_rows(synthetic.generate_rows(10, seed=7), repo / "shards" / "part-2.parquet")
    assert data_revision(pattern) == before  # a shard the glob does not match
    _change_one_shard(repo / "shards")
    assert data_revision(pattern) != before


def test_an_unpinned_glob_names_the_folder_to_dvc_add_and_a_hub_id_says_dvc_cannot_pin_it(repo):
    synthetic.write_rows(synthetic.generate_rows(5), repo / "more" / "a.jsonl")
    with pytest.raises(Unpinned) as error:
        check_pins(
            {"data": f"{repo}/more/*.jsonl", "eval_data": "hf:owner/name"}, repo / "dvc.lock", require=True
        )
    message = str(error.value)
    assert f"{repo}/more/*.jsonl: not pinned; pin it with `dvc add more`" in message
    assert "hf:owner/name: a Hub data set, which DVC cannot pin; save it with `save_to_disk`" in message


def test_a_data_revision_says_whether_the_previous_version_trained_on_other_data():
    first = DataRevision("data/shards", "a" * 32)
    assert not first.changed and "(the model's first version)" in first.line()
    same = DataRevision("data/shards", "a" * 32, "3", "a" * 32)
    assert not same.changed and same.line().endswith("(unchanged since version 3)")
    new = DataRevision("data/shards", "b" * 32, "3", "a" * 32)
    assert new.changed and new.to_dict()["changed"]
    assert (
        new.line() == f"data: data/shards at revision {'b' * 12} (new: version 3 was trained on {'a' * 12})"
    )
    # The same run again (data B → version 4, then a rerun on B): it is version 4, not new data since version
    # 3.
    again = DataRevision("data/shards", "b" * 32, "3", "a" * 32, rerun_of="4")
    assert not again.changed and again.line().endswith(
        "(a rerun of version 4: the same data, base, params and code)"
    )


def test_the_previous_revision_is_the_newest_version_registered_under_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    from pipeline.mlops.registry import client, registry_lineage

    assert registry_lineage("shards-model", "k1") == RegistryLineage(None)  # no such model yet
    client().create_registered_model("shards-model")
    experiment = client().create_experiment("lineage")
    for key, revision in (("k1", "r1"), ("k2", "r2")):
        run_id = (
            client().create_run(experiment).info.run_id
        )  # the store of this test, whatever mlflow's global URI
        client().log_param(run_id, "train.max_steps", 4 if key == "k1" else 8)
        client().log_param(run_id, "train.lora_r", 8)
        client().create_model_version(
            "shards-model",
            f"file://{tmp_path}/{key}",
            run_id=run_id,
            tags={
                "idempotency_key": key,
                "data_md5": revision,
                "base_md5": "b" * 32,
                "code_digest": key * 16,
            },
        )
    found = registry_lineage("shards-model", "k3")
    assert (found.rerun_of, found.previous, found.previous_revision) == (None, "2", "r2")
    assert found.previous_settings == {
        "train.max_steps": "8",
        "train.lora_r": "8",
        "base_md5": "b" * 32,
        "code_digest": "k2" * 16,
    }
    rerun = registry_lineage(
        "shards-model", "k2"
    )  # a rerun of key k2 finds itself, and the one before as previous
    assert (rerun.rerun_of, rerun.previous, rerun.previous_revision) == ("2", "1", "r1")


def test_a_new_version_on_the_same_data_says_what_else_changed():
    before = {
        "train.max_steps": "4",
        "train.lora_r": "8",
        "base_md5": "b" * 32,
        "code_digest": "c" * 64,
        "precision": "auto",  # the MLflow model's config, logged as a bare run param: no setting of the run
    }
    now = {
        "train.max_steps": "8",
        "train.lora_r": "8",
        "train.seed": "1",
        "base_md5": "d" * 32,
        "code_digest": "c" * 64,
        "git_commit": "e" * 40,
    }
    changes = settings_changed(before, now)
    assert changes == (
        "params (train.max_steps 4 -> 8, train.seed (unset) -> 1)",
        f"base ({'b' * 12} -> {'d' * 12})",
    )
    line = DataRevision("data/shards", "a" * 32, "3", "a" * 32, changes=changes).line()
    assert line.endswith(f"(unchanged since version 3; a new version for its {'; '.join(changes)})")
    # a version from before the code digest was tagged: its commit stands in for it
    assert settings_changed({"git_commit": "1" * 40}, {"git_commit": "2" * 40, "code_digest": "c"}) == (
        f"git commit ({'1' * 12} -> {'2' * 12})",
    )
    many = settings_changed({f"train.k{i}": "0" for i in range(7)}, {f"train.k{i}": "1" for i in range(7)})
    assert many[0].endswith("train.k3 0 -> 1 and 3 more)")
    new_data = DataRevision("d", "b" * 32, "3", "a" * 32, changes=("params (train.seed 0 -> 1)",)).line()
    assert new_data.endswith(
        f"(new: version 3 was trained on {'a' * 12}; also changed: params (train.seed 0 -> 1))"
    )
