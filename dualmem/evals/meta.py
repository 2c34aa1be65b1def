"""What a run's report says about it (inputs, models, judges, LangSmith, settings, provenance), and which
operational settings a resumed run takes from the environment it resumes in."""

from __future__ import annotations

import os
from typing import Any

from dualmem.config import ENV_ALIASES, ENV_PREFIX, Settings
from dualmem.evals.runspec import OPERATIONAL, RunSpec, provenance
from dualmem.evals.unit import JudgePlan, UnitEnv
from dualmem.models import describe_embeddings
from dualmem.redact import public_url


def run_meta(
    spec: RunSpec, run: dict[str, Any], env: UnitEnv, store: str, settings: Settings, where: str
) -> dict[str, Any]:
    """Return what the report says about the run: inputs, models, judges, LangSmith, settings, segments."""
    plan = env.judges.get(spec.framework)
    langsmith: dict[str, Any] = {"mode": "off (no judges)"}
    if isinstance(plan, JudgePlan):
        langsmith = {
            "mode": "uploaded" if plan.upload else "offline (upload_results=False)",
            "dataset": plan.dataset_name,
            "experiment": plan.experiment_prefix,
        }
    similarity = env.similarity
    similar = (
        describe_embeddings(similarity)
        if similarity is not None and not isinstance(similarity, str)
        else (settings.evaluation.eval_embedder or settings.embedder)
    )
    return {
        "dataset": spec.dataset_kind,
        "path": spec.path,
        "framework": spec.framework,
        "chat_model": spec.chat_model,
        "judge_model": spec.judge_model or "none (pass --judge MODEL)",
        "judge_repetitions": settings.evaluation.judge_repetitions
        if spec.judge_model and spec.dataset_kind == "rolememo"
        else None,
        "similarity_embedder": similar,
        "limit": spec.limit,
        "respond": spec.respond,
        "retrieval_k": settings.tuning.retrieval_k,
        "retrieval_mode": settings.tuning.retrieval_mode,
        "store": public_url(store),
        "workers": where,
        "langsmith": langsmith,
        "run": {
            "fingerprint": run["fingerprint"],
            "created": run["created"],
            "segments": len(run["segments"]),
            "dualmem_revision": run.get("dualmem_revision"),
        },
        "settings": dict(spec.settings),
        "created": run["segments"][-1],
        "reproducibility": provenance(spec, settings, similar),
    }


def operational_here() -> dict[str, Any]:
    """Return the operational settings this process's environment sets (the endpoint, concurrency, the cluster…): a
    resumed run follows them, not the ones it recorded; its store stays the run's."""
    here = Settings().flat()
    return {
        k: here[k]
        for k in sorted(OPERATIONAL - {"store_uri", "store_options"})
        if k in here and os.environ.get(ENV_ALIASES.get(k, ENV_PREFIX + k.upper()))
    }
