"""A value of the wrong type in params.yaml (or a run config) is refused by `section.key` before any stage
runs."""

import re

import pytest
import yaml

from pipeline.config import ConfigError, load_params, section_config


def test_a_wrong_type_is_refused_naming_section_and_key():
    with pytest.raises(
        ConfigError, match=re.escape("train.max_steps: expected int or null, got 'ten' (str)")
    ):
        section_config("train", {"max_steps": "ten"})
    with pytest.raises(ConfigError, match=re.escape("retrain.model_name: expected str, got 5 (int)")):
        section_config("retrain", {"model_name": 5})


def test_every_wrong_key_of_a_section_is_named_in_one_error():
    with pytest.raises(ConfigError) as caught:
        section_config("validate", {"holdout_fraction": "a tenth", "holdout_max_decisions": 4.5})
    message = str(caught.value)
    assert "validate.holdout_fraction: expected float" in message
    assert "validate.holdout_max_decisions: expected int" in message


def test_an_int_is_accepted_for_a_float_field_and_stored_as_a_float():
    promote = section_config("promote", {"max_ece": 1, "max_accuracy_drop": 0})
    assert promote.max_ece == 1.0 and type(promote.max_ece) is float
    assert type(promote.max_accuracy_drop) is float


def test_a_bool_is_refused_for_an_int_or_float_field():
    with pytest.raises(ConfigError, match=re.escape("train.epochs: expected int, got True (bool)")):
        section_config("train", {"epochs": True})
    with pytest.raises(ConfigError, match=re.escape("promote.max_ece: expected float")):
        section_config("promote", {"max_ece": False})


def test_a_bool_field_takes_only_a_bool():
    assert section_config("train", {"gradient_checkpointing": True}).gradient_checkpointing is True
    with pytest.raises(ConfigError, match=re.escape("train.gradient_checkpointing: expected bool")):
        section_config("train", {"gradient_checkpointing": 1})


def test_null_is_accepted_only_where_the_field_allows_it():
    assert section_config("train", {"max_steps": None}).max_steps is None
    assert section_config("retrain", {"slice": None}).slice is None
    with pytest.raises(ConfigError, match=re.escape("train.epochs: expected int, got None (NoneType)")):
        section_config("train", {"epochs": None})


def test_a_list_of_strings_is_accepted_for_lora_target_modules():
    train = section_config("train", {"lora_target_modules": ["query", "value"]})
    assert train.lora_target_modules == ("query", "value")
    assert section_config("train", {"lora_target_modules": "all-linear"}).lora_target_modules == "all-linear"
    with pytest.raises(
        ConfigError, match=re.escape("train.lora_target_modules: expected str or list of str")
    ):
        section_config("train", {"lora_target_modules": ["query", 3]})


def test_range_checks_still_hold_after_the_type_check():
    with pytest.raises(ConfigError, match=re.escape("train.max_steps: must be >= 0, got -1")):
        section_config("train", {"max_steps": -1})


@pytest.mark.parametrize("name", ["head_lr", "lora_lr", "full_lr"])
@pytest.mark.parametrize("rate", [0, -0.01])
def test_a_learning_rate_is_above_zero(name, rate):
    # A negative rate loaded and trained the wrong way; a sweep range through it sampled such rates.
    with pytest.raises(ConfigError, match=re.escape(f"train.{name}: must be > 0, got {rate}")):
        section_config("train", {name: rate})


def test_a_wrong_type_in_a_run_config_is_refused(tmp_path, project_root):
    (tmp_path / "params.yaml").write_text((project_root / "params.yaml").read_text())
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bad.yaml").write_text(yaml.safe_dump({"train": {"max_steps": "six"}}))
    with pytest.raises(ConfigError, match=re.escape("train.max_steps: expected int or null")):
        load_params(tmp_path / "params.yaml", "bad")


def test_a_misspelt_section_in_a_run_config_names_the_run_config(tmp_path, project_root):
    # It said "params.yaml: unknown section(s) trian", sending the user to the file without the typo.
    (tmp_path / "params.yaml").write_text((project_root / "params.yaml").read_text())
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "typo.yaml").write_text(yaml.safe_dump({"trian": {"max_steps": 6}}))
    with pytest.raises(ConfigError, match=r"with .*configs/typo\.yaml: unknown section\(s\) trian"):
        load_params(tmp_path / "params.yaml", "typo")


def test_the_shipped_params_and_every_run_config_load(project_root):
    params = load_params(project_root / "params.yaml")
    assert type(params.train.lora_lr) is float and params.train.max_steps is None
    assert (params.train.family, params.train.method, params.train.epochs) == ("joint", "head", 4)
    for run_config in sorted(p.stem for p in (project_root / "configs").glob("*.yaml")):
        load_params(project_root / "params.yaml", run_config)


def test_train_threads_is_a_count_or_null(project_root):
    shipped = yaml.safe_load((project_root / "params.yaml").read_text())["train"]
    assert "threads" in shipped and load_params(project_root / "params.yaml").train.threads is None
    assert section_config("train", {"threads": 2}).threads == 2
    assert section_config("train", {"threads": None}).threads is None
    with pytest.raises(ConfigError, match=re.escape("train.threads: expected int or null, got 'two' (str)")):
        section_config("train", {"threads": "two"})
    with pytest.raises(ConfigError, match=re.escape("train.threads: must be >= 1")):
        section_config("train", {"threads": 0})


def test_the_monitor_section_ships_its_defaults_and_checks_its_ranges(project_root):
    params = load_params(project_root / "params.yaml")
    monitor = params.monitor
    assert (monitor.inference, monitor.window_hours, monitor.drift_share, monitor.min_decisions) == (
        None,
        24.0,
        0.5,
        100,
    )
    assert params.flywheel.inference == "inference"  # what the monitor reads when its own is null
    with pytest.raises(ConfigError, match=re.escape("monitor.drift_share: must lie in (0, 1], got 1.5")):
        section_config("monitor", {"drift_share": 1.5})
    with pytest.raises(
        ConfigError,
        match=re.escape("monitor.window_hours: must be > 0 and at most 876,000 (100 years), got 0.0"),
    ):
        section_config("monitor", {"window_hours": 0})
    with pytest.raises(ConfigError, match=re.escape("monitor.min_decisions: expected int, got 'many' (str)")):
        section_config("monitor", {"min_decisions": "many"})


def test_monitoring_and_flywheel_settings_do_not_change_a_runs_idempotency_key(tmp_path):
    from pipeline.lineage import keyed_sections

    (tmp_path / "defaults.yaml").write_text(
        "{}"
    )  # no sections: the code's defaults (an empty file is refused)
    defaults = keyed_sections(load_params(tmp_path / "defaults.yaml"))
    params_file = tmp_path / "params.yaml"
    for unkeyed in ("monitor:\n  window_hours: 6.0\n", "flywheel:\n  retrain_after_rows: 7\n"):
        params_file.write_text(unkeyed)
        assert keyed_sections(load_params(params_file)) == defaults
    params_file.write_text("promote:\n  max_ece: 0.2\n")
    assert keyed_sections(load_params(params_file)) != defaults


def test_the_bag_of_words_settings_take_a_row_count_and_a_margin_or_null():
    assert section_config("train", {"bag_of_words_rows": 0}).bag_of_words_rows == 0  # off
    with pytest.raises(
        ConfigError, match=re.escape("train.bag_of_words_rows: must be >= 0 (0: none), got -5")
    ):
        section_config("train", {"bag_of_words_rows": -5})
    with pytest.raises(ConfigError, match=re.escape("train.bag_of_words_rows: expected int")):
        section_config("train", {"bag_of_words_rows": "all"})
    assert (
        section_config("promote", {"min_accuracy_over_bag_of_words": None}).min_accuracy_over_bag_of_words
        is None
    )
    assert (
        section_config("promote", {"min_accuracy_over_bag_of_words": 0}).min_accuracy_over_bag_of_words == 0.0
    )
    with pytest.raises(ConfigError, match=re.escape("promote.min_accuracy_over_bag_of_words: must lie in")):
        section_config("promote", {"min_accuracy_over_bag_of_words": 5})


@pytest.mark.parametrize("name", ["../params", "/etc/passwd", "a b"])
def test_a_run_config_is_a_name_in_configs_never_a_path(project_root, name):
    with pytest.raises(ConfigError, match="not a path"):
        load_params(project_root / "params.yaml", name)


def test_an_empty_params_file_or_a_folder_is_refused_but_an_empty_run_config_overrides_nothing(tmp_path):
    # A truncated params.yaml trained with the code's defaults (another family and method) and said nothing.
    (tmp_path / "params.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"params\.yaml: empty; a params file holds sections"):
        load_params(tmp_path / "params.yaml")
    with pytest.raises(ConfigError, match="a folder; give the params file"):
        load_params(tmp_path)
    (tmp_path / "params.yaml").write_text("train:\n  max_steps: 7\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "nothing.yaml").write_text("")
    assert load_params(tmp_path / "params.yaml", "nothing").train.max_steps == 7
