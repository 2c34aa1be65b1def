"""full-context keeps only the last N tokens of the history, across sessions and restarts."""

from __future__ import annotations

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.full_context import FullContextFramework
from dualmem.frameworks.kit import Space, truncate_tokens
from dualmem.models.tokens import count_tokens
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings


def _session(sid: str, n: int, words: int = 12) -> Session:
    turns = [
        Turn(id=f"{sid}-t{i}", role="user" if i % 2 == 0 else "assistant", text=" ".join([f"w{sid}{i}"] * words))
        for i in range(n)
    ]
    return Session(id=sid, time="2024-01-01", turns=turns)


def _context(tmp_settings, **kw) -> FrameworkContext:
    return FrameworkContext(namespace=("p", "u"), settings=tmp_settings, embeddings=HashEmbeddings(), **kw)


def test_window_holds_only_the_last_n_tokens(tmp_settings):
    fw = FullContextFramework(_context(tmp_settings), max_tokens=200)
    fw.ingest(_session("s1", 10))
    fw.ingest(_session("s2", 10))
    window = fw.window()
    total = sum(count_tokens(item.text) for item in window)
    assert 0 < total <= 200
    # newest turn is the last one of the last session, and the window is contiguous
    all_ids = [f"s1-t{i}" for i in range(10)] + [f"s2-t{i}" for i in range(10)]
    ids = [item.id for item in window]
    assert ids == all_ids[-len(ids) :]
    assert len(ids) < len(all_ids)
    # one more turn would not have fitted
    dropped = all_ids[-len(ids) - 1]
    assert dropped not in ids


def test_retrieve_returns_newest_first_with_sessions(tmp_settings):
    fw = FullContextFramework(_context(tmp_settings), max_tokens=10_000)
    fw.ingest(_session("a", 4))
    fw.ingest(_session("b", 4))
    items = fw.retrieve("anything", k=3)
    assert [i.id for i in items] == ["b-t3", "b-t2", "b-t1"]
    assert [i.source_session for i in items] == ["b", "b", "b"]
    assert items[0].score > items[1].score > items[2].score
    assert {i.kind for i in items} == {"turn"}


def test_reingest_is_idempotent_and_survives_restart(tmp_settings):
    ctx = _context(tmp_settings)
    fw = FullContextFramework(ctx, max_tokens=10_000)
    fw.ingest(_session("a", 3))
    fw.ingest(_session("b", 3))
    fw.ingest(_session("a", 3))  # replayed: replaced in place, not duplicated nor moved
    again = FullContextFramework(ctx, max_tokens=10_000)
    assert [i.id for i in again.window()] == [f"a-t{i}" for i in range(3)] + [f"b-t{i}" for i in range(3)]
    again.reset()
    assert again.window() == []


def test_overlong_newest_turn_is_cut_to_its_end(tmp_settings):
    fw = FullContextFramework(_context(tmp_settings), max_tokens=30)
    words = [f"word{i}" for i in range(200)]
    fw.ingest(Session(id="s", turns=[Turn(id="t", role="user", text=" ".join(words))]))
    (item,) = fw.window()
    assert item.meta["truncated"] is True
    assert count_tokens(item.text) <= 30
    assert item.text.endswith("word199")


def test_truncate_tokens_keeps_start_or_end():
    text = " ".join(f"x{i}" for i in range(100))
    start, end = truncate_tokens(text, 20), truncate_tokens(text, 20, keep="end")
    assert count_tokens(start) <= 20 and start.startswith("x0 ")
    assert count_tokens(end) <= 20 and end.endswith("x99")
    assert truncate_tokens("short", 20) == "short"


def test_space_values_and_records_are_isolated_per_namespace(tmp_settings):
    quoted = Space(
        FrameworkContext(namespace=("o'brien", "u"), settings=tmp_settings, embeddings=HashEmbeddings()), "kit"
    )
    other = Space(FrameworkContext(namespace=("other", "u"), settings=tmp_settings, embeddings=HashEmbeddings()), "kit")
    quoted.set_values({"k1": {"v": 1}, "k2": [2]})
    other.set_values({"k1": "x"})
    quoted.set_values({"k1": {"v": 3}})
    assert quoted.value("k1") == {"v": 3} and quoted.value("k2") == [2]
    assert other.value("k1") == "x" and other.value("nope", 7) == 7
    quoted.put([{"id": "r1", "seq": 1}, {"id": "r0", "seq": 0}], ["green tea every morning", "plays chess"])
    other.put([{"id": "r1", "seq": 0}], ["green tea at noon"])
    assert [r["id"] for r in quoted.records()] == ["r0", "r1"] and [r["id"] for r in other.records()] == ["r1"]
    assert [r["id"] for r, _ in quoted.search("green tea", 1)] == ["r1"]
    quoted.drop()
    assert quoted.records() == [] and quoted.value("k1") is None and other.value("k1") == "x"


def test_registered_and_opened_by_name(tmp_settings):
    fw = open_framework("full-context", _context(tmp_settings))
    assert isinstance(fw, FullContextFramework)
    assert fw.description


def test_respond_puts_the_window_in_the_prompt(tmp_settings):
    model = FakeChatModel(responses=["in character answer"])
    fw = FullContextFramework(_context(tmp_settings, chat_model=model), max_tokens=60)
    fw.ingest(_session("s", 12))
    fw.respond("what did I say?")
    prompt = "\n".join(str(m.content) for m in model.calls[-1])
    assert "ws11" in prompt  # newest turn is in the prompt
    assert "ws0 " not in prompt  # the oldest turn fell out of the window
