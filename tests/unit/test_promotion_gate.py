"""The gate holds a version trained with --allow-unpinned whatever its figures, and still gives every reason."""

from pipeline.config import PromoteConfig
from pipeline.mlops.promotion import UNPINNED_REASON, gate

GOOD = {"accuracy": 0.9, "ece": 0.01}


def test_a_version_trained_on_unpinned_inputs_is_held_however_good():
    assert gate(GOOD, {"accuracy": 0.5, "ece": 0.2}, True, PromoteConfig()).promote
    held = gate(GOOD, {"accuracy": 0.5, "ece": 0.2}, True, PromoteConfig(), unpinned=True)
    assert not held.promote and held.reasons[0] == UNPINNED_REASON
    assert "--force" in UNPINNED_REASON and any(r.startswith("accuracy 0.9000 >=") for r in held.reasons)
    assert not gate(
        GOOD, None, True, PromoteConfig(), [], unpinned=True
    ).promote  # not even the first version
