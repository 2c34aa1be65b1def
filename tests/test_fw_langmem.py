"""langmem: memories extracted, updated and stored through the real library, with a fake tool-calling model.

The fake answers the tool calls langmem makes through trustcall: ``Memory``
(insert) on an empty store, ``PatchDoc`` (JSON-patch update of an existing
memory, whose id it reads from the ``<existing>`` block of the prompt).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableBinding
from langgraph.store.memory import InMemoryStore

from dualmem.errors import ConfigurationError
from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.langmem_fw import LangMemFramework
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings


class ToolCallingFake(FakeChatModel):
    """FakeChatModel that records the tools bound (its ``bind_tools`` returns a RunnableBinding, as real chat models')
    and whose scripted responses may be whole ``AIMessage``s with any tool calls."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        names = [getattr(t, "__name__", getattr(t, "name", "")) for t in tools]
        self._state.setdefault("bound", []).append(names)
        bound = super().bind_tools(tools, tool_choice=tool_choice, **kwargs)
        assert isinstance(bound, RunnableBinding) and bound.bound is self  # trustcall reaches the model as `.bound`
        return bound

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        item = self._next(messages, None)
        if isinstance(item, AIMessage):
            return ChatResult(generations=[ChatGeneration(message=item)])
        self._state["i"] -= 1  # let the parent consume the same scripted item
        self._state["calls"].pop()
        return super()._generate(messages, stop, run_manager, **kwargs)


def _call(name: str, args: dict, n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call{n}", "type": "tool_call"}])


def librarian(messages):
    """Insert a memory per user statement; patch the job memory when the user changes job."""
    system = str(messages[0].content)
    convo = "\n".join(str(m.content) for m in messages)
    existing = dict(re.findall(r"<instance id=(\w+) schema_type=\"Memory\">\n(.+?)\n</instance>", system))
    if "bakery" in convo:
        job = next(i for i, text in existing.items() if "warehouse" in text)
        patch = [{"op": "replace", "path": "/content", "value": "User now works day shifts at a bakery"}]
        return _call("PatchDoc", {"json_doc_id": job, "planned_edits": "job changed", "patches": patch}, 2)
    if "warehouse" in convo:
        return _call("Memory", {"content": "User works night shifts at a warehouse"}, 1)
    return AIMessage(content="nothing to remember")


def _session(sid: str, text: str) -> Session:
    turns = [Turn(id=f"{sid}-u", role="user", text=text), Turn(id=f"{sid}-a", role="assistant", text="I see.")]
    return Session(id=sid, time="2024-02-0" + sid[-1], turns=turns)


@pytest.fixture(params=["lancedb", "inmemory"])
def fw(request, tmp_settings):
    model = ToolCallingFake(responses=[librarian], cycle=True)
    emb = HashEmbeddings()
    ctx = FrameworkContext(namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=emb)
    store = (
        InMemoryStore(index={"dims": 64, "embed": emb, "fields": ["content.content"]})
        if request.param == "inmemory"
        else None
    )
    return LangMemFramework(ctx, store=store)


def test_library_extracts_stores_and_updates(fw):
    r1 = fw.ingest(_session("s1", "I do night shifts at the warehouse"))
    assert r1.failed_chunks == [] and r1.items_written == 1
    (item,) = fw.retrieve("where does the user work", k=5)
    assert item.text == "User works night shifts at a warehouse" and item.source_session == "s1"
    bound = fw.context.chat_model._state["bound"]
    assert any("Memory" in names for names in bound)  # the library bound its schema tool

    r2 = fw.ingest(_session("s2", "I quit, I bake bread at a bakery now"))
    assert r2.failed_chunks == [] and r2.items_written == 1
    (item,) = fw.retrieve("job", k=5)
    assert item.text == "User now works day shifts at a bakery"
    assert item.sessions() == ["s1", "s2"]
    prompt = str(fw.context.chat_model.calls[-1][0].content)
    assert "User works night shifts at a warehouse" in prompt  # the library showed the old memory


def test_ingest_is_idempotent_and_reset_forgets(fw):
    session = _session("s1", "I do night shifts at the warehouse")
    fw.ingest(session)
    calls = len(fw.context.chat_model.calls)
    assert fw.ingest(session).llm_calls == 0 and len(fw.context.chat_model.calls) == calls
    fw.reset()
    assert fw.retrieve("warehouse", k=5) == []


def test_restart_keeps_memories_on_lancedb(tmp_settings):
    model = ToolCallingFake(responses=[librarian], cycle=True)
    ctx = FrameworkContext(namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=HashEmbeddings())
    open_framework("langmem", ctx).ingest(_session("s1", "I do night shifts at the warehouse"))
    again = LangMemFramework(ctx)
    assert [i.text for i in again.retrieve("warehouse", k=3)] == ["User works night shifts at a warehouse"]
    assert again.ingest(_session("s1", "I do night shifts at the warehouse")).llm_calls == 0


def test_library_failure_is_recorded(tmp_settings):
    model = ToolCallingFake(responses=[RuntimeError("rate limited")], cycle=True)
    ctx = FrameworkContext(namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=HashEmbeddings())
    report = LangMemFramework(ctx).ingest(_session("s1", "I do night shifts at the warehouse"))
    assert len(report.failed_chunks) == 1 and "rate limited" in report.meta["errors"][report.failed_chunks[0]]


def test_model_without_tool_calling_is_a_configuration_error(tmp_settings):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    ctx = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings,
        chat_model=FakeListChatModel(responses=["x"]),
        embeddings=HashEmbeddings(),
    )
    with pytest.raises(ConfigurationError, match="tool calling"):
        LangMemFramework(ctx).ingest(_session("s1", "hello"))


def test_two_writers_of_one_namespace_apply_each_chunk_once(tmp_settings):
    """Two framework instances (two handles on one LanceDB folder, as two processes hold) ingest the same session at
    once: the write lease makes the second wait, then find the chunk in the ledger."""
    import threading
    import time

    def slow_librarian(messages):
        time.sleep(0.5)  # the first writer is still inside the chunk when the second one starts
        return librarian(messages)

    models, done = [], []

    def writer() -> None:
        model = ToolCallingFake(responses=[slow_librarian], cycle=True)
        models.append(model)
        ctx = FrameworkContext(
            namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=HashEmbeddings()
        )
        done.append(LangMemFramework(ctx).ingest(_session("s1", "I do night shifts at the warehouse")))

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.llm_calls for r in done) == [0, 1] and sum(len(m.calls) for m in models) == 1
    ctx = FrameworkContext(
        namespace=("p", "u"), settings=tmp_settings, chat_model=models[0], embeddings=HashEmbeddings()
    )
    assert [i.text for i in LangMemFramework(ctx).retrieve("warehouse", k=5)] == [
        "User works night shifts at a warehouse"
    ]
