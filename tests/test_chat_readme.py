"""The README's chat-agent example runs as written (offline: only the model spec is swapped for a fake)."""

from __future__ import annotations

import re

from conftest import REPO

from dualmem.stores import LanceDBStore
from dualmem.testing import FakeChatModel
from dualmem.writer.pending import PendingThread


def _example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Memory while chatting: a LangChain agent", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_chat_agent_example_forms_memory(tmp_settings, monkeypatch):
    monkeypatch.setenv("DUALMEM_STORE_URI", tmp_settings.store_uri)
    monkeypatch.setenv("DUALMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("DUALMEM_CHAT_MODEL", "fake:memory")  # the writer's model (settings.writer)
    code = _example()
    assert code.count('"openai:gpt-4o-mini"') == 1 and len(code.strip().splitlines()) <= 12
    chat = FakeChatModel(responses=["Night shifts can be hard at first."], cycle=True)
    scope: dict = {"CHAT_MODEL": chat}
    exec(code.replace('"openai:gpt-4o-mini"', "CHAT_MODEL"), scope)  # noqa: S102 - the README's own code
    assert scope["reply"]["messages"][-1].content == "Night shifts can be hard at first." and len(chat.calls) == 2
    store = LanceDBStore.from_settings(tmp_settings)
    assert PendingThread(store, ("mara-okafor", "alice"), "chat-1").read().turns == []  # flushed: nothing left pending
    facts = store.dual.list(("mara-okafor", "alice"), kind="fact")
    insights = store.dual.list(("mara-okafor", "alice"), kind="insight")
    assert [f.source.session_id for f in facts] == ["chat-1"] and "night shifts at the depot" in facts[0].text
    assert insights and insights[0].grounding == [facts[0].id]
