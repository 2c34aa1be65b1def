"""DualMemMiddleware in real `create_agent` runs: recall into the prompt per user, hand-over after the turn, formation."""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from dualmem.chat import DualMemMiddleware, FormationExecutor
from dualmem.chat.pending import PendingThread
from dualmem.errors import ConfigurationError
from dualmem.schema import Fact, Insight, Persona, SourceRef
from dualmem.stores import LanceDBStore
from dualmem.testing import FakeChatModel

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
MEMORY = {
    "alice": ("works night shifts at the warehouse", "the night shifts drain her: exhaustion, not laziness"),
    "bob": ("adopted a rescue dog named Biscuit", "Biscuit gives him a steady routine"),
}


@tool
def clock() -> str:
    """Return the time of day."""
    return "23:40"


def tool_then_answer(messages, bound_tool=None):
    """A tool-calling model: asks the clock first, answers once the tool replied."""
    if bound_tool and not any(isinstance(m, ToolMessage) for m in messages[-2:]):
        return {}
    return "It is late; rest when you can."


@pytest.fixture
def store(tmp_settings):
    lg = LanceDBStore.from_settings(tmp_settings)
    for user, (fact, insight) in MEMORY.items():
        ns = (PERSONA.id, user)
        f = Fact(id=f"f-{user}", namespace=ns, text=fact, source=SourceRef(session_id="s1", turn_ids=["t1"]))
        i = Insight(
            id=f"i-{user}",
            namespace=ns,
            text=insight,
            grounding=[f.id],
            source=SourceRef(session_id="s1", turn_ids=["t1"]),
        )
        lg.dual.upsert([f, i])
    return lg


def _agent(model, store, settings, formation, **kwargs):
    middleware = DualMemMiddleware(
        PERSONA, settings=settings, writer_model=kwargs.pop("writer", None), formation=formation
    )
    return create_agent(
        model, [clock], middleware=[middleware], store=store, system_prompt="Answer in English.", **kwargs
    )


def test_recalled_memory_reaches_every_model_call_and_each_user_sees_only_their_own(tmp_settings, store):
    model = FakeChatModel(responses=[tool_then_answer], cycle=True)
    with FormationExecutor() as formation:
        agent = _agent(model, store, tmp_settings.replace(formation_idle_s=600), formation)
        out = agent.invoke(
            {"messages": [HumanMessage("why am I so tired after the night shifts?")]}, context={"user_id": "alice"}
        )
        assert out["messages"][-1].content == "It is late; rest when you can."
        assert any(isinstance(m, ToolMessage) and m.content == "23:40" for m in out["messages"])  # the tool loop ran
        alice = [str(call[0].content) for call in model.calls]
        assert len(alice) == 2  # before and after the tool call
        for system in alice:
            assert system.startswith("You are Dr. Lee.") and system.endswith(
                "Answer in English."
            )  # the agent's prompt follows
            assert (
                "- the night shifts drain her: exhaustion, not laziness\n    because: works night shifts at the warehouse"
                in system
            )
            assert "Biscuit" not in system

        model.calls.clear()
        agent.invoke(
            {"messages": [HumanMessage("how is my dog doing?")]}, {"configurable": {"user_id": "bob"}}
        )  # user from config
        bob = [str(call[0].content) for call in model.calls]
        assert all("Biscuit gives him a steady routine" in s and "night shifts" not in s for s in bob)

        model.calls.clear()
        agent.invoke({"messages": [HumanMessage("who am I?")]}, context={"user_id": "carol"})  # nobody's memory
        assert all("(nothing relevant remembered)" in str(call[0].content) for call in model.calls)


def test_the_exchange_is_pending_after_the_turn_and_formed_in_the_background(tmp_settings, store, capsys):
    chat = FakeChatModel(responses=["I hear you."], cycle=True)
    writer = FakeChatModel(
        responses=[
            lambda m, t=None: {
                "facts": [{"op": "ADD", "id": "N1", "text": "took up pottery on Tuesdays", "turn_ids": []}],
                "insights": [],
            }
        ],
        cycle=True,
    )
    settings = tmp_settings.replace(formation_idle_s=600)
    with FormationExecutor() as formation:
        agent = _agent(chat, store, settings, formation, writer=writer, checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "th-1"}}
        agent.invoke(
            {"messages": [HumanMessage("I took up pottery on Tuesdays.")]}, config, context={"user_id": "alice"}
        )
        snap = PendingThread(store, (PERSONA.id, "alice"), "th-1").read()
        assert [(t["role"], t["text"]) for t in snap.turns] == [
            ("user", "I took up pottery on Tuesdays."),
            ("assistant", "I hear you."),
        ]
        assert snap.persona["id"] == PERSONA.id and writer.calls == []  # nothing written on the reply's path
        items = store.search(("dualmem_pending", PERSONA.id, "alice", "th-1"))  # ordinary store items
        assert {i.key for i in items} == {t["id"] for t in snap.turns} | {"thread"}

        agent.invoke(
            {"messages": [HumanMessage("I took up pottery on Tuesdays.")]}, config, context={"user_id": "alice"}
        )
        assert len(PendingThread(store, (PERSONA.id, "alice"), "th-1").read().turns) == 4  # a new message is a new turn

        (formed,) = formation.flush(timeout=60, progress=True)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "dualmem: writing the pending chat turns of 1 thread(s) into memory…",
        f"dualmem: thread th-1 of {PERSONA.id}/alice: 1 chunk(s) written",
    ]
    assert (
        [r["status"] for r in formed.rows] == ["applied"]
        and len(formed.rows[0]["turn_ids"]) == 4
        and len(writer.calls) == 1
    )
    assert PendingThread(store, (PERSONA.id, "alice"), "th-1").read().turns == []
    (fact,) = [
        f for f in store.dual.list((PERSONA.id, "alice"), kind="fact") if f.text == "took up pottery on Tuesdays"
    ]
    assert fact.source.session_id == "th-1"
    assert store.dual.list((PERSONA.id, "bob"), kind="fact")[0].text == MEMORY["bob"][0]  # bob untouched


async def test_the_async_agent_recalls_and_hands_over_through_the_same_core(tmp_settings, store):
    chat = FakeChatModel(responses=["Noted."], cycle=True)
    with FormationExecutor() as formation:
        agent = _agent(chat, store, tmp_settings.replace(formation_idle_s=600), formation, checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "th-async"}}
        await agent.ainvoke(
            {"messages": [HumanMessage("the night shifts again")]}, config, context={"user_id": "alice"}
        )
        assert "because: works night shifts at the warehouse" in str(chat.calls[-1][0].content)
        snap = await PendingThread(store, (PERSONA.id, "alice"), "th-async").aread()
        assert [t["text"] for t in snap.turns] == ["the night shifts again", "Noted."]


def test_a_missing_store_or_persona_is_a_configuration_error(tmp_settings, store):
    chat = FakeChatModel(responses=["hi"])
    no_store = create_agent(chat, [], middleware=[DualMemMiddleware(PERSONA, settings=tmp_settings)])
    with pytest.raises(ConfigurationError, match="store=LanceDBStore"):
        no_store.invoke({"messages": [HumanMessage("hello")]})
    no_persona = create_agent(chat, [], middleware=[DualMemMiddleware(settings=tmp_settings)], store=store)
    with pytest.raises(ConfigurationError, match="needs a persona"):
        no_persona.invoke({"messages": [HumanMessage("hello")]})
    # the persona may come with the run instead
    out = no_persona.invoke(
        {"messages": [HumanMessage("the night shifts")]}, context={"persona": PERSONA.model_dump(), "user_id": "alice"}
    )
    assert out["messages"][-1].content == "hi" and "because: works night shifts" in str(chat.calls[-1][0].content)
