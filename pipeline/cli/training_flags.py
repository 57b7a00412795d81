"""What `decision train` and `decision finetune` share: their flags (the same names as the params.yaml keys
they override), and what the flags make of a run: params.yaml with them applied, where the rows come from, the
hooks and controls the stage gets (a cancel token Ctrl-C sets), and the errors that are one line.

    given = training_inputs(args)
    with given.controls.cancel.on_signals():
        run = train_on_data(given.source, BASE, OUT, given.config, "auto", given.hooks, given.controls)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.mapping_flags import BadMappingFlags, add_mapping_arguments, mapping_value
from pipeline.cli.options import (
    AT_LEAST_ONE,
    DATA_HELP,
    add_output_flags,
    device_option,
    model_out,
    parse_layer_plan,
)
from pipeline.cli.runner import EXIT_INTERRUPTED, EXIT_OK, refuse
from pipeline.cli.tables import progress_outputs

if TYPE_CHECKING:  # for annotations only: `decision --help` answers without torch
    from pipeline.config import CertifyConfig, Params, QuantizeConfig, TrainConfig
    from pipeline.data.split import TrainSource
    from pipeline.training.controls import RunControls, RunHooks

NPROC_HELP = (
    "data-parallel ranks under torchrun, each on its share of every window (default: train.nproc; gloo on "
    "the CPU, NCCL on GPUs)"
)


def add_training_arguments(
    command: argparse.ArgumentParser, out_help: str, nproc_help: str = NPROC_HELP
) -> None:
    """The flags `train` and `finetune` share (the same names as the params.yaml keys they override)."""
    _add_model_flags(command, out_help)
    _add_schedule_flags(command, nproc_help)
    command.add_argument("--slice", metavar="START:END", help="use rows [START, END) of DATA only")
    command.add_argument(
        "--device",
        default="auto",
        type=device_option,
        help="auto (cuda if available), cpu, cuda, cuda:1, ...",
    )
    command.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    add_output_flags(command)
    add_mapping_arguments(command)


def _add_model_flags(command: argparse.ArgumentParser, out_help: str) -> None:
    """What is trained, from what, into where, and how."""
    command.add_argument("--data", required=True, help=DATA_HELP)
    command.add_argument(
        "--base",
        required=True,
        help="a Laya-layout folder (its encoder; joint or laya family), or a plain Hugging Face encoder "
        "(BERT, RoBERTa, DeBERTa-v2, ModernBERT, ...) or causal LM (Qwen3, Llama, ...) folder with its "
        "tokenizer (joint family); `decision snapshot --from` pins one. Exit 2 when it is none of these",
    )
    command.add_argument(
        "--family",
        metavar="NAME",
        help="the model family (`decision families` lists them; default: train.family in params.yaml, else "
        "what BASE is: a Laya-layout folder is laya, a plain encoder or causal LM folder joint); joint "
        "on a Laya-layout base trains the joint head on its encoder",
    )
    command.add_argument("--out", required=True, type=model_out, help=out_help)
    command.add_argument(
        "--method",
        metavar="NAME",
        help="how to train, as the family offers (`decision families` lists each family's methods, its "
        "default first; default: train.method in params.yaml, or with --family that family's default): "
        "head trains the joint head on the frozen backbone (its features computed once); qlora (4-bit "
        "nf4) is for causal-LM bases",
    )


def _add_schedule_flags(command: argparse.ArgumentParser, nproc_help: str) -> None:
    """How long, on how many ranks and threads, through which layers."""
    command.add_argument(
        "--epochs",
        type=AT_LEAST_ONE,
        help="epochs (default: train.epochs; a small set trains more, up to train.min_steps steps)",
    )
    command.add_argument(
        "--max-steps", type=AT_LEAST_ONE, help="cap on optimizer steps (default: train.max_steps)"
    )
    command.add_argument("--nproc", type=AT_LEAST_ONE, help=nproc_help)
    command.add_argument(
        "--threads",
        type=AT_LEAST_ONE,
        metavar="N",
        help="torch CPU threads, split between the ranks (default: train.threads; null: the cores this "
        "process may use, its affinity mask or container CPU quota, whichever is smaller)",
    )
    command.add_argument(
        "--layer-plan",
        type=parse_layer_plan,
        metavar="PLAN",
        help="the backbone's layers to run, in order (default: train.layer_plan): 0,1,1,2,3 visits layer 1 "
        "twice with the same weights; 0,1,2,3 skips the rest; JSON [[start,end,passes]] repeats "
        "half-open ranges",
    )
    command.add_argument(
        "--state-windows",
        type=AT_LEAST_ONE,
        metavar="N",
        help="joint family on an encoder: read a state longer than the encoder's window in up to N windows, "
        "the head attending over all of them (default: train.state_windows)",
    )


@dataclass(frozen=True)
class TrainingInputs:
    """What `train` and `finetune` hand their stage: where the rows come from (DATA's slice, split as
    params.yaml says), the train config with the flags applied, and the run's hooks and controls."""

    source: TrainSource
    config: TrainConfig
    hooks: RunHooks
    controls: RunControls
    certify: CertifyConfig
    quantize: QuantizeConfig


def training_inputs(args: argparse.Namespace, save_on_cancel: bool = False) -> TrainingInputs:
    """The run the flags ask for; ConfigError (exit 2) for an --out, --run-dir, --eval-data or params value
    that cannot be, before anything is read or trained."""
    from dataclasses import replace

    from pipeline.config import load_params
    from pipeline.training.controls import CancelToken, RunControls, RunHooks

    _check_places(args)
    params = _with_mapping(load_params(args.params), args)
    config = replace(params.train, **_overrides(args))
    bars, report = progress_outputs(args)
    controls = RunControls(progress=bars, cancel=CancelToken(), save_on_cancel=save_on_cancel)
    hooks = RunHooks(report=report)
    return TrainingInputs(_source(args, params), config, hooks, controls, params.certify, params.quantize)


def training_errors() -> tuple[type[Exception], ...]:
    """The errors of a training run that are one line (exit 2 for the user's input, else 1:
    `runner.exit_code`): a rank that failed, a pin that does not match, a file not there, and the ValueErrors
    (a model layout, a source, a slice, a config value)."""
    from pipeline.data.pins import PinMismatch
    from pipeline.training.launch import RankFailed

    return (RankFailed, PinMismatch, FileNotFoundError, ValueError)


def warn_not_learned(warnings: list[str]) -> None:
    """Say plainly, on stderr, where the fine-tune learned nothing (also with --json or --quiet)."""
    for warning in warnings:
        print(f"warning: the fine-tune did not learn: {warning}", file=sys.stderr)


def run_exit_code(run) -> int:
    """130 for a run that was cancelled (Ctrl-C, SIGTERM), else 0."""
    return EXIT_INTERRUPTED if run.cancelled else EXIT_OK


def _check_places(args: argparse.Namespace) -> None:
    """--out must not replace or overlap --base (the export would replace the base), and --run-dir must take
    files outside --out."""
    from pipeline.config import ConfigError

    out, base = Path(args.out).resolve(), Path(args.base).resolve()
    if out == base or out.is_relative_to(base) or base.is_relative_to(out):
        raise ConfigError(
            f"--out {args.out}: {'the same folder as' if out == base else 'overlaps'} --base {args.base}, "
            "which writing the model would replace; give another --out"
        )
    if getattr(args, "run_dir", None) and (problem := _run_dir_problem(Path(args.run_dir), out)) is not None:
        raise ConfigError(f"--run-dir {args.run_dir}: {problem}")


def _run_dir_problem(run_dir: Path, out: Path) -> str | None:
    """Why `run_dir` cannot hold this run: the export replaces --out whole, a run folder in it included, or no
    folder can be made there."""
    from pipeline.families.base_folders import unwritable_place

    if run_dir.resolve() == out or run_dir.resolve().is_relative_to(out):
        return (
            "inside --out, which the export replaces whole (the calibration report and plots with it); "
            "give another"
        )
    return unwritable_place(run_dir)


def _with_mapping(params: Params, args: argparse.Namespace) -> Params:
    """params with `validate.mapping` from --mapping or the mapping flags, checked now: a mapping that is no
    mapping is one line and exit 2 (SystemExit) before anything is read or trained."""
    from dataclasses import replace

    from pipeline.config import ConfigError
    from pipeline.data.mapping import MappingError, load_mapping

    try:
        value = mapping_value(args)
        if value is None:
            value = params.validate.mapping
        if value is not None:
            load_mapping(value)
        return replace(params, validate=replace(params.validate, mapping=value))
    except (BadMappingFlags, MappingError, ConfigError) as error:
        raise SystemExit(refuse(args, error)) from None


def _overrides(args: argparse.Namespace) -> dict:
    """The train config's keys the flags set."""
    flags = ("family", "method", "epochs", "max_steps", "nproc", "threads", "layer_plan", "state_windows")
    overrides = {key: getattr(args, key) for key in flags if getattr(args, key) is not None}
    if args.family is not None and args.method is None:
        overrides["method"] = (
            None  # params.yaml's method was chosen for its own family: use this one's default
        )
    return overrides


def _source(args: argparse.Namespace, params: Params) -> TrainSource:
    """Where `train` and `finetune` read their decisions: DATA's slice, split as params.yaml says."""
    from pipeline.config import ConfigError
    from pipeline.data.read import RowSlice
    from pipeline.data.split import TrainSource

    eval_data = getattr(args, "eval_data", None)
    if eval_data is not None and Path(eval_data).resolve() == Path(args.data).resolve():
        raise ConfigError(
            f"--eval-data {eval_data}: the training data itself; its held-out figures would be measured on "
            "rows the model trained on: drop --eval-data (a held-out split is carved from --data) or give "
            "other rows"
        )
    return TrainSource(args.data, RowSlice.parse(args.slice), eval_data, params.validate)
