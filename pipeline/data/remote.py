"""Share the DVC-pinned dataset and base snapshot through a DVC remote: push them once, pull them on every
clone.

A remote is plain DVC configuration, set once per team (`.dvc/config`, committed) or per machine
(`.dvc/config.local`, not committed); nothing here names one:

    dvc remote add -d storage s3://my-bucket/decision-pipeline     # or a directory: /mnt/shared/dvc
    python -m pipeline.data.remote push     # make push: the outputs dvc.lock pins, to the default remote
    python -m pipeline.data.remote pull     # make pull (and the start of make run): fetch what the remote has

`make run` pulls before `dvc repro`: outputs the remote holds arrive with the bytes dvc.lock pins, so `dvc
repro` finds their stages up to date and skips them; whatever the remote lacks (or an unreachable remote: DVC
reports both as missing objects) is left to `dvc repro` to build, as on a machine with no remote at all.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dvc.exceptions import CheckoutError, DvcException
from dvc.repo import Repo

from pipeline.masking import mask_url


class RemoteError(RuntimeError):
    """The default remote is configured but cannot be used at all (a missing plugin, a refused push)."""


@dataclass(frozen=True)
class RemoteReport:
    """What a pull or push did: the remote (its URL with any password masked) and the pinned outputs by
    fate."""

    action: str
    remote: str | None
    url: str | None
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    transferred: int = 0

    @property
    def message(self) -> str:
        if self.remote is None:
            return (
                "No default DVC remote: `dvc repro` builds the data here. Share it with "
                "`dvc remote add -d NAME URL` and `make push`."
            )
        where = f"DVC remote '{self.remote}' ({self.url})"
        if self.action == "push":
            return f"{where}: pushed {self.transferred} file(s); it now holds {', '.join(self.present)}."
        if not self.missing:
            return f"{where}: {', '.join(self.present)} present ({self.transferred} file(s) fetched)."
        return (
            f"{where} has not got {', '.join(self.missing)} (or could not be reached): `dvc repro` builds "
            "what dvc.yaml builds here; a `dvc add`ed input (your own data or base) has to be pushed (`make "
            "push`) from where it was added."
        )


def default_remote(root: str | Path = ".") -> tuple[str, str] | None:
    """(name, masked URL) of the repository's default remote (`.dvc/config` or `.dvc/config.local`), or
    None."""
    with Repo(str(root)) as repo:
        return _default_remote(repo)


def pull_pinned(root: str | Path = ".") -> RemoteReport:
    """Fetch and check out every cached output dvc.lock pins from the default remote; what it lacks is
    reported in `missing`, never raised, so `dvc repro` can build it. Without a default remote, does
    nothing."""
    with Repo(str(root)) as repo:
        remote = _default_remote(repo)
        if remote is None:
            return RemoteReport("pull", None, None)
        try:
            result = repo.pull(allow_missing=True)
        except CheckoutError as error:  # a pinned output cannot be written here
            raise RemoteError(f"dvc pull from '{remote[0]}' ({remote[1]}): {error}") from error
        except (ImportError, DvcException) as error:
            raise _unusable(remote, "pull", error) from error
        present, missing = _outputs_on_disk(repo, Path(root))
    return RemoteReport("pull", *remote, present, missing, result["stats"]["fetched"])


def push_pinned(root: str | Path = ".") -> RemoteReport:
    """Push every cached output dvc.lock pins to the default remote; refuses when there is none, or when an
    output is missing here (build it first with `dvc repro`)."""
    with Repo(str(root)) as repo:
        present, missing = _outputs_on_disk(repo, Path(root))
        remote = _default_remote(repo)
        if remote is None:
            raise RemoteError("no default DVC remote to push to: `dvc remote add -d NAME URL` first")
        if missing:
            raise RemoteError(
                f"not here, so not pushed: {', '.join(missing)}; build what dvc.yaml builds with `dvc "
                "repro`, and bring back a `dvc add`ed input with `dvc checkout` (or `dvc pull`)"
            )
        try:
            pushed = repo.push()
        except (ImportError, DvcException) as error:
            raise _unusable(remote, "push", error) from error
    return RemoteReport("push", *remote, present, [], pushed)


def _default_remote(repo: Repo) -> tuple[str, str] | None:
    name = repo.config["core"].get("remote")
    if not name:
        return None
    return name, mask_url(repo.config["remote"][name]["url"])


def _outputs_on_disk(repo: Repo, root: Path) -> tuple[list[str], list[str]]:
    """The stage outputs DVC caches (and so pushes and pulls; a `cache: false` output stays with its stage),
    split into those present under `root` and those missing."""
    # An output's own path is relative to its .dvc file (`own.jsonl` in data/own/own.jsonl.dvc): named from
    # root.
    root = root.resolve()
    paths = sorted(
        Path(out.fs_path).relative_to(root).as_posix()
        for stage in repo.index.stages
        for out in stage.outs
        if out.use_cache
    )
    present = [path for path in paths if (root / path).exists()]
    return present, [path for path in paths if path not in present]


def _unusable(remote: tuple[str, str], action: str, error: Exception) -> RemoteError:
    # DVC raises ImportError when the remote's scheme needs a plugin (dvc-s3, dvc-gs) that is not installed.
    hint = (
        " (install the DVC plugin for this remote, e.g. `pip install dvc-s3`)"
        if isinstance(error, ImportError)
        else ""
    )
    return RemoteError(f"dvc {action} with remote '{remote[0]}' ({remote[1]}) failed: {error}{hint}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("pull", "push"):
        print("usage: python -m pipeline.data.remote {pull,push}", file=sys.stderr)
        return 2
    try:
        report = pull_pinned() if args[0] == "pull" else push_pinned()
    except RemoteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(report.message, file=sys.stderr)
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
