"""A fresh clone getting its pinned data: building it (`dvc repro`, no remote) vs pulling it from a DVC remote
first (`python -m pipeline.data.remote pull`, then `dvc repro`, as `make run` does), side by side in one run.

Clones this checkout's HEAD twice into a temporary folder; the first builds the data and pushes it to a local
directory remote, the second pulls. Nothing in this checkout is touched. About a minute and a half on 2 cores.

    python benchmarks/bench_dvc_remote.py            # writes benchmarks/results/dvc_remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _run(args: list[str], cwd: Path) -> float:
    """Seconds `args` took in `cwd`; raises with its output when it fails."""
    env = os.environ | {"DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(cwd)}
    started = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed in {cwd}:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def _clone(tmp: Path, name: str, remote: Path) -> Path:
    clone = tmp / name
    _run(["git", "clone", "-q", str(ROOT), str(clone)], tmp)
    _run([sys.executable, "-m", "dvc", "remote", "add", "--local", "-d", "bench", str(remote)], clone)
    return clone


def measure(tmp: Path) -> dict[str, float]:
    remote = tmp / "remote"
    dvc = [sys.executable, "-m", "dvc"]
    built = _clone(tmp, "builds", remote)
    results = {"build": _run([*dvc, "repro"], built)}
    results["push"] = _run([sys.executable, "-m", "pipeline.data.remote", "push"], built)
    pulled = _clone(tmp, "pulls", remote)
    results["pull"] = _run([sys.executable, "-m", "pipeline.data.remote", "pull"], pulled)
    results["repro_after_pull"] = _run([*dvc, "repro"], pulled)
    status = subprocess.run([*dvc, "status"], cwd=pulled, capture_output=True, text=True).stdout
    if "up to date" not in status:
        raise RuntimeError(f"the pulled clone is not up to date after dvc repro:\n{status}")
    return results


def report(results: dict[str, float], out: Path) -> None:
    pulled = results["pull"] + results["repro_after_pull"]
    print(f"{'fresh clone':<52}{'wall s':>8}")
    print(f"{'dvc repro (no remote: builds dataset and snapshot)':<52}{results['build']:>8.1f}")
    print(f"{'pull + dvc repro (remote has them)':<52}{pulled:>8.1f}")
    print(f"{'  of which pull':<52}{results['pull']:>8.1f}")
    print(f"{'  of which dvc repro (validate only)':<52}{results['repro_after_pull']:>8.1f}")
    print(f"build / (pull + repro): {results['build'] / pulled:.2f}x   (push took {results['push']:.1f} s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"results_s": results, "ratio_build_over_pull": results["build"] / pulled}
    out.write_text(json.dumps(payload, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "dvc_remote.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dvc-remote-") as tmp:
        report(measure(Path(tmp)), Path(args.out))


if __name__ == "__main__":
    main()
