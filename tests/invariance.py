"""What the invariance tests of both families ask (tests/model/test_joint_isolated.py in process,
tests/api/test_conformance.py over HTTP): the questions, and how two answers are compared."""

import numpy as np

TOL = 1e-4  # docs/serving.md: an answer moves with nothing but its question and the state, beyond float rounding
TONE = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"negative": None, "neutral": "neither", "positive": None},
}
INTENSITY = {"type": "score", "instructions": "How intense?", "criteria": ["none", "mild", "strong"]}
POSITIVE = {"type": "noul", "instructions": "The text is positive.", "criteria": None}
OTHERS = {
    "topic": {"type": "choice", "instructions": "What is it about?", "criteria": ["food", "film", "phone"]},
    "sarcastic": {"type": "noul", "instructions": "The text is sarcastic.", "criteria": None},
    "length": {"type": "score", "instructions": "How long?", "criteria": ["short", "long"]},
}
STATE = "the order came late but the food was great"


def probabilities(answer: dict) -> np.ndarray:
    """A wire answer's probabilities (noul: P(true))."""
    if answer["type"] == "noul":
        return np.array([answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def assert_same(a: dict, b: dict) -> None:
    np.testing.assert_allclose(probabilities(a), probabilities(b), atol=TOL)
