"""InCharacter's interview-based personality test of a role-play agent: interview, then expert rating per dimension.

:func:`interview` asks the agent (any framework's ``respond``: its persona,
its memory and the shared reader) every item of a questionnaire, each as a
fresh one-question conversation. :func:`assess` has the judge model rate
each dimension from batches of 3-4 of those exchanges (names hidden), with
the dimension's description: a 1-5 score for BFI, the percentage of the
first pole for 16Personalities; the dimension's score is the mean over its
batches. Every answer and every rating is journaled once, so a resumed test
asks nothing twice; a rating that stays malformed after repair is recorded
as an error and left out of the mean, never counted as a neutral score.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, create_model, model_validator

from dualmem.config import setting_default
from dualmem.evals.incharacter import Questionnaire, split_batches
from dualmem.evals.journal import PersonaJournal
from dualmem.frameworks.base import MemoryFramework
from dualmem.models.structured import invoke_structured
from dualmem.prompts.personality import ASSESS_BACKGROUND, CONVERSATIONS, EXCHANGE, ONE_SCORE_OUTPUT, TWO_SCORE_OUTPUT

PARTICIPANT = "<the participant>"
Tick = Callable[[], None]


class _Poles(BaseModel):
    """Two percentages that must sum to 100."""

    @model_validator(mode="after")
    def _sums_to_100(self) -> _Poles:
        total = sum(float(v) for v in self.model_dump().values())
        if abs(total - 100.0) > 1.0:
            raise ValueError(f"the two percentages sum to {total:g}, not 100")
        return self


def assessment_schema(questionnaire: Questionnaire, dimension: str) -> type[BaseModel]:
    """Return the structured answer of one rating: ``{analysis, result}`` (a score, or the two poles' percentages)."""
    if questionnaire.two_poles:
        first, second = dimension.split("/")
        poles = create_model(
            f"Poles{first}{second}",
            __base__=_Poles,
            **{first: (float, Field(ge=0, le=100)), second: (float, Field(ge=0, le=100))},
        )  # type: ignore[call-overload]
        return create_model(f"Assessment{first}{second}", analysis=(str, Field(default="")), result=(poles, ...))
    low, high = questionnaire.scale.low, questionnaire.scale.high
    return create_model(
        f"Assessment{dimension}",
        analysis=(str, Field(default="")),
        result=(float, Field(ge=low, le=high, description=f"the score, {low:g}-{high:g}")),
    )


def anonymise(text: str, names: tuple[str, ...]) -> str:
    """Replace the persona's names (longest first, whole words) by ``<the participant>``."""
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(name)}\b", PARTICIPANT, text)
    return text


def rating_messages(questionnaire: Questionnaire, dimension: str, exchanges: list[tuple[str, str]]) -> list[Any]:
    """Return the judge's messages for one batch of (question, answer) exchanges on ``dimension``."""
    name = "16Personalities (highly similar to MBTI)" if questionnaire.two_poles else questionnaire.name
    system = ASSESS_BACKGROUND.format(
        questionnaire=name, dimension=dimension, description=questionnaire.descriptions.get(dimension, "")
    )
    if questionnaire.two_poles:
        first, second = dimension.split("/")
        system += TWO_SCORE_OUTPUT.format(first=first, second=second)
    else:
        scale = questionnaire.scale
        system += ONE_SCORE_OUTPUT.format(
            dimension=dimension, low=f"{scale.low:g}", high=f"{scale.high:g}", neutral=f"{scale.midpoint:g}"
        )
    body = "\n".join(EXCHANGE.format(index=i, question=q, answer=a) for i, (q, a) in enumerate(exchanges, start=1))
    return [SystemMessage(content=system), HumanMessage(content=CONVERSATIONS.format(conversations=body))]


def interview(
    framework: MemoryFramework,
    questionnaire: Questionnaire,
    condition: str,
    journal: PersonaJournal | None = None,
    *,
    k: int = 10,
    on_answer: Tick | None = None,
) -> dict[str, str]:
    """Return ``{item id: answer}``: each item asked once as its own conversation (recorded answers are reused)."""
    answers: dict[str, str] = {}
    for item in questionnaire.items:
        key = f"{condition}/{questionnaire.name}/{item.id}"
        done = journal.get("interview", key) if journal is not None else None
        if done is None:
            done = {"question": item.question, "answer": framework.respond(item.question, k)}
            if journal is not None:
                journal.put("interview", key, done)
        answers[item.id] = str(done["answer"])
        if on_answer:
            on_answer()
    return answers


def assess(
    judge: BaseChatModel,
    questionnaire: Questionnaire,
    answers: Mapping[str, str],
    condition: str,
    journal: PersonaJournal | None = None,
    *,
    names: tuple[str, ...] = (),
    retries: int = setting_default("max_retries"),
    on_rating: Tick | None = None,
) -> dict[str, dict[str, Any]]:
    """Return ``{dimension: {score, type, batches, errors}}`` rated by ``judge`` from the interview ``answers``."""
    out: dict[str, dict[str, Any]] = {}
    for dimension in questionnaire.dimensions:
        batches = []
        for index, batch in enumerate(split_batches(questionnaire.items_of(dimension))):
            key = f"{condition}/{questionnaire.name}/{dimension}/{index}"
            done = journal.get("assessment", key) if journal is not None else None
            if done is None:
                done = _rate(
                    judge,
                    questionnaire,
                    dimension,
                    [(i.question, anonymise(answers[i.id], names)) for i in batch],
                    retries,
                )
                done["items"] = [i.id for i in batch]
                if journal is not None:
                    journal.put("assessment", key, done)
            batches.append(done)
            if on_rating:
                on_rating()
        scores = [b["score"] for b in batches if b["score"] is not None]
        score = sum(scores) / len(scores) if scores else None
        out[dimension] = {
            "score": score,
            "type": None if score is None else questionnaire.scale.type_of(score),
            "batches": batches,
            "errors": [b["error"] for b in batches if b.get("error")],
        }
    return out


def _rate(
    judge: BaseChatModel, questionnaire: Questionnaire, dimension: str, exchanges: list[tuple[str, str]], retries: int
) -> dict[str, Any]:
    result = invoke_structured(
        judge,
        rating_messages(questionnaire, dimension, exchanges),
        assessment_schema(questionnaire, dimension),
        retries=retries,
    )
    if result.value is None:
        return {
            "score": None,
            "analysis": "",
            "error": f"unusable rating after {result.attempts} attempts: {result.error}",
        }
    value = result.value.model_dump()
    raw = value["result"]
    score = float(raw[dimension.split("/")[0]]) if questionnaire.two_poles else float(raw)
    return {"score": score, "analysis": value.get("analysis", ""), "raw": raw}
