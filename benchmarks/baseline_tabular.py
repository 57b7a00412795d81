"""Tabular baselines for record states (JSON objects): what a data scientist would fit on the same rows first.

Each top-level key of the states is a column: a column whose values are all numbers (or null) is numeric, any other
is categorical (nested values as their JSON text). Two models per question:
- `onehot+lr`: numeric columns imputed with the median (plus a missing flag) and standardised, categorical columns
  one-hot (null its own category), then a logistic regression;
- `hist-gbm`: scikit-learn's HistGradientBoostingClassifier on the raw numbers (null as NaN, which it handles) and
  the categorical columns as native categories.

`bench_quality.py` runs both beside TF-IDF + LR on every data set whose states are records.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

TABULAR_MODELS = ("onehot+lr", "hist-gbm")
MISSING = "(missing)"


def record_columns(states: list[dict]) -> tuple[list[str], list[str]]:
    """(numeric, categorical) column names of the states, in the order the keys first appear."""
    keys = list(dict.fromkeys(key for state in states for key in state))

    def is_number(value) -> bool:
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool))

    numeric = [k for k in keys if all(is_number(s.get(k)) for s in states)]
    return numeric, [k for k in keys if k not in numeric]


def record_frame(states: list[dict], numeric: list[str], categorical: list[str]) -> pd.DataFrame:
    """The states as a table: numbers as floats (null as NaN), categories as text (null as its own
    category)."""

    def category(value) -> str:
        if value is None:
            return MISSING
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    def number(value) -> float:
        return float(value) if isinstance(value, int | float) else np.nan  # a held-out row may break the type

    columns = {k: [number(s.get(k)) for s in states] for k in numeric}
    columns |= {k: [category(s.get(k)) for s in states] for k in categorical}
    return pd.DataFrame(columns, columns=[*numeric, *categorical])


def tabular_model(name: str, numeric: list[str], categorical: list[str]) -> Pipeline:
    """An unfitted scikit-learn pipeline from a frame of `record_frame`'s columns to the labels."""
    if name == "onehot+lr":
        columns = ColumnTransformer(
            [
                (
                    "numbers",
                    make_pipeline(SimpleImputer(strategy="median", add_indicator=True), StandardScaler()),
                    numeric,
                ),
                ("categories", OneHotEncoder(handle_unknown="ignore"), categorical),
            ]
        )
        return make_pipeline(columns, LogisticRegression(max_iter=2000))
    if name == "hist-gbm":
        # An unseen category becomes NaN, which the trees send down the missing-value branch.
        codes = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan)
        columns = ColumnTransformer([("numbers", "passthrough", numeric), ("categories", codes, categorical)])
        is_category = [False] * len(numeric) + [True] * len(categorical)
        gbm = HistGradientBoostingClassifier(categorical_features=is_category, random_state=0)
        return make_pipeline(columns, gbm)
    raise ValueError(f"unknown tabular model {name!r} ({', '.join(TABULAR_MODELS)})")


def predict_tabular(name: str, train_states: list[dict], labels: list, held_states: list[dict]):
    """Fit model `name` on the training states and labels; (its classes, their probabilities on the held-out
    states, one row each)."""
    numeric, categorical = record_columns(train_states)
    model = tabular_model(name, numeric, categorical)
    model.fit(record_frame(train_states, numeric, categorical), labels)
    return model.classes_, model.predict_proba(record_frame(held_states, numeric, categorical))
