"""The `retrain` Prefect flow: pins → validate (with the slice, once) → train → calibrate → export → MLflow →
register → smoke test over HTTP → promotion gate → aliases. Every task is a thin call into `pipeline/`.

Task results persist under the project's Prefect home (`.prefect/`, set by the Makefile and `decision
retrain`), cached on their inputs and source, so a rerun after a crash skips the finished tasks, and a train
task killed midway resumes from its last training checkpoint in the run folder. The idempotency key (data +
base snapshot + params + code) names the run folder, the MLflow run and the model version, so the same key
never makes a second run or version (a killed flow's unfinished run is reopened). Retries only where I/O can
fail transiently: the registry and the HTTP smoke test; never training.

It trains only on inputs DVC pins (`dvc.lock`, or a `.dvc` file) and refuses before any task runs otherwise,
naming each path and the command that pins it. `--allow-unpinned` trains anyway: the run and the version are
tagged `allow_unpinned=true`, and the gate holds the version (`decision promote VERSION --force` promotes it).

    decision retrain                         # params.yaml (what `make run` does): this flow in its own process
    decision retrain --run-config tiny
    decision retrain --allow-unpinned        # data or base not pinned yet: train, never promote by itself

It returns the run's `RunResult` (`pipeline.stages.result`), released (registered, smoke-tested, gated), or a
`RunSkipped` where `only_new_data` found nothing new.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from contextlib import ExitStack
from dataclasses import replace

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.runtime import flow_run

from flows.interrupts import refused
from flows.launched import run_launched
from pipeline.config import CertifyConfig, QuantizeConfig, load_params
from pipeline.data.pins import CheckedInputs, data_revision
from pipeline.data.split import SplitData
from pipeline.mlops import tracking
from pipeline.mlops.registry import ensure_experiment, tracking_uri
from pipeline.rundir import RunBusy, RunFolder
from pipeline.scoring.bag_of_words import BAG_OF_WORDS
from pipeline.scoring.certified_coverage import certificate_tags
from pipeline.scoring.report import report_tags
from pipeline.stages import calibrate as calibrate_stage
from pipeline.stages import export as export_stage
from pipeline.stages import promote as promote_stage
from pipeline.stages import quantize as quantize_stage
from pipeline.stages import smoke as smoke_stage
from pipeline.stages import track as track_stage
from pipeline.stages import train as train_stage
from pipeline.stages import validate as validate_stage
from pipeline.stages.calibrate import CalibrationResult
from pipeline.stages.card import attach_model_card, model_card
from pipeline.stages.promote import GateResult
from pipeline.stages.quantize import QuantizeResult
from pipeline.stages.result import Release, RunResult, RunSkipped, Tracked
from pipeline.stages.smoke import SmokeResult
from pipeline.stages.start import REFUSED_INPUTS, RunStart, revision_of, start_run, unchanged_since_champion
from pipeline.stages.validate import ValidateResult
from pipeline.training.controls import RunHooks
from pipeline.training.fit import TrainRun

CACHED = {"cache_policy": INPUTS + TASK_SOURCE, "persist_result": True}
IO_RETRIES = {"retries": 2, "retry_delay_seconds": 5}
LOCAL_UI = "http://127.0.0.1:5000"  # where `make ui` serves the local store


@task(name="validate", **CACHED)
def validate(data: str, row_slice: str | None, config, report_file: str, split: str) -> ValidateResult:
    logger = get_run_logger()
    result = validate_stage.validate_stage(
        data, config, report_file, row_slice, split_out=split, report=logger.info
    )
    rows = [{"reason": reason, "decisions": n} for reason, n in sorted(result.report.skipped.items())]
    usable = f"{result.report.kept} of {result.report.decisions} decisions usable"
    described = usable if result.report.states is None else f"{usable}; {result.report.states.describe()}"
    create_table_artifact(
        rows or [{"reason": "(none)", "decisions": 0}], key="skipped-decisions", description=described
    )
    return result


@task(name="train", **CACHED)
def train(
    run_dir: str, base: str, config, device: str, key: str, tags: dict[str, str], checked: CheckedInputs
) -> TrainRun:
    # No progress bar in the Prefect log: the run logger gets a line every 10 steps or 30 s instead.
    # The MLflow run opens now, so its curves fill in the UI while training runs.
    # With train.nproc > 1 the stage runs on torchrun ranks: rank 0's lines and curves come back here, to this
    # one run (every rank knows its id).
    logger = get_run_logger()
    run_id, live = tracking.open_run(key, flow_run.name, tags)
    watch = tracking.LiveRun(run_id) if live else None
    hooks = RunHooks(logger.info, watch and watch.step, watch and watch.heldout, mlflow_run_id=run_id)
    run = train_stage.train_stage(run_dir, base, config, device, hooks, checked=checked)
    for warning in run.warnings:
        logger.warning("the fine-tune did not learn: %s", warning)
    return run


@task(name="calibrate", **CACHED)
def calibrate(run_dir: str, bag_of_words_rows: int, certify: CertifyConfig) -> CalibrationResult:
    logger = get_run_logger()
    result = calibrate_stage.calibrate_stage(
        run_dir, bag_of_words_rows=bag_of_words_rows, say=logger.info, certify_config=certify
    )
    words = result.heldout.get(BAG_OF_WORDS)
    if words:
        logger.info(
            "bag of words (TF-IDF + logistic regression) on %s training rows in %.0f s: held-out accuracy "
            "%.4f, the calibrated fine-tune's %.4f",
            f"{words['rows']:,}",
            words["seconds"],
            words["accuracy"],
            result.heldout["calibrated"]["accuracy"],
        )
    return result


@task(name="export", **CACHED)
def export(run_dir: str, data: str, base: str, config) -> str:
    return export_stage.export_stage(run_dir, RunFolder(run_dir).export, data, base, config).out


@task(name="quantize", **CACHED)
def quantize(export_dir: str, run_dir: str, config: QuantizeConfig, certify: CertifyConfig) -> QuantizeResult:
    rows = quantize_stage.run_rows(run_dir)
    return quantize_stage.quantize_export(export_dir, rows, config, certify, say=get_run_logger().info)


@task(name="log-to-mlflow", **CACHED, **IO_RETRIES)
def track(result: RunResult, run_id: str | None) -> str:
    return track_stage.track_run(result, run_id)


@task(name="register", **CACHED, **IO_RETRIES)
def register(export_dir: str, name: str, run_id: str, tags: dict[str, str]) -> str:
    return promote_stage.register_stage(export_dir, name, run_id, tags)


@task(name="model-card", **IO_RETRIES)
def card(result: RunResult, name: str, version: str, run_id: str) -> None:
    attach_model_card(name, version, run_id, model_card(result, name, version))


@task(name="smoke-test", **IO_RETRIES)
def smoke(name: str, version: str, run_dir: str, n: int) -> SmokeResult:
    run = RunFolder(run_dir)
    heldout = SplitData.load(run.split).split.heldout
    get_run_logger().info(
        "smoke test: serving %s version %s on a loopback port, then up to %d held-out decisions over HTTP",
        name,
        version,
        n,
    )
    return smoke_stage.smoke_version(name, version, heldout, n, run.expected_answers)


@task(name="promotion-gate", **IO_RETRIES)
def promotion_gate(
    result: RunResult, name: str, version: str, smoke_passed: bool, config, unpinned: bool = False
) -> GateResult:
    """The gate on the run's calibrated held-out figures with their intervals (and its bag of words' where
    scored), scored against the champion on the run's held-out rows; its certificates said in a line."""
    heldout = SplitData.load(RunFolder(result.run_dir).split).split.heldout
    words = result.heldout.get(BAG_OF_WORDS, {}).get("accuracy")
    calibration = result.calibration
    return promote_stage.promotion_stage(
        name,
        version,
        promote_stage.candidate_figures(result.heldout["calibrated"], calibration.report),
        smoke_passed,
        heldout,
        config,
        result.train.warnings,
        unpinned=unpinned,
        bag_of_words=words,
        automation=promote_stage.automation_line(calibration.certificates),
    )


def _run_name() -> str:
    params = flow_run.parameters
    data = load_params(params.get("params_file", "params.yaml"), params.get("run_config")).retrain.data
    return f"retrain-{data_revision(data)[:8]}-{dt.date.today().isoformat()}"


# A hung run (a stuck smoke-test server, say) must not hold the deployment's single slot forever.
@flow(name="retrain", flow_run_name=_run_name, log_prints=True, timeout_seconds=4 * 3600)
def retrain(
    params_file: str = "params.yaml",
    run_config: str | None = None,
    lock: str = "dvc.lock",
    owner: str | None = None,
    allow_unpinned: bool = False,
    only_new_data: bool = False,
    reason: str | None = None,
) -> RunResult | RunSkipped:
    """Retrain on the pinned data and base, track, register, smoke-test and (through the gate) promote.

    `owner` tags the run and the version: the Decision API then serves that version by name to the owner's
    keys. `allow_unpinned` trains on inputs DVC does not pin (refused otherwise); the gate then holds the
    version. `only_new_data` (the scheduled deployment's setting) skips the run, with its reason, when the
    data revision is the one the champion was trained on: no new rows arrived, so there is nothing new to
    learn. `reason` says why the run started (the flywheel automation fills it from its event, e.g. "started
    by decision.certificate.broken: tone broken: 6 wrong of 40 ..."): the log's first line.
    """
    if reason:
        print(reason)
    start = start_run(params_file, run_config, lock, allow_unpinned, owner)
    if start.checked.unpinned:
        unpinned = ", ".join(start.checked.unpinned)
        get_run_logger().warning("--allow-unpinned: training on inputs DVC does not pin: %s", unpinned)
    if only_new_data and (unchanged := unchanged_since_champion(start, run_config)):
        print(unchanged)
        return RunSkipped(
            skip_reason=unchanged, model=start.params.retrain.model_name, data_md5=start.data_md5
        )
    revision = revision_of(start)
    print(revision.line())
    run = RunFolder(start.folder())
    with ExitStack() as held:
        try:
            held.enter_context(run.driven())
        except RunBusy as error:
            return refused(error)
        return _run(start, run, revision)


def _run(start: RunStart, run: RunFolder, revision) -> RunResult:
    """The run's tasks, from validation to the gate, with its folder held."""
    params, config, run_dir = start.params, start.params.retrain, str(run.root)
    # Validated and split once: every later task reads the run's split (RunFolder.split).
    validated = validate(config.data, config.slice, params.validate, str(run.validation), str(run.split))
    params.certify.unasked(SplitData.load(run.split).question_ids())  # refused before the training
    tags = start.tags | {"idempotency_key": start.key}
    trained = train(run_dir, config.base, params.train, config.device, start.key, tags, start.checked)
    calibration = calibrate(run_dir, params.train.bag_of_words_rows, params.certify)
    export_dir = export(run_dir, config.data, config.base, params.train)
    quantized = quantize(export_dir, run_dir, params.quantize, params.certify)
    tracked = Tracked(
        key=start.key,
        params=params.sections(),
        data=config.data,
        data_md5=start.data_md5,
        tags=tags | {"prefect_flow_run_id": str(flow_run.id)},
        run_name=flow_run.name,
        revision=revision,
    )
    result = RunResult(
        run_dir=run_dir,
        validation=validated,
        train=trained,
        calibration=calibration,
        export_dir=export_dir,
        tracked=tracked,
    )
    run_id = track(result, trained.mlflow_run_id)
    result = replace(result, tracked=replace(tracked, mlflow_run_id=run_id))
    version_tags = {
        **tracked.tags,
        "mlflow_run_id": run_id,
        **report_tags(calibration.to_dict()),
        **certificate_tags(calibration.certificates),
        **quantized.tags(),
    }
    version = register(export_dir, config.model_name, run_id, version_tags)
    card(result, config.model_name, version, run_id)
    smoked = smoke(config.model_name, version, run_dir, config.smoke_decisions)
    verdict = promotion_gate(
        result, config.model_name, version, smoked.passed, params.promote, start.unpinned
    )
    release = Release(model=config.model_name, version=version, smoke=smoked, gate=verdict)
    result = replace(result, release=release).saved(run.result)
    _publish(result)
    return result


def _publish(result: RunResult) -> None:
    # A tracking server serves its own UI; otherwise `make ui` serves the local store on port 5000.
    store = tracking_uri()
    ui = os.environ.get("MLFLOW_UI_URL") or (store if store.startswith(("http://", "https://")) else LOCAL_UI)
    run_url = f"{ui}/#/experiments/{ensure_experiment()}/runs/{result.tracked.mlflow_run_id}"
    create_link_artifact(run_url, link_text="MLflow run (make ui)", key="mlflow-run")
    create_markdown_artifact(before_after_markdown(result), key="before-after")


def before_after_markdown(result: RunResult) -> str:
    """The held-out table (base, fine-tune, calibrated) and the gate's verdict, as markdown."""
    release = result.release
    verdict = "promoted to champion" if release.promoted else "held as challenger"
    notices = "".join(f"\n\nNote: {notice}" for notice in result.calibration.notices)
    return (
        f"{tracking.heldout_table(result.heldout)}\n\nVersion {release.version} of `{release.model}`: "
        f"{verdict} ({'; '.join(release.gate.reasons)}).{notices}"
    )


REFUSED = (*REFUSED_INPUTS, RunBusy)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision retrain` starts it (`flows.launched`)."""
    return run_launched(retrain, "retrain", REFUSED, "a rerun resumes from the last checkpoint", argv)


if __name__ == "__main__":
    sys.exit(main())
