"""LLM judges as LangSmith-compatible evaluators ``(inputs, outputs, reference_outputs) -> dict``.

Each judge asks any chat model (a ``provider:model`` spec or a model object)
for a JSON verdict through :func:`dualmem.models.structured.invoke_structured`, so a
malformed or out-of-range answer is fed back and retried; a verdict that
still fails is reported as an error (``score`` None, ``extra["errors"]``) and
never as a zero. Role-play judges run ``repetitions`` times (``Settings.evaluation.judge_repetitions``)
and average; the per-repetition scores are kept in ``extra``.

>>> from dualmem.testing import FakeChatModel
>>> judge = roleplay_judges(FakeChatModel(responses=[{"reasoning": "ok", "score": 4}]), repetitions=2)[0]
>>> judge({"question": "q", "persona": "p"}, {"answer": "a"}, {"facts": [], "insight": ""})["score"]
4.0
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, create_model

from dualmem.config import Settings, setting_default
from dualmem.models import load_chat_model
from dualmem.models.structured import invoke_structured
from dualmem.prompts.judges import (
    JUDGE_SYSTEM,
    LOCOMO_CORRECTNESS,
    REALMEM_ANSWER,
    REALMEM_MEMORY,
    ROLEPLAY_DIMENSIONS,
)

Evaluator = Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], dict[str, Any]]
ROLEPLAY_KEYS: tuple[str, ...] = tuple(ROLEPLAY_DIMENSIONS)
REALMEM_MEMORY_TOP_K = 5


def verdict_schema(name: str, low: float, high: float, *, integer: bool = True) -> type[BaseModel]:
    """Return a pydantic verdict model ``{reasoning, score}`` with ``low <= score <= high``."""
    kind: Any = int if integer else float
    return create_model(
        name,
        reasoning=(str, Field(default="", description="one or two sentences of justification")),
        score=(kind, Field(ge=low, le=high, description=f"the score, from {low} to {high}")),
    )


class MemoryVerdict(BaseModel):
    """RealMem memory judge: semantic recall of gold memory and helpfulness of retrieved memory."""

    reasoning: str = Field(default="", description="which gold items are covered, and why it helps or not")
    recall: float = Field(ge=0.0, le=1.0, description="covered ground-truth items / all ground-truth items")
    score: int = Field(ge=0, le=2, description="helpfulness: 0 confusing, 1 somewhat helpful, 2 very helpful")


def _text(value: Any) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return "\n".join(f"- {v}" for v in value) or "(none)"
    return json.dumps(value, ensure_ascii=False, default=str)


def _numbered(texts: Sequence[str]) -> str:
    return "\n\n".join(f"---- idx {i} ----\n{t}" for i, t in enumerate(texts, start=1)) or "(nothing retrieved)"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run_judge(
    model: BaseChatModel,
    prompt: str,
    schema: type[BaseModel],
    *,
    repetitions: int = 1,
    retries: int = setting_default("max_retries"),
    fields: Sequence[str] = ("score",),
    policy: Settings | None = None,
) -> dict[str, Any]:
    """Ask ``model`` ``repetitions`` times; return per-field means, per-repetition values and errors.

    Transient endpoint errors are retried as ``policy`` (settings) says; a call
    that still fails is one repetition's error, like an unparseable verdict.
    """
    messages = [SystemMessage(content=JUDGE_SYSTEM), HumanMessage(content=prompt)]
    reps: list[dict[str, Any]] = []
    errors: list[str] = []
    call_failed = False
    for _ in range(repetitions):
        out = invoke_structured(model, messages, schema, retries=retries, policy=policy)
        if out.value is None:
            what = "judge model call failed" if out.call_failed else "unparseable judge answer"
            errors.append(f"{what} after {out.attempts} attempts: {out.error}")
            reps.append({"error": out.error})
            call_failed = call_failed or out.call_failed
            continue
        reps.append(out.value.model_dump())
    good = [r for r in reps if "error" not in r]
    means = {f: _mean([float(r[f]) for r in good]) for f in fields}
    return {"means": means, "repetitions": reps, "errors": errors, "call_failed": call_failed}


def _result(key: str, score: float | None, verdict: dict[str, Any], field: str = "score") -> dict[str, Any]:
    reps = verdict["repetitions"]
    scores = [r.get(field) for r in reps]
    reasons = [r.get("reasoning", "") for r in reps if "error" not in r]
    comment = f"repetitions={scores}" + (f"; {reasons[0]}" if reasons else "")
    if score is None:
        comment = "error: " + "; ".join(verdict["errors"])
    return {
        "key": key,
        "score": score,
        "comment": comment,
        "extra": {
            "repetitions": scores,
            "errors": list(verdict["errors"]),
            "reasoning": reasons,
            "call_failed": bool(verdict.get("call_failed")),
        },
    }


def _model(model: str | BaseChatModel | None, settings: Settings | None) -> BaseChatModel:
    return load_chat_model(model, settings, role="judge")


def _named(fn: Evaluator, name: str) -> Evaluator:
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def roleplay_judge(
    dimension: str,
    model: str | BaseChatModel | None = None,
    *,
    settings: Settings | None = None,
    repetitions: int | None = None,
) -> Evaluator:
    """Return the 0-5 judge of one role-play dimension (see ``ROLEPLAY_KEYS``), averaged over repetitions."""
    if dimension not in ROLEPLAY_DIMENSIONS:
        raise ValueError(f"unknown role-play dimension {dimension!r}; use one of {', '.join(ROLEPLAY_KEYS)}")
    chat = _model(model, settings)
    retries = (settings or Settings()).tuning.max_retries
    reps = repetitions or (settings or Settings()).evaluation.judge_repetitions
    schema = verdict_schema("RolePlayVerdict", 0, 5)
    template = ROLEPLAY_DIMENSIONS[dimension]

    def evaluate(inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]) -> dict[str, Any]:
        """Score one answer on this dimension (0-5, mean of the repetitions)."""
        prompt = template.format(
            persona=_text(inputs.get("persona")),
            facts=_text((reference_outputs or {}).get("facts")),
            insight=_text((reference_outputs or {}).get("insight")),
            question=inputs.get("question", ""),
            answer=_text((outputs or {}).get("answer")),
        )
        verdict = run_judge(chat, prompt, schema, repetitions=reps, retries=retries, policy=settings)
        return _result(dimension, verdict["means"]["score"], verdict)

    return _named(evaluate, dimension)


def roleplay_judges(
    model: str | BaseChatModel | None = None, *, settings: Settings | None = None, repetitions: int | None = None
) -> list[Evaluator]:
    """Return the four role-play judges: information richness, logic, character consistency, attractiveness."""
    chat = _model(model, settings)
    return [roleplay_judge(d, chat, settings=settings, repetitions=repetitions) for d in ROLEPLAY_KEYS]


def realmem_answer_judge(
    model: str | BaseChatModel | None = None, *, settings: Settings | None = None, repetitions: int = 1
) -> Evaluator:
    """Return RealMem's 0-3 answer judge (memory used correctly, style ignored)."""
    chat = _model(model, settings)
    retries = (settings or Settings()).tuning.max_retries
    schema = verdict_schema("AnswerVerdict", 0, 3)

    def realmem_answer(
        inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]
    ) -> dict[str, Any]:
        """Score how correctly the answer uses the gold memory (0-3)."""
        ref = reference_outputs or {}
        prompt = REALMEM_ANSWER.format(
            question=inputs.get("question", ""),
            memory="\n".join(ref.get("memory_points") or []) or "No specific memory annotation found.",
            reference=ref.get("answer") or "(none)",
            answer=_text((outputs or {}).get("answer")),
        )
        verdict = run_judge(chat, prompt, schema, repetitions=repetitions, retries=retries, policy=settings)
        return _result("realmem_answer", verdict["means"]["score"], verdict)

    return _named(realmem_answer, "realmem_answer")


def realmem_memory_judge(
    model: str | BaseChatModel | None = None,
    *,
    settings: Settings | None = None,
    top_k: int = REALMEM_MEMORY_TOP_K,
    repetitions: int = 1,
) -> Evaluator:
    """Return RealMem's memory judge: ``mem_recall`` (0-1) and ``mem_helpfulness`` (0-2) of the top-k retrieved."""
    chat = _model(model, settings)
    retries = (settings or Settings()).tuning.max_retries

    def realmem_memory(
        inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]
    ) -> dict[str, Any]:
        """Score recall (0-1) and helpfulness (0-2) of the retrieved memory."""
        gold = (reference_outputs or {}).get("memory_points") or []
        if not gold:  # RealMem skips queries without annotated memory
            return {"results": []}
        prompt = REALMEM_MEMORY.format(
            question=inputs.get("question", ""),
            memory="\n".join(gold),
            retrieved=_numbered(list((outputs or {}).get("retrieved") or [])[:top_k]),
        )
        verdict = run_judge(
            chat,
            prompt,
            MemoryVerdict,
            repetitions=repetitions,
            retries=retries,
            fields=("recall", "score"),
            policy=settings,
        )
        return {
            "results": [
                _result("mem_recall", verdict["means"]["recall"], verdict, "recall"),
                _result("mem_helpfulness", verdict["means"]["score"], verdict, "score"),
            ]
        }

    return _named(realmem_memory, "realmem_memory")


def locomo_correctness_judge(
    model: str | BaseChatModel | None = None, *, settings: Settings | None = None, repetitions: int = 1
) -> Evaluator:
    """Return the LoCoMo answer-correctness judge (1 correct, 0 wrong)."""
    chat = _model(model, settings)
    retries = (settings or Settings()).tuning.max_retries
    schema = verdict_schema("CorrectnessVerdict", 0, 1)

    def locomo_correctness(
        inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]
    ) -> dict[str, Any]:
        """Score the answer against the gold answer (1 correct, 0 wrong)."""
        prompt = LOCOMO_CORRECTNESS.format(
            question=inputs.get("question", ""),
            reference=(reference_outputs or {}).get("answer") or "(not answerable from the conversation)",
            answer=_text((outputs or {}).get("answer")),
        )
        verdict = run_judge(chat, prompt, schema, repetitions=repetitions, retries=retries, policy=settings)
        return _result("locomo_correctness", verdict["means"]["score"], verdict)

    return _named(locomo_correctness, "locomo_correctness")


def judges_for(
    dataset_kind: str,
    model: str | BaseChatModel | None = None,
    *,
    settings: Settings | None = None,
    repetitions: int | None = None,
) -> list[Evaluator]:
    """Return the judges of a protocol: rolememo (4 dimensions), realmem (answer, memory), locomo (correctness)."""
    chat = _model(model, settings)
    if dataset_kind == "rolememo":
        return roleplay_judges(chat, settings=settings, repetitions=repetitions)
    if dataset_kind == "realmem":
        return [realmem_answer_judge(chat, settings=settings), realmem_memory_judge(chat, settings=settings)]
    if dataset_kind == "locomo":
        return [locomo_correctness_judge(chat, settings=settings)]
    raise ValueError(f"unknown dataset kind {dataset_kind!r}; use rolememo, realmem or locomo")


def flatten_result(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return the single results of an evaluator's answer (one dict or ``{"results": [...]}``)."""
    if "results" in result:
        return [dict(r) for r in result["results"]]
    return [dict(result)]


def apply_judges(
    judges: Sequence[Evaluator], inputs: dict[str, Any], outputs: dict[str, Any], reference_outputs: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Run ``judges`` on one example; return ``{key: result}`` and the error messages to record."""
    scores: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for judge in judges:
        try:
            results = flatten_result(judge(inputs, outputs, reference_outputs))
        except Exception as exc:  # noqa: BLE001 - a failing judge is recorded, the run goes on
            name = getattr(judge, "__name__", "judge")
            scores[name] = {"key": name, "score": None, "comment": f"error: {exc}", "extra": {"errors": [str(exc)]}}
            errors.append(f"judge {name} raised {type(exc).__name__}: {exc}")
            continue
        for res in results:
            scores[res["key"]] = res
            errors.extend(f"judge {res['key']}: {e}" for e in (res.get("extra") or {}).get("errors", []))
    return scores, errors
