"""Respond graph, generic reader and the dualmem framework on a real LanceDB directory."""

from __future__ import annotations

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage

from dualmem.context import context_of
from dualmem.frameworks import FrameworkContext, RetrievedItem, open_framework
from dualmem.frameworks.base import answer_from_items
from dualmem.frameworks.dualmem import DualMemFramework
from dualmem.graphs.respond import arespond, builder, respond
from dualmem.schema import Persona, Session, Turn
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer import write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
NS = ("dr-lee", "user")

FACTS = {
    "s0": ("works night shifts at the warehouse", "the night shifts drain her, exhaustion rather than laziness"),
    "s1": ("adopted a rescue dog named Biscuit", "caring for Biscuit gives her a steady routine"),
    "s2": ("failed the nursing exam in spring", "the failed exam still weighs on her confidence"),
}


def _sessions() -> list[Session]:
    return [
        Session(
            id=sid,
            time=f"2024-0{i + 1}-01",
            turns=[
                Turn(id=f"{sid}t0", role="user", text=f"{sid}: {fact}"),
                Turn(id=f"{sid}t1", role="assistant", text="I see."),
            ],
        )
        for i, (sid, (fact, _)) in enumerate(FACTS.items())
    ]


def _writer(messages, tool=None):
    if tool is None:  # asked for a reply, not a MemoryUpdate
        return "Your exam does not define you."
    prompt = str(messages[1].content)
    sid = next(s for s in FACTS if f"[{s}t0]" in prompt)
    fact, insight = FACTS[sid]
    return {
        "facts": [{"op": "ADD", "id": "N1", "text": fact, "turn_ids": [f"{sid}t0"]}],
        "insights": [{"op": "ADD", "id": "M1", "text": insight, "fact_ids": ["N1"]}],
    }


@pytest.fixture
def store(tmp_path):
    return LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))


@pytest.fixture
def filled(tmp_settings, store):
    write_history(
        _sessions(),
        PERSONA,
        settings=tmp_settings.replace(chunk_tokens=200),
        model=FakeChatModel(responses=[_writer], cycle=True),
        store=store,
        progress=False,
        checkpointer=False,
    )
    return store


def test_respond_retrieves_and_grounds_insights_in_the_prompt(tmp_settings, filled):
    model = FakeChatModel(responses=["Those night shifts are wearing you down."])
    reply = respond(
        "why am I so tired after the night shifts?",
        PERSONA,
        settings=tmp_settings,
        model=model,
        store=filled,
        k=4,
        mode="dual",
    )
    assert reply.text == "Those night shifts are wearing you down."
    assert len(reply.facts) == 2 and len(reply.insights) == 2  # dual: half facts, half insights
    assert reply.facts[0].item.text == "works night shifts at the warehouse"
    top = reply.insights[0].item
    assert top.text.startswith("the night shifts drain her")
    assert [f.text for f in reply.grounding[top.id]] == ["works night shifts at the warehouse"]
    system = str(model.calls[-1][0].content)
    assert "You are Dr. Lee" in system
    assert "the night shifts drain her" in system and "because: works night shifts at the warehouse" in system
    assert model.calls[-1][-1].content == "why am I so tired after the night shifts?"


def test_merged_mode_returns_one_pool_of_k(tmp_settings, filled):
    model = FakeChatModel(responses=["ok"])
    reply = respond(
        "Biscuit the rescue dog routine",
        PERSONA,
        settings=tmp_settings.replace(retrieval_mode="merged"),
        model=model,
        store=filled,
        k=3,
    )
    assert len(reply.merged) == 3
    assert {h.item.id for h in reply.merged} == {h.item.id for h in [*reply.facts, *reply.insights]}
    assert {h.item.kind for h in reply.merged} == {"fact", "insight"}
    scores = [h.score for h in reply.merged]
    assert scores == sorted(scores, reverse=True)
    assert "Biscuit" in reply.merged[0].item.text


def test_history_and_empty_memory(tmp_settings, store):
    model = FakeChatModel(responses=["Hello again."])
    reply = respond(
        "do you remember me?", PERSONA, settings=tmp_settings, model=model, store=store, history=[("hi", "hello")]
    )
    assert reply.facts == [] and reply.insights == []
    sent = model.calls[-1]
    assert [type(m).__name__ for m in sent[1:]] == ["HumanMessage", "AIMessage", "HumanMessage"]
    assert "nothing relevant remembered" in str(sent[0].content)


def test_remember_hands_the_exchange_to_formation_which_writes_it_in_the_background(tmp_settings, store):
    from dualmem.chat import FormationExecutor

    def both(messages, tool=None):
        if tool:  # the writer asks for a MemoryUpdate
            return {
                "facts": [{"op": "ADD", "id": "N1", "text": "plans to move to Lisbon next year", "turn_ids": []}],
                "insights": [],
            }
        return "Lisbon will suit you."

    model = FakeChatModel(responses=[both], cycle=True)
    with FormationExecutor() as formation:
        reply = respond(
            "I'm moving to Lisbon next year!",
            PERSONA,
            settings=tmp_settings,
            model=model,
            store=store,
            remember=True,
            thread_id="chat-1",
            formation=formation,
        )
        assert reply.text == "Lisbon will suit you." and reply.written == []
        assert reply.pending["thread"] == "chat-1" and reply.pending["turns"] == 2 and reply.pending["flagged"] == []
        assert store.list(NS) == []  # not written on the reply's path
        (formed,) = formation.flush(timeout=60)
    assert [r["status"] for r in formed.rows] == ["applied"] and formed.pending_turns == 0
    (fact,) = store.list(NS, kind="fact")
    assert fact.text == "plans to move to Lisbon next year" and fact.source.session_id == "chat-1"
    assert fact.source.turn_ids == [formed.rows[0]["turn_ids"][0]]  # no turn ids given: the user's turn


def test_graph_streams_reply_tokens(tmp_settings, filled):
    model = GenericFakeChatModel(messages=iter([AIMessage(content="your night shifts wear you down")]))
    graph = builder.compile()
    context = context_of(tmp_settings, models={"chat": model}, store=filled)
    inputs = {"persona": PERSONA.model_dump(mode="json"), "messages": [HumanMessage(content="why so tired?")]}
    chunks = [
        c
        for c, meta in graph.stream(inputs, context=context, stream_mode="messages")
        if meta["langgraph_node"] == "reply"
    ]
    assert len(chunks) > 3 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(str(c.content) for c in chunks) == "your night shifts wear you down"


def test_graph_takes_the_last_human_message_and_appends_the_reply(tmp_settings, filled):
    model = FakeChatModel(responses=["Rest more."])
    out = builder.compile().invoke(
        {"persona": PERSONA.model_dump(mode="json"), "messages": [HumanMessage(content="night shifts again")]},
        context=context_of(tmp_settings, models={"chat": model}, store=filled),
    )
    assert [m.content for m in out["messages"]] == ["night shifts again", "Rest more."]
    facts = [i for i in out["items"] if i["kind"] == "fact"]
    assert facts and facts[0]["text"] == "works night shifts at the warehouse"


def test_answer_from_items_uses_persona_and_items(tmp_settings):
    model = FakeChatModel(responses=["Remember the dog."])
    context = FrameworkContext(namespace=NS, settings=tmp_settings, persona=PERSONA, chat_model=model)
    items = [RetrievedItem(text="adopted a rescue dog", kind="fact", score=1.0, source_session="s1")]
    assert answer_from_items(context, "what helps me?", items) == "Remember the dog."
    system = str(model.calls[-1][0].content)
    assert "You are Dr. Lee" in system and "- (fact, session s1) adopted a rescue dog" in system


def test_dualmem_framework_ingest_retrieve_respond(tmp_settings):
    writer = FakeChatModel(responses=[_writer], cycle=True)
    context = FrameworkContext(
        namespace=NS,
        settings=tmp_settings.replace(chunk_tokens=200),
        persona=PERSONA,
        chat_model=writer,
        embeddings=HashEmbeddings(64),
    )
    fw = open_framework("dualmem", context)
    assert isinstance(fw, DualMemFramework)
    reports = [fw.ingest(s) for s in _sessions()]
    assert [r.items_written for r in reports] == [2, 2, 2] and all(r.llm_calls == 1 for r in reports)
    assert fw.ingest(_sessions()[0]).llm_calls == 0  # already applied: nothing asked
    items = fw.retrieve("failed nursing exam confidence", k=4)
    assert len(items) == 4 and {i.kind for i in items} <= {"fact", "insight"}
    exam = [i for i in items if "exam" in i.text]
    assert {i.source_session for i in exam} == {"s2"}
    insight = next(i for i in exam if i.kind == "insight")
    assert insight.source_sessions == ["s2"] and insight.meta["grounding_texts"] == [
        "failed the nursing exam in spring"
    ]
    dual = DualMemFramework(context, mode="dual").retrieve("failed nursing exam confidence", k=4)
    assert [i.kind for i in dual].count("insight") == 2 and len(dual) == 4
    assert fw.respond("why do I doubt myself since the nursing exam?", k=2) == "Your exam does not define you."
    assert "failed the nursing exam in spring" in str(writer.calls[-1][0].content)
    fw.reset()
    assert fw.retrieve("exam", k=4) == []


async def test_arespond(tmp_settings, filled):
    reply = await arespond(
        "night shifts", PERSONA, settings=tmp_settings, model=FakeChatModel(responses=["ok"]), store=filled, k=2
    )
    assert reply.text == "ok" and len(reply.facts) == 1 and len(reply.insights) == 1


def test_respond_graph_serves_another_framework(tmp_settings):
    settings = tmp_settings.replace(framework="full-context")
    fw = open_framework(
        "full-context", FrameworkContext(namespace=NS, settings=settings, embeddings=HashEmbeddings(64))
    )
    fw.ingest(Session(id="s9", turns=[Turn(id="s9t0", role="user", text="my cat is called Miso")]))
    model = FakeChatModel(responses=["Miso, of course."])
    reply = respond("what is my cat called?", PERSONA, settings=settings, model=model, remember=True)
    assert reply.text == "Miso, of course." and reply.facts == []
    assert [i.source_session for i in reply.items] == ["s9"] and "Miso" in reply.items[0].text
    assert "my cat is called Miso" in str(model.calls[-1][0].content)
    assert reply.written[0]["items_written"] == 2  # the exchange went into that framework's memory
    again = open_framework(
        "full-context", FrameworkContext(namespace=NS, settings=settings, embeddings=HashEmbeddings(64))
    )
    assert len(again.window()) == 3


def test_respond_graph_with_a_settings_dict_context(tmp_settings, filled):
    from dualmem.graphs.respond import builder
    from dualmem.stores import LanceDBStore

    context = {"options": {"embedder": "hash:64"}, "chat_model": "fake:memory", "retrieval_k": 1}
    graph = builder.compile(store=LanceDBStore(filled.uri, dual=filled))  # the server's store is runtime.store
    out = graph.invoke({"persona": PERSONA.model_dump(mode="json"), "query": "the nursing exam"}, context=context)
    assert out["reply"].startswith("(fake reply)")
    assert [i["text"] for i in out["items"]] == ["failed the nursing exam in spring"]
    assert [m.type for m in out["messages"]] == ["human", "ai"]


def test_a_turn_builds_its_memory_framework_once(tmp_settings, filled, monkeypatch):
    """retrieve builds the framework and renders its memory text into the state; reply and remember build none."""
    import dualmem.frameworks as frameworks
    from dualmem.chat import FormationExecutor

    built: list[str] = []
    real = frameworks.open_framework
    monkeypatch.setattr(frameworks, "open_framework", lambda name, ctx: built.append(name) or real(name, ctx))
    model = FakeChatModel(responses=["Rest after those shifts."], cycle=True)
    with FormationExecutor() as formation:
        reply = respond(
            "the night shifts",
            PERSONA,
            settings=tmp_settings,
            model=model,
            store=filled,
            k=4,
            remember=True,
            thread_id="chat-2",
            formation=formation,
        )
        formation.flush(timeout=60)
    assert built == ["dualmem"] and reply.facts
    assert "works night shifts at the warehouse" in str(model.calls[0][0].content)  # the rendered memory reached reply
