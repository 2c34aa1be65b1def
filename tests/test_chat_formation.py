"""Background formation: debounce (many quick messages → one writer call per chunk), chunking while chatting, sealing."""

from __future__ import annotations

import re
import time

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from dualmem.chat import DualMemMiddleware, FormationExecutor
from dualmem.chat.formation import run_formation
from dualmem.chat.pending import FormationRequest, PendingThread, new_turn
from dualmem.chat.sealing import plan_chunks
from dualmem.schema import Persona
from dualmem.stores import LanceDBStore
from dualmem.testing import FakeChatModel

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
NS = (PERSONA.id, "alice")
MESSAGES = [
    f"On day {i} I walked the dog along the canal and thought about message number {i} for a while." for i in range(10)
]


def counting_writer() -> FakeChatModel:
    """A writer that writes one fact per chunk, naming the chunk's user turns."""

    def answer(messages, tool=None):
        users = re.findall(r"^\[(t-[0-9a-f]+)\] User:", str(messages[-1].content), re.M)
        return {
            "facts": [{"op": "ADD", "id": "N1", "text": f"the user spoke in {' '.join(users)}", "turn_ids": users}],
            "insights": [],
        }

    return FakeChatModel(responses=[answer], cycle=True)


def chat(settings, store, formation, writer, messages):
    agent = create_agent(
        FakeChatModel(responses=["Tell me more."], cycle=True),
        [],
        store=store,
        checkpointer=InMemorySaver(),
        middleware=[DualMemMiddleware(PERSONA, settings=settings, writer_model=writer, formation=formation)],
    )
    sent = []
    for text in messages:
        agent.invoke(
            {"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": "th"}}, context={"user_id": "alice"}
        )
        sent.append(time.monotonic())
    return sent


def writer_calls(writer: FakeChatModel) -> int:
    return sum(1 for call in writer.calls if "CONVERSATION CHUNK" in str(call[-1].content))


def test_many_quick_messages_make_one_writer_call_once_the_thread_is_quiet(tmp_settings):
    store = LanceDBStore.from_settings(tmp_settings)
    settings = tmp_settings.replace(formation_idle_s=3.0, chunk_tokens=4096)
    writer = counting_writer()
    with FormationExecutor() as formation:
        sent = chat(settings, store, formation, writer, MESSAGES[:6])
        assert sent[-1] - sent[0] < 3.0, "the messages came quicker than the quiet time"
        assert writer_calls(writer) == 0  # every message postponed the write
        assert formation.wait(timeout=60)
        quiet_for = time.monotonic() - sent[-1]
    assert writer_calls(writer) == 1 and quiet_for >= 3.0
    (formed,) = formation.formed
    (row,) = formed.rows
    assert row["status"] == "applied" and len(row["turn_ids"]) == 12 and formed.pending_turns == 0
    assert PendingThread(store, NS, "th").read().turns == []


def test_a_long_chat_is_written_a_full_chunk_at_a_time_while_it_goes_on(tmp_settings):
    store = LanceDBStore.from_settings(tmp_settings)
    # No merging: the fake writer's facts differ only in random turn ids, which the 64-bucket hash embedder can put
    # above the default dedup cosine (0.92) by chance; this test counts one stored fact per chunk.
    settings = tmp_settings.replace(formation_idle_s=3.0, chunk_tokens=150, dedup_threshold=1.01)
    writer = counting_writer()
    written_at: list[float] = []
    with FormationExecutor(on_formed=lambda f: written_at.append(time.monotonic()) if f.rows else None) as formation:
        sent = chat(settings, store, formation, writer, MESSAGES)
        assert formation.wait(timeout=120)
    rows = [r for f in formation.formed for r in f.rows]
    assert all(r["status"] == "applied" for r in rows) and len(rows) >= 3
    assert writer_calls(writer) == len(rows)  # one writer call per chunk
    turns = [t for r in rows for t in r["turn_ids"]]
    assert len(turns) == len(set(turns)) == 2 * len(MESSAGES)  # every turn in exactly one chunk
    assert written_at[0] < sent[-1] + 3.0, "full chunks did not wait for the quiet time"
    facts = store.dual.list(NS, kind="fact")
    users = [t for f in facts for t in f.source.turn_ids]
    assert len(facts) == len(rows) and len(users) == len(set(users)) == len(MESSAGES)


def test_a_sealed_chunk_keeps_its_turns_when_more_arrive(tmp_settings):
    """Exactly once: the turns given to a chunk stay that chunk (same id) whatever is appended later."""
    store = LanceDBStore.from_settings(tmp_settings)
    thread = PendingThread(store, NS, "th")
    persona = PERSONA.model_dump(mode="json")
    thread.append(
        [new_turn(f"t-{i}", "user" if i % 2 == 0 else "assistant", MESSAGES[i], seq=i) for i in range(3)], persona
    )
    first, seals = plan_chunks(thread.read(), NS, "th", 4096, write_tail=True)
    assert len(first) == 1 and set(seals) == {"t-0", "t-1", "t-2"}
    from dualmem.chat.pending import seal_ops

    thread.write(seal_ops(thread.ns, thread.read(), seals))
    thread.append([new_turn("t-3", "assistant", MESSAGES[3], seq=3)], persona)
    again, new = plan_chunks(thread.read(), NS, "th", 4096, write_tail=True)
    assert [c["id"] for c in again][0] == first[0]["id"] and again[0]["turn_ids"] == first[0]["turn_ids"]
    assert again[1]["turn_ids"] == ["t-3"] and set(new) == {"t-3"}
    not_quiet, none = plan_chunks(thread.read(), NS, "th", 4096, write_tail=False)
    assert [c["id"] for c in not_quiet] == [first[0]["id"]] and none == {}  # the tail waits for the quiet time


def test_a_run_before_the_quiet_time_leaves_a_short_tail_pending(tmp_settings):
    store = LanceDBStore.from_settings(tmp_settings)
    thread = PendingThread(store, NS, "th")
    thread.append([new_turn("t-0", "user", MESSAGES[0])], PERSONA.model_dump(mode="json"))
    request = FormationRequest(
        PERSONA.model_dump(mode="json"),
        NS,
        "th",
        tmp_settings.replace(formation_idle_s=600),
        store=store,
        writer_model=counting_writer(),
    )
    early = run_formation(request)
    assert early.rows == [] and early.pending_turns == 1
    forced = run_formation(request, flush=True)
    assert [r["status"] for r in forced.rows] == ["applied"] and forced.pending_turns == 0


def test_the_write_graph_forms_a_thread_under_one_hold_of_the_lease(tmp_settings, monkeypatch):
    """The server's path (the ``write`` graph with ``pending``) holds the namespace's lease once per formation, as the
    chat process does: sealing, each chunk's write and the removal of the written turns happen under that one hold."""
    from dualmem.context import context_of
    from dualmem.graphs.write import builder
    from dualmem.stores import LanceDualStore

    store = LanceDBStore.from_settings(tmp_settings)
    thread = PendingThread(store, NS, "th")
    persona = PERSONA.model_dump(mode="json")
    thread.append(
        [
            new_turn(f"t-{i}", "user" if i % 2 == 0 else "assistant", MESSAGES[i % len(MESSAGES)], seq=i)
            for i in range(6)
        ],
        persona,
    )
    held = []
    original = LanceDualStore.exclusive

    def counted(self, namespace, *args, **kwargs):
        held.append(tuple(namespace))
        return original(self, namespace, *args, **kwargs)

    monkeypatch.setattr(LanceDualStore, "exclusive", counted)
    writer = counting_writer()
    context = context_of(tmp_settings.replace(chunk_tokens=40), models={"writer": writer})
    out = builder.compile(store=store).invoke(
        {"persona": persona, "namespace": list(NS), "pending": {"thread": "th", "flush": True}}, context=context
    )
    chunks = [r["chunk_id"] for r in out["report"]]
    assert len(chunks) >= 2 and [r["status"] for r in out["report"]] == ["applied"] * len(chunks)
    assert held == [NS], "one hold of the namespace's write lease for the whole formation"
    assert out["formed"]["pending_turns"] == 0 and thread.read().turns == []
    assert out["failed_chunks"] == []
    assert len(writer.calls) == len(chunks)
