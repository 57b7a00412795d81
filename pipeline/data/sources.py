"""What a DATA argument names: a file, a folder or glob of shards, a partitioned Parquet data set, a Hugging
Face `datasets` folder (`save_to_disk`), or a Hub id; resolved to an ordered list of shards before any row is
read.

    decision validate rows.parquet               # one file: JSONL, Parquet or CSV
    decision validate data/shards                # a folder of *.parquet or *.jsonl shards, in name order
    decision validate 'data/shards/part-*.jsonl' # a glob (quoted, so the shell leaves it alone)
    decision validate data/events                # hive-partitioned Parquet (lang=en/...): partitions become columns
    decision validate data/my_dataset            # datasets' save_to_disk folder; a DatasetDict reads `train`
    decision validate data/my_dataset:test       # ... or the split named after the colon
    decision validate hf:owner/name[/config][:split]   # the Hub, where `datasets` is installed and online

A Hub id is loaded with the optional `datasets` package, which prepares the split once in its cache (or reads
the cache when offline); the Arrow files it prepared are then read as a `save_to_disk` folder's are. Without
the package, or offline without a cached copy, the source is refused in one line saying how to bring the data
here.

Shards of one source must share one format and one schema (column names and types); a source that breaks this,
an empty folder or a glob that matches nothing is a `BadSource`, raised before any row is read.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.dataset as ds

from pipeline.data.shards import (
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    BadSource,
    Shard,
    detect_format,
)

HUB_PREFIX = "hf:"
# Where a harvested row came from (`pipeline.flywheel.harvest`): shards may have them or not; training never
# reads them.
PROVENANCE_COLUMNS = ("decision_id", "decided_at", "decided_by")
DEFAULT_SPLIT = "train"
_GLOB_CHARS = set("*?[")
_SHARD_FORMATS = {**{s: "jsonl" for s in JSONL_SUFFIXES}, **{s: "parquet" for s in PARQUET_SUFFIXES}}


@dataclass(frozen=True)
class Source:
    """A resolved DATA argument: its shards in reading order, and the path DVC pins for it.

    `kind` is file, shards (a folder or glob), partitioned, saved (a `save_to_disk` folder) or hub. `pin_path`
    is the file or folder `dvc add` tracks (a glob's folder, a DatasetDict's root), None for a Hub id. `whole`
    is True when the shards are everything under `pin_path`, so the folder's DVC hash names exactly these
    rows.
    """

    text: str
    kind: str
    shards: tuple[Shard, ...]
    pin_path: Path | None
    whole: bool = True

    @property
    def fmt(self) -> str:
        """The shards' one format (parquet, jsonl, csv or arrow)."""
        return self.shards[0].fmt

    def schema(self) -> pa.Schema:
        """The first shard's schema (all shards share it: `open_source` checked)."""
        return self.shards[0].schema()


def open_source(text: str | Path) -> Source:
    """Resolve a DATA argument to its shards, checking the shards agree; reads metadata, never rows."""
    text = str(text)
    source = _resolve(text)
    _check_schemas(source)
    return source


def pin_path(text: str | Path) -> Path | None:
    """The path DVC pins for a DATA argument (itself for a file or folder), without listing its shards; None
    for a Hub id, which DVC cannot pin."""
    text = str(text)
    if text.startswith(HUB_PREFIX):
        return None
    path = Path(text)
    if path.exists() or not (split := _split_folder(text)):
        return _glob_root(text) if is_glob(text) else path
    return split[0]


def written_into(out: str | Path, data: str) -> str | None:
    """How a file written to `out` would be read back as part of DATA, or None: it is DATA's file, or lies in
    DATA's folder (or under a glob's), where the next read takes it for a shard. A Hub id is never written
    to."""
    source = pin_path(data)
    if source is None:
        return None
    source, target = source.expanduser().resolve(), Path(out).expanduser().resolve()
    if target == source:
        return "the data being read"
    if source.is_dir() and target.is_relative_to(source):
        return "inside the folder being read (the next read would take it for a shard)"
    return None


def _resolve(text: str) -> Source:
    if not text.strip():  # Path("") is the working folder: never read it for a DATA left empty
        raise BadSource("DATA is empty: give a file, a folder or glob of shards, or hf:OWNER/NAME")
    if text.startswith(HUB_PREFIX):
        return Source(text, "hub", hub_shards(text[len(HUB_PREFIX) :]), None, whole=False)
    path = Path(text)
    if path.is_file():
        return Source(text, "file", (Shard(path, detect_format(path)),), path)
    if path.is_dir():
        return _folder(text, path)
    if is_glob(text):
        return Source(text, "shards", _glob_shards(text), _glob_root(text), whole=False)
    if split := _split_folder(text):
        return Source(text, "saved", _saved_shards(split[0] / split[1]), split[0], whole=False)
    if path.is_symlink():
        raise BadSource(f"{path}: a link to {path.readlink()}, which does not exist")
    raise BadSource(f"{path}: no such file or folder")


def _folder(text: str, path: Path) -> Source:
    if (path / "dataset_dict.json").is_file():
        return Source(text, "saved", _saved_shards(path / _default_split(path)), path, whole=False)
    if (path / "state.json").is_file():
        return Source(text, "saved", _saved_shards(path), path)
    if any(child.is_dir() and "=" in child.name for child in path.iterdir()):
        return Source(text, "partitioned", _partitioned_shards(path), path)
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    return Source(text, "shards", _typed_shards(text, _without_metadata(files)), path)


def _without_metadata(files: list[Path]) -> list[Path]:
    """A folder's files less its `.json` files where it holds `.jsonl`, `.ndjson` or `.parquet` shards: there
    a `.json` file is the data set's description (`info.json`, `stats.json`, often pretty-printed), not rows.
    A folder of `.json` files alone is read as JSON lines (Spark writes `part-*.json`)."""
    if not any(p.suffix.lower() in _SHARD_FORMATS and p.suffix.lower() != ".json" for p in files):
        return files
    return [p for p in files if p.suffix.lower() != ".json"]


def _typed_shards(text: str, files: list[Path]) -> tuple[Shard, ...]:
    """Shards of one format, in name order; a CSV among them, mixed formats or none at all are refused."""
    if csv := [p.name for p in files if p.suffix.lower() == ".csv"]:
        raise BadSource(
            f"{text}: holds CSV files ({csv[0]}); shards must be Parquet or JSONL (convert them, "
            "or pass one CSV file as DATA)"
        )
    shards = [Shard(p, _SHARD_FORMATS[p.suffix.lower()]) for p in files if p.suffix.lower() in _SHARD_FORMATS]
    if not shards:
        raise BadSource(
            f"{text}: no .parquet or .jsonl shards there; put the data files in it or name a file"
        )
    if len(formats := sorted({s.fmt for s in shards})) > 1:
        examples = [f"{fmt} ({next(s.path.name for s in shards if s.fmt == fmt)})" for fmt in formats]
        raise BadSource(
            f"{text}: mixes {' and '.join(examples)} shards; keep one format per source (move the "
            "other files out)"
        )
    return tuple(shards)


def _glob_shards(text: str) -> tuple[Shard, ...]:
    files = matched_files(text)
    if not files:
        raise BadSource(f"{text}: the pattern matches no file; check the folder and the pattern (quote it)")
    return _typed_shards(text, files)


def _partitioned_shards(path: Path) -> tuple[Shard, ...]:
    """Hive-partitioned Parquet (`key=value/` folders): one shard per file, its partition values as
    columns."""
    try:
        dataset = ds.dataset(path, format="parquet", partitioning="hive")
    except (pa.ArrowException, OSError) as error:
        raise BadSource(f"{path}: not a readable partitioned Parquet data set ({error})") from None
    fragments = sorted(dataset.get_fragments(), key=lambda fragment: fragment.path)
    if not fragments:
        raise BadSource(f"{path}: a partitioned data set with no Parquet files; put the data files in it")
    return tuple(_partition_shard(fragment, dataset.schema) for fragment in fragments)


def _partition_shard(fragment: ds.ParquetFileFragment, schema: pa.Schema) -> Shard:
    keys = ds.get_partition_keys(fragment.partition_expression)
    values = tuple((name, keys[name], schema.field(name).type) for name in schema.names if name in keys)
    return Shard(Path(fragment.path), "parquet", values)


def _default_split(path: Path) -> str:
    splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
    if DEFAULT_SPLIT not in splits:
        raise BadSource(
            f"{path}: a DatasetDict without a {DEFAULT_SPLIT!r} split; name one as "
            f"{path}:SPLIT (it has {', '.join(splits) or 'none'})"
        )
    return DEFAULT_SPLIT


def _saved_shards(folder: Path) -> tuple[Shard, ...]:
    """The Arrow files of a `save_to_disk` folder, in the order its `state.json` lists them."""
    state = folder / "state.json"
    if not state.is_file():
        raise BadSource(
            f"{folder}: not a datasets save_to_disk folder (no state.json); save it again with "
            "Dataset.save_to_disk"
        )
    files = [folder / entry["filename"] for entry in json.loads(state.read_text()).get("_data_files", [])]
    if not files:
        raise BadSource(
            f"{folder}: a saved data set with no data files; save it again with Dataset.save_to_disk"
        )
    return tuple(Shard(path, "arrow") for path in files)


def _split_folder(text: str) -> tuple[Path, str] | None:
    """(DatasetDict folder, split) for `FOLDER:SPLIT`, or None when the text is not that."""
    folder, sep, split = text.rpartition(":")
    if not sep or not (Path(folder) / "dataset_dict.json").is_file():
        return None
    splits = json.loads((Path(folder) / "dataset_dict.json").read_text()).get("splits", [])
    if split not in splits:
        raise BadSource(f"{text}: no split {split!r} in {folder} (it has {', '.join(splits) or 'none'})")
    return Path(folder), split


def matched_files(text: str) -> list[Path]:
    """The files a glob DATA argument matches, in name order (what is read as its shards)."""
    return sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())


def is_glob(text: str) -> bool:
    return bool(_GLOB_CHARS & set(text))


def _glob_root(text: str) -> Path:
    """The folder above a glob's first wildcard: what `dvc add` pins for it."""
    parts = Path(text).parts
    fixed = next(i for i, part in enumerate(parts) if _GLOB_CHARS & set(part))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _check_schemas(source: Source) -> None:
    """Every shard has the first shard's columns and types (JSONL lines are checked row by row later), but for
    the provenance columns a harvested shard adds (`PROVENANCE_COLUMNS`), which training never reads; no
    column name is given twice (a CSV header can), which no column choice could tell apart."""
    if source.fmt == "jsonl" or not source.shards:
        return
    names = source.shards[0].schema().names
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise BadSource(
            f"{source.text}: column(s) {', '.join(map(repr, repeated))} named more than once in "
            f"{source.shards[0].path.name}; give each column a name of its own"
        )
    if len(source.shards) < 2:
        return
    first = _signature(source.shards[0].schema())
    for shard in source.shards[1:]:
        found = _signature(shard.schema())
        if found.keys() != first.keys() or not all(same_values(first[n], found[n]) for n in first):
            raise BadSource(
                f"{source.text}: shard {shard.path.name} has another schema than "
                f"{source.shards[0].path.name} ({_difference(first, found)}); make the shards "
                "agree or read them as separate sources"
            )


def canonical_type(kind: pa.DataType) -> pa.DataType:
    """The type a column's values are read as, whatever the writer's encoding of it: dictionary-encoded values
    as their value type, large strings, binaries and lists as plain ones (pandas and polars write the same
    text as `large_string` and `string`, and a Parquet writer may dictionary-encode it)."""
    if pa.types.is_dictionary(kind):
        return canonical_type(kind.value_type)
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_large_list(kind) or pa.types.is_list(kind):
        return pa.list_(canonical_type(kind.value_type))
    return kind


def same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two shards' types of a column hold the same kind of values (an all-null column holds any)."""
    return pa.types.is_null(a) or pa.types.is_null(b) or canonical_type(a) == canonical_type(b)


def column_types(source: Source) -> dict[str, pa.DataType]:
    """The type each column of a source's shards is read as: the shards' own where they agree exactly, else
    the canonical type of the first that is not all-null (`_check_schemas` has refused values of other
    kinds)."""
    if len(source.shards) < 2 or source.fmt not in ("parquet", "arrow"):
        return {}
    schemas = [shard.schema() for shard in source.shards]
    types = {}
    for name in schemas[0].names:
        found = [schema.field(name).type for schema in schemas if name in schema.names]
        typed = [kind for kind in found if not pa.types.is_null(kind)] or found
        types[name] = typed[0] if all(kind == typed[0] for kind in typed) else canonical_type(typed[0])
    return types


def _signature(schema: pa.Schema) -> dict[str, pa.DataType]:
    return {field.name: field.type for field in schema if field.name not in PROVENANCE_COLUMNS}


def _difference(first: dict[str, pa.DataType], other: dict[str, pa.DataType]) -> str:
    problems = [f"no column {n}" for n in first if n not in other]
    problems += [f"extra column {n}" for n in other if n not in first]
    problems += [
        f"{n} is {other[n]}, not {t}" for n, t in first.items() if n in other and not same_values(t, other[n])
    ]
    return "; ".join(problems[:4])


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
    """The Arrow files `datasets` prepared for the split, in order; refused in one line when it cannot
    load."""
    repo, config, split = parse_hub_id(spec)
    try:
        import datasets  # optional: only a Hub id needs it, so it is imported only for one
    except ImportError:
        raise BadSource(
            f"hf:{spec}: the `datasets` package is not installed; `pip install datasets`, or {_OFFLINE_HELP}"
        ) from None
    if (
        not env_flag_set("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        and (unreachable := _hub_unreachable()) is not None
    ):
        # Refused at once: `datasets` would retry for half a minute, printing each retry, before failing.
        raise BadSource(
            f"hf:{spec}: the Hugging Face Hub cannot be reached from here ({unreachable}); "
            f"{_OFFLINE_HELP} (or, for a data set in the local cache, set HF_HUB_OFFLINE=1)"
        )
    try:
        dataset = datasets.load_dataset(repo, config, split=split)
    except (ConnectionError, OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise BadSource(
            f"hf:{spec}: cannot load it from the Hugging Face Hub ({reason}); {_OFFLINE_HELP}"
        ) from None
    files = [Path(entry["filename"]) for entry in dataset.cache_files]
    if not files:
        raise BadSource(
            f"hf:{spec}: `datasets` kept the split in memory, not in Arrow files; {_OFFLINE_HELP}"
        )
    return tuple(Shard(path, "arrow") for path in files)


def env_flag_set(*names: str) -> bool:
    """Whether any of these environment variables is set on (1, ON, YES or TRUE, as Hugging Face libraries
    read their offline flags: `datasets` reads its cache only under HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)."""
    return any((os.environ.get(name) or "").upper() in {"1", "ON", "YES", "TRUE"} for name in names)


def _hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hub's endpoint (HF_ENDPOINT, else huggingface.co) takes no connection, or None when it does."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = (
        endpoint.hostname or "huggingface.co",
        endpoint.port or (80 if endpoint.scheme == "http" else 443),
    )
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        return f"{host}:{port}: {error.strerror or type(error).__name__}"
    return None
