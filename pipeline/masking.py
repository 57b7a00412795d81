"""URLs safe to print: a store's or a remote's password never reaches a log or an error message."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """`url` with the password of its user part replaced by `***` (s3://key:secret@host/... ->
    s3://key:***@...)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def error_reason(error: object, url: str | None = None) -> str:
    """The first line of an error's message (its type's name where it has none), with `url`'s password masked:
    what a one-line error may quote of a driver's or a library's message, which can span lines and quote the
    URL."""
    text = str(error).strip()
    reason = text.splitlines()[0] if text else type(error).__name__
    password = urlsplit(url).password if url else None
    return reason.replace(password, "***") if password else reason
