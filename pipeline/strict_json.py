"""Results as strict JSON (what `--json` prints and a flow's process hands back): a metric with no value (NaN,
e.g. KL without soft gold) becomes null, and a value JSON has no form for (a path, a time) its text.

    print(to_json(result.to_dict()))
"""

from __future__ import annotations

import json
import math
from typing import Any


def to_json(value: Any) -> str:
    """`value` as one line of strict JSON (`json.loads` of any standard reads it back)."""
    return json.dumps(finite(value), allow_nan=False, default=str)


def finite(value: Any) -> Any:
    """`value` with every float that is no finite number replaced by None, in dicts, lists and tuples too."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
