"""A Hugging Face Hub data set as shards: `hf:owner/name[/config][:split]`, loaded with the `datasets` package.

`datasets` downloads and prepares the split once (into its cache, or reads the cache when offline), and the
Arrow files it prepared are then read as any `save_to_disk` folder's are: memory-mapped, sliced by row counts.
The package is optional: without it, or without a network and a cached copy, the source is refused in one line
that says how to get the data onto this machine instead.

    decision validate hf:stanfordnlp/imdb:test
"""

from __future__ import annotations

from pathlib import Path

from pipeline.data.shards import BadSource, Shard

DEFAULT_SPLIT = "train"
_OFFLINE_HELP = (
    "on a machine that is online, run `datasets.load_dataset(...).save_to_disk(FOLDER)` and pass FOLDER"
)


def parse_hub_id(spec: str) -> tuple[str, str | None, str]:
    """(repository id, config or None, split) from `owner/name[/config][:split]`."""
    name, _, split = spec.partition(":")
    parts = name.strip("/").split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise BadSource(f"hf:{spec}: expected hf:OWNER/NAME[/CONFIG][:SPLIT], e.g. hf:stanfordnlp/imdb:test")
    return "/".join(parts[:2]), parts[2] if len(parts) == 3 else None, split or DEFAULT_SPLIT


def hub_shards(spec: str) -> tuple[Shard, ...]:
    """The Arrow files `datasets` prepared for the split, in order; refused in one line when it cannot load."""
    repo, config, split = parse_hub_id(spec)
    try:
        import datasets  # optional: only a Hub id needs it, so it is imported only for one
    except ImportError:
        raise BadSource(f"hf:{spec}: the `datasets` package is not installed; `pip install datasets`, "
                             f"or {_OFFLINE_HELP}") from None  # fmt: skip
    try:
        dataset = datasets.load_dataset(repo, config, split=split)
    except (ConnectionError, OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise BadSource(f"hf:{spec}: cannot load it from the Hugging Face Hub ({reason}); "
                             f"{_OFFLINE_HELP}") from None  # fmt: skip
    files = [Path(entry["filename"]) for entry in dataset.cache_files]
    if not files:
        raise BadSource(
            f"hf:{spec}: `datasets` kept the split in memory, not in Arrow files; {_OFFLINE_HELP}"
        )
    return tuple(Shard(path, "arrow") for path in files)
