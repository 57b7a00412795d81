"""Every shipped config loads, and dvc.yaml runs exactly the stage functions the library registers."""

import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, DatasetConfig, ValidateConfig, load_params, section_config
from pipeline.stages.dvc import STAGES


def test_params_yaml_loads_into_configs(project_root):
    params = load_params(project_root / "params.yaml")
    assert isinstance(params.dataset, DatasetConfig)
    assert params.validate.holdout_max_decisions == 4000
    assert params.validate.holdout_fraction == 0.1
    assert params.retrain.model_name == "decision-model" and params.promote.max_ece == 0.05


def test_every_run_config_loads_and_overrides_only_known_keys(project_root):
    names = sorted(p.stem for p in (project_root / "configs").glob("*.yaml"))
    assert "tiny" in names
    base = load_params(project_root / "params.yaml")
    for name in names:
        params = load_params(project_root / "params.yaml", name)
        assert params.dataset == base.dataset  # run configs change runs, never the pinned data
    tiny = load_params(project_root / "params.yaml", "tiny").train
    assert (
        base.train.max_steps is None and tiny.max_steps is not None
    )  # the tiny run is capped, make run is not


def test_dvc_stages_match_the_registered_stage_functions(project_root):
    dvc = yaml.safe_load((project_root / "dvc.yaml").read_text())["stages"]
    assert set(dvc) == set(STAGES)
    for name, stage in dvc.items():
        assert stage["cmd"] == f"python -m pipeline.stages.dvc {name}"
        module = STAGES[name][1]
        assert module in stage["deps"], f"dvc.yaml stage {name} must depend on {module}"
        assert (project_root / module).is_file()
        assert all(
            section in yaml.safe_load((project_root / "params.yaml").read_text())
            for section in stage["params"]
        )


def test_dvc_lock_pins_the_dataset(project_root):
    lock = yaml.safe_load((project_root / "dvc.lock").read_text())
    outs = {o["path"] for stage in lock["stages"].values() for o in stage["outs"]}
    assert "data/processed/vader.jsonl" in outs


def test_bad_config_values_name_the_key():
    with pytest.raises(ConfigError, match="holdout_fraction"):
        ValidateConfig(holdout_fraction=1.5)
    with pytest.raises(ConfigError, match="unknown key"):
        section_config("validate", {"holdout_max": 3})


def test_mlflow_folder_is_not_a_python_package(project_root):
    assert not (Path(project_root) / "mlflow" / "__init__.py").exists()


def test_pipeline_never_imports_prefect(project_root):
    """Not even lazily: `decision retrain` launches the flow as a process instead."""
    import ast

    def imported(path):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                yield node.module

    offenders = [
        f"{p.name}: {name}"
        for p in (project_root / "pipeline").glob("*.py")
        for name in imported(p)
        if name.split(".")[0] in ("prefect", "flows")
    ]
    assert offenders == []


def test_dvc_lock_is_in_step_with_the_code_its_stages_run(project_root):
    """A stage whose code changed since `dvc repro` would rebuild on a fresh clone and leave dvc.lock
    modified."""
    from pipeline.data.pins import current_md5

    lock = yaml.safe_load((project_root / "dvc.lock").read_text())["stages"]
    stale = [
        f"{name}: {dep['path']}"
        for name, stage in lock.items()
        for dep in stage.get("deps", [])
        if dep["path"].endswith(".py") and current_md5(project_root / dep["path"]) != dep["md5"]
    ]
    assert not stale, f"run `dvc repro` and commit dvc.lock; changed since: {stale}"


def test_the_pin_files_of_a_user_s_data_and_base_can_be_committed(project_root):
    # DVC refuses to write a .dvc file git ignores ("bad DVC file name ... is git-ignored"): a base
    # snapshotted into data/snapshots/ could not be pinned while the folder's ignore rule covered its .dvc
    # file.
    pins = ["data/snapshots/mybase.dvc", "data/own/tickets.csv.dvc", "data/own/shards.dvc"]
    ignored = subprocess.run(["git", "check-ignore", *pins], cwd=project_root, capture_output=True, text=True)
    assert ignored.stdout.split() == []
    stock = ["data/snapshots/minilm/model.safetensors"]  # the stock base's bytes stay DVC's
    assert (
        subprocess.run(["git", "check-ignore", *stock], cwd=project_root, capture_output=True).returncode == 0
    )
