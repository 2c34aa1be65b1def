"""benchmarks/locomo_retrieval.py: the leave-one-conversation-out fine-tuned variant (bundled MiniLM, real LoCoMo)."""

from __future__ import annotations

import importlib.util

from conftest import LOCOMO, REPO, need


def _bench():
    spec = importlib.util.spec_from_file_location("locomo_retrieval", REPO / "benchmarks" / "locomo_retrieval.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_ft_never_trains_on_the_conversation_it_scores(tmp_path, monkeypatch):
    from dualmem.datasets import load_locomo
    from dualmem.models import BUNDLED_EMBEDDER, load_embeddings
    from dualmem.retrieval.cache import EmbeddingCache
    from dualmem.retrieval.query_encoder import QueryEncoderConfig
    from dualmem.retrieval.turns import TurnRankConfig

    bench = _bench()
    items = [it.model_copy(update={"queries": it.queries[:40]}) for it in load_locomo(need(LOCOMO)).items[:2]]
    trained_on: list[set[str]] = []
    real = bench.finetune_query_encoder

    def spy(model, groups, config, progress=None):
        trained_on.append({q for g in groups for q in g.queries})
        return real(model, groups, config, progress=None)

    monkeypatch.setattr(bench, "finetune_query_encoder", spy)
    cache = EmbeddingCache(load_embeddings(BUNDLED_EMBEDDER), tmp_path / "cache")
    per = bench.run_best_finetuned(items, cache, TurnRankConfig(), QueryEncoderConfig(epochs=1, batch_size=32))

    assert list(per) == [it.dialogue.id for it in items]
    for item, seen in zip(items, trained_on, strict=True):
        own = set(bench._dense_questions(item))
        others = {q for it in items if it is not item for q in bench._dense_questions(it)}
        assert own and not own & seen - others  # none of its own questions (unless worded like another's)
        assert others <= seen
        rows = per[item.dialogue.id]
        assert len(rows) == len(bench._questions(item))
        assert all(cat in bench.CATEGORIES and 0.0 <= recall <= 1.0 for cat, recall in rows)
