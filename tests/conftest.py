"""Shared fixtures (the project root, small synthetic decision files) and the test tiers.

`make test` runs the fast tier (`-m "not full and not gpu"`): unit, data, model, api and one tiny flow.
`make test-all` (what .ci/run runs) adds the tests below marked `full`: they start services, workers, torchrun
ranks or a browser, or kill processes and wait for them. Membership is kept here, in one table, with why.
"""

import os
from pathlib import Path

import pytest

from pipeline.data import synthetic

# OpenMP threads waiting for work sleep, not spin: with torch's two threads on two cores another process
# shares, spinning made tiny trainings 15-30x slower (test_loss_falls_and_parameters_stay_finite: 78 s, not
# 2.4 s, beside one busy core). Read once, when torch loads OpenMP: so before anything here imports torch
# (commands the tests start inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]

FULL_ONLY = {
    "tests/flows/": "Prefect flows, work pools, workers, MLflow servers, PostgreSQL clusters, Chromium",
    "tests/model/test_ddp.py": "torchrun ranks, killed and stopped ranks",
    "tests/api/test_workers.py": "a multi-process uvicorn server",
    "tests/api/test_schemathesis.py": "property-based fuzzing of the whole API",
    "tests/api/test_mlflow_serving.py": "MLflow's own model server",
    "tests/api/test_js_clients.py": "installs npm packages (and a PyPI client) on first use",
    "tests/api/test_inference_log_kill.py": "real `decision serve` processes, stopped by SIGTERM and SIGKILL",
    "tests/api/test_inference_log_postgres.py": "a PostgreSQL cluster",
    "tests/data/test_remote.py": "DVC pushes and pulls through a remote",
    "tests/unit/test_store.py": "PostgreSQL clusters and a tracking server",
    "tests/unit/test_prefect_server_preflight.py": "a Prefect server on PostgreSQL",
    **dict.fromkeys(
        [
            f"tests/unit/test_gpu_check.py::{name}"
            for name in (
                "test_the_dry_run_checks_every_row_and_fails_none",
                "test_the_default_fit_keeps_the_ensemble",
                "test_the_compiled_runs_compiled_and_matched_eager",
                "test_what_the_cpu_cannot_check_is_skipped",
            )
        ],
        "`scripts/gpu_check.sh --dry-run`: every row of the GPU check trained on the CPU (over a minute)",
    ),
    "tests/model/test_export.py::test_a_killed_export_leaves_a_complete_model": "ten export processes, each "
    "SIGKILLed at another moment of its write (about a minute)",
    "tests/model/test_compile.py::test_compiled_matches_eager": "torch.compile on the CPU: tens of seconds a graph",
    "tests/model/test_compile.py::test_no_recompiles_after_warmup": "torch.compile on the CPU, every bucket",
    "tests/model/test_predict.py::test_a_terminated_command_exits_130": "a real `decision predict` process, "
    "stopped by SIGTERM mid-file",
    # Duplicate: the fast test_a_causal_lm_export_registers_and_answers_as_an_mlflow_model covers the path.
    "tests/model/test_joint_causal_lm_finetune.py::test_lora_finetune_trains_calibrates_exports_and_serves": "150 "
    "LoRA steps on the tiny causal LM until its loss halves, then served (~18 s)",
}
"""Test files, folders or tests (a node id's start) that run in `make test-all` only, with what makes them
slow."""
FAST_FLOW = "tests/flows/test_retrain.py::test_a_first_run_is_tracked_registered_smoke_tested_and_promoted"
"""The one tiny flow of the fast tier: the whole retrain chain, end to end, on a tiny model."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        where = f"{Path(item.fspath).relative_to(ROOT).as_posix()}::{item.name}"
        if item.nodeid.split("[")[0] != FAST_FLOW and any(where.startswith(prefix) for prefix in FULL_ONLY):
            item.add_marker(pytest.mark.full)


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def synthetic_rows():
    return synthetic.generate_rows(120, seed=3, broken_every=6)


@pytest.fixture(scope="session", params=["jsonl", "parquet", "csv"])
def synthetic_file(request, tmp_path_factory, synthetic_rows) -> Path:
    path = tmp_path_factory.mktemp("synthetic") / f"rows.{request.param}"
    return synthetic.write_rows(synthetic_rows, path, row_group_size=16)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny random decision model in the Laya layout, written by laya itself."""
    from tests.tiny import write_tiny_base

    return write_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="session")
def synthetic_train_file(tmp_path_factory) -> Path:
    """Clean synthetic rows (all three question types) to train on."""
    return synthetic.write_rows(
        synthetic.generate_rows(160, seed=11), tmp_path_factory.mktemp("train") / "rows.jsonl"
    )
