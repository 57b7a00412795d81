"""The Decision API's request and response bodies (docs/serving.md), as pydantic models: what FastAPI checks a
body against and what the OpenAPI schema shows (the Jev / TypeSafe System One wire format).

`POST /v1/systemone` takes a `DecisionRequest` and answers a `DecisionResponse`; `POST /v1/feedback` takes a
`FeedbackBody`. The questions' criteria are checked per question type by
`pipeline.data.answers.parse_request`, not here.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    WithJsonSchema,
    field_validator,
)

from pipeline.data.contract import QUESTION_TYPES
from pipeline.flywheel.feedback import MAX_ITEMS
from pipeline.scoring.automation import REASONS as AUTOMATE_REASONS

JSONText = str | dict[str, Any] | list[Any] | None
# What a question's fields may hold, as the OpenAPI schema shows it. The shape is checked by `parse_request`,
# which says per question type what its criteria must be (pydantic's check of a union named each branch's type
# instead).
_SHOWN = {
    name: WithJsonSchema(TypeAdapter(shape).json_schema())
    for name, shape in (("instructions", JSONText), ("criteria", dict[str, JSONText] | list[JSONText] | None))
}


class QuestionIn(BaseModel):
    """One question: `criteria` per type (choice: object or list of ids; score: list of levels; noul:
    optional)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal[QUESTION_TYPES]  # type: ignore[valid-type]
    instructions: Annotated[Any, _SHOWN["instructions"]] = None
    criteria: Annotated[Any, _SHOWN["criteria"]] = None


class DecisionRequest(BaseModel):
    """A state (text or any JSON) and named questions about it."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = Field(None, description="default, jev-latest, jev-preview, or a name from /v1/models")
    state: Any = Field(..., description="text or any JSON value")
    questions: dict[str, QuestionIn] = Field(..., min_length=1)

    @field_validator("state")
    @classmethod
    def _state_present(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("state is required (text or any JSON value, not null)")
        return value


JEV_CONFIDENCE = "the Jev confidence (max p - 1/n) / (1 - 1/n) over the n options: 0 uniform, 1 certain"
TOP_PROBABILITY = "max p: the chosen option's probability (not a Jev field)"


AUTOMATE = (
    "whether this answer may be acted on without a person: its question's certificate matches the question as "
    "asked, the confidence reaches its threshold and the state is not novel (docs/serving.md, Automation; not a "
    "Jev field)"
)
AUTOMATE_REASON = "why not, when x_automate is false (not a Jev field)"


class Automated(BaseModel):
    """What every answer carries beyond the Jev fields: whether it is automated, and why not."""

    x_automate: bool = Field(description=AUTOMATE)
    x_automate_reason: Literal[AUTOMATE_REASONS] | None = Field(None, description=AUTOMATE_REASON)  # type: ignore[valid-type]


class ChoiceAnswer(Automated):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(description=JEV_CONFIDENCE)
    x_top_probability: float = Field(description=TOP_PROBABILITY)


class ScoreAnswer(Automated):
    type: Literal["score"]
    score: float
    legend: dict[str, Any]
    probabilities: dict[str, float]
    confidence: float = Field(description=JEV_CONFIDENCE.replace("options", "levels"))
    x_top_probability: float = Field(description=TOP_PROBABILITY.replace("option", "level"))


class NoulAnswer(Automated):
    """P(true), and no confidence (docs/serving.md)."""

    type: Literal["noul"]
    noul: float
    x_confidence: float = Field(description="max(P(true), 1 - P(true)) (not a Jev field)")


class FeedbackItem(BaseModel):
    """The outcome of one logged decision."""

    decision_id: str = Field(min_length=1, description="the decision_id its answer carried")
    gold: dict[str, Any] = Field(min_length=1, description="{question_id: label or {label, probabilities}}")


# One item or a list of them, told apart by the body's JSON kind: a malformed item is then one error at its
# field (loc body.item.gold, or body.items.0.gold), where a plain union reported each branch's failure.
FeedbackBody = Annotated[
    Annotated[FeedbackItem, Tag("item")]
    | Annotated[list[FeedbackItem], Field(min_length=1, max_length=MAX_ITEMS), Tag("items")],
    Discriminator(lambda body: "items" if isinstance(body, list) else "item"),
]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class DecisionResponse(BaseModel):
    model: str
    x_decision_id: str = Field(
        description="this decision's id (also the X-Decision-Id header): what "
        "POST /v1/feedback labels as its decision_id; not a Jev field"
    )
    answers: dict[str, Annotated[ChoiceAnswer | ScoreAnswer | NoulAnswer, Field(discriminator="type")]]
    usage: Usage
