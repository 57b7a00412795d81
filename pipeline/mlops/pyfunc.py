"""The MLflow model of a decision model: a pyfunc whose only artifact is the export folder.

`mlflow models serve -m models:/decision-model@champion --env-manager local` answers `/invocations` with the
same answers as the Decision API (the same parsing, forward pass, temperatures and answer shaping):

    {"dataframe_records": [{"state": "great phone", "questions": {"tone": {"type": "choice", ...}}}]}
    -> {"predictions": [{"answers": {"tone": {"type": "choice", ...}}, "usage": {...}}]}

`questions` (and a `state` that is a JSON object or list) may also be sent as JSON text.
"""

from __future__ import annotations

import warnings
from typing import Any

import mlflow.pyfunc

from pipeline.data.answers import parse_request
from pipeline.data.contract import parse_json_cell, parse_state
from pipeline.families import load_decision_model

EXPORT_ARTIFACT = "decision_model"


# MLflow warns at class definition that `predict` has no type hints; hints would switch on its own input
# conversion, and requests are validated by `parse_request` (the Decision API's check) instead.
warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method", category=UserWarning)


class DecisionPyfunc(mlflow.pyfunc.PythonModel):
    """Loads the export folder once; answers a batch of requests in shared forward passes."""

    def load_context(self, context) -> None:
        self._model = load_decision_model(context.artifacts[EXPORT_ARTIFACT])

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
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
