"""`decision promote`: the champion alias moved to a version by hand, the move recorded; a version whose smoke
test did not pass, or that trained with --allow-unpinned, is refused (exit 1) unless --force. `move_champion`
is what promote and rollback share.

decision promote 3
decision promote 4 --name tickets --force --json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pipeline.cli.options import add_json_flag, add_model_name_flag
from pipeline.cli.runner import refuse, run_command


@dataclass(frozen=True)
class ChampionMove:
    """The version the champion alias names now, and the one it named before (None where it named none)."""

    name: str
    champion: str
    previous: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def add_promote(commands) -> None:
    """`decision promote` on the `decision` subparsers."""
    promote = commands.add_parser(
        "promote",
        help="make a version the champion by hand",
        description="Point the champion alias at VERSION and record the move; a version whose smoke test "
        "did not pass, or trained with --allow-unpinned, is refused unless --force.",
    )
    promote.add_argument("version", help="the version number to make the champion")
    add_model_name_flag(promote)
    promote.add_argument(
        "--force",
        action="store_true",
        help="promote even without a passed smoke test, or trained on unpinned inputs",
    )
    add_json_flag(promote)
    promote.set_defaults(handler=handle_promote)


def handle_promote(args: argparse.Namespace) -> int:
    from pipeline.mlops.promotion import promote_version

    def promote() -> str:
        promote_version(args.name, args.version, args.force)
        return args.version

    return move_champion(args, promote, f"{args.name} version {args.version}")


def move_champion(args: argparse.Namespace, move: Callable[[], str], subject: str) -> int:
    """Run `move` (it moves the champion alias of `args.name` and gives the version it names now) and print
    the move. A refused move (PromotionRefused) is exit 1; a model or version the registry does not have is
    its own words about `subject`, exit 2, as is a missing default store (MLflow would make an empty one and
    say "not found")."""
    from pipeline.mlops.promotion import PromotionRefused
    from pipeline.mlops.registry import missing_store

    if (problem := missing_store()) is not None:
        return refuse(args, problem)
    return run_command(
        args, lambda: _moved(args.name, move, subject), print_move, refused=(PromotionRefused,)
    )


def _moved(name: str, move: Callable[[], str], subject: str) -> ChampionMove:
    from mlflow.exceptions import MlflowException

    from pipeline.mlops.promotion import CHAMPION, current
    from pipeline.mlops.registry import RegistryError

    try:
        before = current(name, CHAMPION)
        return ChampionMove(name=name, champion=move(), previous=before)
    except MlflowException as error:  # no such model or version: the registry's own words, in one line
        raise RegistryError(f"{subject}: {error.message}") from None


def print_move(moved: ChampionMove) -> None:
    """Which version is champion now, and what it was."""
    if moved.previous == moved.champion:
        was = "already; nothing changed"
    else:
        was = "it had none" if moved.previous is None else f"was {moved.previous}"
    print(f"{moved.name}: champion is version {moved.champion} ({was})")
