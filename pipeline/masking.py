"""URLs safe to print: a store's or a remote's password never reaches a log or an error message."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """`url` with the password of its user part replaced by `***` (s3://key:secret@host/... -> s3://key:***@...)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
