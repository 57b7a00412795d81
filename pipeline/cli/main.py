"""The `decision` command line: one subcommand per stage, each with `--help` and a `--json` mode.

    decision validate data/processed/vader.jsonl --slice 0:1000
    decision validate big.parquet --slice 1000000:1001000 --json

stdout carries the command's result (tables, or one JSON object with `--json`); progress goes to stderr, with or
without `--json`, and `--quiet` (-q) is what silences it. Heavy libraries are imported inside the subcommands so
that `decision --help` answers at once.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from pipeline.cli.api import add_api_commands
from pipeline.cli.compare import add_compare_commands
from pipeline.cli.data import BadMappingFlags, add_data_commands, add_mapping_arguments, mapping_value
from pipeline.cli.flywheel import add_flywheel_commands
from pipeline.cli.harvest import add_harvest
from pipeline.cli.monitor import add_monitor
from pipeline.cli.predict import add_predict_commands
from pipeline.cli.registry import add_registry_commands
from pipeline.cli.retrain import add_retrain
from pipeline.cli.runs import add_run_commands
from pipeline.cli.sweep import add_sweep
from pipeline.cli.tables import (
    AT_LEAST_ONE,
    MISCOVERAGE,
    SCORING_DEVICE_HELP,
    device_option,
    print_evaluation,
    print_finetuned,
    print_heldout,
    print_report,
    progress_outputs,
    quiet_libraries,
    show_defaults,
)
from pipeline.strict_json import to_json

EXIT_OK, EXIT_UNREADABLE, EXIT_NOTHING_USABLE = 0, 1, 2
EXIT_BAD_BASE = 2  # a base no family starts from: refused before anything trains
EXIT_BAD_MAPPING = 2  # a mapping that cannot apply to the table: refused before anything trains
EXIT_BAD_SOURCE = 2  # an empty folder, shards that disagree, a Hub id offline: refused before any row is read
EXIT_BAD_CONFIG = 2  # a params, run config or flag value of the wrong type or range: refused before any work
DATA_HELP = (
    "a decision file (.jsonl, .parquet, .csv), a folder or quoted glob of .parquet/.jsonl shards, a partitioned "
    "Parquet folder, a datasets save_to_disk folder (FOLDER:SPLIT for a split), or hf:OWNER/NAME[:SPLIT] "
    "(docs/data-format.md, Sources)"
)


def _validate(args: argparse.Namespace) -> int:
    from pipeline.data.mapping import MappingError, load_mapping
    from pipeline.data.read import BadSlice, RowSlice, UnreadableInput
    from pipeline.data.validate import validate_file

    try:
        value = mapping_value(args)
        mapping = load_mapping(value) if value is not None else None
        data = validate_file(args.data, RowSlice.parse(args.slice), with_records=False, mapping=mapping,
                             report=progress_outputs(args)[1])  # fmt: skip
    except (BadMappingFlags, MappingError) as error:
        print(f"decision validate: {error}", file=sys.stderr)
        return EXIT_BAD_MAPPING
    except (UnreadableInput, BadSlice) as error:
        print(f"decision validate: {error}", file=sys.stderr)
        return _exit_code(error)
    report = data.report.to_dict()
    if args.json:
        print(to_json(report))
    else:
        print_report(report)
    if data.report.kept == 0:
        print(
            f"decision validate: no usable decision in {args.data} ({data.report.decisions} decisions, "
            "all skipped; see the reasons above)",
            file=sys.stderr,
        )
        return EXIT_NOTHING_USABLE
    return EXIT_OK


def _training_setup(args: argparse.Namespace):
    """params.yaml with the command's overrides applied, a cancel token, and the errors worth one clear line."""
    from dataclasses import replace

    from pipeline.config import ConfigError, load_params
    from pipeline.data.pins import PinMismatch
    from pipeline.data.read import BadSlice, UnreadableInput
    from pipeline.families.base import ModelLayoutError
    from pipeline.training.controls import CancelToken
    from pipeline.training.launch import RankFailed

    errors = (
        ConfigError,
        RankFailed,
        ModelLayoutError,
        PinMismatch,
        UnreadableInput,
        BadSlice,
        FileNotFoundError,
        ValueError,
    )
    out, base = Path(args.out).resolve(), Path(args.base).resolve()
    if (
        out == base or out.is_relative_to(base) or base.is_relative_to(out)
    ):  # the export would replace the base
        raise ConfigError(f"--out {args.out}: {'the same folder as' if out == base else 'overlaps'} --base "
                          f"{args.base}, which writing the model would replace; give another --out")  # fmt: skip
    if getattr(args, "run_dir", None) and (problem := _run_dir_problem(Path(args.run_dir), out)) is not None:
        raise ConfigError(f"--run-dir {args.run_dir}: {problem}")
    params = _with_mapping(load_params(args.params), args)
    overrides = {
        k: v
        for k, v in (
            ("family", args.family),
            ("method", args.method),
            ("epochs", args.epochs),
            ("max_steps", args.max_steps),
            ("nproc", args.nproc),
            ("threads", args.threads),
            ("layer_plan", args.layer_plan),
            ("state_windows", args.state_windows),
        )
        if v is not None
    }
    if args.family is not None and args.method is None:
        overrides["method"] = (
            None  # params.yaml's method was chosen for its own family: use this one's default
        )
    return params, replace(params.train, **overrides), CancelToken(), errors  # ConfigError: main's one line


def _with_mapping(params, args: argparse.Namespace):
    """params with `validate.mapping` from --mapping or the mapping flags, checked now: a mapping that is no
    mapping exits 2 before anything is read or trained."""
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
        print(f"decision {args.command}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_MAPPING) from None


def _exit_code(error: Exception) -> int:
    """2 for a bad base, source, slice, mapping, config value, registered model or a model that is not there
    (`BadBase`, `BadSource`, `BadSlice`, `MappingError`, `ConfigError`, `RegistryError`, `NoSuchModel`: the user's
    input, refused before training), else 1 (a file that cannot be read)."""
    from pipeline.config import ConfigError
    from pipeline.data.mapping import MappingError
    from pipeline.data.read import BadSlice, BadSource
    from pipeline.families.base import BadBase, NoSuchModel
    from pipeline.mlops.registry import RegistryError

    if isinstance(error, BadSource | BadSlice | RegistryError | NoSuchModel):
        return EXIT_BAD_SOURCE
    if isinstance(error, ConfigError):
        return EXIT_BAD_CONFIG
    return EXIT_BAD_BASE if isinstance(error, (BadBase, MappingError)) else EXIT_UNREADABLE


def _source(args: argparse.Namespace, params):
    """Where `train` and `finetune` read their decisions: DATA's slice, split as params.yaml says."""
    from pipeline.config import ConfigError
    from pipeline.data.read import RowSlice
    from pipeline.data.split import TrainSource

    eval_data = getattr(args, "eval_data", None)
    if eval_data is not None and Path(eval_data).resolve() == Path(args.data).resolve():
        raise ConfigError(f"--eval-data {eval_data}: the training data itself; its held-out figures would be "
                          "measured on rows the model trained on: drop --eval-data (a held-out split is carved "
                          "from --data) or give other rows")  # fmt: skip
    return TrainSource(args.data, RowSlice.parse(args.slice), eval_data, params.validate)


def _train(args: argparse.Namespace) -> int:
    from pipeline.stages.train import train_on_data
    from pipeline.training.controls import RunControls, RunHooks

    params, config, cancel, errors = _training_setup(args)
    bars, report = progress_outputs(args)
    try:
        with cancel.on_signals():
            run = train_on_data(_source(args, params), args.base, args.out, config, args.device,
                                RunHooks(report=report),
                                RunControls(progress=bars, cancel=cancel, save_on_cancel=args.save_on_cancel))  # fmt: skip
    except errors as error:
        print(f"decision train: {error}", file=sys.stderr)
        return _exit_code(error)
    _warn(run.warnings)
    if args.json:
        print(to_json(run.to_dict()))
    else:
        print_heldout(run, run.heldout, run.saved_to)
    return 130 if run.cancelled else EXIT_OK


def _evaluate(args: argparse.Namespace) -> int:
    from pipeline.data.mapping import MappingError, load_mapping
    from pipeline.data.read import BadSlice, RowSlice, UnreadableInput
    from pipeline.families.base import ModelLayoutError
    from pipeline.mlops.registry import RegistryError
    from pipeline.stages.evaluate import evaluate_model

    bars, say = progress_outputs(args)
    try:
        value = mapping_value(args)
        mapping = load_mapping(value) if value is not None else None
        report = evaluate_model(args.model, args.data, args.plots, RowSlice.parse(args.slice), args.device,
                                progress=bars, conformal=args.conformal, report=say, mapping=mapping).to_dict()  # fmt: skip
    except (ModelLayoutError, UnreadableInput, BadSlice, FileNotFoundError, ValueError, BadMappingFlags,
            MappingError, RegistryError) as error:  # fmt: skip
        print(f"decision evaluate: {error}", file=sys.stderr)
        return _exit_code(error)
    if args.json:
        print(to_json(report))
        return EXIT_OK
    print_evaluation(report)
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from pipeline.families.base import ModelLayoutError
    from pipeline.families.exporting import NonFiniteWeights
    from pipeline.stages.export import export_folder

    try:
        result = export_folder(args.adapter, args.out)
    except (ModelLayoutError, NonFiniteWeights, FileNotFoundError) as error:
        print(f"decision export: {error}", file=sys.stderr)
        return _exit_code(error)
    if args.json:
        print(to_json({"out": result.out, "written": result.written, "manifest": result.manifest}))
    else:
        print(
            f"exported to {result.out}"
            if result.written
            else f"{result.out} is already this export; nothing to do"
        )
    return EXIT_OK


def _finetune(args: argparse.Namespace) -> int:
    from pipeline.stages.finetune import finetune
    from pipeline.training.controls import RunControls, RunHooks

    params, config, cancel, errors = _training_setup(args)
    bars, report = progress_outputs(args)
    try:
        with cancel.on_signals():
            result = finetune(_source(args, params), args.base, args.out, config, args.device,
                              RunHooks(report=report), RunControls(progress=bars, cancel=cancel), args.run_dir)  # fmt: skip
    except errors as error:
        print(f"decision finetune: {error}", file=sys.stderr)
        return _exit_code(error)
    _warn(result.train.warnings)
    for notice in result.calibration.notices if result.calibration else []:
        print(f"note: {notice}", file=sys.stderr)
    if args.json:
        print(to_json(result.to_dict()))
    else:
        print_finetuned(result)
    return 130 if result.cancelled else EXIT_OK


def _families(args: argparse.Namespace) -> int:
    from pipeline.families import FAMILIES, PICKING_RULE

    described = {name: {"methods": list(family.methods), "default_method": family.default_method,
                        "bases": family.bases, "doc": " ".join((inspect.getdoc(family) or "").split("\n\n")[0].split())}
                 for name, family in FAMILIES.items()}  # fmt: skip
    if args.json:
        print(to_json(described))
        return EXIT_OK
    for name, entry in described.items():
        print(
            f"{name}: methods {', '.join(entry['methods'])} (default {entry['default_method']}); {entry['doc']}"
        )
        print(f"  starts from: {entry['bases']}")
    print(f"rule: {PICKING_RULE}")
    return EXIT_OK


def _snapshot(args: argparse.Namespace) -> int:
    from pipeline.families.base import BadBase
    from pipeline.stages.snapshot import PinFailed, snapshot_base

    try:
        pinned = snapshot_base(args.source, args.out)
    except KeyboardInterrupt:
        print(f"decision snapshot: interrupted; {args.out} and its pin are as they were", file=sys.stderr)
        return 130
    except BadBase as error:
        print(f"decision snapshot: {error}", file=sys.stderr)
        return EXIT_BAD_BASE
    except (PinFailed, OSError) as error:
        print(f"decision snapshot: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        print(to_json(pinned.to_dict()))
        return EXIT_OK
    print(f"{pinned.out}: {pinned.family} family, {pinned.base}")
    if pinned.md5 is not None:
        print(f"pinned by {pinned.pinned_by}: md5 {pinned.md5} (commit it; `dvc push` shares the bytes)")
    elif pinned.pinned_by is not None:
        print(f"a dvc.yaml stage's output: `{pinned.pinned_by}` pins it")
    else:
        print("outside a DVC repository: not pinned")
    return EXIT_OK


def _warn(warnings: list[str]) -> None:
    """Say plainly, on stderr, where the fine-tune learned nothing (also with --json or --quiet)."""
    for warning in warnings:
        print(f"warning: the fine-tune did not learn: {warning}", file=sys.stderr)


def model_out(text: str) -> str:
    """`--out` of a command that writes a model: refused at once (exit 2) where it would replace a file or a folder
    of other files, or where no folder can be made (`base_folders.out_problem`)."""
    from pipeline.families.base_folders import out_problem

    problem = out_problem(Path(text))
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _run_dir_problem(run_dir: Path, out: Path) -> str | None:
    """Why `run_dir` cannot hold this run: the export replaces --out whole, a run folder in it included, or no
    folder can be made there."""
    from pipeline.families.base_folders import unwritable_place

    if run_dir.resolve() == out or run_dir.resolve().is_relative_to(out):
        return "inside --out, which the export replaces whole (the calibration report and plots with it); give another"
    return unwritable_place(run_dir)


def plots_folder(text: str) -> str:
    """`--plots`: a folder that exists or can be made, refused before any row is scored."""
    from pipeline.families.base_folders import unwritable_place

    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: a file; the plots go into a folder: give a new path or a folder"
        )
    if (problem := unwritable_place(Path(text) / "plot.png")) is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def run_folder(text: str) -> str:
    """`--run-dir`: a folder (existing, or made at the start of the run), never a file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: a file; the run folder is a folder: give a new path or a folder"
        )
    return text


def parse_layer_plan(text: str) -> list:
    """`--layer-plan`: comma-separated layer indices, or a JSON list (of indices or [start, end, passes])."""
    try:
        plan = json.loads(text) if text.strip().startswith("[") else [int(v) for v in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected 0,1,1,2 or JSON [[1, 3, 2]] ({error})"
        ) from None
    if not isinstance(plan, list):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a list of layer indices or ranges")
    return plan


NPROC_HELP = ("data-parallel ranks under torchrun, each on its share of every window (default: train.nproc; gloo on "
              "the CPU, NCCL on GPUs)")  # fmt: skip


def _add_training_arguments(
    command: argparse.ArgumentParser, out_help: str, nproc_help: str = NPROC_HELP
) -> None:
    """The flags `train` and `finetune` share (the same names as the params.yaml keys they override)."""
    command.add_argument("--data", required=True, help=DATA_HELP)
    command.add_argument(
        "--base",
        required=True,
        help="a Laya-layout folder (its encoder; joint or laya family), or a plain Hugging Face encoder (BERT, "
        "RoBERTa, DeBERTa-v2, ModernBERT, ...) or causal LM (Qwen3, Llama, ...) folder with its tokenizer (joint "
        "family); `decision snapshot --from` pins one. Exit 2 when it is none of these",
    )
    command.add_argument(
        "--family",
        metavar="NAME",
        help="the model family (`decision families` lists them; default: train.family in params.yaml, else what "
        "BASE is: a Laya-layout folder is laya, a plain encoder or causal LM folder joint); joint on a Laya-layout "
        "base trains the joint head on its encoder",
    )
    command.add_argument("--out", required=True, type=model_out, help=out_help)
    command.add_argument(
        "--method",
        metavar="NAME",
        help="how to train, as the family offers (`decision families` lists each family's methods, its default "
        "first; default: train.method in params.yaml, or with --family that family's default): head trains the "
        "joint head on the frozen backbone (its features computed once); qlora (4-bit nf4) is for causal-LM bases",
    )
    command.add_argument("--epochs", type=AT_LEAST_ONE, help="epochs (default: train.epochs; a small set trains more, "
                         "up to train.min_steps steps)")  # fmt: skip
    command.add_argument(
        "--max-steps", type=AT_LEAST_ONE, help="cap on optimizer steps (default: train.max_steps)"
    )
    command.add_argument("--nproc", type=AT_LEAST_ONE, help=nproc_help)
    command.add_argument("--threads", type=AT_LEAST_ONE, metavar="N", help="torch CPU threads, split between the ranks "
                         "(default: train.threads; null: the cores this process may use, its affinity mask or "
                         "container CPU quota, whichever is smaller)")  # fmt: skip
    command.add_argument("--layer-plan", type=parse_layer_plan, metavar="PLAN",
                         help="the backbone's layers to run, in order (default: train.layer_plan): 0,1,1,2,3 "
                         "visits layer 1 twice with the same weights; 0,1,2,3 skips the rest; JSON "
                         "[[start,end,passes]] repeats half-open ranges")  # fmt: skip
    command.add_argument("--state-windows", type=AT_LEAST_ONE, metavar="N",
                         help="joint family on an encoder: read a state longer than the encoder's window in up to N "
                         "windows, the head attending over all of them (default: train.state_windows)")  # fmt: skip
    command.add_argument("--slice", metavar="START:END", help="use rows [START, END) of DATA only")
    command.add_argument(
        "--device",
        default="auto",
        type=device_option,
        help="auto (cuda if available), cpu, cuda, cuda:1, ...",
    )
    command.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    _add_output_flags(command)
    add_mapping_arguments(command)


def _add_output_flags(command: argparse.ArgumentParser) -> None:
    """`--json` and `--quiet` of a long-running command: one changes stdout, the other silences stderr's progress."""
    command.add_argument("--json", action="store_true",
                         help="print one JSON object on stdout instead of tables (progress stays on stderr)")  # fmt: skip
    command.add_argument("-q", "--quiet", action="store_true",
                         help="no progress on stderr (warnings and errors still appear)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decision",
        description="Fine-tune, calibrate, export, serve and promote decision models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate",
        help="validate a decision file and report skipped decisions by reason",
        description="Validate decision rows (JSONL, Parquet or CSV). Bad rows never stop the run: each unusable "
        "decision is skipped and counted by reason. Exit 0 when at least one decision is usable, 2 when none "
        "is or DATA or the slice is the user's mistake (no such path, an unknown format, a plain table without a "
        "mapping, a slice past the end), 1 when the file cannot be read (corrupt, an I/O error).",
    )
    validate.add_argument("data", help=DATA_HELP)
    validate.add_argument(
        "--slice", metavar="START:END", help="validate rows [START, END) only; taken before rows are parsed"
    )
    _add_output_flags(validate)
    add_mapping_arguments(validate)
    validate.set_defaults(handler=_validate)

    train = commands.add_parser(
        "train",
        help="fine-tune a base model on decision rows and report held-out metrics before and after",
        description="Validate DATA, split off the held-out rows, fine-tune BASE in its model family (laya "
        "or joint) by its head on the frozen backbone (joint's default), LoRA, full fine-tuning or QLoRA, and save "
        "the fine-tune to OUT (laya LoRA: adapters plus "
        "head; otherwise a whole model). Settings come from params.yaml (train:); flags override them. Ctrl-C stops at the next step "
        "and saves nothing unless --save-on-cancel.",
    )
    _add_training_arguments(train, out_help="where to save the fine-tune")
    train.add_argument("--save-on-cancel", action="store_true", help="save what was trained when cancelled")
    train.set_defaults(handler=_train)

    evaluate = commands.add_parser(
        "evaluate",
        help="metrics of a model on decision rows, per question type, with reliability and confusion plots",
        description="Score every usable decision of DATA with MODEL (its calibrator applied, as served): accuracy "
        "per decision and per record, ECE (15 bins, (lo, hi]), Brier, KL from soft gold, score MAE, per "
        "question type and overall; then the calibration report (NLL, ECE-15 with a 95% record-bootstrap "
        "interval, classwise ECE, per type and per question); --plots DIR writes reliability diagrams (all, per "
        "type) and a confusion matrix per question; --conformal ALPHA adds split-conformal prediction sets.",
    )
    evaluate.add_argument(
        "--model",
        required=True,
        help="an export of any family (Laya layout or joint), a fine-tune folder, or a registered version: "
        "models:/NAME@ALIAS or models:/NAME/VERSION",
    )
    evaluate.add_argument("--data", required=True, help=DATA_HELP)
    evaluate.add_argument("--slice", metavar="START:END", help="evaluate rows [START, END) only")
    evaluate.add_argument("--plots", metavar="DIR", type=plots_folder, help="write PNG plots here")
    evaluate.add_argument("--device", default="cpu", type=device_option, help=SCORING_DEVICE_HELP)
    evaluate.add_argument(
        "--conformal", type=MISCOVERAGE, metavar="ALPHA",
        help="add split-conformal prediction sets at miscoverage ALPHA (e.g. 0.1): coverage and mean set size per type",
    )  # fmt: skip
    _add_output_flags(evaluate)
    add_mapping_arguments(evaluate)
    evaluate.set_defaults(handler=_evaluate)

    export = commands.add_parser(
        "export",
        help="merge a fine-tune into one servable, self-describing folder of its family, crash-safe",
        description="Merge LoRA adapters into a copy of the base on the CPU, check every tensor is finite, write "
        "fp16 weights, temperatures and a lineage manifest into a staging folder and swap it in atomically "
        "(the family's marker file last). Exporting the same source again is a no-op.",
    )
    export.add_argument("--adapter", required=True, help="a LoRA fine-tune folder, or a full model folder")
    export.add_argument("--out", required=True, type=model_out, help="the export folder")
    export.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    export.set_defaults(handler=_export)

    chain = commands.add_parser(
        "finetune",
        help="validate, slice, split, train, calibrate and export in one command",
        description="The whole chain, through the same stages as the retrain flow over a run folder: verify pins, "
        "validate DATA (--slice taken on the Arrow table) and split off held-out rows (or use --eval-data) once, "
        "train, calibrate on a validation split carved from the training rows (the held-out rows, cross-fitted, "
        "only where there is none; the calibration report, expected answers and plots stay in the run folder), "
        "and export the merged model to OUT.",
    )
    _add_training_arguments(chain, out_help="the export folder",
                            nproc_help="1 only: finetune trains in one process (decision train --nproc N, or "
                                       "the retrain flow with train.nproc, trains on N ranks)")  # fmt: skip
    chain.add_argument("--eval-data", help="use this file as the held-out set instead of splitting DATA")
    chain.add_argument("--run-dir", type=run_folder, help="the run folder: split, fine-tune, held-out logits, calibration report, "
                       "expected answers, plots (default: OUT.run beside the export; rewritten each run)")  # fmt: skip
    chain.set_defaults(handler=_finetune)

    families = commands.add_parser(
        "families",
        help="the model families, their training methods (default first) and what base folders they start from",
        description="Every model family this installation has, from the family interface itself.",
    )
    families.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    families.set_defaults(handler=_families)

    snapshot = commands.add_parser(
        "snapshot",
        help="make a base folder (or a Hugging Face Hub id, where online) a pinned base: checked, copied, dvc add",
        description="Check that SOURCE loads as a base of some family (`decision families` says which), copy it "
        "whole into OUT with one rename (a Hub id is downloaded once, where the Hub is reachable; nothing is "
        "fetched at training time) and pin OUT with `dvc add` inside a DVC repository. Exit 2 when SOURCE is no "
        "base, or a Hub id while offline; OUT is then left as it was.",
    )
    snapshot.add_argument("--from", dest="source", required=True, metavar="SOURCE",
                          help="a model folder (Hugging Face encoder or causal LM, Laya layout) or a Hub id")  # fmt: skip
    snapshot.add_argument(
        "--out", required=True, type=model_out, help="the pinned copy, e.g. data/snapshots/NAME"
    )
    snapshot.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    snapshot.set_defaults(handler=_snapshot)
    add_api_commands(commands)
    add_registry_commands(commands)
    add_retrain(commands)
    add_run_commands(commands)
    add_data_commands(commands)
    add_predict_commands(commands)
    add_compare_commands(commands)
    add_sweep(commands)
    add_flywheel_commands(commands)
    add_harvest(commands)
    add_monitor(commands)
    show_defaults(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries(args)
    from pipeline.config import ConfigError  # after parsing, so that `--help` answers without pyarrow

    try:
        return args.handler(args)
    except ConfigError as error:  # a bad params.yaml, run config or flag value, from any subcommand
        print(f"decision {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG


if __name__ == "__main__":
    sys.exit(main())
