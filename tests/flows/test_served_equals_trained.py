"""Served equals trained: a version whose exported weights are not what was trained fails the smoke test, is tagged
failed, and never moves `champion`, although it agrees perfectly with its own folder's in-process answers."""

import shutil
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow


def _corrupt_one_tensor(export: Path) -> str:
    """Add noise to the largest decision-head tensor of the export's weight file; the tensor's name."""
    import torch
    from safetensors.torch import load_file, save_file

    path = next(
        export / name for name in ("head.safetensors", "model.safetensors") if (export / name).is_file()
    )
    state = load_file(str(path))
    name = max((k for k, v in state.items() if v.is_floating_point() and not k.startswith("encoder.")),
               key=lambda k: state[k].numel())  # fmt: skip
    tensor = state[name].float()
    noise = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(0)) * (3 * tensor.std() + 0.1)
    state[name] = (tensor + noise).to(state[name].dtype)
    save_file(state, str(path))
    return name


def test_a_corrupted_export_fails_smoke_is_tagged_failed_and_champion_stays(prefect_harness, mlflow_store,
                                                                           tiny_params, tmp_path):  # fmt: skip
    from flows.retrain import retrain
    from pipeline.config import load_params
    from pipeline.mlops.promotion import CHAMPION, current
    from pipeline.mlops.registry import client
    from pipeline.rundir import RunFolder
    from pipeline.stages.promote import promotion_stage, register_stage
    from pipeline.stages.smoke import smoke_version

    first = retrain(str(tiny_params), lock=str(tmp_path / "dvc.lock"))
    assert first["smoke"]["passed"] and first["smoke"]["trained_agreement"] >= 0.995
    assert current("tiny-model", CHAMPION) == first["version"]

    params = load_params(str(tiny_params))
    run = RunFolder(Path(params["retrain"].runs_dir) / first["idempotency_key"][:16])
    corrupted = tmp_path / "corrupted"
    shutil.copytree(run.export, corrupted)
    _corrupt_one_tensor(corrupted)
    version = register_stage(corrupted, "tiny-model", first["mlflow_run_id"],
                             {"idempotency_key": "corrupted-copy", "mlflow_run_id": first["mlflow_run_id"]})  # fmt: skip
    data = yaml.safe_load(tiny_params.read_text())["retrain"]["data"]
    smoked = smoke_version("tiny-model", version, data, 20, params["validate"], run.expected_answers)

    # The folder agrees with itself: the old check alone would have passed this version.
    assert smoked.agreement == 1.0 and smoked.max_probability_diff <= 1e-3
    assert not smoked.passed and any("from the trained model" in f or "with the trained model" in f
                                     for f in smoked.failures)  # fmt: skip
    assert client().get_model_version("tiny-model", version).tags["smoke"] == "failed"
    verdict = promotion_stage("tiny-model", version, {"ece": 0.0}, smoked.passed, data, params["validate"],
                              params["promote"])  # fmt: skip
    assert not verdict["promote"] and "smoke test failed" in verdict["reasons"]
    assert current("tiny-model", CHAMPION) == first["version"]
