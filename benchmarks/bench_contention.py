"""Speed that survives a shared machine: our Decision API, laya-serve and our training step, quiet, beside
busy processes and under a 1-core quota, side by side in one run.

Conditions, each measured with fresh processes (so a server's thread choice sees the condition from its start):
  quiet     nothing else runs (beyond what already ran on the machine)
  busy1     one `python -c 'while True: pass'` pinned to the last core
  busy2     two, pinned to the last two cores
  quota1    the servers and the training run in a cgroup with a 1-CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`)
            where /sys/fs/cgroup is writable, else pinned to core 0 (taskset -c 0); the output says which
In each: ours (`decision serve`, default threads, and `--threads N` for each `--also-threads`) and laya-serve on the
same folder (and ours on a joint-family export with `--joint`), one at a time, warmed up, then the same requests at each concurrency (bench_serve's client); then
`decision train --max-steps STEPS` on a slice of the data, its median s/step (the first step left out).

Prints requests/s and steps/s per condition with the ratios to quiet and ours/laya, the threads ours chose and
why (its /healthz and train.json), and the goals: under busy1 on a 2-core machine (half its cores) and under
quota1, ours keeps at least (cores kept / cores) / 1.1 of its quiet speed (it falls by at most the share lost,
plus 10%), and ours stays ahead of laya at every load. Writes JSON to
benchmarks/results/bench_contention.json.

    python benchmarks/bench_contention.py [--model models/vader-minilm] [--requests 40] [--concurrency 1 8]
    python benchmarks/bench_contention.py --steps 8 --train-method lora --also-threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_serve import build_requests, default_model, load, start_laya, start_ours, wait_ready  # noqa: E402

from pipeline.cpu.budget import CgroupFiles, affinity_cpus, cgroup_paths  # noqa: E402
from pipeline.stages.smoke import free_port  # noqa: E402

CONDITIONS = ("quiet", "busy1", "busy2", "quota1")
SLACK = 1.1  # "the share lost, plus 10%"
Confine = Callable[[], None]


@dataclass(frozen=True)
class Condition:
    """What runs beside the measured processes, and what confines them."""

    name: str
    busy: int = 0
    confine: Confine | None = None
    how: str = ""
    kept_share: float | None = None
    """The machine's share left to us (None: no goal): cores free of busy processes, or the quota, over
    cores."""


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[list[int]]:
    """`count` busy-looping Pythons, each pinned to one of the last cores; killed on the way out."""
    cores = sorted(os.sched_getaffinity(0))
    pinned = [cores[-1 - i % len(cores)] for i in range(count)]
    processes = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pin_to({core}))
        for core in pinned
    ]
    try:
        yield pinned
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=30)


def _pin_to(cores: set[int]) -> Confine:
    return lambda: os.sched_setaffinity(0, cores)


@contextlib.contextmanager
def one_cpu_quota(files: CgroupFiles = CgroupFiles()) -> Iterator[tuple[Confine, str]]:
    """(confine, how): a child cgroup of this process's with a 1-CPU quota where one can be made, else core
    0."""
    folder, version = None, ""
    try:
        folder, version = _make_quota_cgroup(files)
    except OSError as error:
        reason = f"no writable cgroup ({error.strerror or error}); pinned to core 0 instead (taskset -c 0)"
        yield _pin_to({min(os.sched_getaffinity(0))}), reason
        return
    try:
        yield _join(folder / "cgroup.procs"), f"cgroup {version} {folder} with a quota of 1 cpu"
    finally:
        with contextlib.suppress(OSError):  # still busy only if a child outlived its stop; said below
            folder.rmdir()
        if folder.exists():
            print(f"note: could not remove {folder}", file=sys.stderr)


def _make_quota_cgroup(files: CgroupFiles) -> tuple[Path, str]:
    """A new cgroup under this process's own, with a quota of 1 CPU per 100 ms period (OSError where
    refused)."""
    paths = cgroup_paths(files)
    name = f"decision-bench-{os.getpid()}"
    unified = files.cgroup_root / paths.get("", "/").strip("/")
    if "" in paths and "cpu" in _read(unified / "cgroup.controllers").split():
        (unified / "cgroup.subtree_control").write_text(
            "+cpu"
        )  # refused (EBUSY) where this cgroup has members
        return _quota_folder(unified / name, {"cpu.max": "100000 100000"}), "v2"
    controllers = next((c for c in paths if "cpu" in c.split(",")), None)
    mounts = [files.cgroup_root / c for c in (controllers, "cpu") if controllers]
    mount = next((m for m in mounts if m.is_dir()), None)
    if mount is None:
        raise OSError("no cgroup cpu controller for this process")
    quota = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
    return _quota_folder(mount / paths[controllers].strip("/") / name, quota), "v1"


def _quota_folder(folder: Path, settings: dict[str, str]) -> Path:
    """A new cgroup folder with `settings` written, or none left behind when one is refused."""
    folder.mkdir()
    try:
        for name, value in settings.items():
            (folder / name).write_text(value)
    except OSError:
        folder.rmdir()
        raise
    return folder


def _read(file: Path) -> str:
    return file.read_text() if file.is_file() else ""


def _join(procs: Path) -> Confine:
    return lambda: procs.write_text(str(os.getpid()))


def measure_server(name: str, start, condition: Condition, model: Path, bodies: list[dict], args) -> dict:
    """Start a server under `condition`, warm it up, load it at each concurrency; its /healthz when it has
    one."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(model, port, args.device, confine=condition.confine)
    try:
        wait_ready(url, bodies[0], process, timeout_s=args.start_timeout)
        load(url, bodies[: args.warmup], max(args.concurrency), args.seconds)
        runs = [load(url, bodies, c, args.seconds) for c in args.concurrency]
        health = httpx.get(f"{url}/healthz", timeout=30)  # after the load: the threads it settled on
    finally:
        process.terminate()
        process.wait(timeout=30)
    threads, source = _threads_of(health)
    for run in runs:
        print(
            f"  {condition.name:<7}{name:<19}c={run['concurrency']}: {run['throughput_rps']:.1f} req/s, "
            f"p50 {run['p50_ms']:.0f} ms, errors {run['errors']}",
            flush=True,
        )
    return {"runs": runs, "threads": threads, "threads_source": source}


def _threads_of(health) -> tuple[int | None, str | None]:
    """The threads a server reports on /healthz and their source (laya-serve reports none)."""
    try:
        body = health.json() if health.status_code == 200 else {}
    except ValueError:
        body = {}
    return body.get("threads"), body.get("threads_source")


def measure_training(condition: Condition, args, params: Path, threads: int | None = None) -> dict:
    """`decision train --max-steps` on a slice under `condition` (with `--threads` when given): median s/step
    and the threads it chose."""
    name = "train" if threads is None else f"train --threads {threads}"
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
        command = [
            sys.executable,
            "-m",
            "pipeline.cli.main",
            "train",
            "--data",
            str(args.train_data or args.data),
            "--slice",
            f"0:{args.rows}",
            "--base",
            str(args.base),
            "--out",
            f"{folder}/tune",
            "--max-steps",
            str(args.steps),
            "--params",
            str(params),
            "--device",
            args.device,
            "--json",
            "-q",
        ]
        command += [] if threads is None else ["--threads", str(threads)]
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=args.train_timeout,
            preexec_fn=condition.confine,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{name} under {condition.name} failed:\n{done.stderr[-2000:]}")
    run = json.loads(done.stdout)
    result = {
        "s_per_step": run["s_per_step"],
        "steps_per_s": 1 / run["s_per_step"],
        "steps": run["steps"],
        "threads": run["threads"],
        "threads_source": run["threads_source"],
    }
    print(
        f"  {condition.name:<7}{name:<19}{result['steps_per_s']:.3f} steps/s ({run['steps']} steps, "
        f"{result['s_per_step']:.2f} s/step), threads {run['threads']} ({run['threads_source']})",
        flush=True,
    )
    return result


def training_params(args, folder: Path) -> Path:
    """params.yaml with the benchmark's training method and micro-batch (one micro-batch per step)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"] |= {
        "method": args.train_method,
        "micro_batch": args.micro_batch,
        "grad_accum": 1,
        "warmup_steps": 0,
        "checkpoint_every_steps": 0,
        "checkpoint_every_minutes": 0.0,
    }
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def run_condition(condition: Condition, model: Path, bodies: list[dict], args, params: Path) -> dict:
    """Every measurement of one condition, with its busy processes running throughout."""
    with busy_processes(condition.busy) as pinned:
        if pinned:
            print(f"{condition.name}: busy processes on cores {pinned}", flush=True)
        servers = {"ours": measure_server("ours", start_ours, condition, model, bodies, args)}
        if args.joint:
            servers["ours joint"] = measure_server(
                "ours joint", start_ours, condition, args.joint, bodies, args
            )
        for threads in args.also_threads:
            start = functools.partial(start_ours, threads=threads)
            servers[f"ours --threads {threads}"] = measure_server(
                f"ours --threads {threads}", start, condition, model, bodies, args
            )
        servers["laya"] = measure_server("laya", start_laya, condition, model, bodies, args)
        training = {}
        for threads in [None, *args.also_threads] if args.steps else []:
            measured = measure_training(condition, args, params, threads)
            training["train" if threads is None else f"train --threads {threads}"] = measured
    return {
        "condition": condition.name,
        "how": condition.how,
        "kept_share": condition.kept_share,
        "servers": servers,
        "training": training,
    }


def ratios(results: list[dict]) -> list[dict]:
    """Per condition, server and concurrency: req/s, its ratio to quiet, ours/laya; and the training
    step's."""
    quiet = next(r for r in results if r["condition"] == "quiet")
    rows = []
    for result in results:
        for name, server in result["servers"].items():
            for run, base in zip(server["runs"], quiet["servers"][name]["runs"]):
                laya = next(
                    r for r in result["servers"]["laya"]["runs"] if r["concurrency"] == run["concurrency"]
                )
                rows.append(
                    {
                        "condition": result["condition"],
                        "what": name,
                        "concurrency": run["concurrency"],
                        "per_s": run["throughput_rps"],
                        "vs_quiet": run["throughput_rps"] / base["throughput_rps"],
                        "vs_laya": run["throughput_rps"] / laya["throughput_rps"],
                        "threads": server["threads"],
                        "threads_source": server["threads_source"],
                    }
                )
        for name, run in result["training"].items():
            per_s = run["steps_per_s"]
            rows.append(
                {
                    "condition": result["condition"],
                    "what": name,
                    "concurrency": None,
                    "per_s": per_s,
                    "vs_quiet": per_s / quiet["training"][name]["steps_per_s"],
                    "vs_laya": None,
                    "threads": run["threads"],
                    "threads_source": run["threads_source"],
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"\n{'condition':<10}{'what':<20}{'c':>3}{'per s':>9}{'vs quiet':>10}{'ours/laya':>11}  threads "
        "(source)"
    )
    for row in rows:
        c = "" if row["concurrency"] is None else row["concurrency"]
        vs_laya = "" if row["vs_laya"] is None or row["what"] == "laya" else f"{row['vs_laya']:.2f}x"
        unit = " st/s" if row["what"].startswith("train") else " rq/s"
        threads = "" if row["threads"] is None else f"{row['threads']} ({row['threads_source']})"
        print(
            f"{row['condition']:<10}{row['what']:<20}{c:>3}{row['per_s']:>9.2f}{unit}{row['vs_quiet']:>5.2f}"
            f"{vs_laya:>11}  {threads}"
        )


def goals(rows: list[dict], conditions: dict[str, Condition]) -> dict[str, bool]:
    """Ours keeps kept_share / 1.1 of its quiet speed where the condition has a goal, and beats laya
    everywhere."""
    met = {}
    for row in rows:
        if row["what"] not in ("ours", "ours joint", "train"):
            continue
        kept = conditions[row["condition"]].kept_share
        label = f"{row['condition']} {row['what']}" + (
            f" c={row['concurrency']}" if row["concurrency"] else ""
        )
        if kept is not None and row["condition"] != "quiet":
            met[f"{label}: >= {kept / SLACK:.2f} of quiet"] = row["vs_quiet"] >= kept / SLACK
        if row["vs_laya"] is not None:
            met[f"{label}: ahead of laya"] = row["vs_laya"] > 1.0
    return met


def build_conditions(names: list[str], stack: contextlib.ExitStack) -> dict[str, Condition]:
    cores = affinity_cpus()
    conditions = {}
    for name in names:
        if name == "quota1":
            confine, how = stack.enter_context(one_cpu_quota())
            conditions[name] = Condition(name, confine=confine, how=how, kept_share=1 / cores)
        else:
            busy = 0 if name == "quiet" else int(name.removeprefix("busy"))
            kept = (cores - busy) / cores if busy < cores else None
            how = f"{busy} busy process(es) on {cores} cores" if busy else "nothing beside"
            conditions[name] = Condition(name, busy=busy, how=how, kept_share=kept)
    return conditions


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument(
        "--base", type=Path, default=ROOT / "data/snapshots/minilm", help="what training starts from"
    )
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--requests", type=int, default=40, help="requests per concurrency level")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="no new request after this long per level"
    )
    parser.add_argument("--warmup", type=int, default=8, help="requests before measuring")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--joint", type=Path, help="also ours on this joint-family export (the default family)"
    )
    parser.add_argument("--also-threads", type=int, nargs="*", default=[], help="also ours with --threads N")
    parser.add_argument("--steps", type=int, default=8, help="training steps per condition (0: no training)")
    parser.add_argument("--train-data", type=Path, help="what the training run reads (default: --data)")
    parser.add_argument("--rows", type=int, default=200, help="rows of the training data it uses")
    parser.add_argument(
        "--train-method", default="lora", help="lora (default: steps through the backbone) or head"
    )
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds for a server to answer")
    parser.add_argument("--train-timeout", type=float, default=1200.0, help="seconds for one training run")
    parser.add_argument("--out", type=Path, default=HERE / "results/bench_contention.json")
    args = parser.parse_args()
    names = ["quiet", *(n for n in args.conditions if n != "quiet")]  # quiet first: every ratio needs it

    started = time.perf_counter()
    bodies = build_requests(args.data, args.requests)
    print(
        f"model {args.model}, {len(bodies)} requests x {len(bodies[0]['questions'])} questions per level, "
        f"{affinity_cpus()} cores in this process's affinity mask",
        flush=True,
    )
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
        conditions = build_conditions(names, stack)
        for condition in conditions.values():
            print(f"{condition.name}: {condition.how}", flush=True)
        params = training_params(args, Path(folder))
        results = [run_condition(c, args.model, bodies, args, params) for c in conditions.values()]
    rows = ratios(results)
    print_table(rows)
    met = goals(rows, conditions)
    print("\ngoals:\n" + "\n".join(f"  {'met    ' if ok else 'NOT met'} {goal}" for goal, ok in met.items()))
    wall = time.perf_counter() - started
    print(f"\nwall time {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "model": str(args.model),
                "cores": affinity_cpus(),
                "results": results,
                "rows": rows,
                "goals": met,
                "wall_seconds": wall,
                "settings": {k: str(v) for k, v in vars(args).items()},
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
