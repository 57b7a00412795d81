"""The MLflow model of a decision model: a pyfunc whose only artifact is the export folder.

`mlflow models serve -m models:/decision-model@champion --env-manager local` answers `/invocations` with the
same answers as the Decision API (the same parsing, forward pass, temperatures and answer shaping):

    {"dataframe_records": [{"state": "great phone", "questions": {"tone": {"type": "choice", ...}}}]}
    -> {"predictions": [{"answers": {"tone": {"type": "choice", ...}}, "usage": {...}}]}

`questions` (and a `state` that is a JSON object or list) may also be sent as JSON text.

The encoder runs where `decision serve --backend` would run it (`pipeline.families.runtimes.backends`): the
model config's `backend` (logged as `auto`; `mlflow.pyfunc.load_model(uri, model_config={"backend": "torch"})`
overrides it), with the graph the export carries, and torch where no runtime passes. Its `precision` is
`decision serve --precision`'s (`runtimes.precision`; logged as `auto`: the export's int8 encoder where its int8
report passes, else fp32).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd

from pipeline.data.answers import parse_request
from pipeline.data.contract import parse_json_cell, parse_state
from pipeline.families import load_decision_model
from pipeline.families.runtimes.backends import BackendChoice, choose_backend
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE
from pipeline.families.runtimes.precision import served_precision

EXPORT_ARTIFACT = "decision_model"
# What a version is logged with: its encoder's runtime and precision, chosen where it loads.
MODEL_CONFIG = {"backend": "auto", "precision": "auto"}

log = logging.getLogger(__name__)


class DecisionPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the export folder once; answers a batch of requests in shared forward passes."""

    def load_context(self, context) -> None:
        folder = Path(context.artifacts[EXPORT_ARTIFACT])
        config = {**MODEL_CONFIG, **(context.model_config or {})}
        self._model, self.precision = served_precision(
            load_decision_model(folder), config["precision"], folder
        )
        log.info("precision %s: %s", self.precision.name, self.precision.reason)
        if self.precision.name == "int8":  # its encoder is the int8 graph's: no runtime race
            self.backend = BackendChoice("onnxruntime", "int8 (precision)", self._model.encoder)
            return
        wanted = config["backend"]
        self._graphs = tempfile.TemporaryDirectory(
            prefix="decision-pyfunc-"
        )  # a graph exported here, if needed
        self.backend: BackendChoice = choose_backend(
            self._model, wanted, Path(self._graphs.name) / ONNX_FILE, shipped=folder / ONNX_FILE
        )
        if not any(Path(self._graphs.name).iterdir()):
            # Nothing was exported (the export ships its graph, or torch serves): removed now, as a served
            # process is usually stopped by a signal, which leaves a TemporaryDirectory behind.
            self._graphs.cleanup()
        (log.warning if self.backend.fell_back else log.info)(
            "backend %s: %s", self.backend.name, self.backend.reason
        )
        self._model.encoder = self.backend.encoder

    # `pd.DataFrame` is what MLflow hands a signature-checked model, and a hint it infers no schema from: no
    # input conversion of its own (requests are checked by `parse_request`, the Decision API's check), and no
    # warning at class definition that `predict` has no hints (a filter cannot hide that one: MLflow resets
    # the filters there).
    def predict(
        self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        records = model_input.to_dict("records") if hasattr(model_input, "to_dict") else list(model_input)
        parsed = [parse_request(parse_state(r["state"]), parse_json_cell(r["questions"])) for r in records]
        results = self._model.answer(parsed)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return [
            {"answers": r.answers, "usage": {"input_tokens": r.input_tokens, "output_tokens": 0}}
            for r in results
        ]


def decision_signature():
    """Inputs `state` and `questions` (any JSON); outputs `answers` and `usage` per request."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec(AnyType(), "state"), ColSpec(AnyType(), "questions")]),
        outputs=Schema([ColSpec(AnyType(), "answers"), ColSpec(AnyType(), "usage")]),
    )
