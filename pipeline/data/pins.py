"""Verify data and model files against the md5 pins in `dvc.lock` before anything trains on them.

Every training entry point calls `verify_pins`; it refuses, naming the file and both hashes, when the bytes on
disk are not the bytes DVC pinned.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

LOCK_FILE = "dvc.lock"
_CHUNK = 1 << 20


class PinMismatch(RuntimeError):
    """Files on disk differ from their pins in dvc.lock (or have none)."""


def pinned_outputs(lock_path: str | Path = LOCK_FILE) -> dict[str, str]:
    """Every stage output in dvc.lock as {path: md5}."""
    lock = yaml.safe_load(Path(lock_path).read_text()) or {}
    pins = {}
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs", []):
            pins[out["path"]] = out["md5"]
    return pins


def file_md5(path: Path) -> str:
    """md5 of a file's bytes, as DVC 3 records it."""
    digest = hashlib.md5()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dir_md5(path: Path) -> str:
    """A directory's hash as DVC 3 records it: md5 of its sorted file listing, suffixed `.dir`."""
    entries = [
        {"md5": file_md5(f), "relpath": f.relative_to(path).as_posix()}
        for f in sorted(path.rglob("*"), key=lambda p: p.relative_to(path).as_posix())
        if f.is_file()
    ]
    listing = json.dumps(entries, sort_keys=True).encode()
    return hashlib.md5(listing).hexdigest() + ".dir"


def current_md5(path: Path) -> str:
    """The hash of a file or directory in DVC's form."""
    return dir_md5(path) if path.is_dir() else file_md5(path)


def verify_pins(
    paths: list[str], root: str | Path = ".", lock_path: str | Path | None = None
) -> dict[str, str]:
    """Check each path against dvc.lock; return {path: md5} or raise PinMismatch listing every problem."""
    root = Path(root)
    pins = pinned_outputs(lock_path or root / LOCK_FILE)
    problems, verified = [], {}
    for rel in paths:
        target = root / rel
        if rel not in pins:
            problems.append(f"{rel}: not pinned in dvc.lock (add it as a stage output and run `dvc repro`)")
        elif not target.exists():
            problems.append(f"{rel}: missing (pinned md5 {pins[rel]}); run `dvc repro` to rebuild it")
        elif (found := current_md5(target)) != pins[rel]:
            problems.append(f"{rel}: bytes differ from dvc.lock (pinned md5 {pins[rel]}, found md5 {found})")
        else:
            verified[rel] = found
    if problems:
        raise PinMismatch("refusing to train on unpinned data:\n  " + "\n  ".join(problems))
    return verified


def verify_inputs(paths: list[str | Path], lock_path: str | Path = LOCK_FILE) -> dict[str, str]:
    """Verify every input that dvc.lock pins (refusing on a mismatch); unpinned inputs pass through unchecked.

    Returns {path relative to the lock's folder: md5} for the pinned ones.
    """
    lock = Path(lock_path)
    if not lock.is_file():
        return {}
    pinned = pinned_outputs(lock)
    root = lock.resolve().parent
    relative = [rel for rel in (_relative_to(path, root) for path in paths) if rel in pinned]
    return verify_pins(relative, root=root) if relative else {}


def unpinned(paths: list[str | Path], lock_path: str | Path = LOCK_FILE) -> list[str]:
    """The inputs dvc.lock does not pin (so `verify_inputs` could not check them)."""
    lock = Path(lock_path)
    pinned = pinned_outputs(lock) if lock.is_file() else {}
    root = lock.resolve().parent
    return [str(path) for path in paths if _relative_to(path, root) not in pinned]


def _relative_to(path: str | Path, root: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None
