"""dvc.yaml and the retrain flow stay in step: the same stage functions, and the flow verifies DVC's
outputs."""

import logging

import yaml

from pipeline.config import load_params


def test_dvc_and_the_flow_validate_with_the_same_function(project_root, monkeypatch, tmp_path):
    import flows.retrain
    import pipeline.stages.dvc as stages
    import pipeline.stages.validate as validate_stage
    from pipeline.data.split import ledger_path
    from pipeline.data.validate import ValidationReport
    from pipeline.stages.validate import ValidateResult

    calls = []

    def spy(data, config, out=None, row_slice=None, split_out=None, report=None):
        calls.append((str(data), ledger_path(data, config)))
        return ValidateResult(ValidationReport(1, 1, 1, {}, {}), {})

    monkeypatch.setattr(validate_stage, "validate_stage", spy)
    monkeypatch.setattr(flows.retrain, "create_table_artifact", lambda *a, **k: None)
    # The task's function alone, outside a flow run: its progress lines go to a plain logger.
    monkeypatch.setattr(flows.retrain, "get_run_logger", lambda: logging.getLogger("test"))
    params = load_params(project_root / "params.yaml")
    stages.run_stage("validate", root=project_root)  # what `dvc repro validate` runs
    flows.retrain.validate.fn(
        params.retrain.data, None, params.validate, str(tmp_path / "report.json"), str(tmp_path / "split.pkl")
    )
    (dvc_data, dvc_ledger), (flow_data, flow_ledger) = calls
    assert dvc_data.endswith(params.retrain.data) and flow_data == params.retrain.data
    # Both add the held-out rows to one ledger, the data set's, which dvc.yaml declares the stage's output.
    assert dvc_ledger == project_root / flow_ledger
    outs = yaml.safe_load((project_root / "dvc.yaml").read_text())["stages"]["validate"]["outs"]
    assert [str(flow_ledger)] == [next(iter(out)) for out in outs]


def test_the_flow_trains_on_exactly_what_dvc_pins(project_root):
    dvc = yaml.safe_load((project_root / "dvc.yaml").read_text())["stages"]
    # An out is a path, or {path: options} (persist, cache).
    outs = {
        out if isinstance(out, str) else next(iter(out))
        for stage in dvc.values()
        for out in stage.get("outs", [])
    }
    retrain = load_params(project_root / "params.yaml").retrain
    assert {retrain.data, retrain.base} <= outs  # so the run's start checks both against dvc.lock
    source = (project_root / "pipeline" / "stages" / "start.py").read_text()
    assert (
        'check_pins({"data": config.data, "base": config.base}, lock, require=not allow_unpinned)' in source
    )
