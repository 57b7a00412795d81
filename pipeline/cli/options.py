"""The flags and argparse types several `decision` commands share, and what some of them resolve to: a flag
value no command could use is refused while the command line is parsed (exit 2, argparse's usage and one
line), before any work; help that says each option's default.

    command.add_argument("--out", required=True, type=model_out, help="the export folder")
    add_output_flags(command)               # --json and --quiet
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

DATA_HELP = (
    "a decision file (.jsonl, .parquet, .csv), a folder or quoted glob of .parquet/.jsonl shards, a "
    "partitioned Parquet folder, a datasets save_to_disk folder (FOLDER:SPLIT for a split), or "
    "hf:OWNER/NAME[:SPLIT] (docs/data-format.md, Sources)"
)
SCORING_DEVICE_HELP = "cpu (default), cuda, cuda:1, ..., or auto (cuda where there is one)"
INFERENCE_HELP = (
    "the inference log: a folder or postgresql:// URL (default: params.yaml's flywheel.inference)"
)
JSON_HELP = "print one JSON object instead of lines"
MODEL_NAME_HELP = "registered model name (default: decision-model)"


QUIET_HELP = "no progress on stderr (warnings and errors still appear)"
FLOW_QUIET_HELP = "no progress on stderr: the flow's console log shows warnings and errors only"


def add_output_flags(command: argparse.ArgumentParser, quiet_help: str = QUIET_HELP) -> None:
    """`--json` and `--quiet` of a long-running command (a flow's: `FLOW_QUIET_HELP`): one changes stdout, the
    other silences progress."""
    command.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of tables (progress stays on stderr)",
    )
    command.add_argument("-q", "--quiet", action="store_true", help=quiet_help)


def add_json_flag(command: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    """`--json` of a command that prints lines."""
    command.add_argument("--json", action="store_true", help=help)


def add_inference_flags(command: argparse.ArgumentParser) -> None:
    """`--inference` and `--params` of a command that reads the inference log (`inference_store`)."""
    command.add_argument("--inference", metavar="DIR|URL", help=INFERENCE_HELP)
    command.add_argument("--params", default="params.yaml", help="the params file")


def add_model_name_flag(command: argparse.ArgumentParser) -> None:
    """`--name` of a command on the registry."""
    command.add_argument("--name", default="decision-model", type=model_name, help=MODEL_NAME_HELP)


def inference_store(args: argparse.Namespace) -> str:
    """The inference store to read: --inference, else the params file's; a folder that does not exist (a typo)
    is a ConfigError (exit 2) rather than read as a log with nothing in it."""
    from pipeline.config import ConfigError, load_params
    from pipeline.flywheel.table import missing_log

    where = args.inference or load_params(args.params).flywheel.inference
    if (problem := missing_log(where)) is not None:
        raise ConfigError(problem)
    return where


def load_run_params(run_config: str | None):
    """params.yaml with configs/NAME.yaml over it; a ConfigError names --run-config where one is given."""
    from pipeline.config import ConfigError, load_params

    try:
        return load_params(run_config=run_config)
    except ConfigError as error:
        if run_config is None:
            raise
        raise ConfigError(f"--run-config {run_config}: {error}") from None


def number_option(
    read: Callable[[str], float], accept: Callable[[float], bool], expected: str
) -> Callable[[str], float]:
    """An argparse type: the text as `read` takes it (int, float), refused at once (exit 2) saying what was
    `expected` where it is no number or `accept` fails (NaN fails every comparison)."""

    def option(text: str) -> float:
        try:
            value = read(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return option


AT_LEAST_ONE = number_option(int, lambda n: n >= 1, "a whole number of at least 1, e.g. 50")
SECONDS = number_option(float, lambda s: 0 < s < float("inf"), "a positive number of seconds, e.g. 30")
# A conformal set's miscoverage (evaluate --conformal, review --alpha).
MISCOVERAGE = number_option(float, lambda alpha: 0 < alpha < 1, "a miscoverage between 0 and 1, e.g. 0.1")


def device_option(text: str) -> str:
    """`--device`: refused at once (exit 2) where it names no device this process can use, before any load."""
    from pipeline.device import device_problem

    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def model_out(text: str) -> str:
    """`--out` of a command that writes a model: refused at once (exit 2) where it would replace a file or a
    folder of other files, or where no folder can be made (`base_folders.out_problem`)."""
    from pipeline.families.base_folders import out_problem

    problem = out_problem(Path(text))
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def model_name(text: str) -> str:
    """`--name`: a model name every door takes (`registry_name_problem`)."""
    from pipeline.config import registry_name_problem

    if (problem := registry_name_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


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


class DefaultsShown(argparse.HelpFormatter):
    """Help that says each option's default: `(default: X)` after a help text that does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        # by identity: a default of 0 is shown, though 0 == False
        nothing_to_show = (
            any(action.default is v for v in (None, False, argparse.SUPPRESS)) or not action.option_strings
        )
        if nothing_to_show or "default" in help_text or "%(default)" in help_text:
            return help_text
        return f"{help_text} (default: %(default)s)"


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every subcommand's parser under it `DefaultsShown`."""
    parser.formatter_class = DefaultsShown
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                show_defaults(command)
