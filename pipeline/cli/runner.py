"""What every `decision` command does around its work, written once: an error the user can act on is one line
on stderr (`decision COMMAND: ...`) with its exit code, and the result is printed as one JSON object
(`--json`) or as the command's text.

    return run_command(args, lambda: export_folder(args.adapter, args.out), print_exported)

Exit codes: 0 done; 2 the user's input refused before any work (a bad flag, config, source, slice, mapping,
base, registered model, or a model that is not there); 1 a file that cannot be read or a step that failed; 130
interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.strict_json import to_json

T = TypeVar("T")
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def refuse(args: argparse.Namespace, message: Any, code: int = EXIT_BAD_INPUT) -> int:
    """Say why the command stops, in one line on stderr, and give its exit code."""
    print(f"decision {args.command}: {message}", file=sys.stderr)
    return code


def run_command(
    args: argparse.Namespace,
    work: Callable[[], T],
    show: Callable[[T], None],
    *,
    refused: tuple[type[Exception], ...] = (),
    refused_input: tuple[type[Exception], ...] = (),
    as_json: Callable[[T], Any] | None = None,
    done: Callable[[T], int] = lambda result: EXIT_OK,
    interrupted: str | None = None,
) -> int:
    """Run `work`; an error of `refused` or of the project's input errors (`input_errors`) is one line and its
    `exit_code`, one of `refused_input` one line and exit 2; with `interrupted`, Ctrl-C (or SIGTERM where the
    work turns it into one) is that line and exit 130. The result goes to stdout as JSON with `--json`
    (`as_json`, by default its `to_dict()`), else through `show`; `done` gives a result's exit code (130 for a
    cancelled run, say)."""
    try:
        result = work()
    except refused_input as error:
        return refuse(args, error, EXIT_BAD_INPUT)
    except (*refused, *input_errors()) as error:
        return refuse(args, error, exit_code(error))
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        return refuse(args, interrupted, EXIT_INTERRUPTED)
    if getattr(args, "json", False):
        print(to_json(as_json(result) if as_json else result.to_dict()))
    else:
        show(result)
    return done(result)


def input_errors() -> tuple[type[Exception], ...]:
    """The project's errors that say the user's input is wrong (exit 2): imported when a command has run, so
    that `decision --help` answers without the libraries behind them."""
    from pipeline.config import ConfigError
    from pipeline.data.mapping import MappingError
    from pipeline.data.read import BadSlice, BadSource
    from pipeline.families.base import BadBase, NoSuchModel
    from pipeline.mlops.registry import RegistryError

    return (ConfigError, MappingError, BadSlice, BadSource, BadBase, NoSuchModel, RegistryError)


def exit_code(error: Exception) -> int:
    """2 for the user's input (`input_errors`: refused before any work), else 1 (a file that cannot be read, a
    step that failed)."""
    return EXIT_BAD_INPUT if isinstance(error, input_errors()) else EXIT_FAILED
