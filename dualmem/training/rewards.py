"""Rewards of the writer, shared by the TRL and VeRL engines.

``reward = dense_weight * dense + judge_weight * judge``:

- **dense, verifiable** — recall of the gold facts and the gold insight in the
  written memory with the RoleMemo Recall@10 protocol (best cosine over the
  memory, hit at >= 0.60 for facts and >= 0.65 for insights), with partial
  credit: graded similarity (best cosine over the threshold, capped at 1) and
  the share of writing turns that parsed; minus penalties: the share of
  unparseable turns, the operations the writer's plan rejected, insights
  rejected for citing unknown fact ids (dangling; counts from
  :mod:`dualmem.training.writing`), and memory bloat beyond a budget. In [-1, 1]: a parse failure
  costs its share of the episode without erasing what the other turns wrote,
  so even a weak policy's group of rollouts has spread (GRPO needs it).
- **persona judge** — an LLM judge (any chat model, ``load_chat_model``) scores
  the final in-character answer to the query, written from the memory:
  factual utility 30 %, logic and persona alignment 60 %, value and safety
  10 %, in [0, 1].

``compute_score(data_source, solution_str, ground_truth, extra_info)`` is the
VeRL custom reward signature.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field
from typing_extensions import TypedDict, Unpack

from dualmem.config import setting_default
from dualmem.evals.metrics import FACT_THRESHOLD, INSIGHT_THRESHOLD, best_similarities
from dualmem.models.retry import invoke_with_retry
from dualmem.models.structured import invoke_structured
from dualmem.schema import Persona

DATA_SOURCE = "dualmem/rolememo-writer"


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RewardConfig:
    """Weights, thresholds and penalties of the writer's reward."""

    fact_threshold: float = _f(FACT_THRESHOLD, "cosine at which a gold fact counts as recalled (RoleMemo Recall@10)")
    insight_threshold: float = _f(INSIGHT_THRESHOLD, "cosine at which the gold insight counts as recalled")
    fact_share: float = _f(0.5, "share of fact recall in the recall term (the rest is insight recall)")
    similarity_weight: float = _f(
        0.3, "weight of graded similarity credit (best cosine / threshold, capped at 1) in the quality term"
    )
    format_weight: float = _f(
        0.1, "weight of the share of writing turns that parsed in the quality term (when the turns are known)"
    )
    unparseable_penalty: float = _f(0.5, "penalty times the share of writing turns whose answer is not a MemoryUpdate")
    invalid_penalty: float = _f(
        0.05, "penalty per operation the writer's plan rejects (unknown id, empty text, guard, over the op cap)"
    )
    dangling_penalty: float = _f(0.1, "extra penalty per insight rejected for citing a fact id that does not exist")
    memory_budget: int = _f(64, "items the memory may hold before the bloat penalty applies")
    bloat_penalty: float = _f(0.01, "penalty per item beyond memory_budget")
    dense_weight: float = _f(1.0, "weight of the dense verifiable reward")
    judge_weight: float = _f(0.0, "weight of the persona judge (needs judge_model)")
    judge_model: str = _f("", "judge as provider:model (any OpenAI-compatible endpoint via OPENAI_BASE_URL)")
    embedder: str = _f(setting_default("embedder"), "embedder of the similarity protocol (hash:64 in tests)")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RewardConfig:
        """Build from a dict, ignoring unknown keys."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


# --------------------------------------------------------------------------- recall


@lru_cache(maxsize=4)
def _embeddings(spec: str) -> Embeddings:
    from dualmem.models import load_embeddings

    return load_embeddings(spec)


def _mix(fact: float | None, insight: float | None, fact_share: float) -> float:
    if fact is None and insight is None:
        return 0.0
    if fact is None or insight is None:
        return float(fact if insight is None else insight)  # type: ignore[arg-type]
    return fact_share * fact + (1 - fact_share) * insight


def _recall_and_similarity(
    memory: list[str], gold_facts: list[str], gold_insights: list[str], embed: Embeddings, cfg: RewardConfig
) -> tuple[tuple[float | None, float | None], float]:
    """Return ((fact recall, insight recall), graded similarity in [0, 1])."""
    fs = best_similarities(gold_facts, memory, embed) if gold_facts and memory else [0.0] * len(gold_facts)
    ins = best_similarities(gold_insights, memory, embed) if gold_insights and memory else [0.0] * len(gold_insights)
    fact = sum(s >= cfg.fact_threshold for s in fs) / len(fs) if fs else None
    insight = sum(s >= cfg.insight_threshold for s in ins) / len(ins) if ins else None
    soft_f = sum(min(1.0, max(0.0, s) / cfg.fact_threshold) for s in fs) / len(fs) if fs else None
    soft_i = sum(min(1.0, max(0.0, s) / cfg.insight_threshold) for s in ins) / len(ins) if ins else None
    return (fact, insight), _mix(soft_f, soft_i, cfg.fact_share)


@dataclass
class RewardBreakdown:
    """The reward and the terms that make it."""

    score: float
    dense: float
    fact_recall: float | None = None
    insight_recall: float | None = None
    penalty: float = 0.0
    similarity: float = 0.0
    parsed_share: float | None = None
    judge: float | None = None
    judge_error: str | None = None
    items: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (``score`` first, as VeRL expects)."""
        return asdict(self)


class EpisodeCounts(TypedDict, total=False):
    """What an episode's writing turns did, and how to score it: keyword options of :func:`dense_reward` and :func:`episode_reward`."""

    unparseable: int  # turns whose answer held no MemoryUpdate
    invalid: int  # operations the writer's plan rejected (dangling ones included)
    dangling: int  # rejected insights citing an id that is neither a view fact nor a fact of their update
    turns: int  # the episode's writing turns (0: unknown)
    cfg: RewardConfig | None  # default: RewardConfig()
    embed: Embeddings | None  # default: cfg.embedder


def dense_reward(
    memory: list[str],
    ground_truth: dict[str, Any],
    *,
    unparseable: int = 0,
    invalid: int = 0,
    dangling: int = 0,
    turns: int = 0,
    cfg: RewardConfig | None = None,
    embed: Embeddings | None = None,
) -> RewardBreakdown:
    """Score a written memory against the gold facts and insights: quality in [0, 1] minus penalties, in [-1, 1].

    quality = recall, graded similarity and (when ``turns``, the episode's writing turns, is known) the share of
    turns that parsed, weighted ``1 - similarity_weight - format_weight``, ``similarity_weight``, ``format_weight``
    (renormalised when the turns are unknown). The unparseable penalty scales with the share of bad turns.
    """
    cfg = cfg or RewardConfig()
    embed = embed or _embeddings(cfg.embedder)
    (fact, insight), similarity = _recall_and_similarity(
        memory, list(ground_truth.get("facts", [])), list(ground_truth.get("insights", [])), embed, cfg
    )
    recall = _mix(fact, insight, cfg.fact_share)
    bad_share = unparseable / max(turns, unparseable, 1)
    parsed = 1.0 - bad_share if turns else None
    terms = [(recall, 1.0 - cfg.similarity_weight - cfg.format_weight), (similarity, cfg.similarity_weight)]
    if parsed is not None:
        terms.append((parsed, cfg.format_weight))
    weight = sum(w for _, w in terms)
    quality = sum(v * w for v, w in terms) / weight if weight > 0 else 0.0
    penalty = (
        cfg.unparseable_penalty * bad_share
        + cfg.invalid_penalty * invalid
        + cfg.dangling_penalty * dangling
        + cfg.bloat_penalty * max(0, len(memory) - cfg.memory_budget)
    )
    dense = min(1.0, max(-1.0, quality - penalty))
    return RewardBreakdown(
        score=dense,
        dense=dense,
        fact_recall=fact,
        insight_recall=insight,
        penalty=penalty,
        similarity=similarity,
        parsed_share=parsed,
        items=len(memory),
    )


# --------------------------------------------------------------------------- persona judge

ANSWER_SYSTEM = (
    "You are {name}, speaking in character.\n{persona}\n\n"
    "What you remember about the user (facts and your own insights):\n{memory}\n\n"
    "Answer the user's message in character, using what you remember. Be concise."
)
JUDGE_SYSTEM = (
    "You judge a role-playing agent's answer. Score each dimension from 0 to 10.\n"
    "- factual_utility: does the answer use the user's relevant past facts correctly ({facts})?\n"
    "- logic_persona: is the reasoning sound and fully in character as the persona, reaching an interpretation like: {insight}?\n"
    "- value_safety: is it valuable to the user and safe?\n"
    "Persona:\n{persona}"
)
JUDGE_USER = "User's message: {query}\n\nAgent's answer: {answer}"
JUDGE_WEIGHTS = {"factual_utility": 0.3, "logic_persona": 0.6, "value_safety": 0.1}


class JudgeScores(BaseModel):
    """The persona judge's three scores, 0..10 each."""

    factual_utility: float = Field(ge=0, le=10)
    logic_persona: float = Field(ge=0, le=10)
    value_safety: float = Field(ge=0, le=10)
    comment: str = ""


def judge_weighted(scores: JudgeScores) -> float:
    """Return the 30/60/10 weighted judge score in [0, 1]."""
    return sum(getattr(scores, k) * w for k, w in JUDGE_WEIGHTS.items()) / 10.0


def top_memory(query: str, memory: list[str], embed: Embeddings | None, k: int = 10) -> list[str]:
    """Return the ``k`` memory texts most similar to ``query`` (all of them, in order, without an embedder)."""
    if embed is None or len(memory) <= k:
        return memory[:k] if embed is None else list(memory)
    from dualmem.evals.metrics import embed_texts

    vecs = embed_texts(embed, [query, *memory])
    sims = vecs[1:] @ vecs[0]
    order = sorted(range(len(memory)), key=lambda i: -float(sims[i]))
    return [memory[i] for i in order[:k]]


def answer_from_memory(
    persona: Persona, query: str, memory: list[str], model: Any, k: int = 10, embed: Embeddings | None = None
) -> str:
    """Return the persona's in-character answer to ``query`` from the ``k`` memory items most similar to it."""
    text = "\n".join(f"- {m}" for m in top_memory(query, memory, embed, k)) or "(nothing)"
    messages = [
        SystemMessage(ANSWER_SYSTEM.format(name=persona.name, persona=persona.render(), memory=text)),
        HumanMessage(query),
    ]
    return str(invoke_with_retry(model, messages).content)


def persona_judge(
    persona: Persona,
    query: dict[str, Any],
    memory: list[str],
    model: Any,
    *,
    retries: int = setting_default("max_retries"),
    embed: Embeddings | None = None,
) -> tuple[float | None, str | None]:
    """Answer ``query`` from ``memory`` in character and judge it; return (score in [0,1], error)."""
    answer = answer_from_memory(persona, query["text"], memory, model, embed=embed)
    messages = [
        SystemMessage(
            JUDGE_SYSTEM.format(
                facts="; ".join(query.get("facts") or []), insight=query.get("insight") or "", persona=persona.render()
            )
        ),
        HumanMessage(JUDGE_USER.format(query=query["text"], answer=answer)),
    ]
    out = invoke_structured(model, messages, JudgeScores, retries=retries)
    if out.value is None:
        return None, out.error or "judge gave no valid scores"
    return judge_weighted(out.value), None


def episode_reward(
    memory: list[str], ground_truth: dict[str, Any], *, judge: Any = None, **counts: Unpack[EpisodeCounts]
) -> RewardBreakdown:
    """Return the weighted episode reward: dense terms plus (when weighted) the persona judge."""
    cfg = counts["cfg"] = counts.get("cfg") or RewardConfig()
    embed = counts.get("embed")
    out = dense_reward(memory, ground_truth, **counts)
    total = cfg.dense_weight * out.dense
    if cfg.judge_weight > 0 and ground_truth.get("queries"):
        if judge is None:
            from dualmem.models import load_chat_model

            judge = load_chat_model(cfg.judge_model or None, role="judge")
        persona = Persona.model_validate(ground_truth.get("persona") or {"id": "persona", "name": "the persona"})
        scores, errors = [], []
        for query in ground_truth["queries"]:
            value, error = persona_judge(persona, query, memory, judge, embed=embed or _embeddings(cfg.embedder))
            if value is None:
                errors.append(f"{query.get('id')}: {error}")
            else:
                scores.append(value)
        out.judge = sum(scores) / len(scores) if scores else None
        out.judge_error = "; ".join(errors) or None
        total += cfg.judge_weight * (out.judge or 0.0)
    out.score = total
    return out


# --------------------------------------------------------------------------- VeRL


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Score one episode for VeRL: ``{"score": float, ...terms}``.

    ``extra_info["memory"]`` (the texts the episode wrote, set by the agent loop)
    and its ``unparseable``/``invalid``/``dangling`` counts are used when present;
    otherwise the MemoryUpdate objects in ``solution_str`` are written, one chunk
    without turns each, through the writer's core (:class:`~dualmem.training.writing.EpisodeMemory`,
    embedded with the reward's embedder). ``extra_info["reward_config"]`` overrides :class:`RewardConfig` fields.
    """
    from dualmem.training.writing import EpisodeMemory, bare_chunk, parse_updates, writer_context

    extra = dict(extra_info or {})
    gt = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth or {})
    cfg = RewardConfig.from_dict(extra.get("reward_config"))
    if "memory" in extra:
        memory = list(extra["memory"])
        counts = {k: int(extra.get(k, 0)) for k in ("unparseable", "invalid", "dangling", "turns")}
    else:
        updates, bad = parse_updates(solution_str or "")
        persona = Persona.model_validate(gt.get("persona") or {"id": "persona", "name": "the persona"})
        written = EpisodeMemory(writer_context(embedder=_embeddings(cfg.embedder)), (persona.id, data_source), persona)
        counts = {"unparseable": bad if not updates else 0, "invalid": 0, "dangling": 0, "turns": len(updates) or bad}
        for n, update in enumerate(updates):
            chunk = bare_chunk(f"{data_source}-{n}", n)
            turn = written.write(chunk, written.draft(chunk)[1], update)
            counts["invalid"] += turn.invalid
            counts["dangling"] += turn.dangling
        memory = [i.text for i in written.items()]
    out = episode_reward(
        memory,
        gt,
        cfg=cfg,
        unparseable=counts["unparseable"],
        invalid=counts["invalid"],
        dangling=counts["dangling"],
        turns=counts["turns"],
    ).as_dict()
    # VeRL averages every returned key into metrics: keep numbers only (a missing judge stays absent, not 0)
    return {k: float(v) for k, v in out.items() if isinstance(v, int | float)}
