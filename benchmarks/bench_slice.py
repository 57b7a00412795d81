"""Peak memory of taking 1,000 rows from a 10k-row and a 2M-row decision file: Arrow-range slice vs naive;
and, with `--shards`, from the same 200k rows as 1 shard and as 50 shards (a folder of Parquet, then of
JSONL).

Each measurement runs in a fresh Python process; the parent samples the child's RssAnon (anonymous memory, so
the page cache of a memory-mapped file is not counted) every few milliseconds and keeps the peak.

    python benchmarks/bench_slice.py            # builds (and caches) the files under benchmarks/.cache/
    python benchmarks/bench_slice.py --shards   # 1 vs 50 shards; writes results/bench_slice_shards.json

Goals: peak(2M) / peak(10k) <= 1.2 for the Arrow slice, and naive(2M) / arrow(2M) >= 10; peak(50 shards) /
peak(1 shard) <= 1.2 for each format.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results"
SIZES = {"10k": 10_000, "2M": 2_000_000}
TAKE = 1_000
SHARDED_ROWS = 200_000
SHARD_COUNTS = (1, 50)
_WORDS = (
    "order arrived late box damaged support replied quickly refund offered great product works described "
    "would buy again terrible battery life screen flickers night delivery fine neutral experience overall "
    "price fair quality could better service staff friendly rude slow fast cheap expensive"
).split()


def build_file(rows: int, path: Path, chunk: int = 100_000) -> Path:
    """A Parquet decision file with ~300-character text states, JSON-text questions and gold, 10k-row
    groups."""
    import numpy as np
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.data.synthetic import INTENSITY_LEGEND, TONES

    questions = orjson.dumps(
        {
            "tone": {"type": "choice", "instructions": "What is the tone?", "criteria": list(TONES)},
            "intensity": {
                "type": "score",
                "instructions": "How intense?",
                "criteria": list(INTENSITY_LEGEND),
            },
            "is_negative": {"type": "noul", "instructions": "The text is negative."},
        }
    ).decode()
    rng = np.random.default_rng(0)
    words = np.array(_WORDS)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with pq.ParquetWriter(
        partial, pa.schema([(n, pa.string()) for n in ("state", "questions", "gold")])
    ) as out:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            picks = words[rng.integers(0, len(words), size=(n, 48))]
            states = [" ".join(row)[:300] for row in picks.tolist()]
            labels = rng.integers(0, 3, size=n).tolist()
            gold = [
                f'{{"tone":"{TONES[t]}","intensity":{t + 1},"is_negative":{str(t == 0).lower()}}}'
                for t in labels
            ]
            table = pa.table({"state": states, "questions": [questions] * n, "gold": gold})
            out.write_table(table, row_group_size=10_000)
    partial.replace(path)
    return path


def build_shards(count: int, fmt: str) -> Path:
    """A folder of `count` shards (Parquet or JSONL) holding SHARDED_ROWS rows between them."""
    import orjson
    import pyarrow.parquet as pq

    folder = CACHE / f"shards_{fmt}_{count}"
    if folder.exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    for index in range(count):
        shard = build_file(SHARDED_ROWS // count, partial / f"part-{index:03d}.parquet")
        if fmt == "jsonl":  # questions and gold are JSON text already: written into the line as they are
            table = pq.read_table(shard).to_pydict()
            with (partial / f"part-{index:03d}.jsonl").open("w") as out:
                for state, questions, gold in zip(table["state"], table["questions"], table["gold"]):
                    out.write(
                        f'{{"state":{orjson.dumps(state).decode()},"questions":{questions},"gold":{gold}}}\n'
                    )
            shard.unlink()
    partial.rename(folder)
    return folder


def measure_child(method: str, path: str, start: int, end: int) -> dict:
    """Runs in the child: take rows [start, end) with `method`; print what it got."""
    import pyarrow.parquet as pq

    from pipeline.data.read import RowSlice
    from pipeline.data.validate import validate_file

    began = time.perf_counter()
    if method == "arrow":
        report = validate_file(path, RowSlice(start, end)).report
        rows = report.rows
    else:  # the naive way: every row becomes a Python object, then the slice is taken
        everything = pq.read_table(path).to_pylist()
        rows = len(everything[start:end])
    return {"rows": rows, "seconds": time.perf_counter() - began}


def _rss_anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def measure(method: str, path: Path, start: int, end: int) -> dict:
    """Run one measurement in a fresh process and sample its anonymous memory until it exits."""
    command = [sys.executable, __file__, "--child", method, str(path), str(start), str(end)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=HERE.parent)
    peak = 0
    while child.poll() is None:
        peak = max(peak, _rss_anon_kb(child.pid))
        time.sleep(0.002)
    result = json.loads(child.stdout.read())
    if child.returncode:
        raise RuntimeError(f"{method} on {path} failed")
    return result | {"peak_rss_anon_mb": round(peak / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--child", nargs=4, metavar=("METHOD", "PATH", "START", "END"), help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help="results JSON (default results/bench_slice.json, or _shards.json)")
    parser.add_argument("--shards", action="store_true", help="1 shard vs 50 shards of the same rows")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))  # the child too: it must measure this checkout's reader
    if args.child:
        method, path, start, end = args.child
        print(json.dumps(measure_child(method, path, int(start), int(end))))
        return
    if args.shards:
        run_shards(Path(args.out or RESULTS / "bench_slice_shards.json"))
        return
    args.out = args.out or str(RESULTS / "bench_slice.json")
    files = {name: CACHE / f"decisions_{name}.parquet" for name in SIZES}
    for name, path in files.items():
        if not path.exists():
            print(f"building {path} ({SIZES[name]:,} rows) ...", flush=True)
            build_file(SIZES[name], path)
    results = {}
    for name, path in files.items():
        start = SIZES[name] // 2
        for method in ("arrow", "naive"):
            results[f"{method}_{name}"] = measure(method, path, start, start + TAKE)
    report(results, Path(args.out))


def report(results: dict, out: Path) -> None:
    print(f"\nTaking {TAKE:,} rows from the middle of each file (peak RssAnon of a fresh process)")
    print(f"{'method':<8}{'file':>6}{'peak MB':>10}{'seconds':>10}")
    for key, value in results.items():
        method, name = key.split("_")
        print(f"{method:<8}{name:>6}{value['peak_rss_anon_mb']:>10.1f}{value['seconds']:>10.2f}")
    flat = results["arrow_2M"]["peak_rss_anon_mb"] / results["arrow_10k"]["peak_rss_anon_mb"]
    saving = results["naive_2M"]["peak_rss_anon_mb"] / results["arrow_2M"]["peak_rss_anon_mb"]
    print(f"\narrow peak(2M) / peak(10k) = {flat:.2f}   (goal <= 1.2)")
    print(f"naive(2M) / arrow(2M)      = {saving:.1f}   (goal >= 10)")
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "take": TAKE,
        "results": results,
        "ratio_2m_over_10k": flat,
        "ratio_naive_over_arrow_2m": saving,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


def run_shards(out: Path) -> None:
    """Take TAKE rows from the middle of the same rows held in 1 and in 50 shards, per format."""
    results, start = {}, SHARDED_ROWS // 2
    for fmt in ("parquet", "jsonl"):
        for count in SHARD_COUNTS:
            print(f"building {count} {fmt} shard(s) of {SHARDED_ROWS:,} rows in all ...", flush=True)
            results[f"{fmt}_{count}"] = measure("arrow", build_shards(count, fmt), start, start + TAKE)
    print(
        f"\nTaking {TAKE:,} rows from the middle of {SHARDED_ROWS:,} rows (peak RssAnon of a fresh process)"
    )
    print(f"{'format':<9}{'shards':>7}{'peak MB':>10}{'seconds':>10}")
    for key, value in results.items():
        fmt, count = key.split("_")
        print(f"{fmt:<9}{count:>7}{value['peak_rss_anon_mb']:>10.1f}{value['seconds']:>10.2f}")
    low, high = SHARD_COUNTS
    ratios = {
        fmt: results[f"{fmt}_{high}"]["peak_rss_anon_mb"] / results[f"{fmt}_{low}"]["peak_rss_anon_mb"]
        for fmt in ("parquet", "jsonl")
    }
    for fmt, ratio in ratios.items():
        print(f"{fmt:<8} peak({high} shards) / peak({low} shard) = {ratio:.2f}   (goal <= 1.2)")
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"take": TAKE, "rows": SHARDED_ROWS, "results": results, "ratio_many_over_one": ratios}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
