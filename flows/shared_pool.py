"""A Prefect server shared by several workers, set up once: task results in shared storage, and runs whose
worker died marked CRASHED.

    PREFECT_API_URL=http://prefect:4200/api python -m flows.shared_pool /shared/prefect-results

1. Shared results: a LocalFileSystem block on the folder, saved on the server and made its default result
   storage, so a flow run on any worker persists its task results there, and the cache records (the cache keys:
   with no `key_storage` on a policy, Prefect keeps them beside the results) with them. A rerun picked up by
   another worker then finds the tasks a crashed run finished, as a rerun on one machine finds them under
   `.prefect/storage`. The folder must be the same path on every worker (a shared mount); for object storage,
   save a prefect-aws `S3Bucket` block instead and `prefect result-storage set s3-bucket/NAME`.
2. Crashed runs: a worker killed with its flow run (a lost node, `kill -9`) leaves the run RUNNING, holding the
   deployment's only concurrency slot. The deployment's runs send a heartbeat every
   PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (prefect.yaml sets it); this automation marks a run CRASHED when
   `--crash-after` seconds pass without one, which frees the slot for the rerun.

Without a server default, results stay in each worker's own `$PREFECT_HOME/storage`, as for `make run`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.filesystems import LocalFileSystem

BLOCK_NAME = "decision-results"
AUTOMATION_NAME = "decision: crash runs without heartbeats"
# Three missed heartbeats at prefect.yaml's 30 s: a busy machine delays one, never three.
CRASH_AFTER_S = 90
FINAL_EVENTS = {f"prefect.flow-run.{state}" for state in ("Completed", "Failed", "Cancelled", "Crashed")}


def share_results(folder: str | Path, name: str = BLOCK_NAME) -> str:
    """Save a LocalFileSystem block on `folder` as `name` and make it the server's default result storage;
    the block's slug."""
    block_id = LocalFileSystem(basepath=str(Path(folder).resolve())).save(name, overwrite=True)
    with get_client(sync_client=True) as client:
        client.update_server_default_result_storage(block_id)
    return f"local-file-system/{name}"


def crash_silent_runs(after_s: float = CRASH_AFTER_S) -> str:
    """The automation that marks a flow run CRASHED once `after_s` seconds pass after a heartbeat with neither
    another one nor a final state (Prefect's documented zombie-flow automation); replaced if it exists."""
    with get_client(sync_client=True) as client:
        for found in client.read_automations_by_name(AUTOMATION_NAME):
            client.delete_automation(found.id)
    automation = Automation(
        name=AUTOMATION_NAME,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *FINAL_EVENTS},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=dt.timedelta(seconds=after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED, message=f"no heartbeat for {after_s:g} s: its worker or machine died"
            )
        ],
    )
    return str(automation.create().id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.shared_pool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "folder", help="the shared result storage: a folder every worker sees at the same path"
    )
    parser.add_argument("--name", default=BLOCK_NAME, help=f"the storage block's name (default {BLOCK_NAME})")
    parser.add_argument(
        "--crash-after",
        type=float,
        default=CRASH_AFTER_S,
        help=f"seconds without a heartbeat before a run is marked CRASHED (default {CRASH_AFTER_S})",
    )
    args = parser.parse_args(argv)
    print(f"default result storage: {share_results(args.folder, args.name)} ({Path(args.folder).resolve()})")
    print(
        f"automation {crash_silent_runs(args.crash_after)}: a run silent for {args.crash_after:g} s is "
        "CRASHED"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
