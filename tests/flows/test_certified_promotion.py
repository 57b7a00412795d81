"""Promotion by certified coverage, end to end: two registered versions with the same weights (so the same NLL
and accuracy on every decision) and different certificates. The gate, downloading both and scoring them now,
promotes the one whose certificates automate more of the held-out decisions, and holds the one that automates
less, naming the question and its figures; a first run's version carries its certificates on its tags, its run
and its model card."""

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.families.exporting import CERTIFICATES_FILE

pytestmark = pytest.mark.slow


def with_certificates(export: Path, out: Path, threshold: float | None) -> Path:
    """A copy of `export` whose certificates hold every question to ε 0.9 at `threshold` (None: automate
    nothing)."""
    from pipeline.scoring.certify import read_certificates
    from tests.tiny import certified_copy

    certificates = read_certificates((export / CERTIFICATES_FILE).read_text())
    reason = None if threshold is not None else "test: automates nothing"
    changed = {
        q: replace(c, target_error=0.9, threshold=threshold, reason=reason) for q, c in certificates.items()
    }
    return certified_copy(export, out, changed)


def test_the_version_automating_more_at_the_same_error_is_promoted_and_the_one_automating_less_held(
    prefect_harness, mlflow_store, tiny_params, tmp_path
):
    from flows.retrain import retrain
    from pipeline.config import load_params
    from pipeline.data.split import SplitData
    from pipeline.mlops.promotion import CHAMPION, current, promote_version
    from pipeline.mlops.registry import client
    from pipeline.rundir import RunFolder
    from pipeline.scoring.certified_coverage import certificate_tags
    from pipeline.stages.promote import promotion_stage, register_stage

    first = retrain(str(tiny_params), lock=str(tmp_path / "dvc.lock"))
    certificates = first.calibration.certificates
    # The first version carries its certificates: tags, run metrics and artifacts, the card, the gate's line.
    version = client().get_model_version("tiny-model", first.release.version)
    assert certificates and certificate_tags(certificates).items() <= version.tags.items()
    assert version.tags["certified_questions"].endswith(f"of {len(certificates)}")
    run = client().get_run(first.tracked.mlflow_run_id)
    automation = first.calibration.automation["by_question"]
    for question in certificates:
        assert run.data.metrics[f"coverage_{question}"] == pytest.approx(automation[question]["coverage"])
    artifacts = {
        a.path
        for folder in ("plots", "calibration")
        for a in client().list_artifacts(run.info.run_id, folder)
    }
    assert {"plots/coverage_risk.png", "calibration/certificates.json"} <= artifacts
    assert (
        "## Automation" in version.description and "| question | ε | δ | threshold |" in version.description
    )
    assert any(
        r.startswith(("certified to automate", "its certificates automate nothing"))
        for r in first.release.gate.reasons
    )

    params = load_params(str(tiny_params))
    folder = RunFolder(Path(params.retrain.runs_dir) / first.tracked.key[:16])
    heldout = SplitData.load(folder.split).split.heldout
    versions = {}
    for name, threshold in (("nothing", None), ("everything", 0.0)):
        copy = with_certificates(folder.export, tmp_path / name, threshold)
        tags = {"idempotency_key": f"certified-{name}", "mlflow_run_id": first.tracked.mlflow_run_id}
        versions[name] = register_stage(copy, "tiny-model", first.tracked.mlflow_run_id, tags)
    promote_version("tiny-model", versions["nothing"], force=True, why="test: a champion automating nothing")

    more = promotion_stage("tiny-model", versions["everything"], {"ece": 0.0}, True, heldout, params.promote)
    assert more.promote and current("tiny-model", CHAMPION) == versions["everything"]
    assert (
        more.comparison["nll_gain"] == 0
        and more.comparison["challenger_accuracy"] == more.comparison["champion_accuracy"]
    )
    assert all(row["gain"] == 1.0 for row in more.coverage if row["question"] in certificates)
    assert any(r.startswith("automates more than the champion beyond noise on ") for r in more.reasons)
    tags = client().get_model_version("tiny-model", versions["everything"]).tags
    assert tags["gate"] == "promote" and "coverage 0.000 -> 1.000" in tags["gate_coverage"]
    # The per-question table keeps accuracy and NLL and gains the coverage columns.
    row = next(r for r in more.questions if r["question"] in certificates)
    assert {
        "accuracy_gain",
        "nll_gain",
        "champion_coverage",
        "challenger_coverage",
        "coverage_gain_low",
    } <= set(row)
    assert (row["champion_coverage"], row["challenger_coverage"]) == (0.0, 1.0)
    assert ", coverage 0.000 -> 1.000 (+1.000)" in tags["gate_questions"]

    less = promotion_stage("tiny-model", versions["nothing"], {"ece": 0.0}, True, heldout, params.promote)
    assert not less.promote and current("tiny-model", CHAMPION) == versions["everything"]
    question = sorted(certificates)[0]
    assert any(
        r.startswith(f"automates less than the champion beyond noise on {question}: coverage 1.000 -> 0.000")
        for r in less.reasons
    )
