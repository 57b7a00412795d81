"""A sweep's parts without training: the search-space file (and its refusals), the Optuna study it drives
(budget, resume after a kill, pruning), the one-driver lock, and the parent run's table, plots and noise
floor."""

import math
import statistics
import time

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from pipeline.cli.main import build_parser
from pipeline.cli.sweep import sweep_parameters
from pipeline.config import ConfigError, Params
from pipeline.rundir import RunBusy, RunFolder
from pipeline.sweep import report, study
from pipeline.sweep.space import apply, load_space

SPACE = {
    "trials": 4,
    "space": {
        "train.method": ["head", "lora"],
        "train.head_lr": {"low": 1e-4, "high": 1e-2, "log": True},
        "train.epochs": {"low": 2, "high": 8},
        "train.layer_plan": [None, [0, 1, 2, 3]],
    },
}


def write(tmp_path, content) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(content) if isinstance(content, dict) else content)
    return str(path)


def test_a_space_file_becomes_optuna_distributions_and_trial_settings(tmp_path):
    space = load_space(write(tmp_path, SPACE | {"fixed": {"train.early_stopping": 3}}), Params())
    dists = space.distributions
    assert isinstance(dists["train.method"], optuna.distributions.CategoricalDistribution)
    assert isinstance(dists["train.epochs"], optuna.distributions.IntDistribution)
    assert (
        dists["train.head_lr"].log and space.direction == "minimize" and space.objective == "validation_nll"
    )
    settings = space.overrides(
        {"train.method": "lora", "train.layer_plan": "[0, 1, 2, 3]", "train.epochs": 5}
    )
    assert settings == {
        "train.early_stopping": 3,
        "train.method": "lora",
        "train.layer_plan": [0, 1, 2, 3],
        "train.epochs": 5,
    }
    train = apply(Params(), settings).train
    assert (train.method, train.layer_plan, train.epochs, train.early_stopping) == (
        "lora",
        (0, 1, 2, 3),
        5,
        3,
    )
    assert space.with_budget(trials=9).trials == 9 and space.with_budget(minutes=2.5).minutes == 2.5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"trials": 2, "space": {"validate.holdout_fraction": [0.1, 0.2]}}, "only train.NAME settings vary"),
        (
            {"trials": 2, "space": {"train.nonsense": [1, 2]}},
            r"search space .*space\.yaml: train\.nonsense: unknown key",
        ),
        ({"trials": 2, "space": {"train.lora_r": [4, "eight"]}}, "train.lora_r"),
        ({"trials": 2, "space": {"train.epochs": {"low": 0, "high": 4}}}, "train.epochs"),
        ({"trials": 2, "space": {"train.head_lr": {"low": 0.1, "high": 0.01}}}, "low <= high"),
        ({"trials": 2, "space": {"train.head_lr": {"low": 0.0, "high": 0.1, "log": True}}}, "train.head_lr"),
        ({"trials": 2, "space": {"train.head_lr": "0.01"}}, "expected a list of choices"),
        ({"trials": 2, "space": {}}, "`space:` is empty"),
        ({"space": {"train.epochs": [2, 4]}}, "no budget"),
        ({"trials": 0, "space": {"train.epochs": [2, 4]}}, "trials must be a positive int"),
        ({"trials": True, "space": {"train.epochs": [2, 4]}}, "trials must be a positive int, got True"),
        ({"minutes": True, "space": {"train.epochs": [2, 4]}}, "minutes must be a positive number, got True"),
        (
            {"trials": 2, "parallel": True, "space": {"train.epochs": [2, 4]}},
            "parallel must be a positive int",
        ),
        ({"trials": 2, "objective": "heldout_accuracy", "space": {"train.epochs": [2, 4]}}, "objective"),
        ({"trials": 2, "pruner": "hyperband", "space": {"train.epochs": [2, 4]}}, "pruner"),
        ({"trials": 2, "spaces": {}, "space": {"train.epochs": [2, 4]}}, "unknown key"),
        ({"trials": 2, "fixed": {"train.epochs": "many"}, "space": {"train.lora_r": [4]}}, "train.epochs"),
        ("space: [unclosed", "not YAML"),
    ],
)
def test_a_bad_space_file_is_refused_before_any_trial_naming_what_is_wrong(tmp_path, content, message):
    with pytest.raises(ConfigError, match=message):
        load_space(write(tmp_path, content), Params())


def test_a_missing_space_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_space(tmp_path / "absent.yaml", Params())


def _study(tmp_path, **changes):
    space = load_space(
        write(tmp_path, {"trials": 4, "space": {"train.head_lr": {"low": 1e-4, "high": 1e-2}}} | changes),
        Params(),
    )
    return space, study.open_study(space, "s", study.storage_url(tmp_path))


def test_a_trial_a_kill_left_running_is_asked_again_with_its_settings_and_the_budget_counts_it_once(tmp_path):
    space, searched = _study(tmp_path)
    done = searched.ask(space.distributions)
    searched.tell(done, 0.5)
    interrupted = searched.ask(space.distributions)  # running when the process was killed
    budget = study.Budget(space.trials, None, 0.0)
    assert budget.left(searched) == 3

    reopened = study.open_study(space, "s", study.storage_url(tmp_path))  # the next process
    assert study.requeue_interrupted(reopened) == [interrupted.number]
    assert budget.left(reopened) == 3, "the interrupted trial is not spent: it runs again"
    again = reopened.ask(space.distributions)
    assert again.params == interrupted.params and again.user_attrs["requeued_from"] == interrupted.number
    reopened.tell(again, 0.4)
    assert budget.left(reopened) == 2
    assert [t.state for t in reopened.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert study.best_trial(reopened).number == again.number


def test_a_resumed_study_draws_new_settings_not_the_first_processs_again(tmp_path):
    space, first = _study(tmp_path)
    drawn = [first.ask(space.distributions) for _ in range(2)]
    for trial in drawn:
        first.tell(trial, 1.0)
    resumed = study.open_study(space, "s", study.storage_url(tmp_path))
    assert resumed.ask(space.distributions).params not in [t.params for t in drawn]


def test_a_wall_clock_budget_starts_no_trial_once_spent(tmp_path):
    _, searched = _study(tmp_path)
    assert study.Budget(None, 1.0, time.monotonic() - 61).left(searched) == 0  # a minute's budget, 61 s ago
    assert study.Budget(None, 1.0, time.monotonic()).left(searched) > 0


def test_the_median_pruner_stops_a_trial_whose_curve_is_worse_than_the_earlier_ones(tmp_path):
    space, searched = _study(tmp_path)
    for _ in range(study.STARTUP_TRIALS):
        trial = searched.ask(space.distributions)
        prune = study.pruning_callback(trial)
        assert not any(prune(step, 1.0 - 0.01 * step) for step in range(10))
        searched.tell(trial, 0.9)
    worse = study.pruning_callback(searched.ask(space.distributions))
    answers = [worse(step, 5.0) for step in range(10)]
    assert answers.index(True) == study.WARMUP_CHECKS, "pruned at the first check after the warm-up"
    better = study.pruning_callback(searched.ask(space.distributions))
    assert not any(better(step, 0.5) for step in range(10))


def test_a_diverged_trial_gets_the_worst_value_so_it_is_never_best(tmp_path):
    space, _ = _study(tmp_path)
    assert study.objective_value(space, {"validation_nll": float("nan")}) == float("inf")
    maximize = load_space(
        write(tmp_path, {"trials": 1, "objective": "validation_accuracy", "space": {"train.epochs": [2]}}),
        Params(),
    )
    assert study.objective_value(maximize, {"validation_accuracy": float("nan")}) == float("-inf")


def test_one_process_drives_a_sweep_at_a_time(tmp_path):
    sweep = RunFolder(tmp_path)
    busy = r"another process is running this sweep \(.*sweep.lock is locked\)"
    with sweep.driven("sweep"), pytest.raises(RunBusy, match=busy), sweep.driven("sweep"):
        pass  # a second driver, while the first holds it
    with sweep.driven("sweep"):  # released
        pass


def _row(number, state="finished", accuracy=0.8, ece=0.02, ms=1.0, questions=None):
    metrics = {
        "calibrated_accuracy": accuracy,
        "calibrated_record_accuracy": accuracy - 0.2,
        "calibrated_ece": ece,
        "score_ms_per_decision": ms,
        "validation_nll": 1.0 - accuracy,
    }
    return report.TrialRow(
        number,
        state,
        {"train.epochs": number + 2},
        metrics if state != "failed" else {},
        questions or {"q1": accuracy, "q2": accuracy - 0.1},
    )


def test_the_parent_summary_lists_every_trial_with_the_best_first_and_bold(tmp_path):
    rows = [_row(0), _row(1, accuracy=0.9), _row(2, "pruned"), _row(3, "failed")]
    table = report.summary_markdown(rows, 1, "validation_nll")
    lines = table.splitlines()
    assert lines[0].startswith("| trial | state | train.epochs | validation_nll")
    assert lines[2].startswith("| **1** | **finished** | **3**") and "| 3 | failed | 5 |" in table
    assert "trial 1 is best by validation_nll" in table
    assert report.tradeoff_plot(rows, 1, tmp_path / "t.png").stat().st_size > 10_000
    assert report.question_plot(rows, 1, tmp_path / "q.png").stat().st_size > 5_000
    assert report.tradeoff_plot([_row(0, "failed")], None, tmp_path / "none.png") is None
    assert "bag of words" not in table  # no trial scored one


def test_the_summary_and_the_tradeoff_plot_show_the_bag_of_words_every_trial_scored(tmp_path):
    rows = [_row(0), _row(1, accuracy=0.9), _row(2, "failed")]
    for row in rows[:2]:
        row.metrics["bag_of_words_accuracy"] = 0.6789
    assert "A bag of words on the same split: held-out accuracy 0.6789." in report.summary_markdown(
        rows, 1, "x"
    )
    assert report.bag_of_words_accuracy(rows) == 0.6789 and report.bag_of_words_accuracy(rows[2:]) is None
    assert report.tradeoff_plot(rows, 1, tmp_path / "t.png").stat().st_size > 10_000


def test_the_noise_floor_is_the_mean_and_sample_std_over_seeds():
    runs = [
        {"calibrated_accuracy": a, "calibrated_record_accuracy": a / 2, "calibrated_ece": e}
        for a, e in [(0.80, 0.02), (0.82, 0.03), (0.78, 0.025)]
    ]
    floor = report.noise_floor(runs)
    assert floor["seeds"] == 3 and floor["accuracy_mean"] == pytest.approx(0.80)
    assert floor["accuracy_std"] == pytest.approx(statistics.stdev([0.80, 0.82, 0.78]))
    assert floor["ece_mean"] == pytest.approx(
        0.025
    ) and "3 seeds: accuracy 0.8000 ± 0.0200" in report.describe_noise(floor)


def test_one_seed_has_no_spread_rather_than_none():
    # One seed said "± 0.0000": no noise, where nothing measured it.
    floor = report.noise_floor(
        [{"calibrated_accuracy": 0.8, "calibrated_record_accuracy": 0.5, "calibrated_ece": 0.02}]
    )
    assert math.isnan(floor["accuracy_std"]) and "one seed has no spread" in report.describe_noise(floor)


def test_decision_sweep_passes_its_options_to_the_flow():
    args = build_parser().parse_args(
        ["sweep", "--space", "s.yaml", "--trials", "5", "--repeat-best", "3", "--json"]
    )
    assert sweep_parameters(args) == {
        "space_file": "s.yaml",
        "params_file": "params.yaml",
        "run_config": None,
        "trials": 5,
        "minutes": None,
        "parallel": None,
        "repeat_best": 3,
        "storage": None,
        "allow_unpinned": False,
    }


def test_the_first_trial_is_params_yamls_own_settings_where_the_space_holds_them(tmp_path):
    space = load_space(write(tmp_path, SPACE), Params())
    current = apply(Params(), {"train.method": "head", "train.head_lr": 0.001, "train.epochs": 4})
    assert space.baseline(current) == {
        "train.method": "head",
        "train.head_lr": 0.001,
        "train.epochs": 4,
        "train.layer_plan": None,
    }
    planned = apply(current, {"train.layer_plan": [0, 1, 2, 3]})
    assert space.baseline(planned)["train.layer_plan"] == "[0, 1, 2, 3]"  # stored as Optuna stores the choice
    assert space.baseline(apply(current, {"train.epochs": 12})) is None  # 12 epochs lie outside [2, 8]: none


def test_the_summary_writes_counts_as_integers_and_seconds_briefly():
    row = report.TrialRow(
        0, "pruned", {"train.head_lr": 0.00112}, {"steps": 354.0, "train_seconds": 136.4658}
    )
    line = report.summary_markdown([row], None, "validation_nll").splitlines()[2]
    assert "| 0.0011 |" in line and "| 354 |" in line and "| 136.5 |" in line


@pytest.mark.parametrize(
    ("url", "shown", "reason"),
    [
        ("notaurl", "notaurl", "Could not parse"),
        ("postgresql://u:secret@127.0.0.1:1/db", "postgresql://u:***@127.0.0.1:1/db", "refused"),
        ("sqlite:////no/such/folder/optuna.db", "sqlite:////no/such/folder/optuna.db", "unable to open"),
    ],
)
def test_a_study_store_optuna_cannot_use_is_one_error_naming_it_without_its_password(url, shown, reason):
    with pytest.raises(ConfigError) as refused:
        study.check_storage(url)
    message = str(refused.value)
    assert message.startswith(f"--storage {shown}: ") and reason in message and "secret" not in message


def test_a_study_store_optuna_can_use_passes(tmp_path):
    study.check_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert (tmp_path / "optuna.db").is_file()
