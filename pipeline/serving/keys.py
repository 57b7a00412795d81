"""API keys for the Decision API: stored hashed, each belonging to an owner.

A key file is JSON, `{"keys": [{"owner": "alice", "sha256": "<hex of the key>"}, ...]}` (an entry with
`"admin": true` is an admin key: it may label any logged decision, `POST /v1/feedback`); the environment
variable `DECISION_API_KEYS` adds entries as `owner=sha256hex` separated by commas. Only hashes are kept, so
a leaked file gives no key away. `decision keygen --owner alice --keys keys.json` makes a key, prints it once
and stores its hash.

With no keys at all the server is open: every caller is answered and sees every model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

KEYS_ENV = "DECISION_API_KEYS"
KEY_PREFIX = "dp-"


class KeyConfigError(ValueError):
    """A key file or `DECISION_API_KEYS` entry that cannot be read, or keys that cannot serve as asked
    (`--require-key` with none configured)."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.strip().encode()).hexdigest()


@dataclass(frozen=True)
class KeyStore:
    """Owners by key hash; empty means the server is open."""

    owners_by_hash: dict[str, str] = field(default_factory=dict)
    admin_hashes: frozenset[str] = frozenset()

    @property
    def open(self) -> bool:
        return not self.owners_by_hash

    def check_require_key(self, require_key: bool) -> None:
        """KeyConfigError where `--require-key` is asked of a server with no keys: it could answer no one.
        Checked by the CLI before any worker starts, and by every app as it is made."""
        if require_key and self.open:
            raise KeyConfigError(f"--require-key: no API keys are configured (--keys or {KEYS_ENV})")

    def is_admin(self, key: str) -> bool:
        digest = hash_key(key)
        return any(hmac.compare_digest(known, digest) for known in self.admin_hashes)

    def owner_of(self, key: str) -> str | None:
        """The key's owner, or None for an unknown key (compared in constant time per entry)."""
        digest = hash_key(key)
        for known, owner in self.owners_by_hash.items():
            if hmac.compare_digest(known, digest):
                return owner
        return None


def load_keys(path: str | Path | None = None, environ: dict[str, str] | None = None) -> KeyStore:
    """Keys from the file (if given) and the environment; every bad entry is named in one error."""
    environ = os.environ if environ is None else environ
    entries: list[tuple[str, str]] = []
    problems: list[str] = []
    admins: set[str] = set()
    if path is not None:
        entries += _file_entries(Path(path), problems, admins)
    entries += _env_entries(environ.get(KEYS_ENV, ""), problems)
    for owner, digest in entries:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            problems.append(f"owner {owner!r}: sha256 must be 64 lowercase hex characters")
    if problems:
        raise KeyConfigError("API keys: " + "; ".join(problems))
    return KeyStore({digest: owner for owner, digest in entries}, frozenset(admins))


def add_key(path: str | Path, owner: str, admin: bool = False) -> str:
    """Make a new key for `owner` (an admin key with `admin`), store its hash in the key file (created if
    missing), return the key. KeyConfigError, with nothing written, for an owner that is empty or holds a ','
    or '=' (the separators of `DECISION_API_KEYS`), a path that is a folder or under a missing one, or a file
    that is not a key file."""
    path, problems = Path(path), []
    if not owner.strip() or any(not c.isprintable() or c in ",=" for c in owner):
        raise KeyConfigError(f"owner {owner!r}: give a name of printable characters, without ',' or '='")
    if path.exists():
        _file_entries(path, problems, set())
    elif not path.parent.is_dir():
        problems.append(f"{path}: the folder {path.parent} does not exist")
    if problems:  # a file that is not a key file is left as it is, never overwritten
        raise KeyConfigError("; ".join(problems))
    data = json.loads(path.read_text()) if path.exists() else {"keys": []}
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    data["keys"].append({"owner": owner, "sha256": hash_key(key), **({"admin": True} if admin else {})})
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(json.dumps(data, indent=2) + "\n")
    os.chmod(staged, 0o600)
    staged.replace(path)
    return key


def _file_entries(path: Path, problems: list[str], admins: set[str]) -> list[tuple[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        admins.update(str(e["sha256"]).lower() for e in data["keys"] if e.get("admin") is True)
        return [(str(e["owner"]), str(e["sha256"]).lower()) for e in data["keys"]]
    except FileNotFoundError:
        problems.append(f"{path}: no such key file")
    except IsADirectoryError:
        problems.append(f"{path}: a folder; give the key file, e.g. {path / 'keys.json'}")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        problems.append(f'{path}: expected {{"keys": [{{"owner", "sha256"}}]}} ({error})')
    return []


def _env_entries(text: str, problems: list[str]) -> list[tuple[str, str]]:
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        owner, sep, digest = item.partition("=")
        if not sep or not owner:
            problems.append(f"{KEYS_ENV}: entry {item[:12]!r}... is not owner=sha256hex")
            continue
        entries.append((owner.strip(), digest.strip().lower()))
    return entries
