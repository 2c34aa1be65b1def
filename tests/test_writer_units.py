"""Writer pieces without a store: chunking, prompt rendering, update validation."""

from __future__ import annotations

from dualmem.memory.chunking import chunk_sessions
from dualmem.memory.plan import plan_update
from dualmem.memory.view import build_view, view_text
from dualmem.models.tokens import count_tokens
from dualmem.prompts.writer import format_chunk, render_writer_messages
from dualmem.schema import Fact, FactOp, Insight, InsightOp, MemoryUpdate, Persona, Session, SourceRef, Turn
from dualmem.testing import HashEmbeddings

NS = ("dr-lee", "user")
PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist", core_values=["empathy"])


def _session(sid: str, sizes: list[int]) -> Session:
    turns = [
        Turn(id=f"{sid}-t{i}", role="user" if i % 2 == 0 else "assistant", text=" ".join(f"w{i}x{j}" for j in range(n)))
        for i, n in enumerate(sizes)
    ]
    return Session(id=sid, time="2024-03-01", turns=turns)


def test_chunks_cut_at_turn_boundaries_within_the_budget():
    sessions = [_session("s1", [20] * 9), _session("s2", [20] * 3)]
    chunks = chunk_sessions(sessions, NS, 100)
    all_ids = [t.id for s in sessions for t in s.turns]
    assert [tid for c in chunks for tid in c["turn_ids"]] == all_ids  # every turn once, in order
    assert len(chunks) > 2
    for c in chunks:
        assert c["tokens"] <= 100
        assert len({tid.split("-")[0] for tid in c["turn_ids"]}) == 1  # never crosses a session
        assert c["session_id"] == c["turn_ids"][0].split("-")[0]
        assert all(f"[{tid}]" in c["text"] for tid in c["turn_ids"])
    # a chunk is full: the next turn of the same session would not have fitted
    first, second = chunks[0], chunks[1]
    assert second["session_id"] == first["session_id"]
    assert (
        first["tokens"] + count_tokens(f"[{second['turn_ids'][0]}] User: " + " ".join(f"w0x{j}" for j in range(20)))
        > 100
    )


def test_an_overlong_turn_is_a_chunk_of_its_own():
    chunks = chunk_sessions([_session("s", [10, 400, 10])], NS, 100)
    assert [c["turn_ids"] for c in chunks] == [["s-t0"], ["s-t1"], ["s-t2"]]
    assert chunks[1]["tokens"] > 100


def test_chunk_ids_are_stable_and_namespaced():
    sessions = [_session("s1", [30] * 6)]
    a, b = chunk_sessions(sessions, NS, 80), chunk_sessions(sessions, NS, 80)
    other = chunk_sessions(sessions, ("someone-else", "user"), 80)
    assert [c["id"] for c in a] == [c["id"] for c in b]
    assert len({c["id"] for c in a}) == len(a)
    assert not {c["id"] for c in a} & {c["id"] for c in other}


def test_render_writer_messages_is_pure_and_carries_persona_view_chunk():
    fact = Fact(id="f-1", namespace=NS, text="works night shifts at a warehouse")
    ins = Insight(id="i-1", namespace=NS, text="I read the tiredness as burnout", grounding=["f-1"])
    view = view_text(build_view([fact], [ins]))
    chunk = format_chunk([Turn(id="t9", role="user", text="I quit my job today")], session_id="s3", time="2024-05-01")
    first = render_writer_messages(PERSONA, view, chunk)
    second = render_writer_messages(PERSONA, view, chunk)
    assert [m.content for m in first] == [m.content for m in second]
    system, user = (str(m.content) for m in first)
    assert "You are Dr. Lee" in system and "clinical psychologist" in system
    assert "F1: works night shifts at a warehouse" in user
    assert "I1: I read the tiredness as burnout [rests on F1]" in user
    assert '[t9] User: "I quit my job today"' in user and "2024-05-01" in user


def _chunk(turn_ids=("t1", "t2")):
    return {
        "id": "c-1",
        "index": 0,
        "session_id": "s1",
        "time": "2024-01-01",
        "turn_ids": list(turn_ids),
        "user_turn_ids": ["t1"],
        "text": "",
        "tokens": 0,
    }


def _view():
    f1 = Fact(
        id="f-old", namespace=NS, text="has a sister named Ana", source=SourceRef(session_id="s0", turn_ids=["t0"])
    )
    f2 = Fact(id="f-two", namespace=NS, text="runs every morning before work")
    i1 = Insight(id="i-old", namespace=NS, text="family is her anchor", grounding=["f-old"])
    return build_view([f1, f2], [i1])


def _plan(update: MemoryUpdate, view=None, threshold=0.92):
    return plan_update(update, view or _view(), _chunk(), NS, embeddings=HashEmbeddings(64), dedup_threshold=threshold)


def test_add_fact_and_insight_citing_it_in_the_same_update():
    update = MemoryUpdate(
        facts=[FactOp(op="ADD", id="N1", text="lost her job at the bakery", turn_ids=["t2", "t99"])],
        insights=[InsightOp(op="ADD", id="M1", text="the job loss shakes her sense of worth", fact_ids=["N1", "F1"])],
    )
    plan = _plan(update)
    assert not plan["rejected"]
    fact, insight = plan["upserts"]
    assert fact["kind"] == "fact" and fact["source"]["turn_ids"] == ["t2"]  # unknown turn ids dropped
    assert fact["source"]["chunk_id"] == "c-1" and fact["event_time"] == "2024-01-01"
    unsourced = _plan(MemoryUpdate(facts=[FactOp(op="ADD", id="N1", text="moved to Porto")]))["upserts"][0]
    assert unsourced["source"]["turn_ids"] == ["t1"] and unsourced["meta"]["turn_ids_inferred"]  # the user's turns
    assert insight["grounding"] == [fact["id"], "f-old"]
    assert _plan(update)["upserts"][0]["id"] == fact["id"]  # deterministic ids


def test_insight_citing_a_missing_fact_is_rejected_and_recorded():
    update = MemoryUpdate(insights=[InsightOp(op="ADD", id="M1", text="she hides her grief", fact_ids=["F7"])])
    plan = _plan(update)
    assert plan["upserts"] == []
    (rejected,) = plan["rejected"]
    assert rejected["stream"] == "insight" and "F7" in rejected["reason"]
    uncited = _plan(MemoryUpdate(insights=[InsightOp(op="ADD", id="M1", text="a thought", fact_ids=[])]))
    assert uncited["upserts"] == [] and len(uncited["rejected"]) == 1


def test_update_rewrites_in_place_and_keeps_the_old_version():
    update = MemoryUpdate(
        facts=[FactOp(op="UPDATE", id="F1", text="has a sister named Ana who lives in Lisbon", turn_ids=["t1"])],
        insights=[InsightOp(op="UPDATE", id="I1", text="family, even far away, is her anchor")],
    )
    plan = _plan(update)
    assert not plan["rejected"]
    by_id = {r["id"]: r for r in plan["upserts"]}
    assert by_id["f-old"]["text"].endswith("Lisbon") and by_id["f-old"]["status"] == "active"
    assert by_id["f-old"]["source"]["turn_ids"] == ["t0", "t1"]
    assert by_id["i-old"]["grounding"] == ["f-old"]  # UPDATE without fact_ids keeps the grounding
    snapshots = [r for r in plan["upserts"] if r["status"] == "superseded"]
    assert {s["meta"]["version_of"] for s in snapshots} == {"f-old", "i-old"}
    assert {s["text"] for s in snapshots} == {"has a sister named Ana", "family is her anchor"}


def test_delete_supersedes_and_unknown_ids_are_rejected():
    update = MemoryUpdate(
        # "I1" as a fact id fails the schema's id pattern; model_construct stands for an answer that slipped past it
        facts=[
            FactOp(op="DELETE", id="F2"),
            FactOp(op="UPDATE", id="F9", text="x"),
            FactOp.model_construct(op="DELETE", id="I1", text="", turn_ids=[]),
        ],
        insights=[InsightOp(op="ADD", id="M1", text="her routine is crumbling", fact_ids=["F2"])],
    )
    plan = _plan(update)
    assert plan["supersede"] == ["f-two"]
    reasons = [r["reason"] for r in plan["rejected"]]
    assert len(reasons) == 3
    assert any("deletes" in r for r in reasons)  # cannot cite a fact deleted by the same update


def test_near_duplicate_fact_is_merged_and_its_label_still_citable():
    update = MemoryUpdate(
        facts=[FactOp(op="ADD", id="N1", text="Runs every morning before work.")],
        insights=[InsightOp(op="ADD", id="M1", text="discipline keeps her steady", fact_ids=["N1"])],
    )
    plan = _plan(update)
    (merged,) = plan["merged"]
    assert merged["into"] == "f-two"
    (insight,) = plan["upserts"]
    assert insight["grounding"] == ["f-two"]
    # with the threshold above any similarity, the same fact is added instead
    assert any(r["kind"] == "fact" for r in _plan(update, threshold=1.01)["upserts"])


def test_commit_order_is_read_from_stored_meta_as_the_writer_stores_it():
    import json
    from datetime import UTC, datetime

    import pyarrow as pa

    from dualmem.memory.view import seqs
    from dualmem.schema import MemoryItem
    from dualmem.stores._rows import item_to_row

    metas = [{"label": "F1", "seq": 12}, {"seq": -3, "note": "ünïcode"}, {}, {"seq": "7"}, {"seq": True}, None]
    now = datetime.now(UTC)
    made = [
        MemoryItem(id=f"m{i}", namespace=list(NS), kind="fact", text="t", meta=m or {}) for i, m in enumerate(metas)
    ]
    rows = [item_to_row(item, [1.0, 0.0], created_at=now, updated_at=now, dims=2)["meta"] for item in made]
    assert [json.loads(r).get("seq") for r in rows[:2]] == [12, -3]  # the stored form the writer reads back
    column = pa.chunked_array([pa.array(rows[:3]), pa.array([*rows[3:], None])])
    assert seqs(column).tolist() == [12, -3, -1, -1, -1, -1, -1]  # no integer seq (or no meta at all): the oldest
