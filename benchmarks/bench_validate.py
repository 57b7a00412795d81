"""Validation throughput: decisions per second on 100k- and 1M-decision files, and where the time goes.

Files come from the synthetic generator (three question types, hard and soft gold, 1% broken rows,
~300-character states), written as Parquet (JSON-text cells) and JSONL (native nested values), and cached
under benchmarks/.cache/. Each file is validated in a fresh process; the share of time is split into reading
(Arrow and decoding), parsing (facts per decision), the pandera schema, and collecting the report and records.

    python benchmarks/bench_validate.py

Goal: >= 200,000 decisions/s at 1M decisions on a 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results"
ROWS = {"100k": 33_334, "1M": 333_334}  # three decisions per clean row
GOAL = 200_000
# "report": what `decision validate` does; "records": also builds the usable records that training consumes.
MODES = ("report", "records")


def build(name: str, fmt: str) -> Path:
    from pipeline.data import synthetic

    path = CACHE / f"validate_{name}.{fmt}"
    if not path.exists():
        print(f"building {path} ...", flush=True)
        rows = synthetic.generate_rows(ROWS[name], seed=7, broken_every=100, state_chars=300)
        synthetic.write_rows(rows, path.with_suffix(".partial" + path.suffix), row_group_size=10_000).replace(
            path
        )
    return path


def child(path: str, with_records: bool) -> dict:
    from pipeline.data.validate import validate_file

    began = time.perf_counter()
    report = validate_file(path, with_records=with_records).report
    seconds = time.perf_counter() - began
    return {"decisions": report.decisions, "seconds": seconds, "parts": report.seconds}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3] == "records")))
        return
    sys.path.insert(0, str(HERE.parent))
    results = {}
    for name in ROWS:
        for fmt in ("parquet", "jsonl"):
            path = build(name, fmt)
            for mode in MODES:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(path), mode],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=HERE.parent,
                )
                results[f"{name}.{fmt} {mode}"] = json.loads(out.stdout)
    print_table(results)


def print_table(results: dict) -> None:
    print(
        f"\n{'file':<22}{'decisions':>11}{'seconds':>9}{'dec/s':>10}  "
        f"{'read':>6}{'parse':>7}{'pandera':>9}{'collect':>9}"
    )
    for key, r in results.items():
        parts = r["parts"]
        total = sum(parts.values())
        r["decisions_per_second"] = r["decisions"] / r["seconds"]
        r["share"] = {k: v / total for k, v in parts.items()}
        share = r["share"]
        print(
            f"{key:<22}{r['decisions']:>11,}{r['seconds']:>9.2f}{r['decisions_per_second']:>10,.0f}  "
            f"{share['read']:>6.0%}{share['parse']:>7.0%}{share['schema']:>9.0%}{share['collect']:>9.0%}"
        )
    for mode in MODES:
        best = max(
            r["decisions_per_second"] for k, r in results.items() if k.startswith("1M") and k.endswith(mode)
        )
        print(
            f"1M decisions, {mode:<8}: best {best:,.0f} decisions/s = {best / GOAL:.2f} x the goal of "
            f"{GOAL:,}/s"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_validate.json"
    out.write_text(json.dumps({"goal": GOAL, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
