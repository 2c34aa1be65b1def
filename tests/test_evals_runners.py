"""Protocol runners on real data prefixes with a framework whose ranking is known."""

from __future__ import annotations

import math

import pytest
from conftest import LOCOMO, REALMEM_SOPHIE, need

from dualmem.datasets import load_locomo, load_realmem, load_sample
from dualmem.evals import metrics as m
from dualmem.evals.fakes import TurnLogFramework
from dualmem.evals.runners import RunOptions, realmem_plan, run_locomo, run_realmem, run_rolememo
from dualmem.frameworks.base import MemoryFramework, RetrievedItem
from dualmem.testing import HashEmbeddings


@pytest.fixture(scope="module")
def sophie():
    return load_realmem(need(REALMEM_SOPHIE), limit_sessions=14).items[0]


@pytest.fixture(scope="module")
def conv26():
    return load_locomo(need(LOCOMO), limit_sessions=2, limit_items=1).items[0]


def test_realmem_replay_order_and_metrics(sophie):
    fw = TurnLogFramework.standalone("recent")
    out = run_realmem(sophie, fw, RunOptions(respond=False, embed=HashEmbeddings(64)))
    order = [s.id for s in sophie.dialogue.sessions]
    assert out["records"], "the prefix holds queries"
    assert len(out["records"]) == len(sophie.queries)
    # every session, queries or filler, ends up ingested, in file order
    assert fw.ingested == order
    for (query, ingested), rec in zip(fw.queries, out["records"], strict=True):
        asked_in = order.index(rec["session_id"])
        assert query == rec["query"]
        assert ingested == order[:asked_in]  # memory holds exactly the earlier sessions
        sessions = {r["session"] for r in rec["retrieved"]}
        assert sessions <= set(order[:asked_in]) and rec["session_id"] not in sessions
        assert not rec["errors"]
        # recency ranking: the 20 newest turns, so sessions newest first
        newest = [s.id for s in sophie.dialogue.sessions[:asked_in] for _ in s.turns][::-1][:20]
        assert [r["session"] for r in rec["retrieved"]] == newest
        expected = m.realmem_session_metrics(newest, rec["gold"]["session_ids"])
        assert {k: rec["metrics"][k] for k in expected} == expected
    first = out["records"][0]  # asked in session 3, gold = session 2 -> ranked first
    assert order.index(first["session_id"]) == 3 and first["gold"]["session_ids"] == [order[2]]
    assert first["metrics"]["recall_any@5"] == 1.0 and first["metrics"]["ndcg_any@5"] == 1.0
    assert (
        first["metrics"]["id_context_recall"] == 1.0 and first["metrics"]["id_context_precision"] == 0.5
    )  # top-10 turns: 6 of session 2, 4 of session 1
    assert 0.0 <= first["metrics"]["memory_point_recall"] <= 1.0


def test_realmem_limit_ingests_only_what_the_queries_need(sophie):
    fw = TurnLogFramework.standalone("recent")
    out = run_realmem(sophie, fw, RunOptions(respond=False, limit=3))
    order = [s.id for s in sophie.dialogue.sessions]
    third = sophie.queries[2]
    assert [r["query_id"] for r in out["records"]] == [q.id for q in sophie.queries[:3]]
    assert fw.ingested == order[: order.index(third.session_id)]
    sessions, by_session = realmem_plan(sophie, 3)
    assert sessions[-1].id == third.session_id and sum(len(v) for v in by_session.values()) == 3


class LeakyFramework(TurnLogFramework):
    """Pretends to remember a session it has not seen."""

    def retrieve(self, query: str, k: int = 10, *, context=None) -> list[RetrievedItem]:
        return [RetrievedItem(text="future", kind="fact", score=1.0, source_session="from-the-future")]


def test_realmem_flags_retrieval_from_sessions_not_ingested(sophie):
    out = run_realmem(sophie, LeakyFramework.standalone(), RunOptions(respond=False, limit=1))
    assert "from-the-future" in out["records"][0]["errors"][0]


def test_locomo_ingests_everything_first_and_scores_evidence(conv26):
    fw = TurnLogFramework.standalone("lexical")
    out = run_locomo(conv26, fw, RunOptions(respond=True))
    order = [s.id for s in conv26.dialogue.sessions]
    assert fw.ingested == order and all(ing == order for _, ing in fw.queries)
    assert len(out["records"]) == len(conv26.queries) > 0
    for rec in out["records"]:
        turns = [r["id"] for r in rec["retrieved"]]
        assert rec["scored"] == (rec["category"] in {"1", "2", "3", "4"})
        assert rec["answer"].startswith("From memory")
        if rec["gold"]["turn_ids"]:
            assert rec["metrics"]["evidence_recall@10"] == m.locomo_evidence_recall(turns, rec["gold"]["turn_ids"], 10)
    # the lexical ranker finds "D1:3" for the support-group question (shares its words)
    q0 = next(r for r in out["records"] if r["query_id"] == "conv-26:q0")
    assert q0["gold"]["turn_ids"] == ["D1:3"] and q0["metrics"]["evidence_recall@20"] == 1.0


def test_rolememo_runner_on_the_bundled_sample():
    item = load_sample()

    class GoldEcho(MemoryFramework):
        """Returns the gold facts of the asked query, then noise."""

        name = "gold-echo"
        description = "test"

        def ingest(self, session):
            from dualmem.frameworks.base import IngestReport

            return IngestReport(session_id=session.id)

        def retrieve(self, query, k=10, *, context=None):
            q = next(q for q in item.queries if q.text == query)
            facts = [RetrievedItem(text=f, kind="fact", score=1.0) for f in q.gold.facts]
            expansion = [RetrievedItem(text=q.gold.insight or "", kind="fact", score=1.0, meta={"expanded": True})]
            return facts + expansion

    from dualmem.frameworks.base import FrameworkContext

    out = run_rolememo(
        item, GoldEcho(FrameworkContext(namespace=("p", "u"))), RunOptions(respond=False, embed=HashEmbeddings(64))
    )
    for rec in out["records"]:
        assert rec["metrics"]["fact_recall"] == 1.0
        # the insight only came as grounding expansion, which recall excludes
        assert rec["metrics"]["insight_recall"] == 0.0 or math.isnan(rec["metrics"]["insight_recall"])
    with pytest.raises(ValueError, match="similarity embedder"):
        run_rolememo(item, GoldEcho(FrameworkContext(namespace=("p", "u"))), RunOptions(respond=False))


def test_ingest_log_keeps_the_reason_of_each_failed_chunk(sophie):
    from dualmem.frameworks.base import FrameworkContext, IngestReport

    class HalfFailing(MemoryFramework):
        """Fails the second chunk of every session, with a reason, and one chunk without one."""

        name = "half-failing"
        description = "test"

        def ingest(self, session):
            return IngestReport(
                session_id=session.id,
                items_written=1,
                failed_chunks=[f"{session.id}:1", f"{session.id}:2"],
                meta={"errors": {f"{session.id}:1": "ValidationError: facts"}},
            )

        def retrieve(self, query, k=10, *, context=None):
            return []

    out = run_realmem(
        sophie,
        HalfFailing(FrameworkContext(namespace=("p", "u"))),
        RunOptions(respond=False, embed=HashEmbeddings(64), limit=1),
    )
    first = out["ingest"][0]
    assert first["chunk_errors"] == {
        f"{first['session']}:1": "ValidationError: facts",
        f"{first['session']}:2": "no reason recorded",
    }
