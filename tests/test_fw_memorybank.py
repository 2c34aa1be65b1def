"""memorybank: forgetting-curve retention ordering, global summary and portrait, failures, restarts."""

from __future__ import annotations

import math

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.memorybank import MemoryBankFramework, parse_days, retention
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings


def _session(sid: str, time: str | None, texts: list[str]) -> Session:
    return Session(id=sid, time=time, turns=[Turn(id=f"{sid}-t{i}", role="user", text=t) for i, t in enumerate(texts)])


def _answer(messages, tool):
    """Answer digests with the chunk's own words (repairs too: the prompt stays second)."""
    prompt = str(messages[1].content)
    if tool == "SessionDigest":
        body = prompt.split("<session>")[1].split("</session>")[0].strip()
        return {"events": f"Event: {body.split(':', 1)[1].strip()}", "personality": "curious"}
    if tool == "GlobalMemory":
        return {"summary": "a summary", "portrait": "a portrait"}
    return "ok"


def _framework(tmp_settings, chat=None) -> MemoryBankFramework:
    context = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings.replace(chunk_tokens=12),
        chat_model=chat or FakeChatModel(responses=[_answer], cycle=True),
        embeddings=HashEmbeddings(),
    )
    return MemoryBankFramework(context)


def test_retention_formula_decays_slower_when_stronger():
    assert retention(0.0, 1.0) == 1.0
    assert math.isclose(retention(3.0, 1.0), math.exp(-3.0))
    assert math.isclose(retention(3.0, 2.0), math.exp(-1.5))
    assert retention(3.0, 2.0) > retention(3.0, 1.0)


def test_parse_days_needs_a_year():
    assert parse_days("2024-01-04") - parse_days("2024-01-01") == 3.0
    assert parse_days("1:56 pm on 8 May, 2023") is not None
    assert parse_days("Session 3") is None
    assert parse_days(None) is None


def test_recalled_memory_decays_slower_and_old_unrecalled_fall_below_newer(tmp_settings):
    fw = _framework(tmp_settings)
    twin = "I practised the piano scales today"
    fw.ingest(_session("s1", "2024-01-01", [twin, twin]))
    first = fw.retrieve(twin, k=1)  # recall exactly one of the two identical pieces
    assert len(first) == 1 and first[0].meta["unit"] == "piece"
    recalled = first[0].id
    fw.ingest(_session("s2", "2024-01-04", [twin]))  # three days later, the same words again

    rows = {m["id"]: (score, kept, m) for m, score, _, kept in fw.score_all(twin)}
    pieces = {i: r for i, r in rows.items() if r[2]["unit"] == "piece"}
    old = [i for i, r in pieces.items() if r[2]["session"] == "s1"]
    (unrecalled,) = [i for i in old if i != recalled]
    (newer,) = [i for i, r in pieces.items() if r[2]["session"] == "s2"]

    assert pieces[recalled][2]["strength"] == 2.0 and pieces[unrecalled][2]["strength"] == 1.0
    assert math.isclose(pieces[recalled][1], math.exp(-3 / 2))
    assert math.isclose(pieces[unrecalled][1], math.exp(-3))
    assert math.isclose(pieces[newer][1], 1.0)
    # same text, so the ranking is the retention: newer > recalled > unrecalled
    ranked = [i for i in (m["id"] for m, *_ in fw.score_all(twin)) if i in pieces]
    assert ranked == [newer, recalled, unrecalled]
    # retrieving is recalling: strength grows, the clock resets
    top = fw.retrieve(twin, k=2)  # the newer piece and its session's summary (same words) tie at the top
    assert newer in {t.id for t in top} and all(t.meta.get("session") == "s2" or t.source_session == "s2" for t in top)
    assert {m["id"]: m for m in fw.memories()}[newer]["strength"] == 2.0


def test_without_dates_every_session_is_one_day(tmp_settings):
    fw = _framework(tmp_settings)
    fw.ingest(_session("a", None, ["I adopted a grey cat"]))
    fw.ingest(_session("b", None, ["We went hiking in the hills"]))
    fw.ingest(_session("c", None, ["The exam went fine"]))
    assert fw.meta()["clock"] == 3.0
    kept = {m["session"]: k for m, _, _, k in fw.score_all("cat") if m["unit"] == "piece"}
    assert kept["c"] > kept["b"] > kept["a"]
    assert math.isclose(kept["a"], math.exp(-2))


def test_global_summary_and_portrait_are_updated_each_session(tmp_settings):
    globals_seen = []

    def answer(messages, tool):
        if tool == "GlobalMemory":
            prompt = str(messages[1].content)
            globals_seen.append(prompt)
            n = len(globals_seen)
            return {"summary": f"summary after {n} sessions", "portrait": f"portrait v{n}: curious"}
        return _answer(messages, tool)

    chat = FakeChatModel(responses=[answer], cycle=True)
    fw = _framework(tmp_settings, chat)
    fw.ingest(_session("s1", "2024-02-01", ["I started learning Spanish"]))
    assert fw.meta()["summary"] == "summary after 1 sessions"
    fw.ingest(_session("s2", "2024-02-02", ["I booked a trip to Madrid"]))
    meta = fw.meta()
    assert meta["summary"] == "summary after 2 sessions" and meta["portrait"] == "portrait v2: curious"
    # the second update folds the new session into the previous summary and portrait
    assert "summary after 1 sessions" in globals_seen[1] and "portrait v1" in globals_seen[1]
    assert "Event: I booked a trip to Madrid" in globals_seen[1]
    profile = fw.profile()
    assert [p.meta["unit"] for p in profile] == ["portrait", "global_summary"]
    assert profile[0].source_sessions == ["s1", "s2"]


def test_event_summaries_are_retrievable_with_their_session(tmp_settings):
    fw = _framework(tmp_settings)
    fw.ingest(_session("s1", "2024-03-01", ["My sister moved to Lisbon last week", "Football tonight"]))
    items = fw.retrieve("sister moved to Lisbon", k=4)
    assert items[0].source_session == "s1"
    units = {i.meta["unit"] for i in items}
    assert units == {"piece", "event"}
    assert any(i.text == "Event: My sister moved to Lisbon last week" for i in items)
    assert all(items[j].score >= items[j + 1].score for j in range(len(items) - 1))


def test_failed_summary_is_recorded_and_the_piece_kept(tmp_settings):
    def answer(messages, tool):
        if tool == "SessionDigest" and "broken" in str(messages[1].content):
            return "not json at all"
        return _answer(messages, tool)

    fw = _framework(tmp_settings, FakeChatModel(responses=[answer], cycle=True))
    report = fw.ingest(
        _session(
            "s1", "2024-03-01", ["a broken chunk of talk about nothing much", "a fine chunk of talk about nothing much"]
        )
    )
    assert len(report.failed_chunks) == 1
    assert report.meta["errors"][report.failed_chunks[0]]
    units = sorted(m["unit"] for m in fw.memories())
    assert units == ["event", "piece", "piece"]  # both pieces kept, one event summary
    assert report.items_written == 3


def test_state_survives_restart_and_reingest_is_skipped(tmp_settings):
    fw = _framework(tmp_settings)
    fw.ingest(_session("s1", "2024-03-01", ["I work night shifts at a warehouse"]))
    n = len(fw.memories())
    again = open_framework(
        "memorybank",
        FrameworkContext(
            namespace=("p", "u"),
            settings=tmp_settings.replace(chunk_tokens=12),
            chat_model=FakeChatModel(responses=[_answer], cycle=True),
            embeddings=HashEmbeddings(),
        ),
    )
    assert len(again.memories()) == n and again.meta()["sessions"] == ["s1"]
    report = again.ingest(_session("s1", "2024-03-01", ["I work night shifts at a warehouse"]))
    assert report.meta["skipped"] and len(again.memories()) == n
    again.reset()
    assert again.memories() == []
