"""Served equals trained: a version whose exported weights are not what was trained fails the smoke test, is
tagged failed, and never moves `champion`, although it agrees perfectly with its own folder's in-process
answers."""

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _corrupt_one_tensor(export: Path, name: str = "scorer.1.weight") -> None:
    """Add noise to one tensor of the (Laya-layout) export's weights: the option scorer's hidden layer."""
    import torch
    from safetensors.torch import load_file, save_file

    path = export / "model.safetensors"
    state = load_file(str(path))
    tensor = state[name].float()
    noise = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(0)) * (3 * tensor.std() + 0.1)
    state[name] = (tensor + noise).to(state[name].dtype)
    save_file(state, str(path))


def test_a_corrupted_export_fails_smoke_is_tagged_failed_and_champion_stays(
    prefect_harness, mlflow_store, tiny_params, tmp_path
):
    from flows.retrain import retrain
    from pipeline.config import load_params
    from pipeline.data.split import SplitData
    from pipeline.mlops.promotion import CHAMPION, current
    from pipeline.mlops.registry import client
    from pipeline.rundir import RunFolder
    from pipeline.stages.promote import promotion_stage, register_stage
    from pipeline.stages.smoke import smoke_version

    first = retrain(str(tiny_params), lock=str(tmp_path / "dvc.lock"))
    assert first.release.smoke.passed and first.release.smoke.trained_agreement >= 0.995
    assert current("tiny-model", CHAMPION) == first.release.version

    params = load_params(str(tiny_params))
    run = RunFolder(Path(params.retrain.runs_dir) / first.tracked.key[:16])
    corrupted = tmp_path / "corrupted"
    shutil.copytree(run.export, corrupted)
    _corrupt_one_tensor(corrupted)
    version = register_stage(
        corrupted,
        "tiny-model",
        first.tracked.mlflow_run_id,
        {"idempotency_key": "corrupted-copy", "mlflow_run_id": first.tracked.mlflow_run_id},
    )
    heldout = SplitData.load(run.split).split.heldout  # the run's split, as the flow's smoke task reads it
    smoked = smoke_version("tiny-model", version, heldout, 20, run.expected_answers)

    # The folder agrees with itself: the old check alone would have passed this version.
    assert smoked.agreement == 1.0 and smoked.max_probability_diff <= 1e-3
    assert not smoked.passed and any(
        "from the trained model" in f or "with the trained model" in f for f in smoked.failures
    )
    assert client().get_model_version("tiny-model", version).tags["smoke"] == "failed"
    verdict = promotion_stage("tiny-model", version, {"ece": 0.0}, smoked.passed, heldout, params.promote)
    assert not verdict.promote and "smoke test failed" in verdict.reasons
    assert current("tiny-model", CHAMPION) == first.release.version
