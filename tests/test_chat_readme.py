"""The docs' chat-agent example (docs/guides/agents.md) runs as written (offline: only the chat model is swapped for a fake)."""

from __future__ import annotations

import re

from conftest import REPO

from dualmem.chat.pending import PendingThread
from dualmem.stores import LanceDBStore
from dualmem.testing import FakeChatModel

PAGE = REPO / "docs" / "guides" / "agents.md"
MODEL = "load_chat_model()"  # the example's chat model: the settings' (bundled by default)


def _example() -> str:
    section = PAGE.read_text().split("## A chat agent with memory", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_chat_agent_example_forms_memory(tmp_settings, monkeypatch):
    monkeypatch.setenv("DUALMEM_STORE_URI", tmp_settings.store_uri)
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("DUALMEM_CHAT_MODEL", "fake:memory")  # the writer's model (settings.writer)
    code = _example()
    assert code.count(MODEL) == 1 and len(code.strip().splitlines()) <= 25
    chat = FakeChatModel(responses=["Night shifts can be hard at first."], cycle=True)
    scope: dict = {"CHAT_MODEL": chat}
    exec(code.replace(MODEL, "CHAT_MODEL"), scope)
    assert scope["reply"]["messages"][-1].content == "Night shifts can be hard at first." and len(chat.calls) == 2
    store = LanceDBStore.from_settings(tmp_settings)
    assert PendingThread(store, ("mara-okafor", "alice"), "chat-1").read().turns == []  # flushed: nothing left pending
    facts = store.dual.list(("mara-okafor", "alice"), kind="fact")
    insights = store.dual.list(("mara-okafor", "alice"), kind="insight")
    assert [f.source.session_id for f in facts] == ["chat-1"] and "night shifts at the depot" in facts[0].text
    assert insights and insights[0].grounding == [facts[0].id]
